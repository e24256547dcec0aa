"""Short diagnostics of GLoMo pretraining on real text: what does the objective reward?

    python -m benchmarks.text_diagnostics recipe '{"lr": 0.01, "keep_alive": 0.05}' --seconds 240
    python -m benchmarks.text_diagnostics fixed local --seconds 500

Both read the token shards of a prepared IMDB corpus (``--shards``, as built by
``glomo pretrain`` or ``benchmarks.text_recipes``: 20,000 reviews, vocabulary 10,000)
and train on 1 thread in a plain loop (no Lightning, no checkpoints) for a wall-clock
budget, printing every 100 steps the context-prediction loss on 128 fixed held-out
windows:

* ``recipe SETTINGS``: the whole ``Glomo`` model (CPU base: width 96, 2 layers x 4 heads,
  2-layer CNNs, D = 3, 10 positions, ``position='relative'``) with the JSON ``SETTINGS``
  changed (``lr`` and ``bs`` set the Adam rate and batch size; everything else goes to
  ``Glomo``). Beside the loss with the learned graphs it prints the loss of the same
  feature predictor given uniform graphs and previous-word graphs, and the per-head
  graph health (weight on the adjacent unit, share of empty targets).
* ``fixed uniform|local|previous``: only the feature predictor and decoder train, on
  fixed graphs (uniform over the prefix; head h at distance h + 1; every head the
  previous word). The gap between ``local`` and ``uniform`` is how much the objective
  rewards local structure at this scale, i.e. the signal a graph predictor could learn
  locality from.
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from glomo_pyg import Glomo, LatentGraphs
from glomo_pyg.analysis.statistics import graph_health
from glomo_pyg.data.tokens import TokenWindows
from glomo_pyg.sequences import sequence_batch

BASE = dict(hidden_channels=96, num_layers=2, heads=4, cnn_layers=2, context_length=3,
            num_positions=10, position="relative")


def fixed_graphs(x: torch.Tensor, batch: torch.Tensor, kind: str, layers: int, heads: int,
                 direction: str = "forward"):
    """Uniform, local (head h at distance h + 1) or previous-unit graphs."""
    seq = sequence_batch(x.numel(), batch, x.device)
    if kind in ("uniform", "previous"):
        build = LatentGraphs.uniform if kind == "uniform" else LatentGraphs.adjacent
        return seq, build(seq.ptr, num_layers=layers, num_heads=heads, direction=direction)
    pos, length = seq.position, seq.lengths[seq.batch]
    node = torch.arange(x.numel())
    eis, ehs = [], []
    for h in range(heads):
        k = h + 1
        ok = pos >= k if direction == "forward" else pos < length - k
        src = (node - k if direction == "forward" else node + k)[ok]
        eis.append(torch.stack([src, node[ok]]))
        ehs.append(torch.full((int(ok.sum()),), h))
    ei, eh = torch.cat(eis, 1), torch.cat(ehs)
    w = torch.ones(ei.size(1))
    return seq, LatentGraphs([ei] * layers, [w] * layers, [eh] * layers, num_heads=heads,
                             direction=direction, ptr=seq.ptr)


def _model(args) -> tuple:
    """The model, the parameters trained, the learning rate and the batch size of a mode."""
    if args.mode == "recipe":
        settings = json.loads(args.what)
        lr, batch_size = settings.pop("lr", 3e-3), settings.pop("bs", 32)
        model = Glomo.text(10000, **dict(BASE, **settings))
        return model, list(model.parameters()), lr, batch_size
    if args.what not in ("uniform", "local", "previous"):
        raise SystemExit("fixed mode: uniform, local or previous")
    model = Glomo.text(10000, **dict(BASE, position=None), bidirectional=False)
    unique = {id(p): p for p in [*model.feature_predictors.parameters(),
                                 *model.decoders.parameters()]}  # the tied embedding once
    return model, list(unique.values()), args.lr, 32


def _parse_args(argv) -> argparse.Namespace:
    """The command line: the mode, what it runs, the shards, the budget and the rate."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("recipe", "fixed"))
    parser.add_argument("what", help="recipe: JSON settings; fixed: uniform|local|previous")
    parser.add_argument("--shards", default="runs/text-recipes/corpus/tokens")
    parser.add_argument("--seconds", type=float, default=240)
    parser.add_argument("--lr", type=float, default=0.01, help="fixed mode: Adam rate")
    return parser.parse_args(argv)


