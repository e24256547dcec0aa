"""How much syntax learned graphs carry (docs/syntax.md): per target word, a graph's
weights summed per allowed source word are scored against the gold tree by **undirected
attachment** (the heaviest source word shares a gold arc with the target), **directed
attachment** (it is the target's gold head) and **average precision** of all (target,
source word) weights against the gold arcs. A quantitative form of the paper's reading of
learned graphs (Yang et al., 2018, Sec. 4 and Fig. 3), with the metrics of the
attention-vs-syntax literature (e.g. Clark et al., 2019).
"""
from __future__ import annotations

import copy
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor

from glomo_pyg.analysis.export import concat_sequences
from glomo_pyg.analysis.treebank import GoldTree
from glomo_pyg.data.text import tokenize
from glomo_pyg.extras import require
from glomo_pyg.ordering import SequenceOrder
from glomo_pyg.settings import Rule, check_int

METRICS = ("undirected", "directed", "ap")
METRIC = Rule(str, choices=METRICS)


class NothingToScore(ValueError):
    """The gold trees leave nothing to score (no aligned sentence, no scorable target, no
    gold arc among the scored pairs): a fault of the data, not of the graphs."""


_POSITIONAL = {"forward": ("previous word", "word two back"),
               "backward": ("next word", "word two ahead")}
UPPER_BOUND = "upper bound"  # targets with a gold neighbour (head) among their sources


@dataclass
class AlignedSentence:
    """A gold tree with its token ids: ``first[k]`` is the token position of word ``k``'s
    first sub-token, ``word_of[t]`` the word of token ``t``."""

    tree: GoldTree
    ids: Tensor
    first: Tensor
    word_of: Tensor


@dataclass
class Alignment:
    sentences: List[AlignedSentence]
    skipped_sentences: int  # with at least one word that tokenised to nothing
    unaligned_words: int
    short_sentences: int  # fewer than 2 words: nothing to score
    tokens: int
    unknown_tokens: int
    long_sentences: int = 0  # more than max_tokens tokens: skipped (memory is O(T^2))
    max_tokens: int = 512

    def check(self) -> "Alignment":
        """``self``, or :class:`NothingToScore` saying why no sentence is left to score."""
        if not self.sentences:
            total = self.skipped_sentences + self.short_sentences + self.long_sentences
            why = "no gold trees were given (an empty treebank?)" if total == 0 else (
                f"all {total} trees were skipped: {self.skipped_sentences} with words that "
                f"tokenise to nothing, {self.short_sentences} shorter than 2 words, "
                f"{self.long_sentences} longer than max_tokens={self.max_tokens} tokens")
            raise NothingToScore(f"no sentence to score: {why}")
        return self


def align(trees: Sequence[GoldTree], vocabulary: Sequence[str], lower: bool = True,
          unknown: str = "<unk>", max_tokens: int = 512) -> Alignment:
    """Tokenise every word of ``trees`` as the predictor's corpus was and map the tokens
    to ids of ``vocabulary`` (unknown ones to ``unknown``); sentences of more than
    ``max_tokens`` tokens (scoring holds dense ``[T, T]`` graphs) are skipped."""
    check_int("max_tokens", max_tokens, 2)
    index = {t: i for i, t in enumerate(vocabulary)}
    if unknown not in index:
        raise ValueError(f"the vocabulary has no {unknown!r} token")
    unk = index[unknown]
    if trees and all(w == "_" for tree in trees for w in tree.words):
        raise ValueError("every word form is '_': the treebank withholds its words, and "
                         "graphs cannot be computed without them")
    out = Alignment([], 0, 0, 0, 0, 0, 0, max_tokens)
    for tree in trees:
        pieces = [tokenize(w, lower) for w in tree.words]
        missing = sum(not p for p in pieces)
        if missing:
            out.skipped_sentences += 1
            out.unaligned_words += missing
        elif len(tree) < 2:
            out.short_sentences += 1
        elif sum(map(len, pieces)) > max_tokens:
            out.long_sentences += 1
        else:
            ids = [index.get(tok, unk) for p in pieces for tok in p]
            first = [0, *accumulate(map(len, pieces[:-1]))]
            word_of = [k for k, p in enumerate(pieces) for _ in p]
            out.tokens += len(ids)
            out.unknown_tokens += ids.count(unk)
            out.sentences.append(AlignedSentence(tree, torch.tensor(ids), torch.tensor(first),
                                                 torch.tensor(word_of)))
    return out


