"""Processes seen through /proc: a process's state, its descendants, and killing exactly those."""

from __future__ import annotations

import contextlib
import os
import signal
import time

from ..fileio import ReadError, read_text

#: The most bytes of a /proc/PID/stat read (one line of 52 fields, well under 1 KiB).
STAT_MAX = 1 << 16


def proc_state(pid: int) -> str | None:
    """The kernel's state letter of ``pid`` (R, S, D, T stopped, t traced, Z), None when gone."""
    with contextlib.suppress(ReadError, IndexError):
        return read_text(f"/proc/{pid}/stat", STAT_MAX, keep="head").rsplit(")", 1)[1].split()[0]
    return None


def sampled_state(pid: int, samples: int = 37, every: float = 0.0137) -> str | None:
    """The process state over half a second (at an odd interval, so a duty cycle cannot alias it):
    ``T`` when stopped throughout (frozen), ``throttled``
    when it was stopped and ran in turns (a SIGSTOP/SIGCONT duty cycle, as cpulimit does), else the
    state last seen."""
    seen = []
    for _ in range(samples):
        seen.append(proc_state(pid))
        time.sleep(every)
    stopped = sum(1 for s in seen if s in ("T", "t"))
    if stopped == len(seen):
        return "T"
    if stopped:
        return "throttled"
    return seen[-1]


def _proc_table() -> dict[int, tuple[int, int, str]]:
    """pid -> (parent pid, session id, start time) of every process we can see."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(ReadError, IndexError, ValueError):
            fields = read_text(f"/proc/{entry}/stat", STAT_MAX, keep="head").rsplit(")", 1)[1].split()
            table[int(entry)] = (int(fields[1]), int(fields[3]), fields[19])
    return table


def descendants(root: int, table: dict[int, tuple[int, int, str]] | None = None) -> dict[int, str]:
    """``root`` and every process below it: pid -> start time (to tell a reused pid apart)."""
    table = table if table is not None else _proc_table()
    found = {root: table[root][2]} if root in table else {}
    grew = True
    while grew:
        grew = False
        for pid, (ppid, _sid, start) in table.items():
            if ppid in found and pid not in found:
                found[pid] = start
                grew = True
    return found


def kill_all(pids: dict[int, str]) -> None:
    """SIGKILL each process that is still the one we saw (same start time)."""
    table = _proc_table()
    for pid, start in pids.items():
        if pid != os.getpid() and table.get(pid, (0, 0, ""))[2] == start:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
