"""Typed settings, declared once: a :func:`setting` is a dataclass field whose metadata
holds its :class:`Rule` and documentation (docs/design.md, "Settings"); and
:func:`check_int`, the one integer check of constructor arguments. Plain stdlib."""
from __future__ import annotations

import collections.abc
import contextlib
import dataclasses
import math
import operator
import os
import reprlib
import typing
from typing import Any, Callable, Dict, Literal, Mapping, Optional, Tuple, Type, TypeVar, Union

_SHORT = reprlib.Repr()
_SHORT.maxstring, _SHORT.maxother, _SHORT.maxlist, _SHORT.maxdict, _SHORT.maxlevel = \
    80, 80, 6, 6, 3

T = TypeVar("T")


@typing.overload
def check_int(name: str, value: Any, low: int = ..., high: Optional[int] = ...,
              below: Optional[int] = ..., *, optional: Literal[False] = ...,
              unit: str = ...) -> int: ...


@typing.overload
def check_int(name: str, value: Any, low: int = ..., high: Optional[int] = ...,
              below: Optional[int] = ..., *, optional: bool, unit: str = ...
              ) -> Optional[int]: ...


def check_int(name: str, value: Any, low: int = 1, high: Optional[int] = None,
              below: Optional[int] = None, *, optional: bool = False,
              unit: str = "") -> Optional[int]:
    """``value`` as an ``int`` (not a bool) in ``[low, high]`` or ``[low, below)``, or
    ``None`` where ``optional``; ``ValueError`` otherwise."""
    if value is None and optional:
        return None
    try:
        number = None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        number = None
    end = below if high is None else high + 1
    if number is None or number < low or (end is not None and number >= end):
        bounds = (f">= {low}" if end is None else f"in [{low}, {high}]" if below is None
                  else f"in [{low}, {below})")
        raise ValueError(f"{name} must be {'None or ' if optional else ''}an integer "
                         f"{bounds}{unit}, got {value!r}")
    return number


def short_repr(value: Any) -> str:
    """A bounded repr for error messages (a hostile value must not make them huge)."""
    return _SHORT.repr(value)


def _finite(value: Any) -> bool:
    """A number (not a boolean) that is a finite float."""
    try:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and \
            math.isfinite(value)
    except OverflowError:  # an integer beyond the float range
        return False


