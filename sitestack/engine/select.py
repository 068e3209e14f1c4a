"""Choosing what a run touches: hosts (``--host``, ``--limit``), steps (``--tags``, ``--start-at``,
``--step``), and listing them (``--list-steps``, ``--list-tags``) without running anything.

The conventions are ansible-playbook's: ``--limit`` narrows the inventory and never adds to it
(a name that matches no playbook host is an error, so a typo cannot open an SSH connection);
``--start-at`` is ``--start-at-task``; ``--step`` asks ``(N)o/(y)es/(c)ontinue`` before each
step (https://docs.ansible.com/ansible/latest/cli/ansible-playbook.html).
"""

from __future__ import annotations

import fnmatch
import os
import sys
import threading
from collections.abc import Callable
from typing import TextIO

from sitestack.core.errors import InputError
from sitestack.core.step import Step, selected
from sitestack.model.context import RunOptions
from sitestack.model.site import HostSpec, Site
from sitestack.onsite import visible


def select_hosts(site: Site, options: RunOptions) -> list[HostSpec]:
    """The hosts to run on: ``--host`` names (a name not in the playbook is an SSH host), else the
    playbook's hosts; then ``--limit`` keeps those matching one of its names or patterns."""
    known = {h.name: h for h in site.hosts}
    if options.hosts:
        specs = [known.get(n) or HostSpec(name=n, connection="local" if n == "localhost" else "ssh")
                 for n in options.hosts]
    else:
        specs = list(site.hosts)
    if not options.limit:
        return specs
    names = ", ".join(s.name for s in specs)
    for pattern in options.limit:
        if not any(fnmatch.fnmatchcase(s.name, pattern) for s in specs):
            raise InputError("--limit", f"{pattern!r} matches none of the hosts of {site.path} ({names}); "
                             "a new host is given with --host")
    return [s for s in specs if any(fnmatch.fnmatchcase(s.name, p) for p in options.limit)]


def check_start_at(site: Site, options: RunOptions) -> None:
    if options.start_at is not None and options.start_at not in {s.name for s in site.steps}:
        steps = ", ".join(s.name for s in site.steps)
        raise InputError("--start-at", f"{site.path} has no step {options.start_at!r} (steps: {steps})")


def check_rebuild(site: Site, options: RunOptions) -> None:
    """``--rebuild NAME`` names a recipe some recipe-install step of the playbook installs."""
    known = sorted({str(s.args.get("recipe")) for s in site.steps if s.action == "recipe-install"})
    for name in options.rebuild:
        if name not in known:
            raise InputError("--rebuild", f"no recipe-install step of {site.path} installs {name!r} "
                             f"(recipes: {', '.join(known) or 'none'})")


def step_rows(site: Site, options: RunOptions) -> list[tuple[str, str, str, str]]:
    """(name, action, tags, what this run would do with it) for each step, in order."""
    before = options.start_at is not None
    rows = []
    for spec in site.steps:
        before = before and spec.name != options.start_at
        probe = Step()
        probe.name, probe.tags = spec.name, frozenset(spec.tags)
        if not selected(probe, options.tags, options.skip_tags):
            what = "skip (tags)"
        elif before:
            what = "skip (before --start-at)"
        else:
            what = "run"
        rows.append((spec.name, spec.action, ",".join(spec.tags) or "-", what))
    return rows


def list_steps(site: Site, options: RunOptions) -> list[str]:
    """The ``--list-steps`` lines: a header, then one aligned row per step (and handler)."""
    rows = [("step", "action", "tags", "this run"), *step_rows(site, options)]
    rows += [(f"handler {h.name}", h.action, ",".join(h.tags) or "-", "when notified") for h in site.handlers]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return [f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:<{widths[2]}}  {r[3]}".rstrip() for r in rows]


def list_tags(site: Site) -> list[str]:
    """The ``--list-tags`` lines: each tag with the steps that carry it."""
    tags: dict[str, list[str]] = {}
    for spec in (*site.steps, *site.handlers):
        for tag in spec.tags:
            tags.setdefault(tag, []).append(spec.name)
    width = max((len(t) for t in tags), default=0)
    return [f"{tag:<{width}}  {', '.join(names)}" for tag, names in sorted(tags.items())]


#: The answers ``--step`` takes: yes, no (also an empty line: the default), continue (yes to this and
#: every later step).
ANSWERS = {"y": "yes", "yes": "yes", "n": "no", "no": "no", "": "no", "c": "continue", "continue": "continue"}
#: The most bytes of one answer line read, and of all the answers read from a pipe (some 30 000 lines:
#: more than any playbook has steps); past these, stdin is not read further.
ANSWER_MAX = 1024
ANSWERS_MAX = 64 * 1024
#: Wrong answers on a terminal before ``--step`` gives up.
TRIES = 5


def _shown(raw: bytes | str) -> str:
    text = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else raw
    return visible.printable(repr(text[:40] + ("..." if len(text) > 40 else "")))


