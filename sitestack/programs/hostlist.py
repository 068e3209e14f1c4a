#!/usr/bin/env python3
"""Slurm host lists, expanded: the one parser every shipped program uses.

Standard library only, nothing of sitestack: it ships as a file beside the programs that need it
(``get-master`` in the container's run scripts, the validation job's check program, the users'
``sitestack-launch-env`` as ``sitestack-hostlist``) and runs with whatever Python is there.

The syntax is Slurm's (``scontrol show hostnames``, https://slurm.schedmd.com/scontrol.html):

- items are separated by commas outside brackets; whitespace around them is ignored, and
  whitespace alone separates items too (Slurm splits on ``"\\t, \\n"``, src/common/hostlist.c);
- an item is a name with zero or more bracket groups; a group is a comma list of numbers and
  ``lo-hi`` ranges: ``nid[001,005-007]`` is nid001 nid005 nid006 nid007;
- zero padding is kept: a number is as wide as the range's lower bound (``nid[0001-0003]``);
- several groups in one name give their product, the first group varying slowest, as Slurm
  prints it: ``a[1-2]b[3-4]`` is a1b3 a1b4 a2b3 a2b4;
- hosts come out in the order written, duplicates kept (scontrol neither sorts nor merges).

Refused, with a message naming the list: an empty list or item (``a,,b``: a list a program
assembled wrongly, which Slurm would silently mend), nested or unbalanced brackets, whitespace
or anything but numbers and ranges inside brackets, a range that runs backwards, and more than
:data:`MAX_HOSTS` hosts.

Command line: ``hostlist.py [--first] [--sep SEP] LIST`` prints the hosts, one a line (or joined
by SEP; only the first with --first); exit 2 with one message on a list it refuses.
"""

from __future__ import annotations

import itertools
import re
import sys

#: The most hosts one list may expand to. The largest Slurm clusters have ~10,000 nodes (Frontier
#: has 9,408: https://docs.olcf.ornl.gov/systems/frontier_user_guide.html), so a list of more is a
#: mistake (``n[1-2000000]``) that would only exhaust memory.
MAX_HOSTS = 100_000

_GROUP = re.compile(r"\[([^\[\]]*)\]")
_RANGE = re.compile(r"(\d+)(?:-(\d+))?")


class HostlistError(ValueError):
    """A host list that is not valid Slurm syntax, or that expands to too many hosts."""


def split_items(text: str) -> list[str]:
    """The items of a host list: split at commas and whitespace outside brackets."""
    items: list[str] = []
    current: list[str] = []
    depth = 0
    commas = 1  # commas since the last item; a leading comma is an empty item
    for char in text.strip():
        if char == "[":
            depth += 1
            if depth > 1:
                raise HostlistError(f"nested brackets in {text!r}")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"unbalanced ']' in {text!r}")
        if depth == 0 and (char == "," or char.isspace()):
            if current:
                items.append("".join(current))
                current, commas = [], 0
            commas += char == ","
            if commas > 1:
                raise HostlistError(f"empty item in {text!r}")
            continue
        if depth and char.isspace():
            raise HostlistError(f"whitespace inside brackets in {text!r}")
        current.append(char)
    if depth:
        raise HostlistError(f"unbalanced '[' in {text!r}")
    if not current:
        raise HostlistError(f"empty item in {text!r}" if items else "empty host list")
    return [*items, "".join(current)]


def _numbers(body: str, whole: str) -> list[str]:
    """The numbers of one bracket group (``001,005-007``), each as wide as its range's lower bound."""
    out: list[str] = []
    for part in body.split(","):
        match = _RANGE.fullmatch(part)
        if not match:
            raise HostlistError(f"bad range {part!r} in {whole!r}" if part else f"empty range in {whole!r}")
        lo_text, hi_text = match.group(1), match.group(2) or match.group(1)
        lo, hi = int(lo_text), int(hi_text)
        if hi < lo:
            raise HostlistError(f"range {part!r} runs backwards in {whole!r}")
        if hi - lo >= MAX_HOSTS:
            raise HostlistError(f"range {part!r} in {whole!r} has over {MAX_HOSTS} hosts")
        out.extend(str(n).zfill(len(lo_text)) for n in range(lo, hi + 1))
    return out


def expand_item(item: str, whole: str | None = None) -> list[str]:
    """Every host of one item: ``a[1-2]b[3,5]`` -> a1b3 a1b5 a2b3 a2b5."""
    whole = whole or item
    choices: list[list[str]] = []
    position = 0
    for match in _GROUP.finditer(item):
        choices.append([item[position:match.start()]])
        choices.append(_numbers(match.group(1), whole))
        position = match.end()
    choices.append([item[position:]])
    size = 1
    for choice in choices:
        size *= len(choice)
    if size > MAX_HOSTS:
        raise HostlistError(f"{item!r} in {whole!r} expands to over {MAX_HOSTS} hosts")
    return ["".join(parts) for parts in itertools.product(*choices)]


def expand(text: str) -> list[str]:
    """Every host of a Slurm host list, in order, duplicates kept (as ``scontrol show hostnames``)."""
    hosts: list[str] = []
    for item in split_items(text):
        hosts.extend(expand_item(item, text))
        if len(hosts) > MAX_HOSTS:
            raise HostlistError(f"{text!r} expands to over {MAX_HOSTS} hosts")
    return hosts


def first(text: str) -> str:
    """The first host of a host list: where rank 0 runs, hence MASTER_ADDR (the whole list is checked)."""
    return expand(text)[0]


def main(argv: list[str], prog: str = "hostlist.py") -> int:
    """``[--first] [--sep SEP] LIST``: print the hosts; exit 2 with one message on a bad list."""
    args, sep, only_first = list(argv), "\n", False
    if "--first" in args:
        args.remove("--first")
        only_first = True
    if args[:1] == ["--sep"] and len(args) >= 2:
        sep, args = args[1], args[2:]
    if len(args) != 1:
        print(f"usage: {prog} [--first] [--sep SEP] LIST", file=sys.stderr)
        return 2
    try:
        hosts = [first(args[0])] if only_first else expand(args[0])
    except HostlistError as exc:
        print(f"{prog}: cannot parse host list: {exc}", file=sys.stderr)
        return 2
    print(sep.join(hosts))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
