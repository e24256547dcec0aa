"""The pretrained graph predictor that transfer uses: both directions of g and their
vocabulary (paper Sec. 2.2)."""
from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple, Union, cast

import torch
from torch import Tensor

from glomo_pyg.digests import weights_digest
from glomo_pyg.graphs import DIRECTION_KEYS as _KEY
from glomo_pyg.graphs import DirectionalGraphs, LatentGraphs
from glomo_pyg.io import hub
from glomo_pyg.io.pretrained import (
    WEIGHTS_NAME,
    PathLike,
    PretrainedFormatError,
    SavedFolder,
    check_release,
    check_vocabulary,
    open_saved,
    write_predictor,
)
from glomo_pyg.nn.emitter import GraphEmitter
from glomo_pyg.nn.saved import build_emitter, expected_tensors, saved_entry
from glomo_pyg.sequences import sequence_batch
from glomo_pyg.tokenizer import tokenize as split_text

if TYPE_CHECKING:
    from pathlib import Path

def _shared(name: str) -> property:
    """A property both directions agree on, read from the first."""
    return property(lambda self: getattr(self.predictor(self.directions[0]), name),
                    doc=f"The predictors' ``{name}``.")


class PretrainedGraphPredictor(torch.nn.Module):
    r"""The graph predictor :math:`g` of both directions, as transfer uses it.

    Each direction is a graph emitter (:class:`~glomo_pyg.nn.emitter.GraphEmitter`);
    both must agree on layers, heads and input. ``vocabulary`` (token strings, id =
    index) travels with the weights. Build one with :meth:`Glomo.to_pretrained`, persist
    it with :meth:`save_pretrained` and restore it with :meth:`from_pretrained`.

    Args:
        forward_predictor, backward_predictor: the two directions (one may be ``None``).
        vocabulary (sequence of str, optional): one string per token id.
        trained_length (int, optional): the longest sequence the predictor was
            pretrained on (:class:`GlomoTransfer` warns beyond it).
        trained_size (tuple of int, optional): pixel predictors: the ``(height, width)``
            of the images or crops they were pretrained on (each side at least 2).
        lowercase (bool, optional): whether the vocabulary was built from lower-cased
            text (``corpus.lower`` of ``glomo pretrain``); :meth:`encode` then lower-cases
            the tokens it is given. ``None`` (a vocabulary saved before this was
            recorded): inferred, ``True`` when no token of the vocabulary holds an
            upper-case letter.

    Shapes:
        - **input:** units :math:`(N)` token ids or :math:`(N, F)` features,
          sorted batch vector :math:`(N)`
        - **output:** :class:`~glomo_pyg.DirectionalGraphs`
    """

    # (modules pickled before these existed)
    trained_length: Optional[int] = None
    trained_size: Optional[Tuple[int, int]] = None
    lowercase: Optional[bool] = None

    def __init__(self, forward_predictor: Optional[GraphEmitter] = None,
                 backward_predictor: Optional[GraphEmitter] = None,
                 vocabulary: Optional[Sequence[str]] = None,
                 trained_length: Optional[int] = None,
                 trained_size: Optional[Sequence[int]] = None,
                 lowercase: Optional[bool] = None):
        super().__init__()
        bad_length = trained_length is not None and (isinstance(trained_length, bool) or
                                                      not isinstance(trained_length, int) or
                                                      trained_length < 2)
        size = tuple(trained_size) if isinstance(trained_size, (tuple, list)) else ()
        bad_size = trained_size is not None and (len(size) != 2 or not all(
            isinstance(v, int) and not isinstance(v, bool) and 2 <= v <= 1 << 20 for v in size))
        if bad_length or bad_size:
            raise ValueError(f"trained_length must be an integer >= 2 (units) or None, and "
                             f"trained_size must be (height, width), two integers in [2, 2^20] "
                             f"(pixels), or None; got {trained_length!r} and {trained_size!r}")
        self.trained_length = trained_length
        self.trained_size = None if trained_size is None else size
        self.predictors = torch.nn.ModuleDict()
        given = {d: m for d, m in (("forward", forward_predictor),
                                   ("backward", backward_predictor)) if m is not None}
        for direction, module in given.items():
            if not isinstance(module, GraphEmitter):
                raise TypeError(f"{direction} predictor must be a graph emitter (GraphPredictor, "
                                f"FeatureGraphEmitter, ...), got {type(module).__name__}")
            self.predictors[_KEY[direction]] = module
        if not given:
            raise ValueError("give at least one of forward_predictor and backward_predictor")
        dims = {d: (m.num_layers, m.heads, m.num_tokens, m.in_channels, m.include_self)
                for d, m in given.items()}
        disagree = len(set(dims.values())) > 1
        if disagree or any(m.direction != d for d, m in given.items()):
            raise ValueError("each predictor must be built for its direction, and both must "
                             "agree on (layers, heads, num_tokens, in_channels, include_self); "
                             "got " + ", ".join(f"the {d} predictor was built for direction "
                                                f"{m.direction!r} with {dims[d]}"
                                                for d, m in given.items())
                             + ("; the two directions disagree" if disagree else ""))
        if isinstance(vocabulary, str):  # would be one token per character
            raise TypeError("vocabulary must be a sequence of token strings, not one string")
        self.vocabulary = None if vocabulary is None else [str(t) for t in vocabulary]
        seen: set = set()  # (a token listed twice would make encode() pick one id)
        twice: Optional[str] = None
        for t in self.vocabulary or ():
            if t in seen:
                twice = t
                break
            seen.add(t)
        if self.vocabulary is not None and (self.num_tokens is None or twice is not None or
                                            len(self.vocabulary) != self.num_tokens):
            raise ValueError(f"the vocabulary lists {twice!r} more than once"
                             if twice is not None else f"the vocabulary has {len(self.vocabulary)} "
                             f"entries, the predictor embeds {self.num_tokens or 'no'} token ids")
        if lowercase is not None and not isinstance(lowercase, bool):
            raise TypeError(f"lowercase must be True, False or None, got {lowercase!r}")
        # (inferred for vocabularies saved before it was recorded: a lower-cased build
        # holds no upper-case letter, a cased one of real text almost surely does)
        self.lowercase = lowercase if lowercase is not None or self.vocabulary is None else \
            all(t == t.lower() for t in self.vocabulary)

    @property
    def directions(self) -> tuple:
        return tuple(d for d in ("forward", "backward") if _KEY[d] in self.predictors)

    def predictor(self, direction: str) -> GraphEmitter:
        if direction not in self.directions:
            raise ValueError(f"this predictor has directions {self.directions}, not {direction!r}")
        return cast(GraphEmitter, self.predictors[_KEY[direction]])  # (checked in __init__)

    num_layers = _shared("num_layers")
    heads = _shared("heads")
    include_self = _shared("include_self")
    num_tokens = _shared("num_tokens")
    in_channels = _shared("in_channels")

    @property
    def image_size(self) -> Optional[Tuple[int, int]]:
        """``(height, width)`` of the images a pixel predictor reads (:meth:`resized`
        changes it); ``None`` for predictors of sequences."""
        emitter = self.predictor(self.directions[0])
        height = getattr(emitter, "height", None)  # (the pixel emitters' own size)
        return None if height is None else cast(Tuple[int, int], (height, emitter.width))

    @property
    def modality(self) -> str:
        """What the predictor reads, the one answer every caller uses: ``'pixels'``
        (uint8 images of :attr:`image_size`), ``'text'`` (token ids of its vocabulary) or
        ``'features'`` (float features per unit)."""
        if self.image_size is not None:
            return "pixels"
        return "text" if self.num_tokens is not None else "features"

    def fingerprint(self) -> str:
        """SHA-256 (hex) of the configuration, vocabulary and weights: two predictors
        that can emit different graphs have different fingerprints. Every cache of graphs
        (:class:`~glomo_pyg.transforms.GraphsDataset`,
        :class:`~glomo_pyg.transforms.TextGraphCache`) keys on it."""
        parts = {d: [type(self.predictor(d)).__name__, self.predictor(d).config()]
                 for d in self.directions}
        return weights_digest([parts, self.vocabulary, self.trained_length, self.trained_size],
                              self.predictors.state_dict())

    @property
    def learned_distance(self) -> bool:
        """Whether a direction scores with a trained (not all-zero) learned distance term
        (``position='relative'`` or ``'grid'``)."""
        scorers: List[Any] = [getattr(self.predictor(d), "scorer", None)
                              for d in self.directions]
        return any(getattr(s, "position", None) in ("relative", "grid") and
                   bool(s.position_coef.detach().ne(0).any()) for s in scorers)

    def extrapolation_warning(self, units: Union[int, Tuple[int, int]],
                              max_distance: Optional[int] = None,
                              owner: str = "GlomoTransfer") -> Optional[str]:
        """The warning for graphs of ``units`` (the longest sequence's length, or the
        ``(height, width)`` of the images), or ``None`` when none is due: when a learned
        distance term would score offsets beyond those of its pretraining
        (:attr:`trained_length`, :attr:`trained_size`) and ``max_distance`` does not cut
        them. Every path that emits graphs (``owner`` names it) warns with this rule."""
        trained = self.trained_size if isinstance(units, tuple) else self.trained_length
        if trained is None or not self.learned_distance:
            return None
        if isinstance(units, tuple):
            assert self.trained_size is not None
            docs = "docs/images.md, 'Crops and the window'"
            (h, w) = self.trained_size
            window = min(h, w) - 1  # the offsets the term saw along both axes
            larger, seen = units[0] > h or units[1] > w, f"{h}x{w} images"
            now = f"{units[0]}x{units[1]} images"
            far = f"row or column offsets of {window + 1} or more"
        else:
            assert self.trained_length is not None
            docs = "docs/training.md, 'Position information in the scores'"
            window = self.trained_length - 1
            seen = f"sequences of at most {self.trained_length}"
            larger, now = units > self.trained_length, f"sequences of up to {units} units"
            far = f"sources {window + 1} or more units away"
        if not larger or (max_distance is not None and max_distance <= window):
            return None
        return (f"{owner}: {now}, but the predictor's learned distance term was pretrained on "
                f"{seen}: its scores for {far} are extrapolations. Pass "
                f"max_distance={window} to keep only the distances it learned ({docs}).")

    def resized(self, height: int, width: int) -> "PretrainedGraphPredictor":
        """Pixel predictors only: the same predictors for ``height x width`` images."""
        parts = {}
        for d in self.directions:
            emitter: Any = self.predictor(d)  # (a pixel emitter, to have resized())
            if not hasattr(emitter, "resized"):
                raise TypeError(f"{type(emitter).__name__} has no image size to change")
            parts[d] = emitter.resized(height, width)
        return PretrainedGraphPredictor(parts.get("forward"), parts.get("backward"),
                                        self.vocabulary, self.trained_length, self.trained_size,
                                        self.lowercase).train(self.training)

    def set_layout(self, layout: str) -> "PretrainedGraphPredictor":
        """Emit graphs in ``layout`` from now on (same graphs; not saved)."""
        for module in self.predictors.values():
            cast(GraphEmitter, module).set_layout(layout)
        return self

    def forward(self, x: Tensor, batch: Optional[Tensor] = None,
                layout: Optional[str] = None) -> DirectionalGraphs:
        self.predictor(self.directions[0]).check_input(x)
        sequences = sequence_batch(x.size(0), batch, x.device)
        out = {d: cast(LatentGraphs, cast(GraphEmitter, self.predictors[_KEY[d]]).emit(
            x, sequences, layout)) for d in self.directions}
        return DirectionalGraphs(out.get("forward"), out.get("backward"))

    def encode(self, tokens: Union[str, Sequence[str]], unknown: Optional[str] = None,
               tokenize: bool = False) -> Tensor:
        """Token ids ``[len(tokens)]`` of ``tokens`` in this predictor's vocabulary, each
        lower-cased first when the vocabulary was (:attr:`lowercase`).

        Args:
            tokens: a sequence of token strings; a text (one string) only with
                ``tokenize=True``.
            unknown (str, optional): the vocabulary's token for those not in it
                (``'<unk>'`` in vocabularies of ``glomo pretrain``); ``None``: such a
                token raises.
            tokenize (bool): split the text ``tokens`` into tokens with
                :func:`glomo_pyg.data.tokenize`, the rules ``glomo pretrain`` builds its
                vocabulary with (docs/text.md). (default: :obj:`False`)

        Raises:
            TypeError: a string without ``tokenize=True`` (it would be read character by
                character), or ``tokenize=True`` without a string.
            ValueError: no vocabulary, ``unknown`` not in it, or (``unknown=None``)
                tokens not in it.

        Warns:
            UserWarning: more than half of the tokens are not in the vocabulary (text
                split otherwise than the vocabulary was built?).
        """
        tokens = self._tokens(tokens, tokenize)
        index: Dict[str, int] = {t: i for i, t in enumerate(self.vocabulary or ())}
        if self.vocabulary is None or (unknown is not None and unknown not in index):
            raise ValueError("this predictor has no vocabulary" if self.vocabulary is None else
                             f"unknown={unknown!r} is not in the vocabulary; give its token "
                             "for unknown words" + self._unknown_hint(index))
        keys = [t.lower() if self.lowercase else t for t in tokens]
        missing = [t for t, k in zip(tokens, keys) if k not in index]
        if missing and unknown is None:
            shown = ", ".join(repr(t) for t in missing[:5]) + (", ..." if len(missing) > 5 else "")
            raise ValueError(f"{len(missing)} of {len(tokens)} tokens are not in the "
                             f"vocabulary ({shown}): pass unknown=... to map them to the "
                             f"vocabulary's token for unknown words" + self._unknown_hint(index))
        if len(missing) * 2 > len(tokens):
            warnings.warn(f"{len(missing)} of {len(tokens)} tokens are not in the vocabulary "
                          f"and map to {unknown!r}: was the text split as the vocabulary was "
                          "built (encode(text, tokenize=True))?", UserWarning, stacklevel=2)
        fallback = index[unknown] if unknown is not None else -1  # (never used then)
        return torch.tensor([index.get(k, fallback) for k in keys], dtype=torch.long,
                            device=next(self.parameters()).device)

    def _tokens(self, tokens: Union[str, Sequence[str]], tokenize: bool) -> Sequence[str]:
        """The tokens :meth:`encode` looks up: ``tokens``, or the text ``tokens`` split."""
        if isinstance(tokens, str) != bool(tokenize):
            raise TypeError("encode(text, tokenize=True) splits a text; without tokenize it "
                            "takes a sequence of tokens, not a string (which it would read "
                            "character by character): pass a list of tokens, or "
                            "tokenize=True" if isinstance(tokens, str) else
                            "tokenize=True splits a text: give one string, got "
                            f"{type(tokens).__name__}")
        if tokenize:
            return split_text(cast(str, tokens), lower=bool(self.lowercase))
        return tokens

    @staticmethod
    def _unknown_hint(index: Dict[str, int]) -> str:
        return " (here unknown='<unk>')" if "<unk>" in index else ""

    def save_pretrained(self, path, dtype: Optional[torch.dtype] = None) -> None:
        """Write ``config.json`` and ``model.safetensors`` into directory ``path``
        (:func:`~glomo_pyg.save_pretrained`); ``dtype=torch.float16`` halves the bytes."""
        save_pretrained(self, path, dtype=dtype)

    @classmethod
    def from_pretrained(cls, name_or_path, map_location=None,
                        vocabulary: Optional[Sequence[str]] = None,
                        allow_unsealed: bool = False,
                        revision: Optional[str] = None) -> "PretrainedGraphPredictor":
        """Load a predictor written by :meth:`save_pretrained` (eval mode, float32), a
        released predictor by name, or one on the Hugging Face Hub
        (``'hf://owner/name'``); see :func:`~glomo_pyg.load_pretrained`.

        Args:
            name_or_path: the predictor's folder, the bare name of a released predictor
                (``glomo pretrained`` lists them), or ``'hf://owner/name'``: a Hub model
                repository (always the Hub; a local folder named ``hf:`` is
                ``'./hf:/...'``), downloaded into the Hugging Face cache and loaded with
                the same checks as a folder (needs ``pip install 'glomo-pyg[hub]'``).
            map_location: the device to load onto (default: CPU).
            vocabulary: if given, it must equal the saved vocabulary.
            allow_unsealed: load an unsealed predictor (format 1 or 2) with a warning.
            revision: ``hf://`` names only: a branch, tag or commit (default: main).

        Raises:
            PretrainedFormatError: the folder or its files are missing or invalid, or a
                bare name is neither a folder nor a released predictor; for ``hf://``
                names, :class:`~glomo_pyg.io.hub.HubError` (a subclass) when the Hub or
                its cache cannot give the predictor.
        """
        return load_pretrained(name_or_path, map_location=map_location, vocabulary=vocabulary,
                               allow_unsealed=allow_unsealed, revision=revision)

    def push_to_hub(self, repo_id: str, *, revision: Optional[str] = None,
                    private: Optional[bool] = None, token: Union[str, bool, None] = None,
                    commit_message: str = "Upload a GLoMo graph predictor",
                    card: Optional[Dict[str, Any]] = None) -> Any:
        """Upload this predictor to the Hugging Face Hub model repository ``repo_id``
        (``'owner/name'``, created if missing) in one commit: ``config.json`` and
        ``model.safetensors`` as :meth:`save_pretrained` writes them, and a ``README.md``
        model card with the Hub's YAML front matter. Load it back with
        ``from_pretrained('hf://owner/name')``; see :func:`glomo_pyg.io.hub.push_to_hub`.

        Args:
            repo_id: the repository, ``'owner/name'``.
            revision: the branch to commit to (default: main).
            private: make a new repository private (``None``: the Hub's default).
            token: a Hub token (default: the logged-in one, or ``$HF_TOKEN``).
            commit_message: the commit's message.
            card: model card fields (:data:`glomo_pyg.io.releases.CARD_FIELDS`, all
                optional here, plus ``datasets`` and ``metrics``): the card says only
                what it is given and what the predictor shows.

        Returns:
            :class:`~glomo_pyg.io.hub.HubPush`: the repository, revision, commit and URL.
        """
        return hub.push_to_hub(self, repo_id, revision=revision, private=private, token=token,
                               commit_message=commit_message, card=card)

    def reset_parameters(self):
        """Re-initialise both directions' predictors (an untrained predictor, e.g. the
        baseline that pretraining is measured against); the vocabulary stays."""
        for predictor in self.predictors.values():
            cast(GraphEmitter, predictor).reset_parameters()

    def __repr__(self) -> str:
        inner = ", ".join(f"{d}={self.predictors[_KEY[d]]!r}" for d in self.directions)
        vocab = f", vocabulary={len(self.vocabulary)} tokens" if self.vocabulary else ""
        trained = f", trained_length={self.trained_length}" if self.trained_length else ""
        if self.trained_size:
            trained += f", trained_size={self.trained_size}"
        return f"{self.__class__.__name__}({inner}{vocab}{trained})"


