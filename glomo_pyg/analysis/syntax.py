"""How much syntax learned graphs carry: scores against gold dependency trees.

For every target word with at least one allowed source word, a graph's weights on the
target are summed per source word (over the source's sub-tokens) and scored against the
gold tree:

* **undirected attachment**: the heaviest source word shares a gold arc with the
  target, in either direction (it is the target's head or one of its dependents); a
  target without weight on any other word (an empty column, or all weight on its own
  later sub-tokens) attaches nowhere and counts as a miss;
* **directed attachment**: the heaviest source word is the target's gold head;
* **average precision** of the weights of all (target, allowed source word) pairs
  against the gold arcs (undirected), one ranking over the whole treebank.

Words are aligned to the predictor's tokens by tokenising each treebank word on its own
(:func:`~glomo_pyg.data.tokenize`); a word split into sub-tokens is represented by its
first sub-token, so a graph's column at that token is the word's incoming distribution.
Words that tokenise to nothing cannot be aligned; their sentences are skipped and
counted. Baselines: the previous word (forward graphs) or next word (backward graphs),
uniform weights over the allowed source words (exact expected attachment), and, in
:func:`compare_with_syntax`, the untrained predictor of the same architecture.

This is a quantitative form of the paper's qualitative reading of learned graphs
(Yang et al., 2018, Sec. 4 and Fig. 3); the metrics follow the attention-vs-syntax
literature (e.g. Clark et al., 2019).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor

from glomo_pyg.analysis.treebank import GoldTree
from glomo_pyg.data.text import tokenize
from glomo_pyg.ordering import SequenceOrder

METRICS = ("undirected", "directed", "ap")


class NothingToScore(ValueError):
    """The gold trees leave nothing to score (no aligned sentence, no scorable target, no
    gold arc among the scored pairs): a fault of the data, not of the graphs."""


_ADJACENT = {"forward": "previous word", "backward": "next word"}
# the positional baseline beyond adjacency: the nearest source word but one
_SECOND = {"forward": "word two back", "backward": "word two ahead"}
# the baseline that no graph can beat: per metric, the share of targets with a gold
# neighbour (for directed attachment: the gold head) among their allowed sources
UPPER_BOUND = "upper bound"


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

    def why_empty(self) -> str:
        """Why no sentence is left to score (for error messages)."""
        total = (self.skipped_sentences + self.short_sentences + self.long_sentences
                 + len(self.sentences))
        if total == 0:
            return "no gold trees were given (an empty treebank?)"
        return (f"all {total} trees were skipped: {self.skipped_sentences} with words that "
                f"tokenise to nothing, {self.short_sentences} shorter than 2 words, "
                f"{self.long_sentences} longer than max_tokens={self.max_tokens} tokens")


def align(trees: Sequence[GoldTree], vocabulary: Sequence[str], lower: bool = True,
          unknown: str = "<unk>", max_tokens: int = 512) -> Alignment:
    """Tokenise every word of ``trees`` the way the predictor's corpus was tokenised and
    map the tokens to ids of ``vocabulary`` (unknown tokens to ``unknown``). Sentences of
    more than ``max_tokens`` tokens are skipped and counted: scoring holds dense
    ``[layers, heads, T, T]`` graphs per sentence."""
    if max_tokens < 2:
        raise ValueError(f"max_tokens must be >= 2, got {max_tokens}")
    index = {t: i for i, t in enumerate(vocabulary)}
    if unknown not in index:
        raise ValueError(f"the vocabulary has no {unknown!r} token")
    unk = index[unknown]
    if trees and all(w == "_" for tree in trees for w in tree.words):
        raise ValueError("every word form is '_': the treebank withholds its words, and "
                         "graphs cannot be computed without them")
    out, skipped, unaligned, short, long, n_tok, n_unk = [], 0, 0, 0, 0, 0, 0
    for tree in trees:
        pieces = [tokenize(w, lower) for w in tree.words]
        missing = sum(1 for p in pieces if not p)
        if missing:
            skipped += 1
            unaligned += missing
            continue
        if len(tree) < 2:
            short += 1
            continue
        if sum(map(len, pieces)) > max_tokens:
            long += 1
            continue
        ids, first, word_of = [], [], []
        for k, p in enumerate(pieces):
            first.append(len(ids))
            for tok in p:
                ids.append(index.get(tok, unk))
                word_of.append(k)
        n_tok += len(ids)
        n_unk += sum(1 for i in ids if i == unk)
        out.append(AlignedSentence(tree, torch.tensor(ids), torch.tensor(first),
                                   torch.tensor(word_of)))
    return Alignment(out, skipped, unaligned, short, n_tok, n_unk, long, max_tokens)


@dataclass
class GraphScores:
    """Scores of every graph of one direction.

    ``per_graph[metric]``: ``[L, H]``; ``per_layer[metric]``: ``[L]`` (head-averaged
    graph of each layer); ``baselines[name][metric]``; ``targets``: scored targets.
    """

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
        return dict(
            sentences=self.sentences, skipped_sentences=self.skipped_sentences,
            unaligned_words=self.unaligned_words, short_sentences=self.short_sentences,
            long_sentences=self.long_sentences, unknown_fraction=self.unknown_fraction,
            exclude_punct=self.exclude_punct, beyond_adjacent=self.beyond_adjacent,
            directions={d: dict(targets=s.targets,
                                per_graph={m: v.tolist() for m, v in s.per_graph.items()},
                                per_layer={m: v.tolist() for m, v in s.per_layer.items()},
                                baselines=s.baselines)
                        for d, s in self.directions.items()})


def _average_precision(scores: np.ndarray, labels: np.ndarray) -> float:
    """Average precision of one ranking; tied scores count as one step (as scikit-learn)."""
    from glomo_pyg.extras import require

    average_precision_score = require(
        "sklearn.metrics", "The syntax scores' average precision").average_precision_score

    if labels.size == 0 or not labels.any():
        return float("nan")
    return float(average_precision_score(labels, scores))


class _Accumulator:
    """One direction's running sums: per (layer, head) (head ``H`` = the head-averaged
    graph) correct counts and AP pairs, and the baselines' counts and AP pairs."""

    def __init__(self, layers: int, heads: int, names: Sequence[str]):
        self.undirected = np.zeros((layers, heads + 1))
        self.directed = np.zeros((layers, heads + 1))
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
        # baselines: the adjacent word (and the one after it), uniform
        step = -1 if direction == "forward" else 1
        for distance, name in enumerate(self.names, 1):
            src = tgt + step * distance
            ok = pair[src.clamp(0, pair.size(0) - 1), cols] & \
                (src >= 0) & (src < pair.size(0))  # an allowed word at that distance
            src = src.clamp(0, pair.size(0) - 1)
            self.base[name] += [(link[src, tgt] & ok).sum().item(),
                                ((heads_gold[tgt] == src) & ok).sum().item()]
            weights = torch.zeros(pair.shape)
            weights[src[ok], cols[ok]] = 1.0
            self.base_pairs[name].append(weights[pair].numpy())
        n_allowed = pair.sum(0).double()
        head_allowed = (heads_gold[tgt] >= 0) & pair[heads_gold[tgt].clamp_min(0), cols]
        # the best any graph can do: a gold neighbour (the gold head) among the sources
        self.base[UPPER_BOUND] += [(link[:, tgt] & pair).any(0).sum().item(),
                                   head_allowed.sum().item()]
        self.base["uniform"] += [((link[:, tgt] & pair).sum(0) / n_allowed).sum().item(),
                                 head_allowed.double().div(n_allowed).sum().item()]

    def scores_of(self, direction: str, beyond_adjacent: bool) -> "GraphScores":
        if self.targets == 0:
            raise NothingToScore(f"no target to score in the {direction} direction (every "
                                 "target is punctuation, has no allowed source word"
                                 + (", has a gold arc to its adjacent word, or has no other "
                                    "gold neighbour among its sources" if beyond_adjacent
                                    else "") + ")")
        labels = np.concatenate(self.labels)
        if not labels.any():  # e.g. only roots: average precision has no positive
            raise NothingToScore(f"no gold arc joins any scored {direction} (source, "
                                 "target) pair, so the scores are undefined (do the trees "
                                 "have arcs?)")
        scores = np.concatenate(self.scores, axis=-1)
        ap = np.array([[_average_precision(scores[l, h], labels) for h in range(scores.shape[1])]
                       for l in range(scores.shape[0])])
        n = self.targets
        per = {"undirected": self.undirected / n, "directed": self.directed / n, "ap": ap}

        def rates(name: str, ap: float) -> Dict[str, float]:
            return dict(undirected=self.base[name][0] / n, directed=self.base[name][1] / n,
                        ap=ap)

        baselines = {name: rates(name, _average_precision(np.concatenate(self.base_pairs[name]),
                                                          labels)) for name in self.names}
        baselines["uniform"] = rates("uniform", float(labels.mean()))  # constant: positive rate
        baselines[UPPER_BOUND] = rates(UPPER_BOUND, 1.0)  # weight on gold pairs only
        return GraphScores(direction, {m: v[:, :-1] for m, v in per.items()},
                           {m: v[:, -1] for m, v in per.items()}, baselines, n)