class Rule:
    """What one setting may hold.

    Args:
        kind: ``int``, ``float`` (finite; an int or a number written as text such as
            ``'1e-3'`` is accepted), ``bool``, ``str``, ``list`` (of finite numbers) or
            ``dict`` (a mapping, whose entries the consumer checks).
        low, high: the range of a number (inclusive unless ``low_open`` / ``high_open``).
        optional: ``None`` is allowed.
        choices: the allowed strings (a tuple, or a callable returning one, for choices
            known only at run time such as Lightning's accelerators).
        max_length: longest string, or most list entries.
        note: said after the description in errors (e.g. ``"0: no clipping"``).
    """

    def __init__(self, kind: type, low=None, high=None, low_open: bool = False,
                 high_open: bool = False, optional: bool = False, choices=None,
                 max_length: Optional[int] = None, note: str = ""):
        self.kind, self.low, self.high = kind, low, high
        self.low_open, self.high_open, self.optional = low_open, high_open, optional
        self.choices, self.max_length, self.note = choices, max_length, note

    def replace(self, **changes) -> "Rule":
        return Rule(**{**vars(self), **changes})

    def allowed_choices(self) -> Optional[Tuple]:
        return self.choices() if callable(self.choices) else self.choices

    def describe(self) -> str:
        """The rule in words, as errors and the docs say it."""
        most = f"at most {self.max_length} " if self.max_length is not None else ""
        text = "one of " + ", ".join(map(repr, typing.cast(Tuple, self.allowed_choices()))) \
            if self.choices is not None else {
                bool: "true or false", dict: "a mapping", list: f"a list of {most}finite numbers",
                str: f"a string of {most}characters" if most else "a string",
            }.get(self.kind) or self._describe_number()
        return text + (" or null" if self.optional else "") + \
            (f" ({self.note})" if self.note else "")

    def _describe_number(self) -> str:
        article, noun = ("an", "integer") if self.kind is int else ("a", "number")
        low, high = self.low, self.high
        if low is None:
            return "an integer" if self.kind is int else "a finite number"
        if high is not None:
            return (f"{article} {noun} in {'(' if self.low_open else '['}{low}, {high}"
                    f"{')' if self.high_open else ']'}")
        if (low == 0 and self.low_open) or (low == 1 and self.kind is int):
            return f"a positive {noun}"
        return f"a non-negative {noun}" if low == 0 else f"{article} {noun} >= {low}"

    def check(self, key: str, value, error: Type[Exception] = ValueError,
              show: Callable[[Any], str] = short_repr, typed: bool = False):
        """``value`` normalised if it obeys the rule, else ``error`` naming ``key``;
        ``typed``: a JSON value, so text is never read as a number or a number as a choice."""
        if value is None and self.optional:
            return None
        ok, normalised = self._normalise(value, typed)
        if not ok:
            raise error(f"{key} must be {self.describe()}, got {show(value)}")
        return normalised

    def _normalise(self, value, typed: bool) -> Tuple[bool, Any]:
        """``(obeys the rule, the value normalised)``."""
        if self.choices is not None:
            if not typed and isinstance(value, int) and not isinstance(value, bool) and \
                    str(value) in typing.cast(Tuple, self.allowed_choices()):
                value = str(value)  # precision: 32
            return isinstance(value, str) and \
                value in typing.cast(Tuple, self.allowed_choices()), value
        if self.kind is bool:
            return isinstance(value, bool), value
        if self.kind is str:
            if isinstance(value, os.PathLike):
                value = os.fspath(value)
            return isinstance(value, str) and (self.max_length is None or
                                               len(value) <= self.max_length), value
        if self.kind is dict:
            return isinstance(value, Mapping), dict(value) if isinstance(value, Mapping) else value
        if self.kind is list:
            ok = isinstance(value, (list, tuple)) and \
                (self.max_length is None or len(value) <= self.max_length) and \
                all(map(_finite, value))
            return ok, list(value) if ok else value
        if self.kind is float and isinstance(value, str) and not typed:
            with contextlib.suppress(ValueError):  # YAML 1.1 reads '1e-3' as a string
                value = float(value)
        ok = _finite(value) and (self.kind is float or isinstance(value, int)) and \
            (self.low is None or value > self.low or (value == self.low and not self.low_open)) \
            and (self.high is None or value < self.high or
                 (value == self.high and not self.high_open))
        return ok, float(value) if ok and self.kind is float else value

    def __repr__(self) -> str:
        return f"Rule({self.describe()!r})"


# Far above the cores of any real machine: torch accepts any count, then crashes
# (a segmentation fault at 100,000 threads).
MAX_THREADS = 1024
#: torch's CPU thread count (``--threads``, ``train.threads``).
THREADS = Rule(int, low=0, high=MAX_THREADS, note="0: torch's default")


class DevicesRule(Rule):
    """Lightning's ``devices``: 'auto', a count, -1 (all), '0,1' or a list of indices."""

    def __init__(self):
        super().__init__(str)

    def describe(self) -> str:
        return ("'auto', a positive integer (a device count), -1 (all devices), a list of "
                "device indices or a string such as '0,1'")

    def _normalise(self, value, typed: bool) -> Tuple[bool, Any]:
        ok = (isinstance(value, str) and value.strip() != "") or \
            (isinstance(value, int) and not isinstance(value, bool) and
             (value >= 1 or value == -1)) or \
            (isinstance(value, list) and bool(value) and
             all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value))
        return ok, value


_MISSING = dataclasses.MISSING


