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
or anything but numbers and ranges inside brackets, a range that runs backwards
(``nid[005-001]``), a character that no host name has (only letters, digits, ``.``, ``_`` and
``-``; so ``a\\nb``, a control character, ``;`` or ``$`` never reach a program's output), a name
that does not start with a letter or digit (RFC 952 and RFC 1123, 2.1: ``-rf`` would be read as an
option by the program it is given to, ``.`` and ``..`` are paths), a
number of over :data:`MAX_DIGITS` digits, a host name of over :data:`MAX_NAME` characters, a list
of over :data:`MAX_TEXT` characters, and more than :data:`MAX_HOSTS` hosts (counted before they are
made: ``n[0-99999999]`` is refused at once). A message shows at most the list's first
:data:`SHOWN` characters, escaped (one line).

Command line: ``hostlist.py [--first] [--sep SEP] [--name NAME] [--] LIST`` prints the hosts, one a
line (or joined by SEP; only the first with --first); exit 2 with one message on a list it refuses,
naming NAME (the variable the list came from, e.g. SLURM_JOB_NODELIST) where given. Options come
first; a LIST that starts with ``-`` is read as one only after ``--`` (programs pass a variable's
value after ``--``, so it is never taken for an option). ``-h``/``--help`` prints the usage. Output
to a pipe closed early (``| head``) ends quietly (exit 1).
"""

from __future__ import annotations

import itertools
import os
import re
import sys

#: The most hosts one list may expand to. The largest Slurm clusters have ~10,000 nodes (Frontier
#: has 9,408: https://docs.olcf.ornl.gov/systems/frontier_user_guide.html), so a list of more is a
#: mistake (``n[1-2000000]``) that would only exhaust memory.
MAX_HOSTS = 100_000
#: The most digits of a number in brackets (a wider one is no node's: Frontier's are 5).
MAX_DIGITS = 9
#: The longest host name (a DNS name's limit, RFC 1035).
MAX_NAME = 255
#: The longest list read: 100,000 uncompressed names of 10 characters fit.
MAX_TEXT = 1 << 20
#: How much of a refused list a message shows.
SHOWN = 60

_GROUP = re.compile(r"\[([^\[\]]*)\]")
_RANGE = re.compile(r"([0-9]+)(?:-([0-9]+))?")
#: The characters of a host name outside brackets (RFC 1123 letters, digits, hyphens and dots, and
#: the underscore some clusters use).
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
#: What separates items besides commas: Slurm's hostlist_create splits on tabs, spaces and newlines.
_SPACE = frozenset(" \t\n")
_IN_BRACKETS = frozenset("0123456789,-")


class HostlistError(ValueError):
    """A host list that is not valid Slurm syntax, or that expands to too many hosts."""


def shown(text: str) -> str:
    """``text`` for a message: escaped (one line) and cut at :data:`SHOWN` characters."""
    return repr(text) if len(text) <= SHOWN else repr(text[:SHOWN]) + f"... ({len(text)} characters)"


def split_items(text: str) -> list[str]:
    """The items of a host list: split at commas and whitespace outside brackets."""
    if len(text) > MAX_TEXT:
        raise HostlistError(f"{shown(text)} is longer than {MAX_TEXT} characters")
    items: list[str] = []
    current: list[str] = []
    depth = 0
    commas = 1  # commas since the last item; a leading comma is an empty item
    for char in text.strip(" \t\n"):
        if char == "[":
            depth += 1
            if depth > 1:
                raise HostlistError(f"nested brackets in {shown(text)}")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"unbalanced ']' in {shown(text)}")
        if depth == 0 and (char == "," or char in _SPACE):
            if current:
                items.append("".join(current))
                current, commas = [], 0
            commas += char == ","
            if commas > 1:
                raise HostlistError(f"empty item in {shown(text)}")
            continue
        if depth and char in _SPACE:
            raise HostlistError(f"whitespace inside brackets in {shown(text)}")
        if char not in _NAME_CHARS and char not in "[]" and not (depth and char in _IN_BRACKETS):
            raise HostlistError(f"character {char!r} is not allowed in a host name, in {shown(text)}")
        current.append(char)
    if depth:
        raise HostlistError(f"unbalanced '[' in {shown(text)}")
    if not current:
        raise HostlistError(f"empty item in {shown(text)}" if items else "empty host list")
    return [*items, "".join(current)]


def _numbers(body: str, whole: str) -> list[str]:
    """The numbers of one bracket group (``001,005-007``), each as wide as its range's lower bound."""
    out: list[str] = []
    for part in body.split(","):
        match = _RANGE.fullmatch(part)
        if not match:
            raise HostlistError(f"bad range {shown(part)} in {shown(whole)}" if part else f"empty range in {shown(whole)}")
        lo_text, hi_text = match.group(1), match.group(2) or match.group(1)
        if max(len(lo_text), len(hi_text)) > MAX_DIGITS:
            raise HostlistError(f"a number of over {MAX_DIGITS} digits in {shown(whole)}")
        lo, hi = int(lo_text), int(hi_text)
        if hi < lo:
            raise HostlistError(f"range {part!r} runs backwards in {shown(whole)}")
        if len(out) + hi - lo >= MAX_HOSTS:  # counted before the numbers are made
            raise HostlistError(f"{shown(whole)} expands to over {MAX_HOSTS} hosts")
        out.extend(str(n).zfill(len(lo_text)) for n in range(lo, hi + 1))
    return out


def expand_item(item: str, whole: str | None = None) -> list[str]:
    """Every host of one item: ``a[1-2]b[3,5]`` -> a1b3 a1b5 a2b3 a2b5."""
    whole = whole or item
    if item[:1] in ("-", ".", "_"):  # a group ([1-3]) makes digits
        raise HostlistError(f"host name {shown(item)} starts with {item[0]!r} (a host name starts with a letter or "
                            f"digit), in {shown(whole)}")
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
            raise HostlistError(f"{shown(item)} in {shown(whole)} expands to over {MAX_HOSTS} hosts")
    if sum(max(len(c) for c in choice) for choice in choices) > MAX_NAME:
        raise HostlistError(f"a host name of over {MAX_NAME} characters in {shown(whole)}")
    return ["".join(parts) for parts in itertools.product(*choices)]


def expand(text: str) -> list[str]:
    """Every host of a Slurm host list, in order, duplicates kept (as ``scontrol show hostnames``)."""
    hosts: list[str] = []
    for item in split_items(text):
        hosts.extend(expand_item(item, text))
        if len(hosts) > MAX_HOSTS:
            raise HostlistError(f"{shown(text)} expands to over {MAX_HOSTS} hosts")
    return hosts


def first(text: str) -> str:
    """The first host of a host list: where rank 0 runs, hence MASTER_ADDR (the whole list is checked)."""
    return expand(text)[0]


USAGE = "[--first] [--sep SEP] [--name NAME] [--] LIST"


def parse(argv: list[str]) -> tuple[bool, str, str, list[str]]:
    """``(only_first, sep, name, rest)`` of a command line: options up to ``--`` or the first word that
    is not one; ValueError for an unknown option or one without its value."""
    only_first, sep, name, rest = False, "\n", "", list(argv)
    while rest and rest[0].startswith("-"):
        option = rest.pop(0)
        if option == "--":
            break
        if option == "--first":
            only_first = True
        elif option in ("--sep", "--name") and rest:
            sep, name = (rest.pop(0), name) if option == "--sep" else (sep, rest.pop(0))
        else:
            raise ValueError(f"{option!r} needs a value" if option in ("--sep", "--name") else f"unknown option {option!r}")
    return only_first, sep, name, rest


def main(argv: list[str], prog: str = "hostlist.py") -> int:
    """``[--first] [--sep SEP] [--name NAME] [--] LIST``: print the hosts; exit 2 with one message on a bad
    list or command line."""
    if argv[:1] in (["-h"], ["--help"]):
        print(f"usage: {prog} {USAGE}")
        return 0
    try:
        only_first, sep, name, args = parse(argv)
    except ValueError as exc:
        print(f"{prog}: {exc}; usage: {prog} {USAGE}", file=sys.stderr)
        return 2
    if len(args) != 1:
        print(f"usage: {prog} {USAGE}", file=sys.stderr)
        return 2
    try:
        hosts = [first(args[0])] if only_first else expand(args[0])
    except HostlistError as exc:
        print(f"{prog}: {name + ': ' if name else ''}cannot parse host list: {exc}", file=sys.stderr)
        return 2
    return write(sep.join(hosts) + "\n")


def write(text: str) -> int:
    """``text`` to stdout; 0, or 1 where the reader has gone (``| head``): quietly, as
    https://docs.python.org/3/library/signal.html#note-on-sigpipe does it, stdout pointed at devnull so
    that the flush at exit fails no more."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], prog=os.path.basename(sys.argv[0]) or "hostlist.py"))
