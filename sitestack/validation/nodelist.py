"""Slurm host lists: ``nid[001-004,007],nid010`` -> ``nid001 nid002 nid003 nid004 nid007 nid010``.

The batch script asks ``scontrol show hostnames`` where it runs on the host; this parser is
what sitestack and the check program use to read a node list without Slurm (inside a
container, on the controller, in tests). It follows Slurm's hostlist syntax: comma-separated
entries, each a name with zero or more bracketed range lists (``rack[1-2]-node[01-02]`` is the
product of both), ranges keep their zero padding, and commas inside brackets do not split
entries (the bug of LUMI's ``get-master``, which splits on every comma first).
"""

from __future__ import annotations

import itertools
import re

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


class NodelistError(ValueError):
    """A host list that is not valid Slurm syntax."""


def split_entries(nodelist: str) -> list[str]:
    """Split a host list on the commas that are outside brackets."""
    entries, depth, current = [], 0, []
    for char in nodelist.strip():
        if char == "[":
            depth += 1
            if depth > 1:
                raise NodelistError(f"nested brackets in {nodelist!r}")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise NodelistError(f"unbalanced ']' in {nodelist!r}")
        if char == "," and depth == 0:
            entries.append("".join(current))
            current = []
        else:
            current.append(char)
    if depth:
        raise NodelistError(f"unbalanced '[' in {nodelist!r}")
    entries.append("".join(current))
    if any(not e.strip() for e in entries):
        raise NodelistError(f"empty host name in {nodelist!r}")
    return [e.strip() for e in entries]


def _expand_ranges(body: str, whole: str) -> list[str]:
    out: list[str] = []
    for part in body.split(","):
        match = _RANGE.match(part.strip())
        if not match:
            raise NodelistError(f"bad range {part!r} in {whole!r}")
        lo_text, hi_text = match.group(1), match.group(2)
        if hi_text is None:
            out.append(lo_text)
            continue
        lo, hi = int(lo_text), int(hi_text)
        if hi < lo:
            raise NodelistError(f"range {part!r} runs backwards in {whole!r}")
        if hi - lo > 100_000:
            raise NodelistError(f"range {part!r} is implausibly large in {whole!r}")
        width = len(lo_text) if lo_text.startswith("0") or len(lo_text) == len(hi_text) else 0
        out.extend(str(n).zfill(width) for n in range(lo, hi + 1))
    return out


def expand_entry(entry: str, whole: str | None = None) -> list[str]:
    """All host names of one entry: ``a[1-2]b[3,5]`` -> ``a1b3 a1b5 a2b3 a2b5``."""
    whole = whole or entry
    pieces = re.split(r"(\[[^\]]*\])", entry)
    choices: list[list[str]] = []
    for piece in pieces:
        if piece.startswith("["):
            choices.append(_expand_ranges(piece[1:-1], whole))
        elif piece:
            if "]" in piece or "[" in piece:
                raise NodelistError(f"stray bracket in {whole!r}")
            choices.append([piece])
    return ["".join(parts) for parts in itertools.product(*choices)]


def expand_nodelist(nodelist: str) -> list[str]:
    """Every host of a Slurm host list, in order, duplicates kept (as scontrol does)."""
    if not nodelist or not nodelist.strip():
        raise NodelistError("empty node list")
    hosts: list[str] = []
    for entry in split_entries(nodelist):
        hosts.extend(expand_entry(entry, nodelist))
    return hosts


def first_host(nodelist: str) -> str:
    """The first host of a host list: where rank 0 runs, hence MASTER_ADDR."""
    entry = split_entries(nodelist)[0]
    return expand_entry(entry, nodelist)[0]