@dataclass
class GraphScores:
    """Scores of one direction's graphs: ``per_graph[metric]`` ``[L, H]``, ``per_layer``
    ``[L]`` (head-averaged graphs), ``baselines[name][metric]``, scored ``targets``."""

    direction: str
    per_graph: Dict[str, np.ndarray]
    per_layer: Dict[str, np.ndarray]
    baselines: Dict[str, Dict[str, float]]
    targets: int

    def best(self, metric: str = "undirected") -> Tuple[int, int, float]:
        table = self.per_graph[metric]
        l, h = np.unravel_index(int(np.argmax(table)), table.shape)
        return int(l), int(h), float(table[l, h])


@dataclass
class SyntaxScores:
    """:class:`GraphScores` per direction plus the alignment counts."""

    directions: Dict[str, GraphScores]
    sentences: int
    skipped_sentences: int
    unaligned_words: int
    short_sentences: int
    unknown_fraction: float
    exclude_punct: bool
    long_sentences: int = 0
    beyond_adjacent: bool = False  # only targets with a gold neighbour, but not the adjacent word

    def to_dict(self) -> Dict:
        return dict(vars(self), directions={
            d: dict(targets=s.targets, per_graph={m: v.tolist() for m, v in s.per_graph.items()},
                    per_layer={m: v.tolist() for m, v in s.per_layer.items()},
                    baselines=s.baselines)
            for d, s in self.directions.items()})


class _Accumulator:
    """One direction's running sums (head ``H``: the head-averaged graph) and baselines'."""

    def __init__(self, layers: int, heads: int, names: Sequence[str]):
        self.undirected, self.directed = np.zeros((2, layers, heads + 1))
        self.scores: List[np.ndarray] = []  # [L, H + 1, pairs] per sentence
        self.labels: List[np.ndarray] = []
        self.targets = 0
        self.names = names  # the positional baselines
        self.base = {name: np.zeros(2) for name in (*names, "uniform", UPPER_BOUND)}
        self.base_pairs: Dict[str, List[np.ndarray]] = {name: [] for name in names}

    def add(self, ww: Tensor, link: Tensor, heads_gold: Tensor, targets: Tensor,
            allowed: Tensor, direction: str) -> None:
        """One sentence: ``ww`` ``[L, H + 1, W, W]`` word weights, its gold arcs and the
        scored targets with their allowed source words."""
        masked = ww.masked_fill(~allowed, -1.0)[..., targets]  # [L, H+1, W, n]
        top, choice = masked.max(2)  # heaviest allowed source word per target
        hit = top > 0  # a column with no weight on other words attaches nowhere
        tgt = targets.nonzero().view(-1)
        cols = torch.arange(tgt.numel())
        self.undirected += (link[choice, tgt] & hit).sum(-1).numpy()
        self.directed += ((choice == heads_gold[tgt]) & hit).sum(-1).numpy()
        self.targets += tgt.numel()
        pair = allowed[:, tgt]  # [W, n]
        self.scores.append(ww[..., tgt][..., pair].numpy())
        self.labels.append(link[:, tgt][pair].numpy())
        step = -1 if direction == "forward" else 1
        for distance, name in enumerate(self.names, 1):  # the adjacent word (and the next)
            src = tgt + step * distance
            inside = (src >= 0) & (src < pair.size(0))
            src = src.clamp(0, pair.size(0) - 1)
            ok = pair[src, cols] & inside  # an allowed word at that distance
            self.base[name] += [(link[src, tgt] & ok).sum().item(),
                                ((heads_gold[tgt] == src) & ok).sum().item()]
            weights = torch.zeros(pair.shape)
            weights[src[ok], cols[ok]] = 1.0
            self.base_pairs[name].append(weights[pair].numpy())
        n_allowed = pair.sum(0).double()
        head_allowed = (heads_gold[tgt] >= 0) & pair[heads_gold[tgt].clamp_min(0), cols]
        self.base[UPPER_BOUND] += [(link[:, tgt] & pair).any(0).sum().item(),
                                   head_allowed.sum().item()]
        self.base["uniform"] += [((link[:, tgt] & pair).sum(0) / n_allowed).sum().item(),
                                 head_allowed.double().div(n_allowed).sum().item()]

    def scores_of(self, direction: str, beyond_adjacent: bool) -> "GraphScores":
        labels = np.concatenate(self.labels) if self.labels else np.zeros(0, dtype=bool)
        if not labels.any():  # average precision has no positive: undefined scores
            raise NothingToScore(
                f"no gold arc joins any scored {direction} (source, target) pair, so the "
                "scores are undefined (do the trees have arcs?)" if self.targets else
                f"no target to score in the {direction} direction (every target is "
                "punctuation, has no allowed source word" + (
                    ", has a gold arc to its adjacent word, or has no other gold neighbour "
                    "among its sources" if beyond_adjacent else "") + ")")
        ranked = require("sklearn.metrics", "The syntax scores' average precision")

        def average_precision(scores: np.ndarray) -> float:  # ties: one step, as scikit-learn
            return float(ranked.average_precision_score(labels, scores))

        scores = np.concatenate(self.scores, axis=-1)
        ap = np.array([[average_precision(head) for head in layer] for layer in scores])
        n = self.targets
        per = {"undirected": self.undirected / n, "directed": self.directed / n, "ap": ap}

        def rates(name: str, ap: float) -> Dict[str, float]:
            return dict(undirected=self.base[name][0] / n, directed=self.base[name][1] / n,
                        ap=ap)

        baselines = {name: rates(name, average_precision(np.concatenate(self.base_pairs[name])))
                     for name in self.names}
        baselines["uniform"] = rates("uniform", float(labels.mean()))  # constant: positive rate
        baselines[UPPER_BOUND] = rates(UPPER_BOUND, 1.0)  # weight on gold pairs only
        return GraphScores(direction, {m: v[:, :-1] for m, v in per.items()},
                           {m: v[:, -1] for m, v in per.items()}, baselines, n)