def _word_weights(dense: Tensor, sent: AlignedSentence) -> Tensor:
    """``[L, H, W, W]`` weight of source word ``v`` on target word ``w`` (its first
    sub-token's column, summed over the source's sub-tokens) from ``[L, H, T, T]``."""
    cols = dense[..., sent.first]  # [L, H, T, W]
    words = len(sent.tree)
    onehot = torch.zeros(words, sent.word_of.numel(), dtype=dense.dtype)
    onehot[sent.word_of, torch.arange(sent.word_of.numel())] = 1.0
    return onehot @ cols  # [L, H, W, W]


def _targets_and_sources(sent: AlignedSentence, direction: str, exclude_punct: bool):
    """Boolean ``[W]`` scored targets and ``[W_src, W_tgt]`` allowed source words."""
    w = len(sent.tree)
    idx = torch.arange(w)
    # a word's own sub-tokens are never a source of it (include_self is off at word level)
    allowed = SequenceOrder(direction).allowed(target=idx.view(1, -1), source=idx.view(-1, 1))
    targets = allowed.any(0)
    if exclude_punct:
        targets &= ~torch.tensor(sent.tree.punct)
    return targets, allowed


def _adjacent_is_gold(link: Tensor, direction: str) -> Tensor:
    """``[W]``: the target's adjacent source word (previous for forward graphs, next for
    backward ones) shares a gold arc with it."""
    near = link.diagonal(1)  # [w] = link[w, w + 1]
    no = torch.zeros(1, dtype=torch.bool)
    return torch.cat([no, near]) if direction == "forward" else torch.cat([near, no])


