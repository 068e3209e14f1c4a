"""Version numbers and version ranges, as recipes write them.

A version is dotted integers (``4.1.2``, ``5.7.1``); a local part after ``+`` is ignored
(``2.2.2+rocm5.7`` is ``2.2.2``). A range (specifier) is ``*`` (any) or comma-separated
clauses that must all hold: ``>=4.0``, ``<5``, ``==4.1.*``, ``!=4.1.0``, ``~=4.1`` (``>=4.1,
==4.*``). Comparisons pad with zeros: ``5.7 == 5.7.0``.
"""

from __future__ import annotations

import re

_CLAUSE = re.compile(r"^(==|!=|>=|<=|~=|>|<)\s*([0-9][0-9A-Za-z.+*]*)$")


def parse(version: str) -> tuple[int, ...]:
    """``"4.1.2"`` -> ``(4, 1, 2)``; ValueError for anything but dotted integers."""
    text = str(version).split("+", 1)[0].strip()
    if not re.fullmatch(r"\d+(\.\d+)*", text):
        raise ValueError(f"{version!r} is not a version (dotted integers, e.g. 4.1.2)")
    return tuple(int(p) for p in text.split("."))


def _cmp(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = max(len(a), len(b))
    a, b = a + (0,) * (n - len(a)), b + (0,) * (n - len(b))
    return (a > b) - (a < b)


def check_spec(spec: str) -> str | None:
    """A problem with range ``spec``, or None when it parses."""
    try:
        matches(spec, "0")
    except ValueError as exc:
        return str(exc)
    return None


def matches(spec: str, version: str) -> bool:
    """Whether ``version`` is in range ``spec``. ValueError for a malformed range or version."""
    spec = (spec or "").strip()
    if spec in ("", "*"):
        return True
    have = parse(version)
    for clause in spec.split(","):
        clause = clause.strip()
        m = _CLAUSE.match(clause)
        if not m:
            raise ValueError(f"bad version range clause {clause!r} (use e.g. >=4.0, <5, ==4.1.*)")
        op, value = m.groups()
        if value.endswith(".*"):
            if op not in ("==", "!="):
                raise ValueError(f"{clause!r}: a wildcard only goes with == or !=")
            want = parse(value[:-2])
            inside = have[:len(want)] + (0,) * max(0, len(want) - len(have)) == want
            if inside != (op == "=="):
                return False
            continue
        want = parse(value)
        c = _cmp(have, want)
        ok = {"==": c == 0, "!=": c != 0, ">=": c >= 0, "<=": c <= 0, ">": c > 0, "<": c < 0}.get(op)
        if op == "~=":
            if len(want) < 2:
                raise ValueError(f"{clause!r}: ~= needs at least two parts (e.g. ~=4.1)")
            ok = c >= 0 and have[:len(want) - 1] == want[:-1]
        if not ok:
            return False
    return True


def sort_key(version: str) -> tuple:
    """Sort versions numerically; anything that is not dotted integers sorts first, by text."""
    try:
        return (1, parse(version), version)
    except ValueError:
        return (0, (), version)
