"""Reliability harness: the hostile inputs of the reliability review, run and classified.

Every case is one small function. It runs in this process (cases that may allocate
without bound run in a forked child under ``RLIMIT_AS`` and a time limit; kills and
signals use forked children or a ``glomo pretrain`` subprocess) and ends in one of

* ``named error``: the exception type the library raises on purpose (a ``ValueError``,
  ``TypeError`` or ``IndexError`` subclass, or ``SystemExit`` with a one-line
  ``glomo <command>: ...`` message) whose message names the argument, file or setting;
* ``correct result``: input that should work, checked against a reference;
* ``unhelpful crash``: any other exception, or a message that does not name the problem;
* ``silent wrong result``: a hostile input accepted, or a wrong value returned;
* ``excessive memory/time``: over the case's time limit, or an allocation that fails
  or is killed under the memory limit.

Then the property suite (``tests/test_properties.py``, hypothesis) with
``GLOMO_PROPERTY_EXAMPLES=N`` in a subprocess, and a markdown report::

    python -m benchmarks.reliability [--property-examples N] [--kill-trials K]
                                     [--output benchmarks/results/reliability.md]

Everything is written under one temporary folder, removed at the end.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import pickle
import re
import resource
import select
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import torch

from glomo_pyg.data.images import UnsafePickleError

ROOT = Path(__file__).resolve().parent.parent

NAMED, CORRECT = "named error", "correct result"
CRASH, WRONG, EXCESSIVE = "unhelpful crash", "silent wrong result", "excessive memory/time"
OUTCOMES = (NAMED, CORRECT, CRASH, WRONG, EXCESSIVE)
GOOD = (NAMED, CORRECT)
GROUPS = ("silent wrong results", "crashes", "memory and time", "crash windows", "pickles")

NAN, INF = float("nan"), float("inf")
MESSAGE_CHARS = 160


class WrongResult(AssertionError):
    """A case meant to work returned a wrong value."""


class TooSlow(Exception):
    """The case ran past its time limit."""


# --- the catalogue -------------------------------------------------------------------------
@dataclass
class Case:
    group: str
    name: str
    fn: Callable
    error: Optional[tuple] = None   # expected exception types (None: a correct result)
    names: Optional[str] = None     # regex the message must match (it names the problem)
    forbid: Optional[str] = None    # regex the message must not match
    after: Optional[Callable] = None  # (ctx) -> problem or None, checked whatever happened
    limit: float = 120.0            # seconds
    isolate: bool = False           # run in a forked child (RLIMIT_AS, hard time limit)
    memory_gib: float = 3.0         # address space the isolated child may add
    cheap: bool = False             # for the smoke test


@dataclass
class Result:
    group: str
    case: str
    outcome: str
    message: str
    seconds: float
    extra: Dict = field(default_factory=dict)


CASES: List[Case] = []


def case(group: str, name: str, **options):
    assert group in GROUPS, group

    def register(fn):
        CASES.append(Case(group, name, fn, **options))
        return fn
    return register


# --- the context: temporary folders, shared run, pickle markers ----------------------------
class Context:
    def __init__(self, root: Path, kill_trials: int = 24, seed: int = 1234):
        self.root = root
        self.kill_trials = kill_trials
        self.seed = seed
        self.markers: List[Path] = []  # files a planted pickle would create
        self._straight: Optional[Path] = None

    def tmp(self) -> Path:
        """A new empty folder (unique in forked children too)."""
        return Path(tempfile.mkdtemp(prefix="case-", dir=self.root))

    def marker(self) -> Path:
        path = self.root / f"pickle-executed-{len(self.markers):02d}"
        self.markers.append(path)
        return path

    def pickles_executed(self) -> int:
        return sum(m.exists() for m in self.markers)

    def straight(self) -> Path:
        """A finished 6-step pretraining run (checkpoints at steps 2, 4, 6 and last.ckpt)
        and its corpus, built once."""
        if self._straight is None:
            base = self.root / "straight"
            write_corpus(base / "corpus")
            from glomo_pyg.training import run_pretraining
            with quiet_training():
                run_pretraining(pretrain_config(base / "run", base / "corpus"), log=quiet)
            self._straight = base
        return self._straight


def quiet(*args, **kwargs):
    pass


@contextlib.contextmanager
def quiet_training():
    import logging
    names = ("lightning", "lightning.pytorch", "lightning.fabric", "pytorch_lightning")
    levels = {n: logging.getLogger(n).level for n in names}
    for n in names:
        logging.getLogger(n).setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(open(os.devnull, "w")):
            warnings.simplefilter("ignore")
            yield
    finally:
        for n, level in levels.items():
            logging.getLogger(n).setLevel(level)


# --- builders --------------------------------------------------------------------------------
WORDS = "the cat sat on a mat and dog ran to park it was good bad movie film".split()
VOCAB = [f"tok{i}" for i in range(30)]


def write_corpus(folder: Path, documents: int = 30, seed: int = 0) -> Path:
    import random
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for k in range(documents):
        (folder / f"doc{k:03d}.txt").write_text(
            " ".join(rng.choice(WORDS) for _ in range(rng.randint(10, 60))) + ".")
    return folder


def pretrain_settings(out: Path, corpus: Path, **train) -> dict:
    options = dict(batch_size=4, max_steps=6, checkpoint_every=2, validate_every=3,
                   log_every=1, graph_stats_every=2, progress_bar=False, accelerator="cpu",
                   graph_warmup_steps=2, seed=1, threads=1)
    options.update(train)
    return dict(output_dir=str(out),
                corpus=dict(path=str(corpus), min_count=1, max_length=16, min_length=4,
                            validation_fraction=0.1),
                model=dict(hidden_channels=16, num_layers=2, heads=2, cnn_layers=1,
                           num_positions=4),
                train=options)


def pretrain_config(out: Path, corpus: Path, **train):
    from glomo_pyg.training import PretrainConfig
    return PretrainConfig.from_dict(pretrain_settings(out, corpus, **train))


def write_yaml(path: Path, data: dict) -> str:
    import yaml
    path.write_text(yaml.safe_dump(data))
    return str(path)


def copy_run(ctx: Context, keep=("step2.ckpt", "step4.ckpt", "step6.ckpt", "last.ckpt")) -> Path:
    run = ctx.tmp() / "run"
    shutil.copytree(ctx.straight() / "run", run)
    for name in os.listdir(run / "checkpoints"):
        if name not in keep:
            os.remove(run / "checkpoints" / name)
    return run


def ckpt(run: Path, name: str = "last.ckpt") -> Path:
    return run / "checkpoints" / name


def without_recorded_settings(path: Path) -> None:
    """Rewrite a checkpoint as glomo_pyg 0.2.0 wrote it: the corpus fingerprint alone,
    no settings record (its resume is checked against config.json)."""
    from glomo_pyg.training.checkpoints import atomic_save
    data = torch.load(path, weights_only=True)
    data["glomo"] = dict(version=1, corpus=data["glomo"]["corpus"])
    atomic_save(data, path)


def checkpoint_weights(path: Path):
    data = torch.load(path, weights_only=True)
    return data["state_dict"], data["global_step"]


def same_weights(a: Path, b: Path) -> bool:
    (sa, step_a), (sb, step_b) = checkpoint_weights(a), checkpoint_weights(b)
    return step_a == step_b and sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k])
                                                               for k in sa)


def cli(*argv) -> int:
    from glomo_pyg.cli import main
    with quiet_training():
        return main([str(a) for a in argv])


def resume_cli(ctx: Context, run: Path, *extra) -> int:
    cfg = write_yaml(run.parent / "cfg.yaml", pretrain_settings(run, ctx.straight() / "corpus"))
    return cli("pretrain", "--config", cfg, "--resume", *extra)


def tiny_predictor(**kwargs):
    from glomo_pyg import GraphPredictor
    options = dict(num_tokens=10, hidden_channels=8, num_layers=1, heads=2, cnn_layers=1)
    options.update(kwargs)
    return GraphPredictor(**options)


def pretrained(seed: int, tokens: int = 30, hidden: int = 16, heads: int = 2, cnn_layers: int = 1):
    from glomo_pyg import GraphPredictor, PretrainedGraphPredictor
    torch.manual_seed(seed)
    parts = {d: GraphPredictor(num_tokens=tokens, hidden_channels=hidden, num_layers=2,
                               heads=heads, direction=d, cnn_layers=cnn_layers)
             for d in ("forward", "backward")}
    vocab = VOCAB if tokens == len(VOCAB) else None
    return PretrainedGraphPredictor(parts["forward"], parts["backward"], vocab).eval()


def saved_predictor(ctx: Context, seed: int = 1) -> Path:
    from glomo_pyg import save_pretrained
    path = ctx.tmp() / "p"
    save_pretrained(pretrained(seed), path)
    return path


def edit_config(path: Path, change, seal: bool = True) -> None:
    """Edit a saved predictor's config and (``seal``) seal it again, as an attacker could:
    the seal is a digest anyone can compute, so the deeper checks must hold alone."""
    from glomo_pyg.io.seal import seal_of

    config = json.loads((path / "config.json").read_text())
    change(config)
    if seal and "seal" in config:
        config["seal"] = seal_of(config)
    (path / "config.json").write_text(json.dumps(config))


def set_forward(path: Path, **values) -> None:
    edit_config(path, lambda c: c["directions"]["forward"]["config"].update(values))


def rehash(path: Path) -> None:
    """Record the current weights file in the config, as an attacker could."""
    data = (path / "model.safetensors").read_bytes()
    edit_config(path, lambda c: c["weights"].update(bytes=len(data),
                                                    sha256=hashlib.sha256(data).hexdigest()))


def same_state(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def vectors_file(ctx: Context, content, name: str = "v.txt") -> str:
    path = ctx.tmp() / name
    (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
    return str(path)


def shards(ctx: Context) -> Path:
    from glomo_pyg.data import write_token_shards
    folder = ctx.tmp() / "shards"
    write_token_shards([torch.arange(10) % 7, torch.arange(6) % 7], str(folder), vocab_size=7)
    return folder


def edit_index(folder: Path, edit) -> None:
    index = json.loads((folder / "index.json").read_text())
    edit(index)
    (folder / "index.json").write_text(json.dumps(index))


def column_sums_ok(graphs) -> bool:
    dense = graphs.to_dense()
    if not bool(torch.isfinite(dense).all()):
        return False
    sums = dense.sum(-2)
    return bool(((sums == 0) | ((sums - 1).abs() < 1e-5)).all())


def check(condition: bool, what: str) -> None:
    if not condition:
        raise WrongResult(what)


class Exploit:
    """Unpickled by an unrestricted loader, this runs ``touch <path>``."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (os.system, (f"touch {shlex.quote(self.path)}",))