def _gold(sent: AlignedSentence) -> Tuple[Tensor, Tensor]:
    """``[W, W]`` undirected arc indicator and ``[W]`` 0-based heads (-1 = root)."""
    w = len(sent.tree)
    heads = torch.tensor(sent.tree.heads) - 1
    link = torch.zeros(w, w, dtype=torch.bool)
    dep = torch.arange(w)[heads >= 0]
    link[heads[heads >= 0], dep] = True
    return link | link.T, heads


def _batches(sents: List[AlignedSentence], batch_size: int, scores: int = 1 << 22):
    """Consecutive (length-sorted) sentences, at most ``batch_size`` of them and at most
    ``scores`` dense ``T x T`` entries per batch."""
    start = 0
    while start < len(sents):
        end = start + 1
        while end < len(sents) and end - start < batch_size and \
                (end + 1 - start) * sents[end].ids.numel() ** 2 <= scores:
            end += 1
        yield sents[start:end]
        start = end


@torch.no_grad()
def _emit_dense(predictor, batch: List[AlignedSentence], direction: str) -> Tensor:
    x = torch.cat([s.ids for s in batch])
    b = torch.cat([torch.full((s.ids.numel(),), k) for k, s in enumerate(batch)])
    graphs = getattr(predictor(x, b), direction)
    return graphs.to_dense().float()  # [L, B, H, T, T]