def _saved_body(predictor: PretrainedGraphPredictor) -> Dict[str, Any]:
    """The config entries that describe ``predictor`` (the format adds its own)."""
    return dict(
        directions={d: dict(cls=type(predictor.predictor(d)).__name__,
                            config=predictor.predictor(d).config())
                    for d in predictor.directions},
        vocabulary=predictor.vocabulary,
        trained_length=predictor.trained_length,
        trained_size=None if predictor.trained_size is None else list(predictor.trained_size),
        lowercase=predictor.lowercase)


def save_pretrained(predictor: PretrainedGraphPredictor, path: PathLike,
                    dtype: Optional[torch.dtype] = None) -> Path:
    """Save ``predictor`` into directory ``path`` (weights ``<fw|bw>.<name>`` in
    ``model.safetensors``, a sealed ``config.json``:
    :func:`glomo_pyg.io.pretrained.write_predictor`), replacing it whole; return ``path``.

    Args:
        predictor: the predictor to save.
        path: the directory to write; it may hold only a saved predictor.
        dtype: store every floating-point tensor in this dtype (``torch.float16`` or
            ``torch.bfloat16`` halve the file; :func:`load_pretrained` widens them back);
            ``None`` keeps each tensor's own dtype.

    Raises:
        TypeError: ``predictor`` or ``path`` has the wrong type.
        ValueError: ``path`` is a file or holds other entries, ``dtype`` is not a storage
            dtype, or a weight is NaN or infinite (after the cast).
    """
    if not isinstance(predictor, PretrainedGraphPredictor):
        raise TypeError(f"expected a PretrainedGraphPredictor, got {type(predictor).__name__}")
    return write_predictor(path, _saved_body(predictor), predictor.predictors.state_dict(),
                           dtype)


