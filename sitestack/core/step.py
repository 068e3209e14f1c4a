"""The one core abstraction: :class:`Step`, and :func:`converge`, which runs steps.

A Step is a named, idempotent unit of change. ``pending(host)`` is read-only and returns
the reason a change is needed, or ``None`` when the host already matches (when unsure it
returns a reason: a false "changed" beats a false "ok"). ``apply(host)`` makes the change.
An assertion step (``asserts = True``) only checks: its ``pending`` raises
:class:`~sitestack.core.errors.SitestackError` when the host is unfit, and it never changes
anything.

``converge`` runs each step: pending -> (check mode: "would ...") -> apply -> pending again
to verify -> :class:`Result`. Handlers notified by changed steps run once, at the end.

Applying with ``concurrency`` above 1, neighbouring steps that declare themselves independent
(``concurrent = True``: a step that neither reads what the others make nor makes what they
read, e.g. two source builds) run at the same time, at most ``concurrency`` at once; any
other step waits for every earlier one and runs alone. Results are still reported in the
steps' order, and a failure ends the run as it does one step at a time.

A step may belong to a scope (:attr:`Step.scope`: a playbook's further stack, ``stack: seed``). Its
failure ends only its scope: the later steps of that scope are skipped, the others still run (one
stack whose image is gone from the site leaves the other stacks, the launch helpers and the packed
env to be installed), and handlers still run. A failed step of no scope ends the whole run.
"""

from __future__ import annotations

import concurrent.futures
import time
import traceback
from collections import deque
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
    #: May run at the same time as the neighbouring steps that may too (applying, with cores to
    #: spare): it neither reads what they make nor makes what they read. Default: it runs alone.
    concurrent: bool = False
    #: What the step belongs to (a playbook's further stack), or None: the whole run. A failure stops
    #: only the later steps of its own scope; one of no scope stops every later step.
    scope: str | None = None

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
    concurrency: int = 1,
) -> list[Result]:
    """Bring ``host`` to the state ``steps`` describe; return one Result per step and handler.

    - ``check``: nothing is applied (``host`` should be read-only too); pending steps are
      reported as ``changed`` with "would ...". A failure does not end the plan.
    - Applying, a failed step ends the run on this host: the remaining steps are ``skipped``
      and handlers do not run; a failed step of a scope (:attr:`Step.scope`) skips only the
      remaining steps of that scope.
    - After ``apply``, ``pending`` must return None, else the step failed.
    - ``not_probed``: a reason the host cannot be probed at all (not the site's host): in
      check mode every step is planned unprobed; applying, every step fails with it.
    - Handlers run once each, in their declared order, after all steps, if a changed step
      notified them.
    - ``gate``: asked before each selected step runs (``--start-at``, ``--step``), in the steps'
      order; a reason it returns skips the step with that message.
    - ``concurrency``: applying (never in check mode, nor unprobed), up to this many neighbouring
      steps with ``concurrent`` set run at once, each in a thread of its own (``host`` must allow
      that). Each starts in order, after every earlier step has started; a step without it waits
      for all earlier ones to finish. ``on_result`` still gets the results in the steps' order (a
      later step's result waits until those before it are reported). A failure stops the steps
      not started yet (``skipped``); those already running finish and are reported as they end.
    """
    run = _Run(host, check=check, want_diff=want_diff, not_probed=not_probed, on_result=on_result,
               workers=concurrency if concurrency > 1 and not check and not not_probed else 1)
    tags, skip_tags = tuple(tags), tuple(skip_tags)
    try:
        for step in steps:
            together = run.pool is not None and step.concurrent
            run.make_room() if together else run.drain()
            reason = _skip_reason(step, tags, skip_tags, stopped=run.stopped_for(step), gate=gate)
            if reason is not None:
                run.queue.append((step, Result(step.name, "skipped", reason)))
            elif together:
                run.start(step)
            else:
                run.queue.append((step, _run_one(step, host, check=check, want_diff=want_diff, not_probed=not_probed)))
            run.report()
        run.drain()
    finally:
        run.close()

    run.handlers(handlers)
    return run.results


