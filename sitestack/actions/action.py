"""The base of every playbook action, and helpers the actions share.

An action is a :class:`~sitestack.core.step.Step` class with an ``Args`` dataclass (checked
against the playbook when it is loaded, so a bad argument is an error naming file, line and
key before anything runs), a class attribute ``action`` (its name in playbooks) and a
constructor taking the step's spec, its arguments and the
:class:`~sitestack.model.context.RunContext` of the host it runs on. The table of all actions
is :data:`sitestack.actions.ACTIONS`.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from sitestack.core import schema
from sitestack.core.hostbase import Host
from sitestack.core.step import Step
from sitestack.model.context import RunContext
from sitestack.model.site import StepSpec, expand_all
from sitestack.model.site import plain_data as _plain
from sitestack.onsite import visible


class Action(Step):
    """A Step built from a playbook step."""

    action: ClassVar[str] = ""  # the name playbooks use
    #: Whether a step of this action may run at the same time as its neighbours that may too, unless
    #: the playbook says (the step's ``concurrent``); see :meth:`independent`.
    concurrent_by_default: ClassVar[bool] = False
    #: True where the action serves the playbook's own stack whatever a step's ``stack:`` says (the
    #: validation job, the launch helpers: docs/playbooks.md): a ``stack:`` on it is refused at load.
    own_stack: ClassVar[bool] = False

    @dataclass(frozen=True)
    class Args:
        pass

    def __init__(self, spec: StepSpec, args: Any, ctx: RunContext) -> None:
        self.name = spec.name
        self.tags = frozenset(spec.tags)
        self.notify = spec.notify
        self.become = spec.become
        self.args = args
        self.ctx = ctx
        self.concurrent = spec.concurrent if spec.concurrent is not None else self.independent(args)
        # a step of a further stack (``stack:``) fails that stack only (core/step.py, Step.scope)
        self.scope = f"stack {spec.stack}" if spec.stack else None

    @classmethod
    def independent(cls, args: Any) -> bool:
        """Whether a step with these arguments neither reads what other steps make nor makes what
        they read, so it may run beside them (:attr:`sitestack.core.step.Step.concurrent`)."""
        return cls.concurrent_by_default

    @classmethod
    def check_args(cls, raw: Any, file: str, line: int, key: str) -> Any:
        """Validate the raw YAML arguments; raise InputError naming file, line and key."""
        return schema.build(cls.Args, raw if raw is not None else {}, file, line=line, key=key)

    @classmethod
    def site_problem(cls, args: Any, facts: Any, options: Any = None) -> str | None:
        """Why this step, with these checked arguments, contradicts the site's facts (None: it does
        not). Asked when the playbook is loaded (``options`` None) and by the tasks that make a step
        of their own (with the run's options), before anything connects."""
        return None

    @classmethod
    def steps_problem(cls, steps: Sequence[tuple[StepSpec, Any, Any]]) -> tuple[int, str] | None:
        """Why this action's steps of one playbook (each with its checked arguments and the facts it runs
        with: its ``stack:``'s, else the playbook's), taken together, contradict each other: (index in
        ``steps``, why), or None (they do not). Asked when the playbook is loaded, after each step's own
        checks."""
        return None

    @classmethod
    def from_spec(cls, spec: StepSpec, ctx: RunContext) -> Action:
        """The step for one host: arguments checked, placeholders (defaults' too) filled."""
        args = cls.check_args(_plain(spec.args), ctx.site.path, spec.line, "args")
        filled = {f.name: expand_all(_plain(getattr(args, f.name)), ctx.values) for f in dataclasses.fields(args)}
        filled = {k: tuple(v) if isinstance(getattr(args, k), tuple) else v for k, v in filled.items()}
        return cls(spec, dataclasses.replace(args, **filled), ctx)

    def rendered(self, earlier: Mapping[str, str]) -> dict[str, tuple[str, int]]:
        """Every file ``apply`` writes whose text is known without a host: absolute path on the site ->
        (text, mode), computed by the same functions ``pending`` and ``apply`` use (``invoke render``,
        :mod:`sitestack.engine.render`). ``earlier``: path -> text of what the playbook's earlier steps
        render, for a step that reads back what an earlier one wrote (a module directory's rc record).
        What only exists once built on the site (an environment, a build, an image) is not rendered.
        Default: nothing."""
        return {}


def under(base: str, files: Mapping[str, tuple[str, int]]) -> dict[str, tuple[str, int]]:
    """``files`` (path relative to ``base`` -> (text, mode)) keyed by their absolute paths."""
    return {f"{base.rstrip('/')}/{rel}": entry for rel, entry in files.items()}



def printable(text: str) -> str:
    """``text`` with control characters but tab and newline as ``\\xNN`` (:func:`sitestack.onsite.visible.printable`):
    a file on a host may hold terminal escape sequences (a hand edit, a hostile user), and ``--diff``
    prints it to the admin's terminal."""
    return visible.printable(text)


def _lines(text: str) -> list[str]:
    """``text`` as lines split on newlines alone, each keeping its newline (``str.splitlines``
    splits on carriage returns and form feeds too, which would break a line of the diff in two)."""
    parts = text.split("\n")
    return [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def unified_diff(old: str | None, new: str, path: str) -> str:
    """A unified diff from ``old`` (None: no file) to ``new``, printable (:func:`printable`)."""
    return printable("".join(difflib.unified_diff(
        _lines(old or ""), _lines(new),
        fromfile="/dev/null" if old is None else f"{path} (on host)", tofile=f"{path} (new)")))


def log_name(step_name: str) -> str:
    """A log file name for a step: its name with anything but letters, digits, . and - as _."""
    return re.sub(r"[^A-Za-z0-9.-]+", "_", step_name).strip("_") + ".log"


def files_pending(host: Host, base: str, files: Mapping[str, tuple[str, int]]) -> list[str]:
    """Why the files below ``base`` (relative path -> (content, mode)) need writing: one reason each."""
    reasons = []
    for rel, (text, _mode) in files.items():
        current = host.read_text(f"{base}/{rel}")
        if current is None:
            reasons.append(f"{rel} missing")
        elif current != text:
            reasons.append(f"{rel} differs")
    return reasons


def files_diff(host: Host, base: str, files: Mapping[str, tuple[str, int]]) -> str | None:
    """A unified diff of every file below ``base`` that would change (None: none would)."""
    parts = []
    for rel, (text, _mode) in files.items():
        path = f"{base}/{rel}"
        current = host.read_text(path)
        if current != text:
            parts.append(unified_diff(current, text, path))
    return "".join(parts) or None


def write_files(host: Host, base: str, files: Mapping[str, tuple[str, int]]) -> None:
    """Write the files below ``base`` that differ (compare before write: unchanged files keep their mtime)."""
    for rel, (text, mode) in files.items():
        path = f"{base}/{rel}"
        if host.read_text(path) != text:
            host.write_text(path, text, mode)