def setting(default: Any = _MISSING, *, factory: Optional[Callable[[], Any]] = None,
            rule: Optional[Rule] = None, doc: str = "", saved: Union[bool, str] = True,
            **rule_args) -> Any:
    """A dataclass field declaring a setting: default (or ``factory``), :class:`Rule`
    (given, or from ``rule_args`` and the type hint) and a one-line ``doc``. ``saved``
    (model settings, :mod:`glomo_pyg.nn.settings`): whether a saved predictor's config
    holds it (``'optional'``: added after files were first written, which lack it and
    mean its default; ``False``: a setting of pretraining only, never saved)."""
    metadata = dict(doc=doc, rule=rule, rule_args=rule_args, saved=saved)
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def _rule_from_hint(hint) -> Rule:
    """The bare rule of a type hint: ``int``, ``Optional[float]``, ``Sequence[float]``..."""
    optional = False
    if typing.get_origin(hint) is Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        optional = len(args) < len(typing.get_args(hint))
        hint = args[0] if len(args) == 1 else Any
    origin = typing.get_origin(hint)
    if origin in (list, tuple, collections.abc.Sequence) or hint in (list, tuple):
        return Rule(list, optional=optional)
    if hint in (int, float, bool, str):
        return Rule(hint, optional=optional)
    raise TypeError(f"no rule for a setting of type {hint!r}: declare one with setting(rule=...)")


def rules(cls: type) -> Dict[str, Rule]:
    """Every field of the settings dataclass ``cls`` with its :class:`Rule` (cached)."""
    if "_settings_rules" not in cls.__dict__:
        hints = typing.get_type_hints(cls)
        typing.cast(Any, cls)._settings_rules = {  # (cached on the class)
            f.name: f.metadata.get("rule") or
            _rule_from_hint(hints[f.name]).replace(**(f.metadata.get("rule_args") or {}))
            for f in dataclasses.fields(cls)}
    return typing.cast(Any, cls)._settings_rules


def documentation(cls: type) -> Dict[str, Tuple[Any, str, str]]:
    """``{name: (default, rule in words, doc)}`` of a settings dataclass, for docs and
    ``--print-config``."""
    out = {}
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not _MISSING else (
            f.default_factory() if f.default_factory is not _MISSING else None)
        rule = rules(cls)[f.name]
        # choices known only at run time (the installed Lightning's) are described by
        # their function's docstring, so the reference does not depend on the machine
        allowed = rule.describe() if not (callable(rule.choices) and rule.choices.__doc__) \
            else f"one of {rule.choices.__doc__.strip()}{' or null' if rule.optional else ''}"
        out[f.name] = (default, allowed, f.metadata.get("doc", ""))
    return out


def check_settings(obj: Any, section: str = "", error: Type[Exception] = ValueError) -> None:
    """Check and normalise every field of the settings dataclass instance ``obj`` in place."""
    for name, rule in rules(type(obj)).items():
        key = f"{section}.{name}" if section else name
        setattr(obj, name, rule.check(key, getattr(obj, name), error))


def from_mapping(cls: Type[T], data: Optional[Mapping[str, Any]], section: str = "",
                 base: Optional[T] = None, error: Type[Exception] = ValueError) -> T:
    """An instance of the settings dataclass ``cls`` from a mapping, starting from ``base``
    (default: ``cls()``); unknown keys and bad values raise ``error`` naming the key."""
    data = {} if data is None else data
    allowed = rules(cls)
    unknown = sorted(str(k) for k in data if k not in allowed) \
        if isinstance(data, Mapping) else []
    if unknown or not isinstance(data, Mapping):
        where = f"{section} " if section else ""
        raise error(f"unknown {where}settings {unknown}; allowed: {sorted(allowed)}" if unknown
                    else f"{section or 'the settings'} must be a mapping of settings, got "
                         f"{short_repr(data)}")
    out: T = dataclasses.replace(typing.cast(Any, base if base is not None else cls()),
                                 **dict(data))
    check_settings(out, section, error)
    return out


def set_by_path(data: Dict[str, Any], dotted: str, value: Any) -> None:
    """``set_by_path(cfg, 'train.lr', 0.01)``: a command-line override of a nested key."""
    keys = dotted.split(".")
    if not all(keys):
        raise ValueError(f"{dotted!r} is not a setting name (e.g. train.max_steps)")
    node = data
    for depth, key in enumerate(keys[:-1]):
        if node.get(key) is None:
            node[key] = {}
        node = node[key]
        if not isinstance(node, dict):
            raise ValueError(f"cannot set {dotted}: {'.'.join(keys[:depth + 1])} is not a "
                             f"section but the value {short_repr(node)}")
    node[keys[-1]] = value
