"""Modules that can be rebuilt from their constructor arguments."""
from __future__ import annotations

import copy
import functools
import inspect
from typing import Any, Dict, Type, TypeVar

import numpy as np
import torch

_JSON_SCALARS = (type(None), bool, int, float, str)
_M = TypeVar("_M", bound="ConfigurableModule")


def _plain(value: Any, where: str) -> Any:
    """``value`` as plain JSON data (tuples become lists, numpy scalars Python numbers)."""
    if isinstance(value, np.generic) and isinstance(value.item(), _JSON_SCALARS):
        value = value.item()  # (e.g. a size read from an array; np.float64 is a float)
    if isinstance(value, _JSON_SCALARS):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v, where) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _plain(v, where) for k, v in value.items()}
    raise TypeError(f"{where}: constructor argument of type {type(value).__name__} cannot be "
                    "saved in a config (only JSON values)")


class ConfigurableModule(torch.nn.Module):
    """A module whose outermost constructor's arguments are recorded (defaults filled in,
    ``**kwargs`` flattened), so that :meth:`config` returns exactly what rebuilds it with
    :meth:`from_config`. Only plain JSON values can be saved."""

    _config: Dict[str, Any]

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        if init is None:
            return
        signature = inspect.signature(init)

        @functools.wraps(init)
        def recorded(self: ConfigurableModule, *args: Any, **kw: Any) -> None:
            if "_config" not in self.__dict__:  # the outermost constructor records
                bound = signature.bind(self, *args, **kw)
                bound.apply_defaults()
                values: Dict[str, Any] = {}
                for name, value in list(bound.arguments.items())[1:]:
                    kind = signature.parameters[name].kind
                    if kind is inspect.Parameter.VAR_KEYWORD:
                        values.update(value)
                    elif kind is not inspect.Parameter.VAR_POSITIONAL:  # (no module has *args)
                        values[name] = value
                object.__setattr__(self, "_config", values)
            init(self, *args, **kw)

        cls.__init__ = recorded

    def config(self) -> Dict[str, Any]:
        """The constructor arguments of this module, as plain JSON data."""
        return _plain(copy.deepcopy(self._config), type(self).__name__)

    @classmethod
    def from_config(cls: Type[_M], config: Dict[str, Any]) -> _M:
        """A new module (freshly initialised) built from :meth:`config`'s output."""
        params = inspect.signature(cls.__init__).parameters
        open_ended = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        keyed = isinstance(config, dict) and all(isinstance(k, str) for k in config)
        unknown = [] if open_ended or not keyed else sorted(set(config) - set(params) - {"self"})
        if not keyed or unknown:
            raise TypeError(f"a {cls.__name__} config must be a dict with string keys naming "
                            "its constructor arguments"
                            + (f"; it has no arguments {unknown}" if unknown else ""))
        return cls(**config)