class _Run:
    """One converge: the results reported so far, the handlers notified, whether a step failed,
    and the steps started but not yet reported (in order; each a Result or a running future)."""

    def __init__(self, host: Host, *, check: bool, want_diff: bool, not_probed: str | None,
                 on_result: Callable[[Result], None] | None, workers: int) -> None:
        self.host, self.check, self.want_diff, self.not_probed = host, check, want_diff, not_probed
        self.on_result, self.workers = on_result, workers
        self.results: list[Result] = []
        self.notified: dict[str, str] = {}
        self.stopped = False
        self.failed_scopes: set[str] = set()
        self.queue: deque[tuple[Step, Result | concurrent.futures.Future[Result]]] = deque()
        self.running: dict[concurrent.futures.Future[Result], Step] = {}
        self.pool = (concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="step")
                     if workers > 1 else None)

    def emit(self, result: Result) -> None:
        self.results.append(result)
        if self.on_result:
            self.on_result(result)

    def start(self, step: Step) -> None:
        assert self.pool is not None
        future = self.pool.submit(_run_one, step, self.host, check=self.check, want_diff=self.want_diff,
                                  not_probed=self.not_probed)
        self.running[future] = step
        self.queue.append((step, future))

    def failed(self, step: Step) -> None:
        """``step`` failed: its scope ends, or, of no scope, the run (applying; checking goes on)."""
        if self.check:
            return
        if step.scope is None:
            self.stopped = True
        else:
            self.failed_scopes.add(step.scope)

    def stopped_for(self, step: Step) -> str | None:
        """Why ``step`` must not run after a failure (None: it may)."""
        if self.stopped:
            return "not run: an earlier step failed"
        if step.scope is not None and step.scope in self.failed_scopes:
            return f"not run: an earlier step of {step.scope} failed"
        return None

    def _wait(self, until: str) -> None:
        """Wait for one running step to end (``until`` FIRST_COMPLETED) or all; a failure stops the run."""
        done, _ = concurrent.futures.wait(self.running, return_when=until)
        for future in done:
            step = self.running.pop(future)
            if future.result().status == "failed":
                self.failed(step)

    def make_room(self) -> None:
        """Report what has ended, and wait until fewer than ``workers`` steps run."""
        while len(self.running) >= self.workers or any(f.done() for f in self.running):
            self._wait(concurrent.futures.FIRST_COMPLETED)
        self.report()

    def drain(self) -> None:
        """Wait for every running step, and report every result."""
        if self.running:
            self._wait(concurrent.futures.ALL_COMPLETED)
        self.report()

    def report(self) -> None:
        """Report the results at the head of the queue that are known, in order."""
        while self.queue:
            step, entry = self.queue[0]
            if isinstance(entry, concurrent.futures.Future):
                if entry in self.running:  # not ended, or its failure not yet seen by _wait
                    return
                entry = entry.result()
            self.queue.popleft()
            self.emit(entry)
            if entry.status == "changed":
                for target in step.notify:
                    self.notified.setdefault(target, step.name)
            if entry.status == "failed":
                self.failed(step)

    def handlers(self, handlers: Sequence[Step]) -> None:
        """Run each notified handler once, in its declared order, one after the other."""
        for handler in handlers:
            if handler.name not in self.notified:
                continue
            if self.stopped:
                self.emit(Result(handler.name, "skipped", "not run: an earlier step failed", handler=True))
                continue
            result = _run_one(handler, self.host, check=self.check, want_diff=self.want_diff,
                              not_probed=self.not_probed, forced=f"notified by {self.notified[handler.name]}")
            self.emit(Result(**{**result.__dict__, "handler": True}))

    def close(self) -> None:
        """Wait for the steps still running (an interrupt: they are told to stop, not abandoned)."""
        if self.pool is not None:
            if self.running:
                stop = getattr(self.host, "stop_commands", None)
                if callable(stop):
                    stop()
            self.pool.shutdown(wait=True, cancel_futures=True)


def _skip_reason(step: Step, tags: Sequence[str], skip_tags: Sequence[str], *, stopped: str | None,
                 gate: Callable[[Step], str | None] | None) -> str | None:
    """Why ``step`` is skipped (tags, an earlier failure: ``stopped``, the gate), or None: it runs."""
    if not selected(step, tags, skip_tags):
        return "not selected by tags"
    if stopped:
        return stopped
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
        return done("failed", f"would fail: {exc}" if check else str(exc))
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
