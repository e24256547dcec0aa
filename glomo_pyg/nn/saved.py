"""Building a saved predictor's emitters from its config, checked before anything is
built at its real size: the module side of the format that :mod:`glomo_pyg.io.pretrained`
reads (docs/design.md lists the checks in order)."""
from __future__ import annotations

import contextlib
import inspect
import itertools
import threading
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Tuple, Type, cast

import torch

from glomo_pyg.graphs import DIRECTION_KEYS
from glomo_pyg.io.pretrained import (
    WEIGHTS_NAME,
    PretrainedFormatError,
    describe_value,
    first_items,
)
from glomo_pyg.nn.emitter import EMITTERS, GraphEmitter
from glomo_pyg.nn.settings import check_model_setting, saved_settings

if TYPE_CHECKING:
    from pathlib import Path

Entries = Dict[str, Tuple[Type[GraphEmitter], Dict[str, Any]]]


def _legacy_entry(entry: Any) -> Any:
    """A format-1 direction entry (``cls`` + ``kwargs``) as format 2."""
    if not isinstance(entry, dict) or not isinstance(entry.get("kwargs"), dict):
        return entry
    kwargs = {k: v for k, v in entry["kwargs"].items() if k != "layout"}
    emitter = entry.get("cls") == "FeaturePredictor" and kwargs.get("decouple") is False
    if emitter:
        del kwargs["decouple"]
    return dict(cls="FeatureGraphEmitter" if emitter else entry.get("cls"), config=kwargs)


def _missing_arguments(cls: Type[GraphEmitter], config: Dict[str, Any]) -> List[str]:
    """Constructor arguments of ``cls`` that a format-2 ``config`` should hold but lacks."""
    params = inspect.signature(cls.__init__).parameters
    # (settings added after format 2 appeared: their defaults reproduce what files saved
    # without them did; any other missing one means an edited or truncated file)
    added = set(saved_settings(cls.settings, which=("optional",)))
    return sorted(name for name, p in params.items() if name != "self" and p.kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        and name not in config and name not in added)


def saved_entry(direction: str, entry: Any, file: Path,
                version: int) -> Tuple[Type[GraphEmitter], Dict[str, Any]]:
    """The emitter class and checked config of a direction entry of format ``version``:
    the config may hold the class's saved settings (:attr:`GraphEmitter.settings`), each
    within its rule, and must hold every constructor argument but those added later."""
    entry = _legacy_entry(entry) if version == 1 else entry
    known = isinstance(entry, dict) and isinstance(entry.get("cls"), str) and \
        entry["cls"] in EMITTERS and isinstance(entry.get("config"), dict)
    cls, config = (EMITTERS[entry["cls"]], entry["config"]) if known else (None, {})
    saved = saved_settings(cls.settings) if cls is not None else ()
    unknown = sorted(k for k in config if k not in saved)
    missing = _missing_arguments(cast(Type[GraphEmitter], cls), config) \
        if known and version >= 2 else []
    if not known or unknown or missing:
        raise PretrainedFormatError(
            f"{file}: the {direction} entry must name one of {sorted(EMITTERS)} with its "
            "config" if not known else
            f"{file}: cannot build the {direction} {cast(type, cls).__name__} from its config: "
            + "; ".join(f"{what} arguments {first_items(names)}" for what, names in (
                ("unknown", unknown), ("it lacks", missing)) if names)
            + " (the file was edited or truncated)")
    assert cls is not None  # (known)
    for key, value in config.items():
        check_model_setting(key, value, PretrainedFormatError,
                            f"{file}: {direction} {cls.__name__} config: {key}",
                            cls.settings, show=describe_value, typed=True)
    return cls, config


class _TooManyTensors(Exception):
    pass


@contextlib.contextmanager
def _registration_budget(limit: int) -> Iterator[None]:
    """Raise :class:`_TooManyTensors` past ``limit`` modules and tensors built here."""
    from torch.nn.modules import module as nn_module

    thread, count = threading.get_ident(), itertools.count(1)

    def hook(*args):
        if threading.get_ident() == thread and next(count) > limit:
            raise _TooManyTensors

    handles = [nn_module.register_module_module_registration_hook(hook),
               nn_module.register_module_parameter_registration_hook(hook),
               nn_module.register_module_buffer_registration_hook(hook)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def build_emitter(direction: str, cls: Type[GraphEmitter], config: Dict[str, Any],
                  file: Path, budget: Optional[int] = None) -> GraphEmitter:
    """The emitter of ``config``; with ``budget``, on the meta device and bounded."""
    try:
        if budget is None:
            return cls.from_config(dict(config))
        with _registration_budget(budget), torch.device("meta"):
            return cls.from_config(dict(config))
    except (_TooManyTensors, TypeError, ValueError, OverflowError, RuntimeError) as err:
        raise PretrainedFormatError(
            f"{file}: the {direction} {cls.__name__} config describes far more tensors than "
            f"{WEIGHTS_NAME} holds" if isinstance(err, _TooManyTensors) else
            f"{file}: cannot build the {direction} {cls.__name__} from its config ({err})"
        ) from None


def expected_tensors(entries: Entries, header: Dict[str, Tuple], file: Path,
                     config_file: Path) -> Dict[str, torch.Tensor]:
    """The tensors the config describes (on the meta device), which must be the
    ``header``'s (names and shapes) of the weights ``file``."""
    budget = 8 * len(header) + 256  # modules and non-persistent buffers included
    expected = torch.nn.ModuleDict({
        DIRECTION_KEYS[d]: build_emitter(d, cls, c, config_file, budget)
        for d, (cls, c) in entries.items()}).state_dict()
    missing = sorted(set(expected) - set(header))
    unexpected = sorted(k[:60] for k in set(header) - set(expected))
    shapes = [f"{k}: file {header[k]} vs config {tuple(expected[k].shape)}"
              for k in sorted(set(expected) & set(header)) if header[k] != expected[k].shape]
    parts = [f"{what} {first_items(items)}" for what, items in (
        ("missing tensors", missing), ("unexpected tensors", unexpected)) if items]
    parts += ["shape mismatch " + "; ".join(shapes[:5])] if shapes else []
    if parts:
        raise PretrainedFormatError(f"{file} does not match {config_file}: " + "; ".join(parts))
    return expected