def load_pretrained(path: PathLike,
                    map_location: Union[str, torch.device, None] = None,
                    vocabulary: Optional[Sequence[str]] = None,
                    allow_unsealed: bool = False,
                    revision: Optional[str] = None) -> PretrainedGraphPredictor:
    """Load a predictor written by :func:`save_pretrained`, in eval mode.

    Both files are untrusted and checked before any module is built at its real size
    (the checks, in order: docs/design.md).

    Args:
        path: the directory given to :func:`save_pretrained`, the name of a released
            predictor (a bare name such as ``'imdb-text-cpu'`` that is no existing path),
            or ``'hf://owner/name'``: a Hugging Face Hub model repository, downloaded
            into the Hugging Face cache (:mod:`glomo_pyg.io.hub`; always the Hub, never
            a local folder: a folder named ``hf:`` is ``'./hf:/...'``).
        map_location: device to put the weights on (default: CPU).
        vocabulary: if given, it must equal the saved vocabulary.
        allow_unsealed: load a predictor of format 1 or 2 (not sealed), with an
            :class:`~glomo_pyg.io.pretrained.UnsealedPredictorWarning` (never a
            release); without it, refused.
        revision: ``hf://`` names only: the branch, tag or commit to load (default: the
            main branch).

    Raises:
        TypeError: ``path`` is not a str or os.PathLike.
        PretrainedFormatError: a missing folder or release, a path or name holding a NUL,
            a missing, corrupt, edited or newer file, a config value of the wrong type or
            out of range, weights that do not match the config or are not finite, a
            vocabulary mismatch, or a release found under a name that is not its own (a
            renamed copy, or a card not its own); for ``hf://`` names, also its subclass
            :class:`~glomo_pyg.io.hub.HubError` for what the Hub route refuses.
    """
    if hub.is_hub_name(path):
        return _load_from_hub(cast(str, path), revision, map_location=map_location,
                              vocabulary=vocabulary, allow_unsealed=allow_unsealed)
    if revision is not None:
        raise ValueError(f"revision={revision!r} picks a commit of a Hugging Face Hub "
                         f"predictor ('hf://owner/name'); {path!r} is a folder or a release")
    _check_load_options(map_location, vocabulary)
    with open_saved(path, allow_unsealed) as saved:
        modules, weights = _saved_modules(saved)
    torch.nn.ModuleDict({_KEY[d]: m for d, m in modules.items()}).load_state_dict(
        weights, strict=True)
    config = saved.config
    if vocabulary is not None:
        check_vocabulary(vocabulary, config.get("vocabulary"), saved.config_file)
    try:
        predictor = PretrainedGraphPredictor(modules.get("forward"), modules.get("backward"),
                                             config.get("vocabulary"),
                                             config.get("trained_length"),
                                             config.get("trained_size"),
                                             config.get("lowercase"))
    except (TypeError, ValueError) as err:
        raise PretrainedFormatError(f"{saved.config_file}: {err}") from None
    if saved.release is not None:
        check_release(saved.release, saved.path, config, predictor.modality)
    if map_location is not None:
        predictor = predictor.to(map_location)
    return predictor.eval()