def marker_absent(marker_index: int):
    def after(ctx: Context) -> Optional[str]:
        marker = ctx.markers[marker_index]
        return f"the planted pickle ran ({marker.name} was created)" if marker.exists() else None
    return after


def last_marker_absent(ctx: Context) -> Optional[str]:
    return marker_absent(-1)(ctx)


# ==== silent wrong results =================================================================
G = "silent wrong results"


@case(G, "weighted_spmm with unsorted rows", error=(ValueError,), names=r"row must be sorted",
      cheap=True)
def _():
    from glomo_pyg.nn.functional import weighted_spmm
    weighted_spmm(torch.tensor([2, 0, 1]), torch.tensor([0, 1, 2]), torch.ones(3),
                  torch.randn(4, 3), 3)


@case(G, "weighted_spmm with sorted rows (control: equals the dense product)", cheap=True)
def _():
    from glomo_pyg.nn.functional import weighted_spmm
    x = torch.randn(4, 3)
    row, col, w = torch.tensor([0, 0, 2]), torch.tensor([1, 3, 0]), torch.rand(3)
    dense = torch.zeros(3, 4).index_put((row, col), w)
    check(torch.allclose(weighted_spmm(row, col, w, x, 3), dense @ x), "differs from dense @ x")
    return "equals dense @ x"


@case(G, "head_propagate with an out-of-range source id (9 of 4 nodes)", error=(ValueError,),
      names=r"outside \[0, 4\)", cheap=True)
def _():
    from glomo_pyg.nn.functional import head_propagate
    head_propagate(torch.randn(4, 3), torch.tensor([[0, 9], [1, 2]]), torch.ones(2),
                   torch.zeros(2, dtype=torch.long), 1)


def _conv_features(bad):
    from glomo_pyg import GlomoConv
    x = torch.randn(3, 4)
    x[1, 2] = bad
    GlomoConv(4, heads=2)(x, torch.tensor([[0, 1], [1, 2]]))


case(G, "GlomoConv with a NaN feature", error=(ValueError,), names=r"x contains NaN or Inf",
     cheap=True)(lambda: _conv_features(NAN))
case(G, "GlomoConv with an Inf feature", error=(ValueError,),
     names=r"x contains NaN or Inf")(lambda: _conv_features(INF))


@case(G, "GlomoConv with a NaN edge weight", error=(ValueError,),
      names=r"edge_weight contains NaN or Inf")
def _():
    from glomo_pyg import GlomoConv
    GlomoConv(4, heads=2)(torch.randn(3, 4), torch.tensor([[0, 1], [1, 2]]),
                          torch.tensor([NAN, 1.0]), torch.tensor([0, 1]))


@case(G, "GlomoConv.forward_dense with a NaN in the dense adjacency", error=(ValueError,),
      names=r"x or adj contains NaN or Inf")
def _():
    from glomo_pyg import GlomoConv
    adj = torch.rand(1, 2, 3, 3)
    adj[0, 1, 0, 2] = NAN
    GlomoConv(4, heads=2).forward_dense(torch.randn(3, 4), adj)


@case(G, "GatedFusion with NaN features", error=(ValueError,), names=r"x contains NaN or Inf")
def _():
    from glomo_pyg import GatedFusion
    m = torch.randn(3, 4)
    GatedFusion(4)(torch.full((3, 4), NAN), [m, m])


@case(G, "GatedFusion with Inf features", error=(ValueError,), names=r"x contains NaN or Inf")
def _():
    from glomo_pyg import GatedFusion
    m = torch.randn(3, 4)
    GatedFusion(4)(torch.full((3, 4), INF), [m, m])


@case(G, "GatedFusion with a NaN in a mixture", error=(ValueError,),
      names=r"mixture 1 contains NaN or Inf")
def _():
    from glomo_pyg import GatedFusion
    m = torch.randn(3, 4)
    bad = m.clone()
    bad[0, 0] = NAN
    GatedFusion(4)(torch.randn(3, 4), [m, bad])


def _extreme(sparse: bool, scale: float = 1e20) -> str:
    torch.manual_seed(0)
    model = tiny_predictor(num_layers=2, cnn_layers=0, sparse=sparse, norm=None)
    x, batch = torch.randint(0, 10, (12,)), torch.tensor([0] * 5 + [1] * 7)
    with torch.no_grad():
        for lin in (*model.scorer.key, *model.scorer.query):
            lin.bias.zero_()  # scores then scale as scale**2 exactly
        model.scorer.bias.zero_()
    reference = model(x, batch, layout="dense").to_dense()
    with torch.no_grad():
        model.encoder.embedding.weight.mul_(scale)
    layouts = ("sparse", "dense", "fused") if sparse else ("sparse", "dense")
    for layout in layouts:
        graphs = model(x, batch, layout=layout)
        check(column_sums_ok(graphs), f"{layout}: non-finite weights or columns not summing to 1")
        got = graphs.to_dense()
        if sparse:  # squared ReLU is scale invariant: the graphs of the unscaled model
            check(torch.allclose(got, reference, atol=1e-5, rtol=1e-4),
                  f"{layout}: differs from the unscaled model's graphs")
        else:  # softmax: one-hot at the largest score (ties split)
            check(torch.equal(got.argmax(-2), reference.argmax(-2)),
                  f"{layout}: heaviest source differs from the unscaled model's")
    return (f"{'/'.join(layouts)}: finite, columns sum to 1 or are empty, "
            + ("equal to the unscaled model" if sparse else "same heaviest sources"))


case(G, "extreme weights: embedding x1e20, cnn_layers=0, squared ReLU", cheap=True)(
    lambda: _extreme(True))
case(G, "extreme weights: embedding x1e20, cnn_layers=0, softmax (sparse=False)")(
    lambda: _extreme(False))


@case(G, "extreme weights: fused layout with softmax cannot rescale", error=(ValueError,),
      names=r"fused softmax layout cannot rescale")
def _():
    model = tiny_predictor(num_layers=2, cnn_layers=0, sparse=False, norm=None)
    with torch.no_grad():
        model.encoder.embedding.weight.mul_(1e20)
    model(torch.randint(0, 10, (12,)), layout="fused")


@case(G, "a predictor file with NaN weights (re-hashed)", error=(ValueError,),
      names=r"model\.safetensors.*NaN or infinite weights in bw\.key_cnn\.convs\.0\.weight|"
            r"NaN or infinite weights in bw\.key_cnn\.convs\.0\.weight.*model\.safetensors")
def _(ctx):
    from safetensors.torch import save

    from glomo_pyg import load_pretrained
    path = saved_predictor(ctx)
    tensors = dict(pretrained(1).predictors.state_dict())
    tensors["bw.key_cnn.convs.0.weight"] = tensors["bw.key_cnn.convs.0.weight"].clone()
    tensors["bw.key_cnn.convs.0.weight"][0, 0, 1] = NAN
    (path / "model.safetensors").write_bytes(save(tensors))
    rehash(path)
    load_pretrained(path)


@case(G, "save_pretrained of a predictor with NaN weights", error=(ValueError,),
      names=r"NaN or infinite weights in bw\.key_cnn\.convs\.0\.weight")
def _(ctx):
    from glomo_pyg import save_pretrained
    predictor = pretrained(1)
    with torch.no_grad():
        predictor.predictor("backward").key_cnn.convs[0].weight[0, 0, 1] = NAN
    save_pretrained(predictor, ctx.tmp() / "q")


@case(G, 'config.json kwargs sparse="no"', error=(ValueError,),
      names=r'config\.json.*sparse must be true or false, got "no"')
def _(ctx):
    from glomo_pyg import load_pretrained
    path = saved_predictor(ctx)
    set_forward(path, sparse="no")
    load_pretrained(path)


# --- sealed bundles: edits that would change the graphs silently, without a reseal --------
def _tampered(ctx, change) -> Path:
    path = saved_predictor(ctx)
    edit_config(path, change, seal=False)
    return path


