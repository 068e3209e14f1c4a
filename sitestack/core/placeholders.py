"""``{placeholder}`` strings in data files: checked at load time, filled at run time.

One implementation for playbooks and recipes. A string's placeholders are Python format
fields (``{{`` and ``}}`` write literal braces). :func:`check` refuses, at load time, any
placeholder outside the file kind's fixed set, naming file, line and key. :func:`expand`
fills them; what a known placeholder without a value becomes is the caller's explicit choice:

- ``missing="keep"``: it stays as ``{name}`` (a playbook's ``{account}`` before --account is
  given, ``{rocm_version}`` on a CUDA site: filled later, or reported where used);
- ``missing="raise"``: a :class:`SitestackError` (a recipe string must be complete to build).
"""

from __future__ import annotations

import string
from collections.abc import Collection, Mapping
from typing import Any, Literal

from sitestack.core import schema
from sitestack.core.errors import InputError, SitestackError

Missing = Literal["keep", "raise"]

_BRACES = "write {{ and }} for braces"


def names(text: str) -> list[str]:
    """The placeholder names in ``text``, in order; ValueError for bad brace syntax, and for a
    format spec or conversion (``{home:>60}``, ``{home!r}``): placeholders are plain names."""
    found = []
    for _, field, spec, conversion in string.Formatter().parse(text):
        if field is None:
            continue
        if spec or conversion:
            raise ValueError(f"{{{field}{'!' + conversion if conversion else ''}{':' + spec if spec else ''}}} "
                             "has a conversion or format spec; placeholders are plain {name}")
        found.append(field)
    return found


def check(node: Any, known: Mapping[str, str], shown: str, line: int = 1, key: str = "", *,
          skip: Collection[str] = ()) -> None:
    """Every ``{name}`` in every string of data tree ``node`` must be in ``known``.

    Keys in ``skip`` hold prose and are not checked. Raises :class:`InputError` at the string's
    ``shown:line`` and key.
    """
    if isinstance(node, dict):
        for k, v in node.items():
            if str(k) not in skip:
                check(v, known, shown, schema.line_of(node, k), f"{key}.{k}" if key else str(k), skip=skip)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            check(v, known, shown, schema.line_of(node, i), f"{key}[{i}]", skip=skip)
    elif isinstance(node, str):
        try:
            found = names(node)
        except ValueError as exc:
            raise InputError(f"{shown}:{line}", f"bad placeholder syntax in {node!r}: {exc} ({_BRACES})",
                             key=key) from None
        for name in found:
            if name not in known:
                raise InputError(f"{shown}:{line}", f"unknown placeholder {{{name}}} (known: "
                                 f"{', '.join('{' + p + '}' for p in known)}; {_BRACES})", key=key)


def expand(text: str, values: Mapping[str, str], *, missing: Missing) -> str:
    """Fill the placeholders of one string (checked at load time); ``missing`` says what a
    placeholder without a value becomes: kept as ``{name}``, or a :class:`SitestackError`."""
    try:
        parts = list(string.Formatter().parse(text))
    except ValueError as exc:
        raise SitestackError(f"bad placeholder syntax in {text!r}: {exc} ({_BRACES})") from None
    out = []
    for literal, field, _spec, _conversion in parts:
        out.append(literal)
        if field is None:
            continue
        if field in values:
            out.append(values[field])
        elif missing == "keep":
            out.append("{" + field + "}")
        else:
            raise SitestackError(f"placeholder {{{field}}} has no value on this site")
    return "".join(out)


def bind_early(text: str, values: Mapping[str, str], late: Collection[str]) -> str:
    """Fill every placeholder of ``text`` but those in ``late``, which stay ``{name}``: the result is
    still a placeholder string (literal braces stay ``{{``/``}}``), for :func:`expand` later."""
    out = []
    for literal, field, _spec, _conversion in string.Formatter().parse(text):
        out.append(_escape(literal))
        if field is None:
            continue
        if field in late or field not in values:
            out.append("{" + field + "}")
        else:
            out.append(_escape(values[field]))
    return "".join(out)


def _escape(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


def expand_all(node: Any, values: Mapping[str, str], *, missing: Missing) -> Any:
    """Fill placeholders in every string of a plain data tree (dicts, lists, scalars)."""
    if isinstance(node, dict):
        return {k: expand_all(v, values, missing=missing) for k, v in node.items()}
    if isinstance(node, list):
        return [expand_all(v, values, missing=missing) for v in node]
    if isinstance(node, str):
        return expand(node, values, missing=missing)
    return node