@torch.no_grad()
def syntax_scores(predictor, alignment: Alignment, exclude_punct: bool = True,
                  batch_size: int = 64, directions: Optional[Sequence[str]] = None,
                  beyond_adjacent: bool = False) -> SyntaxScores:
    """Scores of every graph of ``predictor`` (a
    :class:`~glomo_pyg.PretrainedGraphPredictor`, or any module returning
    :class:`~glomo_pyg.DirectionalGraphs` for ``(x, batch)``) on aligned gold trees.

    Punctuation targets are left out with ``exclude_punct`` (punctuation stays a
    candidate source). With ``beyond_adjacent``, only targets with a gold neighbour among
    their allowed source words, but not their adjacent source word (previous for forward
    graphs, next for backward ones), are scored: there the adjacent word never attaches,
    and the word at distance 2 is added as the positional baseline (gold arcs are short,
    so nearness alone beats uniform there). Returns per-graph and head-averaged scores and the
    baselines, among them the ``'upper bound'`` that no graph can exceed: the share of
    targets with a gold neighbour among their allowed sources (directed: with their gold
    head among them; average precision 1).
    """
    if not alignment.sentences:
        raise NothingToScore(f"no sentence to score: {alignment.why_empty()}")
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
    names = (_ADJACENT[direction], _SECOND[direction]) if beyond_adjacent else \
        (_ADJACENT[direction],)
    acc: Optional[_Accumulator] = None
    for batch in _batches(sents, batch_size):
        dense = _emit_dense(predictor, batch, direction)
        if acc is None:
            acc = _Accumulator(dense.size(0), dense.size(2), names)
        for k, sent in enumerate(batch):
            t = sent.ids.numel()
            ww = _word_weights(dense[:, k, :, :t, :t], sent)  # [L, H, W, W]
            ww = torch.cat([ww, ww.mean(1, keepdim=True)], 1)  # + head-averaged
            targets, allowed = _targets_and_sources(sent, direction, exclude_punct)
            link, heads_gold = _gold(sent)
            if beyond_adjacent:  # a gold neighbour to find, but not the adjacent word
                targets &= ~_adjacent_is_gold(link, direction) & (link & allowed).any(0)
            if targets.any():
                acc.add(ww, link, heads_gold, targets, allowed, direction)
    return acc.scores_of(direction, beyond_adjacent)


def untrained_copy(predictor, seed: int = 0):
    """A predictor of the same architecture with freshly initialised weights (the
    "untrained" baseline): every submodule with ``reset_parameters`` is reset under
    ``seed``."""
    fresh = copy.deepcopy(predictor)
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        for module in fresh.modules():
            if module is not fresh and hasattr(module, "reset_parameters"):
                module.reset_parameters()
    finally:
        torch.random.set_rng_state(gen_state)
    return fresh


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
                 f"words, {ev.long_sentences} longer than the token limit); unknown tokens {ev.unknown_fraction:.1%}; punctuation targets "
                 f"{'excluded' if ev.exclude_punct else 'included'}"]
        if ev.beyond_adjacent:
            lines.append("targets: only those with a gold neighbour among their source words "
                         "but not their adjacent word (previous for forward graphs, next for "
                         "backward ones), where that baseline never attaches; the word at "
                         "distance 2 is the positional baseline")
        for d, s in ev.directions.items():
            l, h = self.chosen[d]
            un = self.untrained.directions[d] if self.untrained else None
            lines.append(f"\n{d} graphs, {s.targets} targets "
                         f"(undirected / directed attachment / average precision):")

            def row(name, values, untrained=None):
                text = f"  {name:<44s}" + " / ".join(f"{values[m]:.3f}" for m in METRICS)
                if untrained is not None:
                    text += "   untrained: " + " / ".join(f"{untrained[m]:.3f}" for m in METRICS)
                return text

            pick = {m: s.per_graph[m][l, h] for m in METRICS}
            lines.append(row(f"chosen graph (layer {l}, head {h})", pick,
                             {m: un.per_graph[m][l, h] for m in METRICS} if un else None))
            for layer in range(len(s.per_layer["undirected"])):
                lines.append(row(f"layer {layer}, head-averaged", {m: s.per_layer[m][layer] for m in METRICS},
                                 {m: un.per_layer[m][layer] for m in METRICS} if un else None))
            for name, values in s.baselines.items():
                lines.append(row(f"baseline: {name}", values))
            bl, bh, bv = s.best(self.metric)
            lines.append(f"  (best graph on these trees, for reference: layer {bl}, head {bh}, "
                         f"{bv:.3f}; per head, layer by layer: " +
                         "; ".join(" ".join(f"{v:.2f}" for v in s.per_graph[self.metric][layer])
                                   for layer in range(s.per_graph[self.metric].shape[0])) + ")")
        lines.extend(self.notes)
        return "\n".join(lines)

    def to_dict(self) -> Dict:
        return dict(metric=self.metric, chosen={d: list(v) for d, v in self.chosen.items()},
                    evaluation=self.evaluation.to_dict(),
                    untrained=self.untrained.to_dict() if self.untrained else None,
                    selection=self.selection.to_dict() if self.selection else None)


