"""The one core abstraction: :class:`Step`, and :func:`converge`, which runs steps.

A Step is a named, idempotent unit of change. ``pending(host)`` is read-only and returns
the reason a change is needed, or ``None`` when the host already matches (when unsure it
returns a reason: a false "changed" beats a false "ok"). ``apply(host)`` makes the change.
An assertion step (``asserts = True``) only checks: its ``pending`` raises
:class:`~sitestack.core.errors.SitestackError` when the host is unfit, and it never changes
anything.

``converge`` runs each step: pending -> (check mode: "would ...") -> apply -> pending again
to verify -> :class:`Result`. Handlers notified by changed steps run once, at the end.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from sitestack.core.errors import CannotProbe, SitestackError

if TYPE_CHECKING:
    from sitestack.core.host import Host

Status = Literal["ok", "changed", "skipped", "failed"]


class Step:
    """Base class of every step. Subclasses set ``name`` and implement the two methods."""

    name: str = ""
    tags: frozenset[str] = frozenset()
    notify: tuple[str, ...] = ()
    asserts: bool = False

    def describe(self) -> str:
        """What the step makes true, as a short phrase (used when it cannot probe)."""
        return self.name

    def pending(self, host: Host) -> str | None:
        """Read-only: why a change is needed on ``host``, or None when it already matches."""
        raise NotImplementedError

    def apply(self, host: Host) -> None:
        """Make the change on ``host``."""
        raise NotImplementedError

    def diff(self, host: Host) -> str | None:
        """Read-only: a unified diff of what ``apply`` would change, where that makes sense."""
        return None


@dataclass(frozen=True)
class Result:
    """What happened to one step on one host."""

    step: str
    status: Status
    message: str = ""
    diff: str | None = None
    elapsed: float = 0.0
    probed: bool = True
    handler: bool = False
    detail: str | None = field(default=None, repr=False)  # traceback of an unexpected error


def selected(step: Step, tags: Iterable[str] = (), skip_tags: Iterable[str] = ()) -> bool:
    """Whether ``step`` runs under ``--tags`` / ``--skip-tags`` (``always`` runs unless skipped)."""
    tags, skip_tags = set(tags), set(skip_tags)
    if step.tags & skip_tags or step.name in skip_tags:
        return False
    if not tags:
        return True
    return bool(step.tags & tags) or step.name in tags or "always" in step.tags


def converge(
    steps: Sequence[Step],
    host: Host,
    *,
    check: bool = False,
    want_diff: bool = False,
    tags: Iterable[str] = (),
    skip_tags: Iterable[str] = (),
    handlers: Sequence[Step] = (),
    on_result: Callable[[Result], None] | None = None,
    not_probed: str | None = None,
    gate: Callable[[Step], str | None] | None = None,
) -> list[Result]:
    """Bring ``host`` to the state ``steps`` describe; return one Result per step and handler.

    - ``check``: nothing is applied (``host`` should be read-only too); pending steps are
      reported as ``changed`` with "would ...". A failure does not end the plan.
    - Applying, a failed step ends the run on this host: the remaining steps are ``skipped``
      and handlers do not run.
    - After ``apply``, ``pending`` must return None, else the step failed.
    - ``not_probed``: a reason the host cannot be probed at all (not the site's host): in
      check mode every step is planned unprobed; applying, every step fails with it.
    - Handlers run once each, in their declared order, after all steps, if a changed step
      notified them.
    - ``gate``: asked before each selected step runs (``--start-at``, ``--step``); a reason it
      returns skips the step with that message.
    """
    tags, skip_tags = tuple(tags), tuple(skip_tags)
    results: list[Result] = []
    notified: dict[str, str] = {}
    stopped = False

    def emit(result: Result) -> None:
        results.append(result)
        if on_result:
            on_result(result)

    for step in steps:
        reason = _skip_reason(step, tags, skip_tags, stopped=stopped, gate=gate)
        if reason is not None:
            emit(Result(step.name, "skipped", reason))
            continue
        result = _run_one(step, host, check=check, want_diff=want_diff, not_probed=not_probed)
        emit(result)
        if result.status == "changed":
            for target in step.notify:
                notified.setdefault(target, step.name)
        if result.status == "failed" and not check:
            stopped = True

    for handler in handlers:
        if handler.name not in notified:
            continue
        if stopped:
            emit(Result(handler.name, "skipped", "not run: an earlier step failed", handler=True))
            continue
        result = _run_one(handler, host, check=check, want_diff=want_diff, not_probed=not_probed,
                          forced=f"notified by {notified[handler.name]}")
        emit(Result(**{**result.__dict__, "handler": True}))
    return results


def _skip_reason(step: Step, tags: Sequence[str], skip_tags: Sequence[str], *, stopped: bool,
                 gate: Callable[[Step], str | None] | None) -> str | None:
    """Why ``step`` is skipped (tags, an earlier failure, the gate), or None: it runs."""
    if not selected(step, tags, skip_tags):
        return "not selected by tags"
    if stopped:
        return "not run: an earlier step failed"
    return gate(step) if gate is not None else None


def _run_one(step: Step, host: Host, *, check: bool, want_diff: bool, not_probed: str | None,
             forced: str | None = None) -> Result:
    start = time.perf_counter()

    def done(status: Status, message: str, **extra: Any) -> Result:
        return Result(step.name, status, message, elapsed=time.perf_counter() - start, **extra)

    if not_probed:
        if check:
            return done("changed", f"would {step.describe()} (not probed: {not_probed})", probed=False)
        return done("failed", not_probed)
    try:
        reason = step.pending(host)
    except CannotProbe as exc:
        if check:
            return done("changed", f"would {step.describe()} (not probed: {exc})", probed=False)
        return done("failed", f"cannot run: {exc}")
    except SitestackError as exc:
        return done("failed", str(exc))
    except Exception as exc:  # a bug in a step must fail that step, not the other hosts
        return done("failed", f"internal error: {exc!r} (run with --debug for the traceback)",
                    detail=traceback.format_exc())
    if reason is None and forced is None:
        return done("ok", "")
    reason = reason or forced or ""
    if step.asserts:  # an assertion that returned a reason instead of raising
        return done("failed", reason)
    diff = None
    if want_diff:
        try:
            diff = step.diff(host)
        except SitestackError as exc:
            diff = f"(no diff: {exc})"
    if check:
        return done("changed", f"would change: {reason}", diff=diff)
    try:
        step.apply(host)
        after = step.pending(host)
    except SitestackError as exc:
        return done("failed", str(exc), diff=diff)
    except Exception as exc:
        return done("failed", f"internal error: {exc!r} (run with --debug for the traceback)",
                    diff=diff, detail=traceback.format_exc())
    if after is not None and forced is None:
        return done("failed", f"still pending after apply: {after}", diff=diff)
    return done("changed", reason, diff=diff)
