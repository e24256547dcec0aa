"""A seeded synthetic corpus with planted long-range dependencies.

Vocabulary (``num_tokens = F + S*V + S + V``): ``F`` fillers (a sparse Markov chain over
a per-sequence *topic* of fillers), triggers ``trigger(s, v)`` (slot ``s``, value ``v``),
cues ``cue(s)`` and dependents ``dependent(v)``. A planted dependency is
``trigger(s, v)`` at ``p``, ``cue(s)`` at ``p + d - 1`` and ``dependent(v)`` at ``p + d``
(each slot at most once per sequence): with GLoMo's objective (position ``t`` predicts
``x_{t+1..t+D}``), the cue at ``p + d - 1`` is the *reader* that must read the trigger."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List

import numpy as np
import torch
from torch_geometric.data import Data


@dataclass(frozen=True)
class Vocabulary:
    """Token-id layout of a :class:`PlantedDependencyCorpus`."""

    num_filler: int
    num_slots: int
    num_values: int

    @property
    def num_tokens(self) -> int:
        s, v = self.num_slots, self.num_values
        return self.num_filler + s * v + s + v

    def trigger(self, slot: int, value: int) -> int:
        return self.num_filler + slot * self.num_values + value

    def cue(self, slot: int) -> int:
        return self.num_filler + self.num_slots * self.num_values + slot

    def dependent(self, value: int) -> int:
        return self.num_filler + self.num_slots * self.num_values + self.num_slots + value

    def tokens(self) -> List[str]:
        """A readable string per token id (``filler3``, ``trigger1=2``, ``cue1``, ``dep2``),
        e.g. node labels for :meth:`~glomo_pyg.LatentGraphs.to_networkx`."""
        out = [f"filler{f}" for f in range(self.num_filler)]
        out += [f"trigger{s}={v}" for s in range(self.num_slots) for v in range(self.num_values)]
        out += [f"cue{s}" for s in range(self.num_slots)]
        return out + [f"dep{v}" for v in range(self.num_values)]


class PlantedDependencyCorpus(torch.utils.data.Dataset):
    r"""Seeded synthetic sequences: item ``i``, a pure function of ``(seed, start + i)``,
    is a :class:`~torch_geometric.data.Data` with ``x`` (``[T]`` int64 token ids) and
    ``source`` (``[T]`` int64: a dependent's trigger position, ``-1`` elsewhere).

    Args:
        num_sequences (int): corpus size.
        min_length, max_length (int): sequence length range (inclusive).
        num_filler, num_slots, num_values (int): vocabulary layout.
        min_distance, max_distance (int): trigger -> dependent distance range.
        dependencies (int): planted dependencies per sequence (fewer when crowded).
        topic_size (int): fillers per sequence topic (``num_filler``: no topics).
        seed (int): corpus seed (language and items).
        start (int): global index of item 0 (disjoint ranges of one seed: splits of one
            filler language).
    """

    def __init__(self, num_sequences: int = 4000, min_length: int = 48, max_length: int = 64,
                 num_filler: int = 40, num_slots: int = 8, num_values: int = 8,
                 min_distance: int = 4, max_distance: int = 24, dependencies: int = 4,
                 topic_size: int = 10, seed: int = 0, start: int = 0):
        if not (start >= 0 and num_sequences >= 1 and 2 <= min_length <= max_length
                and 2 <= min_distance <= max_distance < min_length
                and min(num_filler, num_slots, num_values) >= 1 and dependencies <= num_slots
                and 1 <= topic_size <= num_filler):
            raise ValueError("need start >= 0, num_sequences >= 1, 2 <= min_length <= "
                             "max_length, 2 <= min_distance <= max_distance < min_length, at "
                             "least one token of each kind, dependencies <= num_slots and "
                             f"topic_size in [1, num_filler = {num_filler}]")
        self.topic_size = topic_size
        self.num_sequences, self.min_length, self.max_length = num_sequences, min_length, max_length
        self.min_distance, self.max_distance = min_distance, max_distance
        self.dependencies, self.seed, self.start = dependencies, seed, start
        self.vocab = Vocabulary(num_filler, num_slots, num_values)
        rng = np.random.default_rng([seed, 0x5EED])
        # Sparse Markov chain over fillers: 4 preferred successors carry 80% of the mass.
        trans = np.full((num_filler, num_filler), 0.2 / num_filler)
        k = min(4, num_filler)
        for a in range(num_filler):
            trans[a, rng.choice(num_filler, size=k, replace=False)] += 0.8 / k
        self.transitions = trans / trans.sum(1, keepdims=True)

    @property
    def num_tokens(self) -> int:
        return self.vocab.num_tokens

    def __len__(self) -> int:
        return self.num_sequences

    def __getitem__(self, index: int) -> Data:
        if not 0 <= index < self.num_sequences:
            raise IndexError(f"index {index} out of range for {self.num_sequences} sequences")
        tokens, source = self.generate(index)
        return Data(x=torch.from_numpy(tokens), source=torch.from_numpy(source),
                    num_nodes=len(tokens))

    def generate(self, index: int):
        """Tokens and trigger positions (-1: not a dependent), ``[T]`` each, of item ``index``."""
        rng = np.random.default_rng([self.seed, self.start + index])
        length = int(rng.integers(self.min_length, self.max_length + 1))
        tokens = np.full(length, -1, dtype=np.int64)
        source = np.full(length, -1, dtype=np.int64)
        slots = rng.permutation(self.vocab.num_slots)[: self.dependencies]
        for slot in slots:
            for _ in range(20):  # rejection-sample free positions
                dist = int(rng.integers(self.min_distance, self.max_distance + 1))
                start = int(rng.integers(0, length - dist))
                spots = (start, start + dist - 1, start + dist)
                if all(tokens[p] < 0 for p in spots):
                    value = int(rng.integers(self.vocab.num_values))
                    tokens[start] = self.vocab.trigger(int(slot), value)
                    tokens[start + dist - 1] = self.vocab.cue(int(slot))
                    tokens[start + dist] = self.vocab.dependent(value)
                    source[start + dist] = start
                    break
        topic = np.sort(rng.choice(self.vocab.num_filler, size=self.topic_size, replace=False))
        prev = -1
        for p in range(length):
            if tokens[p] < 0:
                if 0 <= prev < self.vocab.num_filler:
                    probs = self.transitions[prev, topic]
                    tokens[p] = topic[rng.choice(len(topic), p=probs / probs.sum())]
                else:
                    tokens[p] = topic[rng.integers(len(topic))]
            prev = tokens[p]
        return tokens, source

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}({self.num_sequences} sequences, length "
                f"{self.min_length}-{self.max_length}, vocab={self.num_tokens}, distance "
                f"{self.min_distance}-{self.max_distance}, seed={self.seed}, start={self.start})")
