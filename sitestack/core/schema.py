"""Turn parsed YAML into frozen dataclasses, checking every key against the type hints.

``build(cls, node, where)`` walks the fields of dataclass ``cls``: unknown keys, missing
required keys, wrong types and values outside a ``Literal`` are :class:`InputError` naming
``file:line`` and the dotted key. Supported field types: ``str``, ``int``, ``float``,
``bool``, ``Literal[...]``, ``X | None``, ``tuple[X, ...]`` (from a YAML list),
``Mapping[str, X]`` (from a YAML mapping, stored read-only) and nested dataclasses.

A field's ``metadata["doc"]`` is its one-line documentation (``docs/`` is generated from it
where useful); ``metadata["yaml"]`` names the YAML key when it differs from the field
name (YAML keys use dashes or reserved words Python cannot).

Strings are one line: a control character (newline, carriage return, NUL, ...) is an error
naming file, line and key (:func:`sitestack.core.quoting.control_problem`), because values end
up in generated shell, Lua and Tcl text. A field whose ``metadata["multiline"]`` is true (prose,
and argv items that never meet a shell) may hold several lines. Numbers must be finite.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import re
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

from sitestack.core.errors import InputError
from sitestack.core.quoting import control_problem
from sitestack.core.yamlfile import MarkedDict, MarkedList

T = TypeVar("T")


def yaml_key(field: dataclasses.Field[Any]) -> str:
    """The YAML key of a dataclass field."""
    return str(field.metadata.get("yaml", field.name))


class _Where:
    """Where a node is: file, line and dotted key path."""

    def __init__(self, file: str, line: int, key: str) -> None:
        self.file, self.line, self.key = file, line, key

    def child(self, key: str | int, line: int | None) -> _Where:
        path = f"{self.key}[{key}]" if isinstance(key, int) else (f"{self.key}.{key}" if self.key else key)
        return _Where(self.file, line or self.line, path)

    def error(self, message: str) -> InputError:
        return InputError(f"{self.file}:{self.line}", message, key=self.key or None)


def build(cls: type[T], node: Any, file: str, *, line: int | None = None, key: str = "") -> T:
    """Build dataclass ``cls`` from ``node`` (a :class:`MarkedDict`), validating as it goes."""
    where = _Where(file, line if line is not None else getattr(node, "line", 1), key)
    built: T = _convert(cls, node, where)
    return built


def _describe(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    kind = {str: "a string", bool: "a boolean", int: "an integer", float: "a number"}.get(type(value))
    if kind:
        return f"{kind} ({value!r})"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return type(value).__name__


def _not_a_choice(choices: tuple[Any, ...], value: Any) -> str:
    """Why ``value`` is none of ``choices``: a value of the choices' own type is shown as it is (the
    type is right, the value is not) with the closest choice when one is close; another type is named."""
    shown = ", ".join(repr(c) for c in choices)
    if not any(type(c) is type(value) for c in choices):
        return f"must be one of {shown}, not {_describe(value)}"
    close = difflib.get_close_matches(value, [c for c in choices if isinstance(c, str)], n=1) \
        if isinstance(value, str) else []
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"must be one of {shown}, not {value!r}{hint}"


_NO_META: Mapping[str, Any] = types.MappingProxyType({})


def _bounds(value: float, meta: Mapping[str, Any], where: _Where) -> None:
    low, high = meta.get("min"), meta.get("max")
    if low is not None and value < low:
        raise where.error(f"must be at least {low}, not {value}")
    if high is not None and value > high:
        raise where.error(f"must be at most {high}, not {value}")


def _convert(tp: Any, value: Any, where: _Where, meta: Mapping[str, Any] = _NO_META) -> Any:
    """``value`` as ``tp``, checked against the field's metadata ``meta``: strings must be one line
    unless ``multiline`` and match ``pattern`` (a regex, described by ``pattern_doc``) when given;
    ``min``/``max`` bound numbers; ``key_pattern`` (a regex) and ``key_doc``
    constrain the keys of a mapping."""
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        return _convert_union(tp, value, where, meta)
    if origin is Literal:
        choices = get_args(tp)
        if value not in choices:
            raise where.error(_not_a_choice(choices, value))
        return value
    if origin is tuple:
        (item_type, _ellipsis) = get_args(tp)
        if not isinstance(value, list):
            raise where.error(f"expected a list, got {_describe(value)}")
        lines = getattr(value, "lines", [])
        return tuple(
            _convert(item_type, item, where.child(i, lines[i] if i < len(lines) else None), meta)
            for i, item in enumerate(value)
        )
    if origin in (Mapping, typing.Mapping, dict) or tp is Mapping:
        return _convert_mapping(get_args(tp)[1], value, where, meta)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _build_dataclass(tp, value, where)
    if tp in (bool, int, float, str):
        return _convert_scalar(tp, value, where, meta)
    if tp is Any:
        return value
    raise TypeError(f"schema: unsupported field type {tp!r}")  # a bug in a dataclass, not bad input


def _convert_union(tp: Any, value: Any, where: _Where, meta: Mapping[str, Any]) -> Any:
    """``value`` as the first option of the union ``tp`` it fits (None where the union allows it)."""
    options = [a for a in get_args(tp) if a is not type(None)]
    if value is None and len(options) < len(get_args(tp)):
        return None
    if len(options) == 1:
        return _convert(options[0], value, where, meta)
    errors = []
    for option in options:
        try:
            return _convert(option, value, where, meta)
        except InputError as exc:
            errors.append(exc.detail)
    raise where.error(" or ".join(errors))


def _convert_mapping(value_type: Any, value: Any, where: _Where, meta: Mapping[str, Any]) -> Any:
    """A read-only mapping of string keys (one line each, matching ``key_pattern``) to ``value_type``."""
    if not isinstance(value, dict):
        raise where.error(f"expected a mapping, got {_describe(value)}")
    lines = getattr(value, "lines", {})
    out = {}
    for k, v in value.items():
        child = where.child(str(k), lines.get(k))
        if not isinstance(k, str):
            raise child.error(f"keys must be strings, got {_describe(k)}")
        problem = control_problem(k)
        if problem:
            raise child.error(f"key {problem}")
        pattern = meta.get("key_pattern")
        if pattern is not None and not re.fullmatch(pattern, k):
            raise child.error(f"{k!r} is not {meta.get('key_doc', 'a valid key')}")
        out[k] = _convert(value_type, v, child, meta)
    return types.MappingProxyType(out)


def _convert_scalar(tp: type, value: Any, where: _Where, meta: Mapping[str, Any]) -> Any:
    """A bool, int, float (finite) or str (one line unless ``multiline``; ``pattern``) checked against ``meta``."""
    if tp is bool:
        if not isinstance(value, bool):
            raise where.error(f"expected true or false, got {_describe(value)}")
        return value
    if tp is int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise where.error(f"expected an integer, got {_describe(value)}")
        _bounds(value, meta, where)
        return value
    if tp is float:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise where.error(f"expected a number, got {_describe(value)}")
        if not math.isfinite(value):
            raise where.error(f"expected a finite number, got {value!r}")
        _bounds(value, meta, where)
        return float(value)
    if not isinstance(value, str):
        raise where.error(f"expected a string, got {_describe(value)}")
    if not meta.get("multiline"):
        problem = control_problem(value)
        if problem:
            raise where.error(problem)
    if meta.get("pattern") and not re.fullmatch(meta["pattern"], value):
        raise where.error(f"{value!r} is not {meta.get('pattern_doc', 'in the expected form')}")
    return value


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """The resolved annotations of a dataclass, once per class (``get_type_hints`` evaluates every
    string annotation again on each call: a no-op provision spent a fifth of its time there)."""
    return get_type_hints(cls)


def _build_dataclass(cls: type, value: Any, where: _Where) -> Any:
    if not isinstance(value, dict):
        raise where.error(f"expected a mapping, got {_describe(value)}")
    hints = _hints(cls)
    fields = {yaml_key(f): f for f in dataclasses.fields(cls) if f.init}
    lines = getattr(value, "lines", {})
    for key in value:
        if key not in fields:
            known = ", ".join(sorted(fields))
            raise where.child(str(key), lines.get(key)).error(f"unknown key (known keys: {known})")
    kwargs = {}
    for name, field in fields.items():
        if name not in value:
            if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
                raise where.error(f"missing required key '{name}'")
            continue
        kwargs[field.name] = _convert(hints[field.name], value[name], where.child(name, lines.get(name)),
                                      field.metadata)
    obj = cls(**kwargs)
    check = getattr(obj, "check", None)
    if check is not None:
        problem = check()
        if problem:
            raise where.error(problem)
    return obj


def line_of(node: Any, key: str | int | None = None) -> int:
    """The line of ``node`` (or of its ``key``/item) when it came from :func:`load_yaml`."""
    if key is None:
        return getattr(node, "line", 0)
    if isinstance(node, MarkedDict):
        return node.lines.get(key, node.line)
    if isinstance(node, MarkedList) and isinstance(key, int) and key < len(node.lines):
        return node.lines[key]
    return getattr(node, "line", 0)