def _check_load_options(map_location: Any, vocabulary: Any) -> None:
    try:
        cuda = map_location is not None and torch.device(map_location).type == "cuda"
        why = ": CUDA is not available here" if cuda and not torch.cuda.is_available() else None
    except (RuntimeError, TypeError) as err:
        why = f" is not a device: {err}"
    if why is not None:
        raise ValueError(f"map_location {map_location!r}{why}")
    if vocabulary is not None and (isinstance(vocabulary, (str, bytes)) or
                                   not hasattr(vocabulary, "__iter__")):
        raise TypeError(f"vocabulary must be a sequence of tokens, got "
                        f"{type(vocabulary).__name__}")


def _saved_modules(saved: SavedFolder) -> Tuple[Dict[str, GraphEmitter], Dict[str, Tensor]]:
    """The emitters the config of ``saved`` describes (fresh) and its checked weights."""
    directions = saved.config["directions"]
    entries = {d: saved_entry(d, directions[d], saved.config_file, saved.version)
               for d in _KEY if d in directions}
    weights = saved.read_weights(lambda header: expected_tensors(
        entries, header, saved.path / WEIGHTS_NAME, saved.config_file))
    return ({d: build_emitter(d, cls, c, saved.config_file) for d, (cls, c) in entries.items()},
            weights)


def _load_from_hub(name: str, revision: Optional[str], **load: Any) -> PretrainedGraphPredictor:
    """The predictor ``name`` (``'hf://owner/name'``) at ``revision``:
    :func:`glomo_pyg.io.hub.download`, then :func:`load_pretrained` with every check
    (seal, weights' digest, settings) and, for a pushed release, its sealed model card."""
    folder = hub.download(name, revision)
    try:  # (any error is named for the repository and commit)
        predictor = load_pretrained(folder, **load)
        problem = hub.card_problem(folder, predictor.modality)
    except PretrainedFormatError as err:
        raise PretrainedFormatError(f"{name} (commit {folder.name}): {err}") from None
    if problem is not None:
        raise PretrainedFormatError(f"{name} (commit {folder.name}): {problem}")
    return predictor