def _word_weights(dense: Tensor, sent: AlignedSentence) -> Tensor:
    """``[L, H, W, W]`` of ``[L, H, T, T]``: targets' first sub-token, sources' summed."""
    cols = dense[..., sent.first]  # [L, H, T, W]
    onehot = torch.zeros(len(sent.tree), sent.word_of.numel(), dtype=dense.dtype)
    onehot[sent.word_of, torch.arange(sent.word_of.numel())] = 1.0
    return onehot @ cols  # [L, H, W, W]


def _gold(sent: AlignedSentence, direction: str, exclude_punct: bool, beyond_adjacent: bool):
    """Targets ``[W]``, allowed sources ``[W, W]``, gold arcs (undirected), heads (-1: root)."""
    w = len(sent.tree)
    idx = torch.arange(w)
    # a word's own sub-tokens are never a source of it (include_self is off at word level)
    allowed = SequenceOrder(direction).allowed(target=idx.view(1, -1), source=idx.view(-1, 1))
    heads = torch.tensor(sent.tree.heads) - 1
    link = torch.zeros(w, w, dtype=torch.bool)
    link[heads[heads >= 0], idx[heads >= 0]] = True
    link = link | link.T
    targets = allowed.any(0)
    if exclude_punct:
        targets &= ~torch.tensor(sent.tree.punct)
    if beyond_adjacent:  # a gold neighbour to find, but not the adjacent word
        near, no = link.diagonal(1), torch.zeros(1, dtype=torch.bool)  # link[w, w + 1]
        adjacent = torch.cat([no, near] if direction == "forward" else [near, no])
        targets &= ~adjacent & (link & allowed).any(0)
    return targets, allowed, link, heads


def _batches(sents: List[AlignedSentence], batch_size: int, scores: int = 1 << 22):
    """Consecutive sentences, at most ``batch_size`` and ``scores`` dense entries per batch."""
    start = 0
    while start < len(sents):
        end = start + 1
        while end < len(sents) and end - start < batch_size and \
                (end + 1 - start) * sents[end].ids.numel() ** 2 <= scores:
            end += 1
        yield sents[start:end]
        start = end


