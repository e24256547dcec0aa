"""Do transferred graphs carry relational knowledge a downstream model can use?

    python -m benchmarks.transfer_synthetic [--predictor runs/quickstart/predictor]
        [--seeds 0 1 2] [--steps 300] [--output benchmarks/results/transfer_synthetic.md]

Downstream task on the quickstart corpus (its language, sequences the predictor never
saw): at every *cue* token, predict the value of the trigger that the cue refers back to
(planted 3-12 units earlier). The downstream model has only its own freshly initialised
token embeddings H and a per-token linear classifier on ``GlomoTransfer``'s output: no
RNN, no attention, so the only way information reaches the cue from the trigger is the
transferred graphs. Compared with ``graph='uniform'`` and ``graph='none'`` (same model,
same parameters, only the graphs differ); chance is 1 / num_values. Test accuracy on
held-out sequences, mean +- std over seeds (downstream initialisation and data order).
The downstream token vectors are fixed random vectors by default (``--features frozen``,
the setting of pretrained word vectors) or trained (``--features trainable``).
"""
from __future__ import annotations

import argparse
import datetime
import sys
import time

import torch
from torch_geometric.loader import DataLoader

from benchmarks.common import append_results, hardware
from benchmarks.statistics import mean_sd
from glomo_pyg import GlomoTransfer, PretrainedGraphPredictor
from glomo_pyg.data import PlantedDependencyCorpus, Vocabulary
from glomo_pyg.training.quickstart import QuickstartConfig

TRAIN_START, TEST_START = 3 * 10**7, 4 * 10**7  # disjoint from pretraining/validation/test
GRAPHS = ("learned", "uniform", "none")


def cue_targets(data, vocab: Vocabulary):
    """Flat ids of cue tokens and the value of the trigger each refers to."""
    dependent = (data.source >= 0).nonzero().view(-1)
    cue = dependent - 1  # the reader: predicts the dependent from the trigger
    trigger = data.source[dependent] + (data.ptr[data.batch[dependent]])
    value = (data.x[trigger] - vocab.num_filler) % vocab.num_values
    return cue, value


class CueClassifier(torch.nn.Module):
    def __init__(self, predictor, num_values: int, dim: int, graph: str, mixing: str,
                 frozen: bool):
        super().__init__()
        self.embed = torch.nn.Embedding(predictor.num_tokens, dim)
        self.embed.weight.requires_grad_(not frozen)  # frozen: fixed vectors, like GloVe
        self.glomo = GlomoTransfer(predictor, in_channels=dim, graph=graph, mixing=mixing)
        self.out = torch.nn.Linear(self.glomo.out_channels, num_values)

    def forward(self, x, batch):
        return self.out(self.glomo(self.embed(x), x, batch))


def run(predictor, vocab, corpus_kwargs, graph, seed, args):
    torch.manual_seed(seed)
    model = CueClassifier(predictor, vocab.num_values, args.dim, graph, args.mixing,
                          args.features == "frozen")
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    train = PlantedDependencyCorpus(args.steps * args.batch_size, seed=0, start=TRAIN_START,
                                    **corpus_kwargs)
    loader = DataLoader(train, batch_size=args.batch_size, shuffle=True,
                        generator=torch.Generator().manual_seed(seed))
    start = time.perf_counter()
    model.train()
    for data in loader:
        cue, value = cue_targets(data, vocab)
        loss = torch.nn.functional.cross_entropy(model(data.x, data.batch)[cue], value)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    seconds = time.perf_counter() - start
    test = next(iter(DataLoader(PlantedDependencyCorpus(args.test_sequences, seed=0,
                                                        start=TEST_START, **corpus_kwargs),
                                batch_size=args.test_sequences)))
    model.eval()
    with torch.no_grad():
        cue, value = cue_targets(test, vocab)
        accuracy = float((model(test.x, test.batch)[cue].argmax(-1) == value).float().mean())
    return accuracy, seconds, int(cue.numel())


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--predictor", default="runs/quickstart/predictor")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--test-sequences", type=int, default=512)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--mixing", choices=["free", "conditioned"], default="free")
    parser.add_argument("--features", choices=["frozen", "trainable"], default="frozen",
                        help="downstream token vectors: fixed random (like pretrained word "
                             "vectors) or trained with the classifier")
    parser.add_argument("--output", default="benchmarks/results/transfer_synthetic.md")
    args = parser.parse_args(argv)
    corpus_kwargs = QuickstartConfig().corpus
    vocab = Vocabulary(corpus_kwargs["num_filler"], corpus_kwargs["num_slots"],
                       corpus_kwargs["num_values"])
    # The predictor must read this corpus's vocabulary: checked against the saved one.
    predictor = PretrainedGraphPredictor.from_pretrained(args.predictor, vocabulary=vocab.tokens())
    rows = []
    for graph in GRAPHS:
        accs, secs = [], []
        for seed in args.seeds:
            acc, sec, count = run(predictor, vocab, corpus_kwargs, graph, seed, args)
            accs.append(acc)
            secs.append(sec)
            print(f"graph={graph} seed {seed}: test accuracy {acc:.3f} over {count} cues, "
                  f"{sec:.0f} s", flush=True)
        mean, std = mean_sd(accs)
        rows.append(f"| `{graph}` | {mean:.3f} ± {std if len(accs) > 1 else 0.0:.3f} | "
                    f"{', '.join(f'{a:.3f}' for a in accs)} | {mean_sd(secs)[0]:.0f} |")
    lines = [
        f"\n## {datetime.date.today().isoformat()}: cue -> trigger value, "
        f"{len(args.seeds)} seeds, {args.steps} steps",
        "",
        "Command: `" + " ".join(["python -m benchmarks.transfer_synthetic",
                                 *(sys.argv[1:] if argv is None else argv)]) + "`  ",
        f"Hardware: {hardware()}; torch {torch.__version__}  ",
        f"Predictor: `{args.predictor}` ({predictor.num_layers} layers x {predictor.heads} heads, "
        f"directions {', '.join(predictor.directions)}); downstream: {args.features} embeddings of "
        f"width {args.dim}, `mixing='{args.mixing}'`, Adam lr {args.lr}, batch {args.batch_size}; "
        f"test: {args.test_sequences} held-out sequences; chance {1 / vocab.num_values:.3f}",
        "",
        "| graph | test accuracy (mean ± std) | per seed | train s / run |",
        "|---|---|---|---|",
        *rows,
    ]
    print(append_results(args.output, lines))


if __name__ == "__main__":
    main()
