"""Each rank's watchdog: the parent process of the rank (forked before MPI_Init and torch), which kills
the rank at the deadline (after asking it for its stacks), ends it soon after another rank's fault was
reported, and names a rank that died by a signal nobody asked for or exited before it finished."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from typing import Any

from ..fileio import ReadError, read_json
from . import stacks
from .faults import describe_fault, earliest, report_fault
from .procs import descendants, kill_all, sampled_state
from .rank_progress import CRASH_SIGNALS, RECORD_MAX, Progress, read_progress, status_dir

#: Seconds a rank's watchdog gives its rank to end by itself once another rank's fault was reported.
FAULT_GRACE = 3.0


def supervise(progress: Progress, out: str, deadline: float, limit: float, expected: int | None) -> None:
    """Fork: the child returns (it runs the checks); the parent watches it and never returns.
    ``deadline`` is on this host's monotonic clock (:func:`.rank_progress.monotonic_deadline`); the
    rank moves it once it has compared its clock with rank 0's (``deadline_mono`` in its record)."""
    if not hasattr(os, "fork"):
        return
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    parent = os.getpid()
    child = os.fork()
    if child == 0:
        _die_with(parent)
        progress.data.update(pid=os.getpid(), watchdog=parent)
        progress.save()
        return
    _watch(child, progress, out, deadline, limit, expected)


def _recorded(out: str, wait: float = 3.0) -> dict[int, dict[str, Any]]:
    """Every rank's record once each says how it ended (the other watchdogs time out at the same
    deadline and dump their ranks' stacks too), or after ``wait`` seconds."""
    end = time.time() + wait
    while True:
        ranks = read_progress(out)
        if time.time() >= end or all(d.get("state") != "running" for d in ranks.values()):
            return ranks
        time.sleep(0.1)


def _die_with(parent: int) -> None:
    """PR_SET_PDEATHSIG: a launcher that SIGKILLs the watchdog (Hydra does, when another rank
    fails) takes the rank with it, so no rank is left behind (prctl(2))."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG = 1
    if os.getppid() != parent:
        os._exit(1)


def _watch(child: int, progress: Progress, out: str, deadline: float, limit: float, expected: int | None) -> None:
    """The watchdog's loop: forward the launcher's signals, kill the rank at the deadline, name a rank killed by a signal; exits with the rank's status."""
    asked: list[int] = []

    def forward(sig: int, _frame: Any) -> None:  # the launcher's TERM/INT reach the rank, and are not faults
        asked.append(sig)
        with contextlib.suppress(OSError):
            os.kill(child, sig)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, forward)
    status = 0
    fault_seen: float | None = None
    checked = 0.0
    while True:
        try:
            pid, status = os.waitpid(child, os.WNOHANG)
        except ChildProcessError:
            os._exit(1)
        if pid:
            break
        now = time.monotonic()
        if now - checked >= 1.0:
            checked = now
            deadline = _moved(progress.path, deadline)
        if now >= deadline:
            _time_out(child, progress, out, limit, expected)
        if fault_seen is None and os.path.exists(os.path.join(status_dir(out), "fault.json")):
            fault_seen = now
        if fault_seen is not None and now - fault_seen >= FAULT_GRACE:
            # another rank (or its watchdog) reported what ends the run: this rank cannot finish without
            # it, and the launcher may not end it (srun without --kill-on-bad-exit waits for every task)
            kill_all(descendants(child))
            with contextlib.suppress(ChildProcessError):
                os.waitpid(child, 0)
            os._exit(1)
        time.sleep(0.2)
    if os.WIFEXITED(status):
        _exited(os.WEXITSTATUS(status), progress, out, deadline, limit, expected, asked)
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        ranks = read_progress(out)
        mine = ranks.get(progress.data["rank"], progress.data)
        # a rank that dies because the deadline ended another one is not the fault: that watchdog reports
        late = time.monotonic() >= deadline - 1 or any(d.get("state") == "timed out" for d in ranks.values())
        if not asked and not late and mine.get("phase") != "finished":
            progress.data = dict(mine)  # the worker's record, with rank 0's checks so far
            name = signal.Signals(number).name
            progress.data.update(state="crashed" if name in CRASH_SIGNALS else "killed", signal=name,
                                 signal_text=signal.strsignal(number) or "")
            progress.save()
            ranks = read_progress(out)
            cause = describe_fault("killed", ranks, limit, expected, culprit=progress.data["rank"])
            report_fault(out, {"kind": progress.data["state"], "cause": cause, "rank": progress.data["rank"],
                               "host": progress.data["host"], "phase": mine.get("phase"),
                               "signal": progress.data["signal"], "expected": expected})
            print(f"sitestack watchdog: {cause}", file=sys.stderr, flush=True)
        os._exit(128 + number)
    os._exit(os.WEXITSTATUS(status))


def _exited(code: int, progress: Progress, out: str, deadline: float, limit: float, expected: int | None,
            asked: list[int]) -> None:
    """The rank exited by itself before it finished (a site hook's sys.exit, an uncaught error, an MPI
    library that called exit): name it, with its code, at once; the others cannot finish without it."""
    ranks = read_progress(out)
    mine = ranks.get(progress.data["rank"], progress.data)
    if asked or mine.get("phase") == "finished" or time.monotonic() >= deadline - 1:
        return
    progress.data = dict(mine)
    progress.data.update(state="exited", exit_code=code)
    progress.save()
    ranks = read_progress(out)
    cause = describe_fault("rank exited", ranks, limit, expected, culprit=progress.data["rank"], rc=code)
    if report_fault(out, {"kind": "rank exited", "cause": cause, "rank": progress.data["rank"],
                          "host": progress.data["host"], "phase": mine.get("phase"), "exit_code": code,
                          "expected": expected}):
        print(f"sitestack watchdog: {cause}", file=sys.stderr, flush=True)


def _moved(path: str, deadline: float) -> float:
    """The deadline the rank set at the barrier (clocks.py: ``deadline_mono``), else ``deadline``."""
    with contextlib.suppress(ReadError, TypeError, ValueError):
        moved = read_json(path, RECORD_MAX).get("deadline_mono")
        if isinstance(moved, (int, float)) and moved == moved:
            return float(moved)
    return deadline


def _time_out(child: int, progress: Progress, out: str, limit: float, expected: int | None) -> None:
    """The deadline passed: record where the rank was and its stacks, kill it, and (first watchdog
    only, once the others have recorded theirs) report the rank(s) that held the run up."""
    rank = progress.data["rank"]
    progress.data = dict(read_progress(out).get(rank, progress.data))
    state = sampled_state(child)
    dumped = state not in ("T", "t") and stacks.request(child, stacks.stacks_path(status_dir(out), rank))
    progress.data.update(state="timed out", proc_state=state, stacks=dumped)
    progress.save()
    kill_all(descendants(child))
    with contextlib.suppress(ChildProcessError):
        os.waitpid(child, 0)
    ranks = _recorded(out)
    cause = describe_fault("timeout", ranks, limit, expected, stacks=stacks.read_stacks(status_dir(out), ranks))
    if report_fault(out, {"kind": "timeout", "cause": cause, "phase": earliest(ranks), "expected": expected,
                          "limit_s": limit}):
        print(f"sitestack watchdog: {cause}", file=sys.stderr, flush=True)
    os._exit(3)
