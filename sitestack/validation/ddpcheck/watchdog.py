"""Each rank's watchdog: the parent process of the rank (forked before MPI_Init and torch), which kills
the rank at the deadline and names a rank that died by a signal nobody asked for."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from typing import Any

from .faults import describe_fault, earliest, report_fault
from .procs import descendants, kill_all, sampled_state
from .rank_progress import CRASH_SIGNALS, Progress, read_progress


def supervise(progress: Progress, out: str, deadline: float, limit: float, expected: int | None) -> None:
    """Fork: the child returns (it runs the checks); the parent watches it and never returns."""
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
    while True:
        try:
            pid, status = os.waitpid(child, os.WNOHANG)
        except ChildProcessError:
            os._exit(1)
        if pid:
            break
        if time.time() >= deadline:
            _time_out(child, progress, out, limit, expected)
        time.sleep(0.2)
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        ranks = read_progress(out)
        mine = ranks.get(progress.data["rank"], progress.data)
        # a rank that dies because the deadline ended another one is not the fault: that watchdog reports
        late = time.time() >= deadline - 1 or any(d.get("state") == "timed out" for d in ranks.values())
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


def _time_out(child: int, progress: Progress, out: str, limit: float, expected: int | None) -> None:
    """The deadline passed: record where the rank was, kill it, and (first watchdog only) report."""
    progress.data = dict(read_progress(out).get(progress.data["rank"], progress.data))
    progress.data.update(state="timed out", proc_state=sampled_state(child))
    progress.save()
    kill_all(descendants(child))
    with contextlib.suppress(ChildProcessError):
        os.waitpid(child, 0)
    time.sleep(1.0)  # the other ranks' watchdogs record their state too
    ranks = read_progress(out)
    cause = describe_fault("timeout", ranks, limit, expected)
    if report_fault(out, {"kind": "timeout", "cause": cause, "phase": earliest(ranks), "expected": expected,
                          "limit_s": limit}):
        print(f"sitestack watchdog: {cause}", file=sys.stderr, flush=True)
    os._exit(3)