def _aligned(name: str, trees: Sequence[GoldTree], vocabulary: Sequence[str], lower: bool,
             max_tokens: int) -> Alignment:
    """:func:`align`, refusing trees with no sentence to score; errors name the trees."""
    try:
        alignment = align(trees, vocabulary, lower, max_tokens=max_tokens)
        if not alignment.sentences:
            raise NothingToScore(f"no sentence to score: {alignment.why_empty()}")
    except ValueError as err:  # (NothingToScore included)
        raise type(err)(f"{name} trees: {err}") from None
    return alignment


def compare_with_syntax(predictor, trees: Sequence[GoldTree],
                        select_trees: Optional[Sequence[GoldTree]] = None,
                        vocabulary: Optional[Sequence[str]] = None, lower: bool = True,
                        exclude_punct: bool = True, metric: str = "undirected",
                        untrained: bool = True, seed: int = 0, batch_size: int = 64,
                        max_tokens: int = 512, beyond_adjacent: bool = False
                        ) -> SyntaxComparison:
    """Score ``predictor`` on ``trees``, choosing the single graph per direction on
    ``select_trees`` (by ``metric``; on ``trees`` themselves if not given, which the
    report notes), beside the baselines and, with ``untrained``, the same architecture
    freshly initialised (seeded). ``beyond_adjacent`` scores (and chooses on) only the
    targets with a gold neighbour other than their adjacent word (:func:`syntax_scores`)."""
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
    if not -(1 << 63) <= seed < (1 << 64):  # what torch.manual_seed accepts
        raise ValueError(f"seed must lie in [-2**63, 2**64), got {seed}")
    vocabulary = vocabulary if vocabulary is not None else getattr(predictor, "vocabulary", None)
    if vocabulary is None:
        raise ValueError("the predictor carries no vocabulary: pass vocabulary=")
    # both sets of trees are aligned (and checked) before any scoring, which takes a while
    ev_align, sel_align = (None if t is None else _aligned(name, t, vocabulary, lower, max_tokens)
                           for name, t in (("evaluation", trees), ("selection", select_trees)))
    options = dict(exclude_punct=exclude_punct, batch_size=batch_size,
                   beyond_adjacent=beyond_adjacent)
    evaluation = syntax_scores(predictor, ev_align, **options)
    notes = []
    selection = None
    if sel_align is not None:
        try:
            selection = syntax_scores(predictor, sel_align, **options)
        except NothingToScore as err:  # (a fault of the model passes through as it is)
            raise NothingToScore(f"selection trees: {err}") from None
        chosen = {d: selection.directions[d].best(metric)[:2] for d in evaluation.directions}
    else:
        chosen = {d: s.best(metric)[:2] for d, s in evaluation.directions.items()}
        notes.append("note: the graph was chosen on the evaluation trees themselves "
                     "(pass selection trees for an unbiased choice)")
    fresh = syntax_scores(untrained_copy(predictor, seed), ev_align, **options) \
        if untrained else None
    return SyntaxComparison(evaluation, fresh, selection, chosen, metric, notes)