for _label, _change, _key in [
        ("a direction's sparse true -> false", lambda c: c["directions"]["forward"]["config"]
         .update(sparse=False), "directions.forward.config.sparse"),
        ("include_self false -> true", lambda c: c["directions"]["forward"]["config"]
         .update(include_self=True), "directions.forward.config.include_self"),
        ("two vocabulary entries swapped", lambda c: c["vocabulary"].__setitem__(
            slice(0, 2), c["vocabulary"][1::-1]), "vocabulary"),
        ("the vocabulary replaced by other words", lambda c: c.update(
            vocabulary=[f"other{i}" for i in range(len(c["vocabulary"]))]), "vocabulary")]:
    def _make(change):
        def run(ctx):
            from glomo_pyg import load_pretrained
            load_pretrained(_tampered(ctx, change))
        return run
    case(G, f"sealed config.json edited: {_label}", error=(ValueError,),
         names=rf"config\.json: it was edited after it was sealed \(changed: {re.escape(_key)}"
         )(_make(_change))


@case(G, "sealed config.json edited: a pixel predictor's pixel_mean", error=(ValueError,),
      names=r"changed: directions\.forward\.config\.pixel_mean")
def _(ctx):
    from glomo_pyg import PretrainedGraphPredictor, load_pretrained, save_pretrained
    from glomo_pyg.nn.pixel import PixelGraphPredictor
    path = ctx.tmp() / "pixels"
    torch.manual_seed(0)
    save_pretrained(PretrainedGraphPredictor(PixelGraphPredictor(
        height=4, width=4, hidden_channels=8, num_layers=1, heads=2, cnn_layers=1)), path)
    edit_config(path, lambda c: c["directions"]["forward"]["config"].update(
        pixel_mean=[0.5, 0.5, 0.5]), seal=False)
    load_pretrained(path)


@case(G, 'config.json kwargs dropout="0.5"', error=(ValueError,),
      names=r'config\.json.*dropout must be a number in \[0, 1\), got "0.5"')
def _(ctx):
    from glomo_pyg import load_pretrained
    path = saved_predictor(ctx)
    set_forward(path, dropout="0.5")
    load_pretrained(path)


def _vectors(content, name="v.txt", **kwargs):
    def run(ctx):
        from glomo_pyg.data import read_word_vectors
        return read_word_vectors(vectors_file(ctx, content, name), **kwargs)
    return run


case(G, "read_word_vectors: ragged line `dog 4 5 6 7` after `cat 1 2 3`", error=(ValueError,),
     names=r"v\.txt:2: expected 3 numbers .*got 4", cheap=True)(
    _vectors("cat 1 2 3\ndog 4 5 6 7\n"))
case(G, "read_word_vectors: header `2 2` above 3-number lines", error=(ValueError,),
     names=r"v\.txt:2: expected 2 numbers .*set by line 1")(
    _vectors("2 2\ncat 1 2 3\ndog 4 5 6\n"))
case(G, "read_word_vectors: 1e39 (overflows float32)", error=(ValueError,),
     names=r"v\.txt:2: non-finite")(_vectors("cat 1 2\ndog 1e39 0\n"))


@case(G, "read_word_vectors: UTF-8 byte-order mark and CRLF", cheap=True)
def _(ctx):
    words, array = _vectors("\ufeffcat 1 2\r\ndog 3 4\r\n".encode())(ctx)
    check(words == ["cat", "dog"], f"words {words}")
    check(array.tolist() == [[1, 2], [3, 4]], f"vectors {array.tolist()}")
    return "words ['cat', 'dog'], vectors [[1, 2], [3, 4]]"


case(G, "read_word_vectors: max_words=0", error=(ValueError,),
     names=r"max_words must be a positive integer.*got 0")(
    _vectors("cat 1 2\ndog 3 4\n", max_words=0))


@case(G, "read_aclimdb with rating -7 in pos/", error=(ValueError,),
      names=r"4_-7\.txt: rating -7 does not belong in pos/")
def _(ctx):
    from glomo_pyg.data import read_aclimdb
    root = ctx.tmp()
    for kind, name in (("pos", "1_8.txt"), ("neg", "2_3.txt"), ("pos", "4_-7.txt")):
        (root / "aclImdb" / "train" / kind).mkdir(parents=True, exist_ok=True)
        (root / "aclImdb" / "train" / kind / name).write_text("fine")
    read_aclimdb(str(root), "train")


def _shard_name(outside: bool):
    def run(ctx):
        from glomo_pyg.data import TokenWindows
        folder = shards(ctx)
        target = folder.parent / "outside.bin"
        os.rename(folder / "tokens-00000.bin", target)
        bad = str(target) if outside else "../outside.bin"
        edit_index(folder, lambda index: index["shards"][0].update(tokens=bad))
        TokenWindows.from_shards(str(folder), 4, 2)
    return run


case(G, "token-shard index.json naming ../outside.bin", error=(ValueError,),
     names=r"index\.json: shard 0: 'tokens' must be a plain file name")(_shard_name(False))
case(G, "token-shard index.json naming an absolute path", error=(ValueError,),
     names=r"index\.json: shard 0: 'tokens' must be a plain file name")(_shard_name(True))


@case(G, "TokenWindows with out-of-vocabulary ids (99 in a 7-token shard)", error=(ValueError,),
      names=r"tokens-00000\.bin: tokens 4\.\.7 hold ids in \[0, 99\], outside the vocabulary")
def _(ctx):
    from glomo_pyg.data import TokenWindows
    folder = shards(ctx)
    np.asarray([0, 1, 2, 3, 99, 5, 6, 0, 1, 2, 3, 4, 5, 6, 0, 1], dtype="<i4").tofile(
        folder / "tokens-00000.bin")
    windows = TokenWindows.from_shards(str(folder), 4, 2)
    check(windows[0].x.tolist() == [0, 1, 2, 3], "the clean first window changed")
    windows[1]


@case(G, "TokenWindows with document offsets beyond the token count", error=(ValueError,),
      names=r"tokens-00000\.bin: its document end offsets")
def _(ctx):
    from glomo_pyg.data import TokenWindows
    folder = shards(ctx)
    np.asarray([10, 17], dtype="<i8").tofile(folder / "docs-00000.bin")
    TokenWindows.from_shards(str(folder), 4, 2)


def _no_output(ctx):
    out = ctx.root / "wv-out.txt"
    return f"{out} was written" if out.exists() else None


@case(G, "glomo word-vectors --dim 0", error=(SystemExit,),
      names=r"^glomo word-vectors: --dim must be >= 1( and <= \d+)?, got 0", after=_no_output)
def _(ctx):
    corpus = write_corpus(ctx.tmp() / "corpus", documents=5)
    cli("word-vectors", "--corpus", corpus, "--output", ctx.root / "wv-out.txt", "--dim", "0")


@case(G, "delete the run's tokens/, edit the corpus, then --resume", error=(SystemExit,),
      names=r"^glomo pretrain: .*the corpus changed since")
def _(ctx):
    base = ctx.tmp()
    corpus = write_corpus(base / "corpus", documents=20)
    run = base / "run"
    from glomo_pyg.training import run_pretraining
    with quiet_training():
        run_pretraining(pretrain_config(run, corpus, max_steps=2), log=quiet)
    shutil.rmtree(run / "tokens")
    before = {p.relative_to(run): p.read_bytes() if p.is_file() else None
              for p in run.rglob("*")}
    with open(corpus / "doc000.txt", "a") as fh:
        fh.write(" zebra zebra zebra giraffe giraffe giraffe")
    cfg = write_yaml(base / "cfg.yaml", pretrain_settings(run, corpus, max_steps=4))
    try:
        cli("pretrain", "--config", cfg, "--resume")
    finally:
        step = checkpoint_weights(ckpt(run))[1]
        check(step == 2, f"trained on the changed corpus: last.ckpt at step {step}")
        after = {p.relative_to(run): p.read_bytes() if p.is_file() else None
                 for p in run.rglob("*")}
        changed = sorted(str(k) for k in set(before) | set(after)
                         if before.get(k, b"?") != after.get(k, b"?"))
        check(not changed, f"the refused resume changed the run folder: {changed[:5]}")


@case(G, "a kill while last.ckpt is rewritten at the final step, then --resume")
def _(ctx):
    straight = ctx.straight()
    run = copy_run(ctx)
    shutil.copyfile(ckpt(run, "step4.ckpt"), ckpt(run))  # last.ckpt left at step 4
    resume_cli(ctx, run)
    step = checkpoint_weights(ckpt(run))[1]
    check(step == 6 and same_weights(ckpt(run), ckpt(straight / "run", "step6.ckpt")),
          f"last.ckpt was not repaired: still at step {step}")


# ==== crashes ==============================================================================
G = "crashes"

# A compiled GlomoConv given a hostile graph, in a child process (an abort there is an
# unhelpful crash here, not the end of the harness).
_COMPILED_HOSTILE = r"""
import sys, torch
from glomo_pyg import GlomoConv
backend, side = sys.argv[1], sys.argv[2]
conv = torch.compile(GlomoConv(4), backend=backend, fullgraph=True)
x = torch.randn(6, 4)
conv(x, torch.tensor([[0, 1], [1, 2]]), torch.ones(2))
bad = [[0, 1], [50, 2]] if side == "target" else [[50, 1], [0, 2]]
try:
    out = conv(x, torch.tensor(bad), torch.ones(2))
except ValueError as err:
    print("REFUSED", err)
else:
    print("ACCEPTED", tuple(out.shape))
"""


