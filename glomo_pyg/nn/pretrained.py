"""The pretrained graph predictor that transfer uses: both directions of g, plus the
vocabulary it reads (paper Sec. 2.2: after pretraining, f is discarded)."""
from __future__ import annotations

import copy
from typing import List, Optional, Sequence, Union

import torch
from torch import Tensor

from glomo_pyg.nn.feature_predictor import FeaturePredictor
from glomo_pyg.nn.glomo import _KEY, DirectionalGraphs, Glomo
from glomo_pyg.nn.graph_predictor import GraphPredictor
from glomo_pyg.sequences import sequence_batch

GraphSource = Union[GraphPredictor, FeaturePredictor]


def _direction_of(module: GraphSource) -> str:
    return module.direction if isinstance(module, GraphPredictor) else module.scorer.direction


class PretrainedGraphPredictor(torch.nn.Module):
    r"""The graph predictor :math:`g` of both directions, as transfer uses it.

    Each direction is a :class:`GraphPredictor` or, for the "-decouple"
    ablation, a :class:`FeaturePredictor` with ``decouple=False`` (whose
    graphs come from its own states). Both directions must agree on layers,
    heads and input (token ids from the same vocabulary, or features of the
    same width). ``vocabulary`` (token strings, id = index) travels with the
    weights, so downstream data can be encoded the way the predictor reads it.

    Build one from a trained :class:`Glomo` with :meth:`from_glomo`, persist it
    with :meth:`save_pretrained` and restore it with :meth:`from_pretrained`
    (a JSON config plus safetensors weights; nothing is unpickled).

    Args:
        forward_predictor, backward_predictor: the two directions (either may
            be ``None``, not both).
        vocabulary (sequence of str, optional): one string per token id.

    Shapes:
        - **input:** units :math:`(N)` token ids or :math:`(N, F)` features,
          sorted batch vector :math:`(N)`
        - **output:** :class:`~glomo_pyg.DirectionalGraphs`
    """

    def __init__(self, forward_predictor: Optional[GraphSource] = None,
                 backward_predictor: Optional[GraphSource] = None,
                 vocabulary: Optional[Sequence[str]] = None):
        super().__init__()
        self.predictors = torch.nn.ModuleDict()
        for direction, module in (("forward", forward_predictor), ("backward", backward_predictor)):
            if module is None:
                continue
            if isinstance(module, FeaturePredictor) and module.scorer is None:
                raise TypeError("a FeaturePredictor emits graphs only with decouple=False; "
                                "pass the GraphPredictor instead")
            if not isinstance(module, (GraphPredictor, FeaturePredictor)):
                raise TypeError(f"{direction} predictor must be a GraphPredictor or a "
                                f"FeaturePredictor(decouple=False), got {type(module).__name__}")
            if _direction_of(module) != direction:
                raise ValueError(f"the {direction} predictor was built for direction "
                                 f"{_direction_of(module)!r}")
            self.predictors[_KEY[direction]] = module
        if not len(self.predictors):
            raise ValueError("give at least one of forward_predictor and backward_predictor")
        first = next(iter(self.predictors.values()))
        for module in self.predictors.values():
            mine = (module.num_layers, module.heads, module.encoder.num_tokens,
                    module.encoder.in_channels, self._include_self(module))
            theirs = (first.num_layers, first.heads, first.encoder.num_tokens,
                      first.encoder.in_channels, self._include_self(first))
            if mine != theirs:
                raise ValueError("the two directions disagree on (layers, heads, num_tokens, "
                                 f"in_channels, include_self): {theirs} vs {mine}")
        if vocabulary is not None:
            vocabulary = [str(t) for t in vocabulary]
            if self.num_tokens is None:
                raise ValueError("a vocabulary is only meaningful for a predictor that reads "
                                 "token ids")
            if len(vocabulary) != self.num_tokens:
                raise ValueError(f"the vocabulary has {len(vocabulary)} entries, the predictor "
                                 f"embeds {self.num_tokens} token ids")
        self.vocabulary: Optional[List[str]] = vocabulary

    @staticmethod
    def _include_self(module: GraphSource) -> bool:
        return module.scorer.include_self

    @classmethod
    def from_glomo(cls, model: Glomo, vocabulary: Optional[Sequence[str]] = None) -> "PretrainedGraphPredictor":
        """The graph-emitting parts of a pretrained :class:`Glomo` (copied; the
        feature predictor and decoders are left behind, as the paper discards
        :math:`f`), in eval mode."""
        sources = model.graph_predictors if model.decouple else model.feature_predictors
        parts = {d: copy.deepcopy(sources[_KEY[d]]) for d in model.directions}
        return cls(parts.get("forward"), parts.get("backward"), vocabulary).eval()

    # --- description --------------------------------------------------------------
    @property
    def directions(self) -> tuple:
        return tuple(d for d in ("forward", "backward") if _KEY[d] in self.predictors)

    def predictor(self, direction: str) -> GraphSource:
        if direction not in self.directions:
            raise ValueError(f"this predictor has directions {self.directions}, not {direction!r}")
        return self.predictors[_KEY[direction]]

    @property
    def num_layers(self) -> int:
        return self.predictor(self.directions[0]).num_layers

    @property
    def heads(self) -> int:
        return self.predictor(self.directions[0]).heads

    @property
    def include_self(self) -> bool:
        return self._include_self(self.predictor(self.directions[0]))

    @property
    def num_tokens(self) -> Optional[int]:
        return self.predictor(self.directions[0]).encoder.num_tokens

    @property
    def in_channels(self) -> Optional[int]:
        return self.predictor(self.directions[0]).encoder.in_channels

    # --- graphs -------------------------------------------------------------------
    def forward(self, x: Tensor, batch: Optional[Tensor] = None) -> DirectionalGraphs:
        encoder = self.predictor(self.directions[0]).encoder
        encoder.check(x)
        sequences = sequence_batch(x.size(0), batch, x.device)
        out = {}
        for d in self.directions:
            module = self.predictors[_KEY[d]]
            if isinstance(module, GraphPredictor):
                out[d] = module.from_sequences(x, sequences)
            else:
                out[d] = module.from_sequences(x, sequences)[1]
        return DirectionalGraphs(out.get("forward"), out.get("backward"))

    def encode(self, tokens: Sequence[str], unknown: Optional[str] = None) -> Tensor:
        """Token ids ``[len(tokens)]`` of strings in this predictor's vocabulary;
        strings not in it map to ``unknown`` (an error if ``None``)."""
        if self.vocabulary is None:
            raise ValueError("this predictor has no vocabulary")
        index = {t: i for i, t in enumerate(self.vocabulary)}
        fallback = index.get(unknown) if unknown is not None else None
        if unknown is not None and fallback is None:
            raise ValueError(f"the unknown token {unknown!r} is not in the vocabulary")
        ids = []
        for t in tokens:
            i = index.get(t, fallback)
            if i is None:
                raise ValueError(f"token {t!r} is not in the vocabulary (pass unknown=...)")
            ids.append(i)
        return torch.tensor(ids, dtype=torch.long, device=self._device())

    def _device(self) -> torch.device:
        return next(self.parameters()).device

    # --- persistence (implemented in glomo_pyg.io.pretrained) ---------------------
    def save_pretrained(self, path) -> None:
        """Write ``config.json`` and ``model.safetensors`` into directory ``path``;
        see :func:`glomo_pyg.io.save_pretrained`."""
        from glomo_pyg.io.pretrained import save_pretrained
        save_pretrained(self, path)

    @classmethod
    def from_pretrained(cls, path, map_location=None,
                        vocabulary: Optional[Sequence[str]] = None) -> "PretrainedGraphPredictor":
        """Load a predictor written by :meth:`save_pretrained` (eval mode); see
        :func:`glomo_pyg.io.load_pretrained`."""
        from glomo_pyg.io.pretrained import load_pretrained
        return load_pretrained(path, map_location=map_location, vocabulary=vocabulary)

    def __repr__(self) -> str:
        inner = ", ".join(f"{d}={self.predictors[_KEY[d]]!r}" for d in self.directions)
        vocab = f", vocabulary={len(self.vocabulary)} tokens" if self.vocabulary else ""
        return f"{self.__class__.__name__}({inner}{vocab})"
