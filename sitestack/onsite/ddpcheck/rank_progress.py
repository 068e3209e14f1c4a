"""Where each rank is: OUT/ranks/rank-R.json, rewritten at every phase, read by the watchdogs and the guard."""

from __future__ import annotations

import contextlib
import glob
import os
import time
from typing import Any

from ..fileio import ReadError, private_dir, read_json, write_json
from . import envvalues
from .checks import CHECKS
from .ranks import RankInfo

# --------------------------------------------------------------------------------------------
# Progress and the watchdogs: separate processes, so they need no GIL and exist before MPI_Init
# --------------------------------------------------------------------------------------------
# A Python thread cannot time out a rank frozen by SIGSTOP, a rank whose other thread spins in an
# MPI call holding the GIL, or a hang inside MPI_Init (the thread would start after it). So every
# rank forks before it imports mpi4py or torch: the parent is the rank's watchdog (standard library
# only, it sleeps and polls), the child runs the checks and records its phase in
# OUT/ranks/rank-R.json as it goes. At the deadline the watchdog SIGKILLs its child (SIGKILL ends a
# stopped process too); when the child dies by a signal nobody asked for, the watchdog names it.
# The first watchdog with something to say writes result.json (an O_EXCL lock elects it).
# `ddp_check.py --guard -- LAUNCHER ...` wraps the whole job step the same way, for what happens
# before any rank's watchdog exists (a launcher or a Python start-up that hangs) and for ranks a
# launcher leaves behind.

#: Where a rank can be, in order: before the checks, the checks, and after them.
PHASES = ("startup", "MPI_Init", "import torch", *CHECKS, "report", "finished")
PHASE_WORDS = {"startup": "at start-up", "MPI_Init": "inside MPI_Init (importing mpi4py)",
               "import torch": "while importing torch", "report": "while writing the report",
               "finished": "after finishing"}
#: Signals that mean the process crashed rather than was killed.
#: The most bytes of a rank's progress record or the fault record read (each a few KiB).
RECORD_MAX = 1 << 20
CRASH_SIGNALS = ("SIGBUS", "SIGSEGV", "SIGILL", "SIGFPE", "SIGABRT", "SIGSYS")


def status_dir(out: str) -> str:
    """Where the ranks' progress records and fault.json live: OUT/ranks."""
    return os.path.join(out, "ranks")


def phase_words(phase: str, detail: str | None = None) -> str:
    """A phase in words: "during ddp (step 1 forward)", "inside MPI_Init (importing mpi4py)"."""
    return PHASE_WORDS.get(phase, f"during {phase}") + (f" ({detail})" if detail else "")


def where(d: dict[str, Any]) -> str:
    """What a rank was doing, from its progress record: "during ddp (step 1 forward)"."""
    return phase_words(str(d.get("phase", "?")), d.get("detail"))


def state_of(d: dict[str, Any]) -> str:
    """Where a rank was, after its name: "was in the ddp check (step 1 forward)", "had finished"."""
    phase, detail = str(d.get("phase", "?")), d.get("detail")
    if phase == "finished":
        return "had finished"
    words = {"startup": "starting up", "MPI_Init": "inside MPI_Init (importing mpi4py)",
             "import torch": "importing torch", "report": "writing the report"}.get(phase, f"in the {phase} check")
    return f"was {words}" + (f" ({detail})" if detail else "")


def waited(d: dict[str, Any]) -> str:
    """What a rank ahead of the one behind did: "had finished" or "waited during ..."."""
    return "had finished" if d.get("phase") == "finished" else f"waited {where(d)}"


class Progress:
    """This rank's progress: OUT/ranks/rank-R.json, rewritten atomically at every phase."""

    def __init__(self, out: str, info: RankInfo, host: str, meta: dict[str, Any]) -> None:
        self.path = os.path.join(status_dir(out), f"rank-{info.rank}.json")
        self.data: dict[str, Any] = {
            "rank": info.rank, "world_size": info.world_size, "local_rank": info.local_rank, "host": host,
            "launcher": info.launcher, "pid": os.getpid(), "watchdog": None, "phase": "startup",
            "since": round(time.time(), 3), "state": "running", **meta}

    def enter(self, phase: str, checks: list[dict[str, Any]] | None = None, **extra: Any) -> None:
        if phase != self.data.get("phase"):
            self.data.update(detail=None, tick=0)
        self.data.update(phase=phase, since=round(time.time(), 3), **extra)
        if checks is not None:
            self.data["checks"] = checks
        self.save()

    def save(self) -> None:
        with contextlib.suppress(OSError):
            private_dir(os.path.dirname(self.path))
            # atomic, not synced: rewritten at every step, read by the watchdogs of a live machine
            write_json(self.path, self.data, sync=False)


def read_progress(out: str) -> dict[int, dict[str, Any]]:
    """Every rank's last recorded progress, by rank."""
    ranks: dict[int, dict[str, Any]] = {}
    for path in glob.glob(os.path.join(status_dir(out), "rank-*.json")):
        with contextlib.suppress(ReadError, KeyError, TypeError, ValueError):
            data = read_json(path, RECORD_MAX)
            if type(data.get("rank")) is int:   # a rank, not true (which int() reads as 1) nor "3"
                ranks[data["rank"]] = data
    return ranks


def read_fault(out: str) -> dict[str, Any] | None:
    """The fault a watchdog or the guard reported (OUT/ranks/fault.json), or None."""
    try:
        return read_json(os.path.join(status_dir(out), "fault.json"), RECORD_MAX)
    except ReadError:
        return None


def deadline_from_env(env: dict[str, str] | os._Environ[str], limit: float) -> float:
    """The job's deadline (epoch seconds): $SITESTACK_DEADLINE, set once by the batch script, so every
    rank and the guard share it; else ``limit`` seconds from now. A deadline that is not a number of
    seconds (``nan``, ``inf``: one that never comes) is an :class:`~.envvalues.EnvError` naming it."""
    deadline = envvalues.seconds(env, "SITESTACK_DEADLINE", 1)
    return deadline if deadline is not None else time.time() + limit


#: Seconds of a shared deadline a rank trusts at least before the barrier has compared its clock with
#: rank 0's (or the whole limit, when shorter): a clock a minute ahead would otherwise see the deadline
#: as past, or near, at start-up and end a healthy rank (clocks.py corrects it at the barrier).
TRUSTED_LEFT = 60.0


def monotonic_deadline(deadline: float, limit: float) -> float:
    """The wall-clock ``deadline`` as a point on this host's monotonic clock (which no clock step moves):
    the seconds it leaves by this host's clock, but at least min(``limit``, :data:`TRUSTED_LEFT`) and at
    most ``limit``: this host's clock may be off by more than the job's start-up took."""
    left = deadline - time.time()
    return time.monotonic() + min(limit, max(left, min(limit, TRUSTED_LEFT)))