class CompiledRefusal(ValueError):
    """The child's ValueError, raised again here to be classified."""


def _compiled_hostile(backend: str, side: str):
    def run():
        result = subprocess.run([sys.executable, "-c", _COMPILED_HOSTILE, backend, side],
                                capture_output=True, text=True, timeout=600)
        if result.returncode:
            raise RuntimeError(f"the child died (exit {result.returncode}): "
                               f"{result.stderr.strip().splitlines()[-1:]}")
        if result.stdout.startswith("REFUSED"):
            raise CompiledRefusal(result.stdout[len("REFUSED "):].strip())
        check(False, f"a compiled GlomoConv read outside x: {result.stdout.strip()}")
    return run


for _backend in ("eager", "inductor"):
    for _side in ("target", "source"):
        case(G, f"torch.compile({_backend}) GlomoConv with a {_side} id of 50 among 6 nodes",
             error=(ValueError,), names=r"edge_index refers to nodes outside \[0, 6\)",
             limit=600)(_compiled_hostile(_backend, _side))


def _token_dtype(dtype):
    def run():
        tiny_predictor()(torch.randint(0, 10, (5,)).to(dtype))
    return run


for _dtype in (torch.int16, torch.uint8):
    case(G, f"{str(_dtype)[6:]} token ids into GraphPredictor", error=(TypeError,),
         names=rf"int64 or int32.*{_dtype}.*x\.long\(\)", cheap=True)(_token_dtype(_dtype))


@case(G, "uint8 token ids into Glomo.text", error=(TypeError,), names=r"int64 or int32.*uint8")
def _():
    from glomo_pyg import Glomo
    Glomo.text(10, hidden_channels=8, heads=2, num_layers=1)(
        torch.randint(0, 10, (5,)).to(torch.uint8))


@case(G, "int32 token ids (control: the same graphs as int64)")
def _():
    model = tiny_predictor()
    x = torch.randint(0, 10, (5,))
    check(torch.equal(model(x.int()).to_dense(), model(x).to_dense()), "int32 graphs differ")
    return "same graphs as int64"


def _features_into_predictor(dtype):
    def run():
        torch.manual_seed(0)
        from glomo_pyg import GraphPredictor
        predictor = GraphPredictor(in_channels=3, hidden_channels=8, num_layers=1, heads=2,
                                   cnn_layers=1)
        x = torch.randn(6, 3).to(dtype)
        got, want = predictor(x).to_dense(), predictor(x.float()).to_dense()
        check(got.dtype == torch.float32 and torch.allclose(got, want),
              f"graphs of {dtype} features differ from those of the fp32 features")
        return "converted to fp32: the graphs of x.float()"
    return run


def _features_into_mixer(dtype):
    def run():
        from glomo_pyg import GraphMixer, LatentGraphs
        graphs = LatentGraphs.uniform(torch.tensor([0, 6]), num_layers=1, num_heads=2,
                                      direction="forward")
        GraphMixer(4, 1, 2, directions=("forward",))(torch.randn(6, 4).to(dtype), graphs)
    return run


for _dtype in (torch.float16, torch.bfloat16, torch.float64):
    _short = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64"}[_dtype]
    case(G, f"{_short} features into an fp32 GraphPredictor", cheap=_dtype == torch.float16)(
        _features_into_predictor(_dtype))
    case(G, f"{_short} features into an fp32 GraphMixer outside autocast", error=(TypeError,),
         names=rf"x is {_dtype} but GraphMixer's parameters are torch\.float32")(
        _features_into_mixer(_dtype))


@case(G, "bf16 features into an fp32 GraphMixer inside autocast (control)")
def _():
    from glomo_pyg import GraphMixer, LatentGraphs
    graphs = LatentGraphs.uniform(torch.tensor([0, 6]), num_layers=1, num_heads=2,
                                  direction="forward")
    mixer = GraphMixer(4, 1, 2, directions=("forward",))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = mixer(torch.randn(6, 4).to(torch.bfloat16), graphs)
    check(all(bool(torch.isfinite(o.float()).all()) for o in out), "non-finite output")
    return "finite output"


@case(G, "padding_idx=num_tokens", error=(ValueError,),
      names=r"padding_idx must be a token id in \[0, 10\).*got 10", cheap=True)
def _():
    tiny_predictor(padding_idx=10)


@case(G, "Glomo.text(decoder_layers=0)", error=(ValueError,),
      names=r"decoder_layers must be an integer in \[1, 1024\], got 0")
def _():
    from glomo_pyg import Glomo
    Glomo.text(10, hidden_channels=8, heads=2, num_layers=1, decoder_layers=0)


@case(G, "GlomoConv(4)(zeros(0, 4), zeros(2, 0))", cheap=True)
def _():
    from glomo_pyg import GlomoConv
    out = GlomoConv(4)(torch.zeros(0, 4), torch.zeros(2, 0))
    check(tuple(out.shape) == (0, 4), f"shape {tuple(out.shape)}")
    return "empty [0, 4] output"


@case(G, "LatentGraphs.uniform(ptr=tensor([0, 5, 3]))", error=(ValueError,),
      names=r"ptr.*start at 0 and never decrease", cheap=True)
def _():
    from glomo_pyg import LatentGraphs
    LatentGraphs.uniform(torch.tensor([0, 5, 3]), num_layers=1, num_heads=1, direction="forward")


@case(G, "LatentGraphs.uniform(ptr=[0, 5, 3]) (a list)", error=(TypeError, ValueError),
      names=r"ptr must be an int64")
def _():
    from glomo_pyg import LatentGraphs
    LatentGraphs.uniform([0, 5, 3], num_layers=1, num_heads=1, direction="forward")


def _layer(layout):
    def run():
        tiny_predictor(num_layers=2)(torch.randint(0, 10, (6,)), layout=layout).layer(7)
    return run


for _layout in ("sparse", "dense"):
    case(G, f"graphs.layer(7) of 2 layers ({_layout})", error=(IndexError,),
         names=r"graph layer 7 is out of range.*2 layers \(0\.\.1\)",
         cheap=_layout == "sparse")(_layer(_layout))


@case(G, "PretrainedGraphPredictor.from_pretrained(None)", error=(TypeError,),
      names=r"path must be a str or os\.PathLike", cheap=True)
def _():
    from glomo_pyg import PretrainedGraphPredictor
    PretrainedGraphPredictor.from_pretrained(None)


@case(G, "deeply nested config.json ('[' x 100,000)", error=(ValueError,),
      names=r"config\.json is not valid JSON \(nested more than 16 deep\)", limit=2.0)