def piped_answers(stdin: TextIO) -> list[str]:
    """The answers on a stdin that is not a terminal: at most :data:`ANSWERS_MAX` bytes are read
    (``yes |`` never ends: its first lines are the answers); each line of at most :data:`ANSWER_MAX`
    bytes, one of :data:`ANSWERS`. None at all, a longer line (``< /dev/zero``) or another answer
    (``maybe``): an :class:`InputError` naming ``--step`` before anything runs."""
    data = b""
    try:
        fd = stdin.fileno()
    except (AttributeError, OSError, ValueError):  # not a file (a test's StringIO)
        data = stdin.read(ANSWERS_MAX).encode()
    else:
        while len(data) < ANSWERS_MAX and (chunk := os.read(fd, ANSWERS_MAX - len(data))):
            data += chunk
    lines = data.split(b"\n")
    if len(data) >= ANSWERS_MAX:
        lines.pop()  # the line the cut fell in (or the empty one after the last newline)
    elif lines[-1] == b"":
        lines.pop()  # after the last newline
    if not lines:
        raise InputError("--step", "no terminal to ask on and no answers on stdin (pipe y/n/c lines, "
                         "one per step, or run without --step)" if not data else
                         f"no whole answer line in the first {ANSWERS_MAX // 1024} KiB of stdin (y/n/c lines, one per step)")
    answers = []
    for number, raw in enumerate(lines, 1):
        answer = raw.decode("utf-8", errors="replace").strip().lower() if len(raw) <= ANSWER_MAX else None
        if answer not in ANSWERS:
            what = f"is longer than {ANSWER_MAX} bytes" if answer is None else f"is {_shown(raw.strip())}"
            raise InputError("--step", f"answer {number} on stdin {what}: answer y, n or c (one a line); nothing was run")
        answers.append(ANSWERS[answer])
    return answers


class Confirm:
    """``--step``: ask before each step, ``(N)o/(y)es/(c)ontinue``, as ansible-playbook does.

    On a terminal it prompts, reading at most :data:`ANSWER_MAX` bytes of each answer; a wrong answer
    is asked again, and after :data:`TRIES` wrong ones, or at the end of input (Ctrl-D), the host's
    run stops with an error (exit 1). Otherwise the answers are read from stdin, one a line, all at
    once before anything runs (:func:`piped_answers`: so an absent answer never leaves the run
    waiting, and a wrong one runs nothing): no answers at all is refused up front, and a step past
    the last answer is not run.
    """

    def __init__(self, stdin: TextIO | None = None, prompt: TextIO | None = None) -> None:
        self.stdin = stdin or sys.stdin
        self.prompt = prompt or sys.stderr
        self.interactive = self.stdin.isatty()
        self.answers: list[str] = []
        self.go_on = False
        self._lock = threading.Lock()
        if not self.interactive:
            self.answers = piped_answers(self.stdin)

    def _typed(self) -> str | None:
        """One answer typed on the terminal (None at the end of input): a line read up to
        :data:`ANSWER_MAX` characters, the rest of a longer one read and dropped (a bad answer)."""
        line = self.stdin.readline(ANSWER_MAX + 1)
        if not line:
            return None
        if len(line) > ANSWER_MAX and not line.endswith("\n"):
            while (rest := self.stdin.readline(ANSWER_MAX)) and not rest.endswith("\n"):
                pass
            return line[:40]
        return line.strip().lower()

    def _answer(self, question: str) -> str | None:
        if self.interactive:
            print(question, end="", file=self.prompt, flush=True)  # stderr: stdout may be --json -
            return self._typed()
        print(question, file=self.prompt, flush=True)
        return self.answers.pop(0) if self.answers else None

    def gate(self, host: str) -> Callable[[Step], str | None]:
        """The converge gate for ``host``: None runs the step, a reason skips it."""
        def ask(step: Step) -> str | None:
            with self._lock:
                if self.go_on:
                    return None
                for _ in range(TRIES):
                    answer = self._answer(f"Perform step {step.name} on {host}? (N)o/(y)es/(c)ontinue: ")
                    if answer is None and self.interactive:
                        raise InputError("--step", f"no answer for step {step.name} on {host} (end of input): "
                                         "nothing more is run")
                    if answer is None:
                        return "not confirmed (--step: no more answers)"
                    if ANSWERS.get(answer) == "continue":
                        self.go_on = True
                        return None
                    if answer in ANSWERS:
                        return None if ANSWERS[answer] == "yes" else "not confirmed (--step)"
                    print(f"--step: answer y, n or c, not {_shown(answer)}", file=self.prompt, flush=True)
                raise InputError("--step", f"{TRIES} wrong answers for step {step.name} on {host}: nothing more is run")
        return ask


def gate_for(site: Site, options: RunOptions, host: str,
             confirm: Confirm | None) -> Callable[[Step], str | None] | None:
    """The gate of ``host``'s steps: ``--start-at`` first, then ``--step``."""
    if options.start_at is None and confirm is None:
        return None
    order = [s.name for s in site.steps]
    first = order.index(options.start_at) if options.start_at in order else 0
    ask = confirm.gate(host) if confirm is not None else None

    def gate(step: Step) -> str | None:
        if step.name in order and order.index(step.name) < first:
            return f"before --start-at {options.start_at}"
        return ask(step) if ask is not None else None
    return gate