def _batch_of(windows: TokenWindows, ids) -> tuple:
    """The tokens of windows ``ids`` concatenated, and the window of each token."""
    xs = [windows[i].x for i in ids]
    return torch.cat(xs), torch.cat([torch.full((len(t),), k) for k, t in enumerate(xs)])


def _loss_with(model, x: torch.Tensor, batch: torch.Tensor, kind: str,
               direction: str) -> torch.Tensor:
    """The context-prediction loss in ``direction`` given learned or fixed ``kind`` graphs."""
    key = {"forward": "fw", "backward": "bw"}[direction]
    gp = model.graph_predictors[key]
    if kind == "learned":
        seq = sequence_batch(x.numel(), batch, x.device)
        graphs = gp.emit(x, seq)
    else:
        seq, graphs = fixed_graphs(x, batch, kind, gp.num_layers, gp.heads, direction)
    f, _ = model.feature_predictors[key].from_sequences(x, seq, graphs)
    positions = model._positions(seq, direction)
    targets = model.decoders[key].targets(x, seq, positions, direction)
    return model.decoders[key].loss(f[positions], targets)[0]


def _recipe_measures(model, x: torch.Tensor, batch: torch.Tensor) -> dict:
    """Held-out losses with learned, uniform and previous-word graphs, and graph health."""
    out = {}
    for kind in ("learned", "uniform", "previous"):
        out[kind] = round(sum(float(_loss_with(model, x, batch, kind, d))
                              for d in model.directions) / len(model.directions), 3)
    graphs = model.graphs(x, batch)
    for d in model.directions:
        health = graph_health(getattr(graphs, d))
        out[f"{d}/adjacent"] = [round(v, 2) for v in health.adjacent.flatten().tolist()]
        out[f"{d}/empty"] = [round(v, 2) for v in health.empty.flatten().tolist()]
        out["uniform_adjacent"] = round(health.uniform_adjacent, 3)
    return out


def _report(args, model, held_out: tuple, step: int, start: float) -> None:
    """Print the step, the seconds so far and the held-out measures as one JSON line."""
    model.eval()
    x, batch = held_out
    out = dict(step=step, seconds=round(time.time() - start))
    with torch.no_grad():
        if args.mode == "fixed":
            out[args.what] = round(float(_loss_with(model, x, batch, args.what, "forward")), 3)
        else:
            out.update(_recipe_measures(model, x, batch))
    model.train()
    print(json.dumps(out), flush=True)


def main(argv=None) -> int:
    args = _parse_args(argv)
    torch.set_num_threads(1)
    windows = TokenWindows.from_shards(args.shards, 64, 8)
    order = torch.Generator().manual_seed(0)
    held_out = _batch_of(windows, torch.randint(
        0, len(windows), (128,), generator=torch.Generator().manual_seed(99)).tolist())
    torch.manual_seed(0)
    model, params, lr, batch_size = _model(args)
    optimizer = torch.optim.Adam(params, lr)
    start, step = time.time(), 0
    while time.time() - start < args.seconds:
        x, batch = _batch_of(windows, torch.randint(0, len(windows), (batch_size,),
                                                    generator=order).tolist())
        if args.mode == "recipe":
            loss = model(x, batch).loss
        else:
            loss = _loss_with(model, x, batch, args.what, "forward")
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        step += 1
        if step % 100 == 0:
            _report(args, model, held_out, step, start)
    _report(args, model, held_out, step, start)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