@torch.no_grad()
def syntax_scores(predictor, alignment: Alignment, exclude_punct: bool = True,
                  batch_size: int = 64, directions: Optional[Sequence[str]] = None,
                  beyond_adjacent: bool = False) -> SyntaxScores:
    """Scores of every graph of ``predictor`` (any module returning
    :class:`~glomo_pyg.DirectionalGraphs` for ``(x, batch)``) on aligned gold trees.
    ``exclude_punct`` leaves punctuation targets out (not sources). ``beyond_adjacent``
    scores only targets with a gold neighbour among their allowed source words other than
    the adjacent one, with the word at distance 2 as a second positional baseline."""
    alignment.check()
    was_training = getattr(predictor, "training", False)
    if hasattr(predictor, "eval"):
        predictor.eval()
    sents = sorted(alignment.sentences, key=lambda s: s.ids.numel())
    if directions is None:
        probe = predictor(sents[0].ids, None)
        directions = [d for d in ("forward", "backward") if getattr(probe, d) is not None]
    results = {d: _direction_scores(predictor, sents, d, exclude_punct, batch_size,
                                    beyond_adjacent) for d in directions}
    if was_training and hasattr(predictor, "train"):
        predictor.train()
    return SyntaxScores(results, len(alignment.sentences), alignment.skipped_sentences,
                        alignment.unaligned_words, alignment.short_sentences,
                        alignment.unknown_tokens / max(1, alignment.tokens), exclude_punct,
                        alignment.long_sentences, beyond_adjacent)


def _direction_scores(predictor, sents: List[AlignedSentence], direction: str,
                      exclude_punct: bool, batch_size: int, beyond_adjacent: bool
                      ) -> GraphScores:
    names = _POSITIONAL[direction][:2 if beyond_adjacent else 1]
    acc: Optional[_Accumulator] = None
    for batch in _batches(sents, batch_size):
        graphs = predictor(*concat_sequences([s.ids for s in batch]))
        dense = getattr(graphs, direction).to_dense().float()  # [L, B, H, T, T]
        if acc is None:
            acc = _Accumulator(dense.size(0), dense.size(2), names)
        for k, sent in enumerate(batch):
            t = sent.ids.numel()
            ww = _word_weights(dense[:, k, :, :t, :t], sent)  # [L, H, W, W]
            ww = torch.cat([ww, ww.mean(1, keepdim=True)], 1)  # + head-averaged
            targets, allowed, link, heads_gold = _gold(sent, direction, exclude_punct,
                                                       beyond_adjacent)
            if targets.any():
                acc.add(ww, link, heads_gold, targets, allowed, direction)
    assert acc is not None  # (checked alignments: a sentence at least)
    return acc.scores_of(direction, beyond_adjacent)


def untrained_copy(predictor, seed: int = 0):
    """A predictor of the same architecture with fresh weights (the "untrained"
    baseline): every submodule with ``reset_parameters`` is reset under ``seed``."""
    fresh = copy.deepcopy(predictor)
    with torch.random.fork_rng(devices=[]):  # the caller's CPU generator is left as it was
        torch.manual_seed(seed)
        for module in fresh.modules():
            if module is not fresh and hasattr(module, "reset_parameters"):
                module.reset_parameters()
    return fresh


def _row(name: str, values: Dict[str, float], untrained: Optional[Dict[str, float]]) -> str:
    text = f"  {name:<44s}" + " / ".join(f"{values[m]:.3f}" for m in METRICS)
    if untrained is not None:
        text += "   untrained: " + " / ".join(f"{untrained[m]:.3f}" for m in METRICS)
    return text


