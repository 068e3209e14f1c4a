#!/usr/bin/env python3
"""get-master: print the first host of a Slurm node list (the job's MASTER_ADDR).

Installed as ``$RUNSCRIPTS/get-master`` by the container-image step and called by
``conda-python-distributed`` inside the container, where ``scontrol show hostnames`` is not
available (seed 000). Standard library only, nothing of sitestack: it runs with the container's
Python.

Slurm's hostlist syntax: comma-separated entries, each a name with zero or more bracket groups of
comma-separated numbers or ranges (zero padding kept): ``nid[001,005-007]`` is nid001, nid005,
nid006, nid007; ``a[1-2]-b[3-4]`` expands both groups. The LUMI script split the list on every
comma before expanding brackets, so ``nid[001,005-007]`` broke (research/spack_easybuild.md s7).

Usage: ``get-master NODELIST`` (default ``$SLURM_JOB_NODELIST``, else ``$SLURM_NODELIST``) prints
the first host; ``get-master --all NODELIST`` prints every host, one a line. Exit 2 on a list that
does not parse.
"""

import os
import re
import sys


def split_top(text: str) -> "list[str]":
    """Split at commas outside brackets."""
    parts: list[str] = []
    depth, cur = 0, ""
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError("unbalanced ]")
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if depth:
        raise ValueError("unbalanced [")
    parts.append(cur)
    return [p for p in (x.strip() for x in parts) if p]


def expand_group(group: str) -> "list[str]":
    """'001,005-007' -> ['001', '005', '006', '007'] (padding of the lower bound kept)."""
    out: list[str] = []
    for item in group.split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", item.strip())
        if not m:
            raise ValueError(f"bad range {item!r}")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        if int(hi) < int(lo):
            raise ValueError(f"bad range {item!r}")
        out += [str(n).zfill(len(lo)) for n in range(int(lo), int(hi) + 1)]
    return out


def expand_entry(entry: str) -> "list[str]":
    m = re.search(r"\[([^\[\]]*)\]", entry)
    if not m:
        if "[" in entry or "]" in entry:
            raise ValueError(f"bad entry {entry!r}")
        return [entry]
    head, tail = entry[:m.start()], entry[m.end():]
    return [head + n + rest for n in expand_group(m.group(1)) for rest in expand_entry(tail)]


def hosts(nodelist: str) -> "list[str]":
    out: list[str] = []
    for entry in split_top(nodelist):
        out += expand_entry(entry)
    if not out:
        raise ValueError("empty node list")
    return out


def main(argv: "list[str]") -> int:
    every = "--all" in argv
    args = [a for a in argv if a != "--all"]
    nodelist = args[0] if args else os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST", "")
    try:
        found = hosts(nodelist)
    except ValueError as exc:
        print(f"get-master: cannot parse node list {nodelist!r}: {exc}", file=sys.stderr)
        return 2
    print("\n".join(found) if every else found[0])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
