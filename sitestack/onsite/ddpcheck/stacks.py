"""Where each rank's Python is at a hang: every thread's stack, dumped on request into the rank's status
directory, and the rank(s) whose stack differs from the others'.

The rank registers :func:`faulthandler.register` for :data:`DUMP_SIGNAL` at start-up. Its watchdog
sends that signal at the deadline, before it kills the rank: faulthandler writes the stacks from its
C signal handler, without the GIL, so a rank blocked in C (a collective, MPI, a ``sleep``) or holding
the GIL in a loop still answers (https://docs.python.org/3/library/faulthandler.html). A rank
stopped by SIGSTOP cannot answer; its state says so instead.

A real-time signal, not SIGUSR1/SIGUSR2: Slurm's ``--signal`` sends SIGUSR1 by default, and the
watchdog forwards a launcher's signals to the rank as they are.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import re
import signal
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import IO, Any

from ..fileio import ReadError, read_text

#: The signal a watchdog sends to ask its rank for its stacks.
#: The most bytes of a rank's stack dumps read, the newest (a dump of a few hundred threads: a few hundred KiB).
STACKS_MAX = 4 << 20
DUMP_SIGNAL = signal.SIGRTMIN + 5 if hasattr(signal, "SIGRTMIN") else None
#: Files whose frames mean the rank is waiting for its peers (a collective, the store, MPI), not stuck on its own.
WAITING = re.compile(r"torch/distributed/|torch/nn/parallel/distributed\.py|mpi4py|horovod/|c10d|gloo", re.I)
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]*)", line (?P<line>\d+) in (?P<func>\S+)')
_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-f]+)", re.I)
_held: list[IO[str]] = []  # faulthandler writes to the file's descriptor: keep it open


def stacks_path(status_dir: str, rank: int) -> str:
    return os.path.join(status_dir, f"rank-{rank}.stacks")


def register(status_dir: str, rank: int) -> int | None:
    """Let a watchdog ask this rank for its stacks; the main thread's id (faulthandler names threads so)."""
    if DUMP_SIGNAL is None:
        return None
    with contextlib.suppress(OSError, ValueError, RuntimeError):
        handle = open(stacks_path(status_dir, rank), "w", encoding="utf-8")  # noqa: SIM115  (held open)
        faulthandler.register(DUMP_SIGNAL, file=handle, all_threads=True, chain=False)
        _held.append(handle)
        return threading.main_thread().ident
    return None


def request(pid: int, path: str, wait: float = 2.0) -> bool:
    """Ask ``pid`` for its stacks and wait (at most ``wait`` s) until the dump stops growing; True when written."""
    if DUMP_SIGNAL is None:
        return False
    with contextlib.suppress(OSError):
        before = os.path.getsize(path)
        os.kill(pid, DUMP_SIGNAL)
        end, size, still = time.time() + wait, before, 0
        while time.time() < end:
            time.sleep(0.05)
            now = os.path.getsize(path)
            still = still + 1 if now == size and now > before else 0
            size = now
            if still >= 3:
                return True
    return False


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    func: str

    def text(self) -> str:
        return f"{self.func} ({os.path.basename(self.file)}:{self.line})"


def main_stack(text: str, main_thread: int | None) -> list[Frame]:
    """The main thread's frames, innermost first, from a faulthandler dump (the last dump in ``text``)."""
    threads: dict[str, list[Frame]] = {}
    order: list[str] = []
    current = None
    for line in text.splitlines():
        head = _THREAD.match(line)
        if head:
            current = head.group(1).lower()
            if current in threads:  # a later dump: start again
                threads, order = {}, []
            threads[current] = []
            order.append(current)
            continue
        frame = _FRAME.match(line)
        if frame and current is not None:
            threads[current].append(Frame(frame["file"], int(frame["line"]), frame["func"]))
    if not order:
        return []
    if main_thread is not None:
        for name in order:
            if int(name, 16) == main_thread:
                return threads[name]
    return threads[order[-1]]  # faulthandler lists the main thread last


def read_stacks(status_dir: str, ranks: dict[int, dict[str, Any]]) -> dict[int, list[Frame]]:
    """Each rank's main-thread stack where its watchdog got one."""
    out = {}
    for rank, data in ranks.items():
        with contextlib.suppress(ReadError, ValueError):
            frames = main_stack(read_text(stacks_path(status_dir, rank), STACKS_MAX, keep="tail"), data.get("main_thread"))
            if frames:
                out[rank] = frames
    return out


def own_frame(frames: list[Frame]) -> Frame | None:
    """The innermost frame of the check program itself: which check, which line."""
    return next((f for f in frames if "/ddpcheck/" in f.file.replace(os.sep, "/")), None)


def odd_ones(stacks: dict[int, list[Frame]]) -> list[int]:
    """The ranks whose stack differs from the others': a minority where the innermost frames have a
    majority; where they do not, the ranks not waiting for their peers (a rank in a collective waits
    for the one that is not). Empty when nothing tells them apart."""
    if len(stacks) < 2:
        return []
    top = {r: frames[0] for r, frames in stacks.items()}
    counts = Counter(top.values())
    most, n = counts.most_common(1)[0]
    if n > len(top) / 2 and len(counts) > 1:
        return sorted(r for r, f in top.items() if f != most)
    alone = sorted(r for r, frames in stacks.items() if not any(WAITING.search(f.file) for f in frames[:6]))
    return alone if 0 < len(alone) < len(stacks) else []


def where_words(frames: list[Frame]) -> str:
    """``in hang (fault_hook.py:17), called from ddp (training.py:122)``."""
    inner, own = frames[0], own_frame(frames)
    text = f"in {inner.text()}"
    if own is not None and own != inner:
        text += f", called from {own.text()}"
    return text
