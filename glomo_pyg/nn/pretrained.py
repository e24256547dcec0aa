"""The pretrained graph predictor that transfer uses: both directions of g, plus the
vocabulary it reads (paper Sec. 2.2: after pretraining, f is discarded)."""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from glomo_pyg.graphs import DIRECTION_KEYS as _KEY
from glomo_pyg.graphs import DirectionalGraphs
from glomo_pyg.nn.emitter import GraphEmitter
from glomo_pyg.sequences import sequence_batch

# Saving and loading live in glomo_pyg.io (nn holds no file I/O and does not import
# io); io registers its two functions here when it is imported, which importing
# glomo_pyg always does.
_PERSISTENCE: Dict[str, Callable] = {}


def register_persistence(save: Callable, load: Callable) -> None:
    _PERSISTENCE.update(save=save, load=load)


class PretrainedGraphPredictor(torch.nn.Module):
    r"""The graph predictor :math:`g` of both directions, as transfer uses it.

    Each direction is a graph emitter (:class:`~glomo_pyg.nn.emitter.GraphEmitter`):
    a :class:`GraphPredictor` or, for the "-decouple" ablation, a
    :class:`~glomo_pyg.nn.FeatureGraphEmitter` (whose graphs come from its own
    states). Both directions must agree on layers,
    heads and input (token ids from the same vocabulary, or features of the
    same width). ``vocabulary`` (token strings, id = index) travels with the
    weights, so downstream data can be encoded the way the predictor reads it.

    Build one from a trained :class:`Glomo` with :meth:`Glomo.to_pretrained`,
    persist it with :meth:`save_pretrained` and restore it with
    :meth:`from_pretrained` (a JSON config plus safetensors weights; nothing is
    unpickled; implemented in :mod:`glomo_pyg.io`). The graph layout is a
    run-time choice: :meth:`set_layout`.

    Args:
        forward_predictor, backward_predictor: the two directions (either may
            be ``None``, not both).
        vocabulary (sequence of str, optional): one string per token id.
        trained_length (int, optional): the longest sequence the predictor was
            pretrained on (``glomo pretrain`` records ``corpus.max_length``). A learned
            distance term (``position='relative'``) has never seen distances of this
            length or more; :class:`GlomoTransfer` warns when it reads longer sequences
            without ``max_distance``.
        trained_size (tuple of int, optional): pixel predictors: the ``(height,
            width)`` of the images or crops they were pretrained on (``glomo pretrain``
            records ``corpus.crop``), each side at least 2. A learned offset term
            (``position='grid'``) has never seen row offsets of ``height`` or column
            offsets of ``width`` or more; :class:`GlomoTransfer` warns when it reads larger
            images without a ``max_distance`` of at most ``min(trained_size) - 1`` (the
            square window, conservative for crops that are not square).

    Shapes:
        - **input:** units :math:`(N)` token ids or :math:`(N, F)` features,
          sorted batch vector :math:`(N)`
        - **output:** :class:`~glomo_pyg.DirectionalGraphs`
    """

    # (modules pickled before these existed)
    trained_length: Optional[int] = None
    trained_size: Optional[Tuple[int, int]] = None

    def __init__(self, forward_predictor: Optional[GraphEmitter] = None,
                 backward_predictor: Optional[GraphEmitter] = None,
                 vocabulary: Optional[Sequence[str]] = None,
                 trained_length: Optional[int] = None,
                 trained_size: Optional[Sequence[int]] = None):
        super().__init__()
        if trained_length is not None and (isinstance(trained_length, bool) or
                                           not isinstance(trained_length, int) or
                                           trained_length < 2):
            raise ValueError(f"trained_length must be an integer >= 2 (units) or None, got "
                             f"{trained_length!r}")
        self.trained_length = trained_length
        if trained_size is not None:
            size = tuple(trained_size) if isinstance(trained_size, (tuple, list)) else ()
            if len(size) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) and
                                         2 <= v <= 1 << 20 for v in size):
                raise ValueError(f"trained_size must be (height, width), two integers in "
                                 f"[2, 2^20] (pixels), or None, got {trained_size!r}")
            trained_size = size
        self.trained_size = trained_size
        self.predictors = torch.nn.ModuleDict()
        for direction, module in (("forward", forward_predictor), ("backward", backward_predictor)):
            if module is None:
                continue
            if not isinstance(module, GraphEmitter):
                raise TypeError(f"{direction} predictor must be a graph emitter (GraphPredictor, "
                                f"FeatureGraphEmitter, ...), got {type(module).__name__}")
            if module.direction != direction:
                raise ValueError(f"the {direction} predictor was built for direction "
                                 f"{module.direction!r}")
            self.predictors[_KEY[direction]] = module
        if not len(self.predictors):
            raise ValueError("give at least one of forward_predictor and backward_predictor")
        first = next(iter(self.predictors.values()))
        for module in self.predictors.values():
            mine = (module.num_layers, module.heads, module.num_tokens, module.in_channels,
                    module.include_self)
            theirs = (first.num_layers, first.heads, first.num_tokens, first.in_channels,
                      first.include_self)
            if mine != theirs:
                raise ValueError("the two directions disagree on (layers, heads, num_tokens, "
                                 f"in_channels, include_self): {theirs} vs {mine}")
        self.vocabulary = self._checked_vocabulary(vocabulary)

    def _checked_vocabulary(self, vocabulary: Optional[Sequence[str]]) -> Optional[List[str]]:
        if isinstance(vocabulary, str):  # would be one token per character
            raise TypeError("vocabulary must be a sequence of token strings, not one string")
        if vocabulary is None:
            return None
        vocabulary = [str(t) for t in vocabulary]
        seen: set = set()  # (a token listed twice: encode() would pick one id silently)
        twice = next((t for t in vocabulary if t in seen or seen.add(t)), None)
        if self.num_tokens is None or len(vocabulary) != self.num_tokens or twice is not None:
            raise ValueError(f"the vocabulary lists {twice!r} more than once"
                             if twice is not None else f"the vocabulary has {len(vocabulary)} "
                             f"entries, the predictor embeds {self.num_tokens or 'no'} token ids")
        return vocabulary

    # --- description --------------------------------------------------------------
    @property
    def directions(self) -> tuple:
        return tuple(d for d in ("forward", "backward") if _KEY[d] in self.predictors)

    def predictor(self, direction: str) -> GraphEmitter:
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
        return self.predictor(self.directions[0]).include_self

    @property
    def num_tokens(self) -> Optional[int]:
        return self.predictor(self.directions[0]).num_tokens

    @property
    def in_channels(self) -> Optional[int]:
        return self.predictor(self.directions[0]).in_channels

    @property
    def learned_distance(self) -> bool:
        """Whether a direction scores with a learned distance term
        (``position='relative'`` or ``'grid'``, not all zero: an untrained one is), which
        is only trained up to :attr:`trained_length` (:attr:`trained_size` for images)."""
        for d in self.directions:
            scorer = getattr(self.predictor(d), "scorer", None)
            if getattr(scorer, "position", None) in ("relative", "grid") and \
                    bool(scorer.position_coef.detach().ne(0).any()):
                return True
        return False

    def resized(self, height: int, width: int) -> "PretrainedGraphPredictor":
        """Pixel predictors only: the same graph predictors for ``height x width`` images
        (see :meth:`PixelGraphPredictor.resized`)."""
        parts = {}
        for d in self.directions:
            emitter = self.predictor(d)
            if not hasattr(emitter, "resized"):
                raise TypeError(f"{type(emitter).__name__} has no image size to change")
            parts[d] = emitter.resized(height, width)
        return PretrainedGraphPredictor(parts.get("forward"), parts.get("backward"),
                                        self.vocabulary, self.trained_length, self.trained_size
                                        ).train(self.training)

    def set_layout(self, layout: str) -> "PretrainedGraphPredictor":
        """Emit graphs in ``layout`` (``'sparse'``, ``'dense'`` or ``'auto'``) from now
        on, in both directions; same graphs, different speed (not saved)."""
        for module in self.predictors.values():
            module.set_layout(layout)
        return self

    # --- graphs -------------------------------------------------------------------
    def forward(self, x: Tensor, batch: Optional[Tensor] = None,
                layout: Optional[str] = None) -> DirectionalGraphs:
        self.predictor(self.directions[0]).check_input(x)
        sequences = sequence_batch(x.size(0), batch, x.device)
        out = {d: self.predictors[_KEY[d]].emit(x, sequences, layout) for d in self.directions}
        return DirectionalGraphs(out.get("forward"), out.get("backward"))

    def encode(self, tokens: Sequence[str], unknown: Optional[str] = None) -> Tensor:
        """Token ids ``[len(tokens)]`` of strings in this predictor's vocabulary;
        strings not in it map to ``unknown`` (an error if ``None``)."""
        index = {t: i for i, t in enumerate(self.vocabulary or ())}
        fallback = index.get(unknown)
        missing = [t for t in ([unknown] if unknown is not None else tokens) if t not in index]
        if missing or self.vocabulary is None:
            raise ValueError(f"token {(missing or [None])[0]!r} is not in the vocabulary ("
                             + ("this predictor has none)" if self.vocabulary is None else
                                "given as unknown)" if unknown is not None else
                                "pass unknown=...)"))
        return torch.tensor([index.get(t, fallback) for t in tokens], dtype=torch.long,
                            device=self._device())

    def _device(self) -> torch.device:
        return next(self.parameters()).device

    # --- persistence (implemented in glomo_pyg.io.pretrained) ---------------------
    def save_pretrained(self, path, dtype: Optional[torch.dtype] = None) -> None:
        """Write ``config.json`` and ``model.safetensors`` into directory ``path``;
        ``dtype=torch.float16`` stores the floating-point weights in half the bytes. See
        :func:`glomo_pyg.io.save_pretrained`."""
        _PERSISTENCE["save"](self, path, dtype=dtype)

    @classmethod
    def from_pretrained(cls, name_or_path, map_location=None,
                        vocabulary: Optional[Sequence[str]] = None,
                        allow_unsealed: bool = False) -> "PretrainedGraphPredictor":
        """Load a predictor written by :meth:`save_pretrained` (eval mode, float32), or
        a released predictor by name; see :func:`glomo_pyg.io.load_pretrained`.

        Args:
            name_or_path: the predictor's folder, or the name of a released predictor
                (``glomo pretrained`` lists them): a string that is a bare name
                (``'imdb-text-cpu'``, not ``'./imdb-text-cpu'``) and no existing
                path.
            map_location: the device to load onto (default: CPU).
            vocabulary: if given, it must equal the saved vocabulary.
            allow_unsealed: load a predictor of format 1 or 2 (not sealed), with a
                warning; without it such a predictor is refused (``glomo reseal``).

        Raises:
            PretrainedFormatError: the folder or its files are missing or invalid, or a
                bare name is neither a folder nor a released predictor (the message
                lists the released ones).
        """
        return _PERSISTENCE["load"](name_or_path, map_location=map_location,
                                    vocabulary=vocabulary, allow_unsealed=allow_unsealed)

    def __repr__(self) -> str:
        inner = ", ".join(f"{d}={self.predictors[_KEY[d]]!r}" for d in self.directions)
        vocab = f", vocabulary={len(self.vocabulary)} tokens" if self.vocabulary else ""
        trained = f", trained_length={self.trained_length}" if self.trained_length else ""
        if self.trained_size:
            trained += f", trained_size={self.trained_size}"
        return f"{self.__class__.__name__}({inner}{vocab}{trained})"