def _(ctx):
    from glomo_pyg import load_pretrained
    path = saved_predictor(ctx)
    (path / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    load_pretrained(path)


case(G, "binary word-vector file", error=(ValueError,), names=r"v\.bin:1: not UTF-8")(
    _vectors(b"\x00\x01\xff\xfe" * 100, "v.bin"))
case(G, "latin-1 word-vector file", error=(ValueError,),
     names=r"v\.txt:2: not UTF-8 text \(byte 0xe9 at byte offset 11\)")(
    _vectors("cat 1 2\ndogé 3 4\n".encode("latin-1")))


def _index(edit):
    def run(ctx):
        from glomo_pyg.data import read_shard_index
        folder = shards(ctx)
        edit_index(folder, edit)
        read_shard_index(str(folder))
    return run


case(G, 'shard index with version "1" (a string)', error=(ValueError,),
     names=r"index\.json: 'version' must be a positive integer")(
    _index(lambda i: i.update(version="1")))
case(G, "shard index without 'shards'", error=(ValueError,),
     names=r"index\.json: 'shards' must be a list")(_index(lambda i: i.pop("shards")))
case(G, "shard index whose shard lacks 'num_tokens'", error=(ValueError,),
     names=r"index\.json: shard 0: the count of its 'tokens'")(
    _index(lambda i: i["shards"][0].pop("num_tokens")))


@case(G, "glomo pretrain on an empty corpus file", error=(SystemExit,),
      names=r"^glomo pretrain: (\S*empty\.txt: (no documents|no word occurs)|the corpus is empty)")
def _(ctx):
    base = ctx.tmp()
    (base / "empty.txt").write_bytes(b"")
    cfg = write_yaml(base / "cfg.yaml", pretrain_settings(base / "run", base / "empty.txt"))
    cli("pretrain", "--config", cfg)


@case(G, "write_token_shards of an empty corpus", error=(ValueError,),
      names=r"the corpus is empty")
def _(ctx):
    from glomo_pyg.data import write_token_shards
    write_token_shards([[], []], str(ctx.tmp() / "empty"), vocab_size=5)


def _override_case(override: str):
    return lambda: cli("pretrain", "--set", override, "--print-config")


for _override, _message in (("train.max_steps=abc", r"train\.max_steps must be a positive "
                                                     r"integer, got 'abc'"),
                            ("train=5", r"train must be a mapping"),
                            ("model=5", r"model must be a mapping")):
    case(G, f"glomo pretrain --set {_override}", error=(SystemExit,),
         names=rf"^glomo pretrain: .*{_message}")(_override_case(_override))


def _damaged_last(content: bytes):
    def run(ctx):
        run_dir = copy_run(ctx, keep=("last.ckpt",))
        ckpt(run_dir).write_bytes(content)
        resume_cli(ctx, run_dir)
    return run


case(G, "--resume on a random-bytes last.ckpt", error=(SystemExit,),
     names=r"^glomo pretrain: cannot resume: \S*last\.ckpt is corrupt")(
    _damaged_last(os.urandom(4096)))
case(G, "--resume on a 0-byte last.ckpt", error=(SystemExit,),
     names=r"^glomo pretrain: cannot resume: \S*last\.ckpt is empty \(0 bytes\)")(
    _damaged_last(b""))


@case(G, "--resume on a malicious checkpoint (os.system pickle)", error=(SystemExit,),
      names=r"^glomo pretrain: refusing to load \S*step2\.ckpt: it contains objects other than",
      forbid=r"weights_only|False", after=last_marker_absent)
def _(ctx):
    from glomo_pyg.training.checkpoints import atomic_save
    run = copy_run(ctx, keep=())
    atomic_save(dict(state_dict={}, global_step=9, payload=Exploit(ctx.marker())),
                ckpt(run, "step2.ckpt"))
    resume_cli(ctx, run)


@case(G, "--resume on a foreign checkpoint (other model settings)", error=(SystemExit,),
      names=r"^glomo pretrain: \S*last\.ckpt does not match this run's configuration.*"
            r"model\.hidden_channels: checkpoint 32, this run 16")
def _(ctx):
    from glomo_pyg.training.checkpoints import atomic_save
    run = copy_run(ctx, keep=())
    data = torch.load(ckpt(ctx.straight() / "run"), weights_only=True)
    data["hyper_parameters"]["model_kwargs"]["hidden_channels"] = 32
    key = next(k for k, v in data["state_dict"].items() if v.dim() == 2)
    data["state_dict"][key] = torch.zeros(data["state_dict"][key].size(0) * 2, 3)
    atomic_save(data, ckpt(run))
    resume_cli(ctx, run)


def _damaged_run_file(name: str, content: str):
    def run(ctx):
        run_dir = copy_run(ctx, keep=("last.ckpt",))
        if name == "corpus.json":
            os.remove(run_dir / "config.json")
        else:  # config.json is read only for checkpoints without their own settings record
            without_recorded_settings(ckpt(run_dir))
        (run_dir / name).write_text(content)
        resume_cli(ctx, run_dir)
    return run


case(G, "--resume with a corrupt config.json", error=(SystemExit,),
     names=r"^glomo pretrain: \S*config\.json is damaged \(not valid JSON")(
    _damaged_run_file("config.json", '{"model": {'))
case(G, "--resume with a corrupt corpus.json", error=(SystemExit,),
     names=r"^glomo pretrain: \S*corpus\.json is damaged")(
    _damaged_run_file("corpus.json", "\x00garbage"))


@case(G, "glomo word-vectors on an empty corpus (0-byte file)", error=(SystemExit,),
      names=r"^glomo word-vectors: \S*blank\.txt: no documents with words", after=_no_output)
def _(ctx):
    blank = ctx.tmp() / "blank.txt"
    blank.write_bytes(b"")
    cli("word-vectors", "--corpus", blank, "--output", ctx.root / "wv-out.txt")


@case(G, "glomo word-vectors on a corpus of blank lines", error=(SystemExit,),
      names=r"^glomo word-vectors: \S*blank\.txt: no documents with words", after=_no_output)
def _(ctx):
    blank = ctx.tmp() / "blank.txt"
    blank.write_text("  \n\n\t\n")
    cli("word-vectors", "--corpus", blank, "--output", ctx.root / "wv-out.txt")


# ==== memory and time ======================================================================
G = "memory and time"


def _absurd_batch(last: int):
    def run():
        tiny_predictor()(torch.tensor([3, 4]), torch.tensor([0, last]))
    return run


for _last in (10 ** 6, 10 ** 8):
    case(G, f"batch=[0, 10**{len(str(_last)) - 1}] for 2 units", error=(ValueError,),
         names=rf"{_last + 1} sequences .* for 2 units: at most N \+ MAX_EMPTY_SEQUENCES = 1026",
         limit=2.0, isolate=True, cheap=_last == 10 ** 6)(_absurd_batch(_last))


def _long_sequence(layout):
    def run():
        model = tiny_predictor(heads=8, head_channels=2)
        x = torch.randint(0, 10, (20000,))
        if layout is None:
            model(x)
        else:
            model(x, layout=layout)
    return run


for _layout in (None, "sparse", "dense", "auto"):
    case(G, f"one 20,000-token sequence through a predictor (layout={_layout or 'default'})",
         error=(ValueError,), names=r"MAX_GRAPH_PAIRS", limit=5.0, isolate=True)(
        _long_sequence(_layout))


@case(G, "one 20,000-token sequence through a loaded PretrainedGraphPredictor",
      error=(ValueError,), names=r"MAX_GRAPH_PAIRS.*Split long sequences into chunks", limit=5.0,
      isolate=True)
def _(ctx):
    from glomo_pyg import load_pretrained
    predictor = load_pretrained(saved_predictor(ctx))
    predictor(torch.randint(0, 30, (20000,)))


@case(G, "one 20,000-token sequence without gradients, layout='auto' (fused FlexAttention)",
      limit=300.0, isolate=True)
def _():
    """Past MAX_GRAPH_PAIRS 'auto' takes the fused layout where FlexAttention runs (no
    gradients): memory linear in T. Checked by causality: the first 500 targets of a
    forward graph see only the first 500 units, so their propagation must equal that of
    the sparse graphs of those 500 units alone."""
    torch.manual_seed(0)
    model = tiny_predictor(heads=8, head_channels=2).eval()
    x, h = torch.randint(0, 10, (20000,)), torch.randn(20000, 3)
    with torch.no_grad():
        graphs = model(x, layout="auto")
        check(graphs.layout == "fused", f"layout {graphs.layout}")
        out = graphs.propagate(h, 0)
        ref = model(x[:500], layout="sparse").propagate(h[:500], 0)
    check(tuple(out.shape) == (8, 20000, 3) and bool(torch.isfinite(out).all()),
          "non-finite or misshapen propagation")
    err = float((out[:, :500] - ref).abs().max())
    check(err < 1e-4, f"first 500 targets differ from the sparse reference by {err:.2e}")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    return (f"fused; [8, 20000, 3] propagation, first 500 targets = sparse reference "
            f"(max diff {err:.1e}); peak RSS {peak:.2f} GB")


@case(G, "uniform graphs over one 20,000-unit sequence propagate in O(N) (control)", limit=5.0,
      isolate=True)
def _():
    from glomo_pyg import LatentGraphs
    uniform = LatentGraphs.uniform(torch.tensor([0, 20000]), num_layers=1, num_heads=8,
                                   direction="forward")
    x = torch.randn(20000, 3)
    out = uniform.propagate(x, 0)
    check(tuple(out.shape) == (8, 20000, 3), f"shape {tuple(out.shape)}")
    want = x[:-1].double().cumsum(0) / torch.arange(1, 20000).double().unsqueeze(1)
    check(torch.allclose(out[3, 1:].double(), want, atol=1e-4), "not the prefix mean")
    check(bool((out[:, 0] == 0).all()), "the first unit has no source: zero expected")
    return "[8, 20000, 3], the prefix means"


def _config_bomb(key, value):
    def run(ctx):
        from glomo_pyg import load_pretrained
        path = saved_predictor(ctx)
        set_forward(path, **{key: value})
        load_pretrained(path)
    return run


for _key, _value, _message in (
        ("num_tokens", 2e7, r"num_tokens must be an integer in \[1, 16777216\] or null, "
                            r"got 20000000\.0"),
        ("num_tokens", 20_000_000, r"num_tokens must be an integer in \[1, 16777216\] or null, "
                                   r"got 20000000"),
        ("num_layers", 1e5, r"num_layers must be an integer in \[1, 1024\], got 100000\.0"),
        ("num_layers", 100_000, r"num_layers must be an integer in \[1, 1024\], got 100000"),
        ("cnn_layers", 1e6, r"cnn_layers must be an integer in \[0, 1024\], got 1000000\.0"),
        ("cnn_layers", 1_000_000, r"cnn_layers must be an integer in \[0, 1024\], got 1000000")):
    case(G, f"edited config.json with {_key}={_value!r}", error=(ValueError,),
         names=r"config\.json: forward GraphPredictor config: " + _message, limit=2.0,
         isolate=True)(_config_bomb(_key, _value))


# ==== crash windows ========================================================================
G = "crash windows"


def _in_child(work: Callable[[], None]) -> int:
    """Fork a child that runs ``work`` and never returns into the harness; its pid."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (child)
        try:
            torch.set_num_threads(1)
            work()
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(0)
    return pid


def _leftovers(path: Path) -> List[Path]:
    return sorted(p for p in path.parent.iterdir() if p.name.startswith(f".{path.name}.glomo-"))


def _size(path: Path) -> int:
    if path.is_dir():
        return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    return path.stat().st_size


def _which(loaded, candidates) -> Optional[str]:
    for name, predictor in candidates.items():
        if same_state(loaded, predictor):
            return name
    return None


@case(G, "SIGKILL during save_pretrained over an existing predictor (K trials)")
def kill_trials(ctx):
    import random
    from collections import Counter

    from glomo_pyg import PretrainedFormatError, load_pretrained, save_pretrained
    old = pretrained(1, tokens=2000, hidden=128, heads=4, cnn_layers=2)  # ~4 MB of weights
    new = pretrained(2, tokens=2000, hidden=128, heads=4, cnn_layers=2)
    path = ctx.tmp() / "p"
    save_pretrained(new, path)
    start = time.perf_counter()
    save_pretrained(old, path)  # the directory holds the old predictor before every kill
    per_save = time.perf_counter() - start
    size_mb = (path / "model.safetensors").stat().st_size / 1e6
    rng = random.Random(ctx.seed)
    counts: Counter = Counter()
    largest_leftover = 0

    def save_forever():
        for k in range(10 ** 9):
            save_pretrained((new, old)[k % 2], path)

    for _ in range(ctx.kill_trials):
        pid = _in_child(save_forever)
        time.sleep(rng.uniform(0, 3 * per_save))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        left = _leftovers(path) + [p for p in path.iterdir()
                                   if p.name not in ("config.json", "model.safetensors")]
        counts["kill left temporaries"] += bool(left)
        largest_leftover = max([largest_leftover] + [_size(p) for p in left])
        try:
            loaded = load_pretrained(path)
        except PretrainedFormatError as err:
            counts["lost: does not load"] += 1
            counts[f"error: {str(err)[:80]}"] += 1
            backup = re.search(r"Rename (\S+) to ", str(err))
            if backup is None:
                continue
            os.rename(backup.group(1), path)
            loaded = load_pretrained(path)
        name = _which(loaded, {"old": old, "new": new})
        counts[f"loads {name}" if name else "lost: neither old nor new"] += 1
        # the next save removes what the killed one left behind; it also puts the old
        # predictor back, so that every trial kills a save of the new one over the old
        save_pretrained(old, path)
        stray = _leftovers(path) + [p for p in path.iterdir()
                                    if p.name not in ("config.json", "model.safetensors")]
        if stray:
            counts["stray temporaries after the next save"] += 1
    lost = counts["lost: does not load"] + counts["lost: neither old nor new"]
    detail = dict(trials=ctx.kill_trials, size_mb=round(size_mb, 1),
                  per_save_s=round(per_save, 3), lost=lost,
                  largest_leftover_mb=round(largest_leftover / 1e6, 1), **counts)
    note = (f"{ctx.kill_trials} kills, {size_mb:.1f} MB, {per_save:.3f} s/save: "
            f"{counts['loads old']} old, {counts['loads new']} new, {lost} lost; "
            f"{counts['kill left temporaries']} kills left temporaries (largest "
            f"{largest_leftover / 1e6:.1f} MB), "
            f"{counts['stray temporaries after the next save']} remained after the next save")
    if lost or counts["stray temporaries after the next save"]:
        raise WrongResult(note)
    return note, detail


@case(G, "kill after the first periodic checkpoint, before last.ckpt, then --resume")
def _(ctx):
    from glomo_pyg.training import run_pretraining
    from glomo_pyg.training.checkpoints import AtomicCheckpointIO
    straight = ctx.straight()
    run = ctx.tmp() / "run"
    config = pretrain_config(run, straight / "corpus")

    def killed_before_last():
        save = AtomicCheckpointIO.save_checkpoint

        def save_checkpoint(self, checkpoint, path, storage_options=None):
            if os.path.basename(str(path)) == "last.ckpt":
                os.kill(os.getpid(), signal.SIGKILL)  # step2.ckpt is on disk, last.ckpt not
            return save(self, checkpoint, path, storage_options)
        AtomicCheckpointIO.save_checkpoint = save_checkpoint
        with quiet_training():
            run_pretraining(config, log=quiet)

    pid = _in_child(killed_before_last)
    _, status = os.waitpid(pid, 0)
    check(os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL,
          f"the child was not killed (status {status})")
    on_disk = sorted(os.listdir(run / "checkpoints"))
    check(on_disk == ["step2.ckpt"], f"checkpoints after the kill: {on_disk}")
    messages: List[str] = []
    with quiet_training():
        summary = run_pretraining(config, resume=True, log=messages.append)
    check(summary["steps"] == 6, f"resumed run ended at step {summary['steps']}")
    check(any("step2.ckpt (step 2)" in m and "no last.ckpt" in m for m in messages),
          f"did not say it resumed from step2.ckpt: {messages[:3]}")
    check(same_weights(ckpt(run), ckpt(straight / "run")),
          "resumed weights differ from the uninterrupted run's")
    return ("killed with only step2.ckpt on disk; --resume took step2.ckpt and ended on the "
            "uninterrupted run's weights (step 6)")


@case(G, "SIGTERM to a training `glomo pretrain` process", limit=600.0)
def _(ctx):
    straight = ctx.straight()
    base = ctx.tmp()
    cfg = write_yaml(base / "cfg.yaml", pretrain_settings(base / "killed", straight / "corpus",
                                                          max_steps=100000, validate_every=1000))
    env = dict(os.environ, PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    env.setdefault("OMP_NUM_THREADS", "1")
    first = base / "killed" / "checkpoints" / "step2.ckpt"
    with open(base / "stdout", "w") as out, open(base / "stderr", "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "glomo_pyg.cli", "pretrain", "--config",
                                 cfg], stdout=out, stderr=err, env=env, cwd=base)
        deadline = time.time() + 400
        while not first.exists() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.01)
        sent = time.time()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise TooSlow("glomo pretrain did not stop within 120 s of SIGTERM")
    stopped = time.time() - sent
    err = (base / "stderr").read_text()
    check(proc.returncode == 143, f"exit status {proc.returncode}: {err[-300:]!r}")
    last = base / "killed" / "checkpoints" / "last.ckpt"
    check(last.exists(), "no last.ckpt written")
    step = checkpoint_weights(last)[1]
    check(step >= 2, f"last.ckpt at step {step}")
    check(f"stopped by SIGTERM after step {step}" in err, f"stderr: {err[-300:]!r}")
    check(f"--config {cfg} --resume" in err, "stderr does not say how to resume")
    check("Traceback" not in err, "a traceback on stderr")
    code = cli("pretrain", "--config", cfg, "--resume", "--set", f"train.max_steps={step + 2}")
    summary = json.loads((base / "killed" / "pretrain.json").read_text())
    check(code == 0 and summary["steps"] == step + 2,
          f"resume: exit {code}, pretrain.json says {summary['steps']} steps")
    return (f"exit 143 {stopped:.1f} s after SIGTERM, last.ckpt at step {step}, one-line "
            f"message with the resume command; --resume went on to step {step + 2}")


# ==== pickles ==============================================================================
G = "pickles"


def _write_pickle(path: Path, obj) -> None:
    with open(path, "wb") as fh:
        pickle.dump(obj, fh, protocol=4)


def _cifar_folder(ctx: Context) -> Path:
    rng = np.random.default_rng(0)
    root = ctx.tmp() / "cifar"
    root.mkdir()
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        _write_pickle(root / name, {b"data": rng.integers(0, 256, (4, 3072), dtype=np.uint8),
                                    b"labels": [0, 1, 2, 3], b"batch_label": name.encode()})
    return root


@case(G, "os.system pickle as a CIFAR-10 batch file (load_cifar10)", error=(UnsafePickleError,),
      names=r"data_batch_3: refusing to load (posix|os)\.system", after=last_marker_absent)
def _(ctx):
    from glomo_pyg.data.images import load_cifar10
    root = _cifar_folder(ctx)
    _write_pickle(root / "data_batch_3", Exploit(ctx.marker()))
    load_cifar10(str(root))


@case(G, "os.system pickle inside a CIFAR-10 batch dict (load_cifar10 test split)",
      error=(UnsafePickleError,), names=r"test_batch: refusing to load (posix|os)\.system",
      after=last_marker_absent)
def _(ctx):
    from glomo_pyg.data.images import load_cifar10
    root = _cifar_folder(ctx)
    _write_pickle(root / "test_batch", {b"data": Exploit(ctx.marker()), b"labels": [0]})
    load_cifar10(str(root), "test")


@case(G, "os.system pickle as an ImageNet-32 batch (load_imagenet32)",
      error=(UnsafePickleError,),
      names=r"train_data_batch_2: refusing to load (posix|os)\.system", after=last_marker_absent)
def _(ctx):
    from glomo_pyg.data.images import load_imagenet32
    root = ctx.tmp() / "imagenet32"
    root.mkdir()
    data = np.random.default_rng(1).integers(0, 256, (3, 3072), dtype=np.uint8)
    _write_pickle(root / "train_data_batch_1", {"data": data, "labels": [1, 2, 3]})
    _write_pickle(root / "train_data_batch_2", {"data": data, "labels": [1, 2, 3],
                                                "mean": Exploit(ctx.marker())})
    load_imagenet32(str(root))


@case(G, "os.system pickle in last.ckpt (run_pretraining resume)", error=(ValueError,),
      names=r"refusing to load \S*last\.ckpt: it contains objects other than tensors",
      forbid=r"weights_only|False", after=last_marker_absent)
def _(ctx):
    from glomo_pyg.training import run_pretraining
    from glomo_pyg.training.checkpoints import atomic_save
    run = copy_run(ctx, keep=("step2.ckpt",))
    data = torch.load(ckpt(run, "step2.ckpt"), weights_only=True)
    data["global_step"] = 10
    data["payload"] = Exploit(ctx.marker())
    atomic_save(data, ckpt(run))
    with quiet_training():
        run_pretraining(pretrain_config(run, ctx.straight() / "corpus"), resume=True, log=quiet)


@case(G, "os.system pickle as model.safetensors (re-hashed)", error=(ValueError,),
      names=r"model\.safetensors.*not a valid safetensors file", after=last_marker_absent)
def _(ctx):
    from glomo_pyg import load_pretrained
    path = saved_predictor(ctx)
    (path / "model.safetensors").write_bytes(pickle.dumps(Exploit(ctx.marker())))
    rehash(path)
    load_pretrained(path)


@case(G, "torch.save zip with an os.system pickle as model.safetensors (re-hashed)",
      error=(ValueError,), names=r"model\.safetensors.*not a valid safetensors file",
      after=last_marker_absent)
def _(ctx):
    from glomo_pyg import load_pretrained
    path = saved_predictor(ctx)
    torch.save({"weight": Exploit(ctx.marker())}, path / "model.safetensors")
    rehash(path)
    load_pretrained(path)


# --- running a case --------------------------------------------------------------------------
def _first_line(text: str) -> str:
    text = str(text).strip()
    line = text.splitlines()[0] if text else ""
    return line if len(line) <= MESSAGE_CHARS else line[:MESSAGE_CHARS - 3] + "..."


def _message_of(err: BaseException) -> str:
    if isinstance(err, SystemExit):
        return str(err.code)
    return str(err)


def _allocation_failure(err: BaseException) -> bool:
    text = str(err)
    return isinstance(err, MemoryError) or (isinstance(err, RuntimeError) and (
        "can't allocate memory" in text or "not enough memory" in text or
        "DefaultCPUAllocator" in text))


def classify(c: Case, err: Optional[BaseException], value, seconds: float) -> Tuple[str, str]:
    if err is None:
        note = value[0] if isinstance(value, tuple) else value
        if c.error is not None:
            return WRONG, f"no error: the hostile input was accepted ({note!r:.80})"
        outcome, message = CORRECT, str(note or "")
    elif isinstance(err, TooSlow):
        return EXCESSIVE, f"over the {c.limit:g} s limit: {err}"
    elif _allocation_failure(err):
        return EXCESSIVE, f"{type(err).__name__}: {_first_line(_message_of(err))}"
    elif isinstance(err, WrongResult):
        return WRONG, _first_line(str(err))
    else:
        text = _message_of(err)
        shown = f"{type(err).__name__}: {_first_line(text)}"
        if c.error is None or not isinstance(err, c.error):
            return CRASH, shown
        if isinstance(err, SystemExit) and "\n" in text.strip():
            return CRASH, shown + " (not one line)"
        if not re.search(c.names or "", text, re.S):
            return CRASH, shown + f" (does not name: /{c.names}/)"
        if c.forbid and re.search(c.forbid, text):
            return CRASH, shown + f" (says /{c.forbid}/)"
        outcome, message = NAMED, shown
    if seconds > c.limit:
        return EXCESSIVE, f"took {seconds:.1f} s, over the {c.limit:g} s limit ({message})"
    return outcome, message


def _alarm(signum, frame):
    raise TooSlow("interrupted by the time limit")


def run_in_process(c: Case, ctx: Context) -> Result:
    import inspect
    takes_ctx = bool(inspect.signature(c.fn).parameters)
    torch.manual_seed(0)
    err, value = None, None
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, max(c.limit * 2, c.limit + 10))
    start = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            value = c.fn(ctx) if takes_ctx else c.fn()
    except BaseException as e:  # noqa: BLE001 (everything is classified)
        if isinstance(e, KeyboardInterrupt):
            raise
        err = e
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    seconds = time.perf_counter() - start
    outcome, message = classify(c, err, value, seconds)
    message = re.sub(r"\$TMP/case-[A-Za-z0-9_]+/", "$TMP/",
                     message.replace(str(ctx.root), "$TMP"))
    if c.after is not None:
        problem = c.after(ctx)
        if problem:
            outcome, message = WRONG, problem
    extra = value[1] if err is None and isinstance(value, tuple) else {}
    return Result(c.group, c.name, outcome, message, round(seconds, 3), extra)


def _vm_bytes() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def run_isolated(c: Case, ctx: Context) -> Result:
    """Run ``c`` in a forked child with its address space limited to the current size
    plus ``memory_gib``, killed after ``max(30, 10 * limit)`` seconds."""
    read, write = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (child)
        try:
            os.close(read)
            torch.set_num_threads(1)
            cap = _vm_bytes() + int(c.memory_gib * (1 << 30))
            resource.setrlimit(resource.RLIMIT_AS, (cap, resource.getrlimit(resource.RLIMIT_AS)[1]))
            result = run_in_process(c, ctx)
            os.write(write, json.dumps(asdict(result)).encode())
        except BaseException:  # noqa: BLE001
            traceback.print_exc()
        finally:
            os._exit(0)
    os.close(write)
    deadline = start + max(30.0, 10 * c.limit)
    data, status = b"", None
    while True:
        wait = max(0.0, min(1.0, deadline - time.perf_counter()))
        ready, _, _ = select.select([read], [], [], wait)
        if ready:
            chunk = os.read(read, 1 << 16)
            if not chunk:
                break
            data += chunk
        elif time.perf_counter() > deadline:
            os.kill(pid, signal.SIGKILL)
            break
    os.close(read)
    _, status = os.waitpid(pid, 0)
    seconds = round(time.perf_counter() - start, 3)
    if data:
        return Result(**json.loads(data))
    if os.WIFSIGNALED(status):
        sig = signal.Signals(os.WTERMSIG(status)).name
        if seconds >= deadline - start - 0.5:
            return Result(c.group, c.name, EXCESSIVE, f"killed after {seconds:.0f} s (no answer)",
                          seconds)
        outcome = EXCESSIVE if sig == "SIGKILL" else CRASH  # SIGKILL: the OOM killer
        return Result(c.group, c.name, outcome, f"the child died of {sig}", seconds)
    return Result(c.group, c.name, CRASH, f"the child exited ({status}) without a result", seconds)


def run_case(c: Case, ctx: Context) -> Result:
    return run_isolated(c, ctx) if c.isolate else run_in_process(c, ctx)


def select_cases(only: Optional[str] = None, cheap: bool = False) -> List[Case]:
    chosen = [c for c in CASES if not cheap or c.cheap]
    if only:
        chosen = [c for c in chosen if only.lower() in f"{c.group}: {c.name}".lower()]
    return chosen


def run_cases(cases: List[Case], ctx: Context, echo=print) -> List[Result]:
    results = []
    for c in cases:
        result = run_case(c, ctx)
        results.append(result)
        echo(f"{result.group:<20} | {result.case[:70]:<70} | {result.outcome:<22} | "
             f"{result.seconds:7.2f} s | {result.message}")
    return results


# --- the property suite ----------------------------------------------------------------------
_TEST = re.compile(r"^(\S+\.py)::(\S+):\s*$")
_PHASE = re.compile(r"- during (\w+) phase \(([\d.]+) seconds\)")
_COUNTS = re.compile(r"- (\d+) passing, (\d+) failing, and (\d+) invalid test cases")


def parse_statistics(text: str) -> Dict[str, Dict[str, float]]:
    """Per test: passing, failing and invalid examples over all phases, and seconds."""
    stats: Dict[str, Dict[str, float]] = {}
    current = None
    for line in text.splitlines():
        m = _TEST.match(line.strip())
        if m:
            current = stats.setdefault(m.group(2), dict(passing=0, failing=0, invalid=0,
                                                        seconds=0.0, phases=""))
            continue
        if current is None:
            continue
        m = _PHASE.search(line)
        if m:
            current["seconds"] += float(m.group(2))
            current["phases"] = (current["phases"] + " " + m.group(1)).strip()
        m = _COUNTS.search(line)
        if m:
            for key, value in zip(("passing", "failing", "invalid"), m.groups()):
                current[key] += int(value)
    return stats


def run_properties(examples: int, timeout: float = 1500.0) -> Dict:
    command = [sys.executable, "-m", "pytest", "tests/test_properties.py", "-q",
               "-p", "no:cacheprovider", "--hypothesis-show-statistics"]
    env = dict(os.environ, GLOMO_PROPERTY_EXAMPLES=str(examples))
    start = time.perf_counter()
    try:
        proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=timeout)
        output, code = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as err:
        output = err.stdout or ""
        output = output.decode() if isinstance(output, bytes) else output
        code = None
    seconds = time.perf_counter() - start
    summary = [line for line in output.splitlines() if re.search(r"\d+ (passed|failed)", line)]
    return dict(examples=examples, command=f"GLOMO_PROPERTY_EXAMPLES={examples} "
                + " ".join(["python"] + command[1:]), returncode=code, seconds=round(seconds, 1),
                stats=parse_statistics(output), summary=summary[-1].strip("= ") if summary else "",
                tail=output[-3000:] if code != 0 else "")


# --- the report ------------------------------------------------------------------------------
def totals(results: List[Result]) -> Dict[str, Dict[str, int]]:
    table = {g: {o: 0 for o in OUTCOMES} for g in GROUPS}
    for r in results:
        table[r.group][r.outcome] += 1
    return table


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def report(results: List[Result], properties: Optional[Dict], ctx: Context, command: str,
           seconds: float, load: Tuple[float, float, float] = (0.0, 0.0, 0.0)) -> str:
    from benchmarks.common import hardware
    table = totals(results)
    kill = next((r for r in results if r.case.startswith("SIGKILL during save_pretrained")), None)
    lost = kill.extra.get("lost") if kill and kill.extra else None
    pickles = ctx.pickles_executed()
    bad = [r for r in results if r.outcome not in GOOD]
    date = subprocess.run(["date"], capture_output=True, text=True).stdout.strip()
    lines = [f"## {date}", "",
             f"- hardware: {hardware()}, {os.cpu_count()} cores visible; torch "
             f"{torch.__version__}, Python {sys.version.split()[0]}; OMP_NUM_THREADS="
             f"{os.environ.get('OMP_NUM_THREADS', 'unset')}",
             f"- command: `{command}`; load average at the start {load[0]:.1f}, "
             f"{load[1]:.1f}, {load[2]:.1f} (1, 5, 15 min)",
             f"- wall time: {seconds / 60:.1f} min ({len(results)} cases"
             + (f", property suite {properties['seconds'] / 60:.1f} min" if properties else "")
             + ")", "",
             "### Totals", "",
             "| group | " + " | ".join(OUTCOMES) + " | cases |",
             "|---|" + "---:|" * (len(OUTCOMES) + 1)]
    for g in GROUPS:
        row = table[g]
        lines.append(f"| {g} | " + " | ".join(str(row[o]) for o in OUTCOMES)
                     + f" | {sum(row.values())} |")
    all_row = {o: sum(table[g][o] for g in GROUPS) for o in OUTCOMES}
    lines.append("| **all** | " + " | ".join(f"**{all_row[o]}**" for o in OUTCOMES)
                 + f" | **{len(results)}** |")
    lines += ["", f"- pickles executed: **{pickles}** of {len(ctx.markers)} planted",
              f"- predictors lost in kill trials: **{lost if lost is not None else 'not run'}**"
              + (f" of {kill.extra.get('trials')} SIGKILL trials" if kill and kill.extra else ""),
              ""]
    # targets
    prop_total = prop_fail = None
    if properties and properties["stats"]:
        prop_total = sum(int(s["passing"]) + int(s["failing"])
                         for s in properties["stats"].values())
        prop_fail = sum(int(s["failing"]) for s in properties["stats"].values())
    n_bad = {o: all_row[o] for o in (WRONG, CRASH, EXCESSIVE)}
    targets = [
        ("every listed case ends in a clear named error or a correct result: 0 silent wrong "
         "results, 0 unhelpful crashes, 0 unbounded allocations",
         not bad, f"{all_row[NAMED]} named errors, {all_row[CORRECT]} correct results; "
                  f"{n_bad[WRONG]} silent wrong, {n_bad[CRASH]} unhelpful crashes, "
                  f"{n_bad[EXCESSIVE]} excessive memory/time"),
        (">= 10,000 generated property cases in the large run, 0 failures",
         bool(properties) and properties["returncode"] == 0 and prop_total is not None
         and prop_total >= 10_000 and prop_fail == 0,
         "not run" if not properties else
         f"{prop_total} generated cases (passing + failing), {prop_fail} failing; pytest: "
         f"{properties['summary'] or 'exit ' + str(properties['returncode'])}"),
        ("0 pickles executed", pickles == 0 and len(ctx.markers) > 0,
         f"{pickles} of {len(ctx.markers)} planted payloads ran"),
        ("0 predictors lost to a kill during save, over >= 20 kill trials",
         lost == 0 and kill is not None and kill.extra.get("trials", 0) >= 20,
         f"{lost} lost over {kill.extra.get('trials') if kill and kill.extra else 0} trials"
         if kill else "not run"),
    ]
    lines += ["### Targets (from the issue)", "", "| target | met | evidence |", "|---|---|---|"]
    for text, met, evidence in targets:
        lines.append(f"| {text} | {'met' if met else '**not met**'} | {_cell(evidence)} |")
    lines.append("")
    if bad:
        lines += ["### Cases that did not end in a named error or a correct result", ""]
        lines += [f"- {r.group} / {r.case}: **{r.outcome}**: {_cell(r.message)}" for r in bad]
        lines.append("")
    if kill and kill.extra:
        lines += ["### Kill trials", "", "| " + " | ".join(map(str, kill.extra)) + " |",
                  "|" + "---|" * len(kill.extra),
                  "| " + " | ".join(str(v) for v in kill.extra.values()) + " |", ""]
    if properties:
        lines += ["### Property suite", "", f"`{properties['command']}` (exit "
                  f"{properties['returncode']}, {properties['seconds']:.0f} s): "
                  f"{properties['summary']}", "",
                  "| property | passing | failing | invalid | phases | seconds |",
                  "|---|---:|---:|---:|---|---:|"]
        for name, s in properties["stats"].items():
            lines.append(f"| {name} | {s['passing']} | {s['failing']} | {s['invalid']} | "
                         f"{s['phases']} | {s['seconds']:.1f} |")
        sums = {k: sum(int(s[k]) for s in properties["stats"].values())
                for k in ("passing", "failing", "invalid")}
        lines += [f"| **all** | **{sums['passing']}** | **{sums['failing']}** | "
                  f"**{sums['invalid']}** | | |", ""]
        if properties["tail"]:
            lines += ["```", properties["tail"].strip(), "```", ""]
    lines += ["### Cases", "", "| group | case | outcome | s | message |", "|---|---|---|---:|---|"]
    for r in results:
        lines.append(f"| {r.group} | {_cell(r.case)} | {r.outcome} | {r.seconds:.2f} | "
                     f"{_cell(r.message)} |")
    lines.append("")
    return "\n".join(lines)


HEADER = """# Reliability: hostile inputs, kills, pickles and properties

`python -m benchmarks.reliability` runs every hostile input of the reliability review
(one small function each, grouped as in the issue) and classifies how it ends: a
**named error** (the library's deliberate ValueError/TypeError/IndexError subclass, or a
one-line `glomo <command>: ...` exit, whose message names the argument, file or
setting), a **correct result** (checked against a reference), an **unhelpful crash**, a
**silent wrong result** or **excessive memory/time**. Allocation cases run in a forked
child under `RLIMIT_AS` (current size + 3 GiB) and must fail within their limit (2-5 s).
Then the hypothesis property suite with `GLOMO_PROPERTY_EXAMPLES=N`. Newest run last.
"""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--property-examples", type=int, default=2000,
                        help="GLOMO_PROPERTY_EXAMPLES for the property suite (0: skip it)")
    parser.add_argument("--kill-trials", type=int, default=100,
                        help="SIGKILL trials during save_pretrained (>= 20 for the target)")
    parser.add_argument("--output", default=str(ROOT / "benchmarks" / "results" / "reliability.md"),
                        help="markdown file the dated section is appended to ('' : none)")
    parser.add_argument("--only", help="run only the cases whose 'group: name' contains this")
    parser.add_argument("--seed", type=int, default=1234, help="seed of the kill times")
    args = parser.parse_args(argv)
    command = "python -m benchmarks.reliability " + " ".join(
        shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    start, load = time.perf_counter(), os.getloadavg()
    root = Path(tempfile.mkdtemp(prefix="glomo-reliability-"))
    try:
        ctx = Context(root, kill_trials=args.kill_trials, seed=args.seed)
        print(f"{len(select_cases(args.only))} cases in {root}", flush=True)
        results = run_cases(select_cases(args.only), ctx, echo=lambda s: print(s, flush=True))
        pickles = ctx.pickles_executed()
        properties = None
        if args.property_examples > 0:
            print(f"property suite: GLOMO_PROPERTY_EXAMPLES={args.property_examples} ...",
                  flush=True)
            properties = run_properties(args.property_examples)
            for name, s in properties["stats"].items():
                print(f"  {name}: {s['passing']} passing, {s['failing']} failing, "
                      f"{s['invalid']} invalid ({s['seconds']:.0f} s)")
            print(f"  {properties['summary'] or properties['tail'][-500:]}", flush=True)
        seconds = time.perf_counter() - start
        text = report(results, properties, ctx, command, seconds, load)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    table = totals(results)
    print("\n" + " | ".join(f"{o}: {sum(table[g][o] for g in GROUPS)}" for o in OUTCOMES)
          + f" | pickles executed: {pickles} | {seconds / 60:.1f} min")
    if args.output:
        new = not os.path.exists(args.output)
        os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
        with open(args.output, "a") as fh:
            fh.write((HEADER + "\n" if new else "\n") + text)
        print(f"report appended to {args.output}")
    bad = [r for r in results if r.outcome not in GOOD]
    failed_properties = properties is not None and properties["returncode"] != 0
    return 1 if bad or pickles or failed_properties else 0


if __name__ == "__main__":
    sys.exit(main())