@dataclass
class SyntaxComparison:
    """Scores of the trained and the untrained predictor on the evaluation trees, with
    the graph chosen per direction on the selection trees (``chosen[d] = (layer, head)``)."""

    evaluation: SyntaxScores
    untrained: Optional[SyntaxScores]
    selection: Optional[SyntaxScores]
    chosen: Dict[str, Tuple[int, int]]
    metric: str = "undirected"
    notes: List[str] = field(default_factory=list)

    def format(self) -> str:
        ev = self.evaluation
        lines = [f"sentences scored: {ev.sentences} (skipped: {ev.skipped_sentences} with "
                 f"{ev.unaligned_words} unaligned words, {ev.short_sentences} shorter than 2 "
                 f"words, {ev.long_sentences} longer than the token limit); unknown tokens "
                 f"{ev.unknown_fraction:.1%}; punctuation targets "
                 f"{'excluded' if ev.exclude_punct else 'included'}"]
        if ev.beyond_adjacent:
            lines.append("targets: only those with a gold neighbour among their source words "
                         "but not their adjacent word; the word at distance 2 is the "
                         "positional baseline")
        for d, s in ev.directions.items():
            l, h = self.chosen[d]
            un = self.untrained.directions[d] if self.untrained else None
            lines.append(f"\n{d} graphs, {s.targets} targets "
                         f"(undirected / directed attachment / average precision):")
            rows: List[Tuple[str, Callable[..., float]]] = [
                (f"chosen graph (layer {l}, head {h})",
                 lambda g, m, l=l, h=h: g.per_graph[m][l, h])]
            rows += [(f"layer {k}, head-averaged", lambda g, m, k=k: g.per_layer[m][k])
                     for k in range(len(s.per_layer["undirected"]))]
            for name, value in rows:
                lines.append(_row(name, {m: value(s, m) for m in METRICS},
                                  None if un is None else {m: value(un, m) for m in METRICS}))
            lines += [_row(f"baseline: {name}", values, None)
                      for name, values in s.baselines.items()]
            bl, bh, bv = s.best(self.metric)
            table = s.per_graph[self.metric]
            lines.append(f"  (best graph on these trees, for reference: layer {bl}, head {bh}, "
                         f"{bv:.3f}; per head, layer by layer: "
                         + "; ".join(" ".join(f"{v:.2f}" for v in row) for row in table) + ")")
        lines.extend(self.notes)
        return "\n".join(lines)

    def to_dict(self) -> Dict:
        return dict(metric=self.metric, chosen={d: list(v) for d, v in self.chosen.items()},
                    evaluation=self.evaluation.to_dict(),
                    untrained=self.untrained.to_dict() if self.untrained else None,
                    selection=self.selection.to_dict() if self.selection else None)


@contextmanager
def _about(trees: str, errors=ValueError):
    """``errors`` raised inside reworded to name the ``trees`` they are about."""
    try:
        yield
    except errors as err:
        raise type(err)(f"{trees} trees: {err}") from None


def compare_with_syntax(predictor, trees: Sequence[GoldTree],
                        select_trees: Optional[Sequence[GoldTree]] = None,
                        vocabulary: Optional[Sequence[str]] = None, lower: bool = True,
                        exclude_punct: bool = True, metric: str = "undirected",
                        untrained: bool = True, seed: int = 0, batch_size: int = 64,
                        max_tokens: int = 512, beyond_adjacent: bool = False
                        ) -> SyntaxComparison:
    """Score ``predictor`` on ``trees``, choosing the single graph per direction on
    ``select_trees`` by ``metric`` (on ``trees`` themselves if not given, which the
    report notes), beside the baselines and, with ``untrained``, the same architecture
    freshly initialised under ``seed``. ``beyond_adjacent`` as in :func:`syntax_scores`."""
    METRIC.check("metric", metric)
    check_int("seed", seed, -(1 << 63), below=1 << 64)  # what torch.manual_seed accepts
    vocabulary = vocabulary if vocabulary is not None else getattr(predictor, "vocabulary", None)
    if vocabulary is None:
        raise ValueError("the predictor carries no vocabulary: pass vocabulary=")
    aligned = {}  # both sets of trees are checked before any scoring, which takes a while
    for name, given in (("evaluation", trees), ("selection", select_trees)):
        if given is not None:
            with _about(name):
                aligned[name] = align(given, vocabulary, lower, max_tokens=max_tokens).check()
    options: Dict[str, Any] = dict(exclude_punct=exclude_punct, batch_size=batch_size,
                                   beyond_adjacent=beyond_adjacent)
    evaluation = syntax_scores(predictor, aligned["evaluation"], **options)
    notes, selection = [], None
    if "selection" in aligned:
        with _about("selection", NothingToScore):  # a fault of the model passes as it is
            selection = syntax_scores(predictor, aligned["selection"], **options)
        chosen = {d: selection.directions[d].best(metric)[:2] for d in evaluation.directions}
    else:
        chosen = {d: s.best(metric)[:2] for d, s in evaluation.directions.items()}
        notes.append("note: the graph was chosen on the evaluation trees themselves "
                     "(pass selection trees for an unbiased choice)")
    fresh = syntax_scores(untrained_copy(predictor, seed), aligned["evaluation"], **options) \
        if untrained else None
    return SyntaxComparison(evaluation, fresh, selection, chosen, metric, notes)
