"""The one lock of sitestack: a directory made with mkdir, with an owner file inside.

mkdir is atomic on every POSIX file system (NFS and Lustre included, where flock may fail with
ENOSYS), and it works the same through the OS and through a shell over SSH: a run on this
machine and a run over SSH against the same path exclude each other. The lock named ``path``
is a directory that stays in place (as a lock file would: taking and releasing the lock
changes nothing beside it); it is held while ``path/lock.d`` exists, whose ``owner`` file says
who holds it::

    pid 4242 on login1 (process start 889911, locked at 2026-11-22T20:05:00Z)

A lock whose owner is a process of *this* machine that is gone (killed, or its connection
dropped before it could clean up) is stale and taken over; the process start time tells a
reused pid apart. A lock held from another machine is never taken over: the message names
its holder and the directory to remove if that run is gone.

Taking over goes through a second directory (``lock.d.break``, with an owner file of its own) so
that two waiters that both saw the same stale owner cannot remove each other's fresh lock: under
it, the owner is read again and the lock removed only if it is still the stale one. A ``lock.d.break``
left behind (its maker killed in those few milliseconds) is removed when its owner is a process of
this machine that is gone, or when it is older than :data:`BREAK_STALE_S` (an older sitestack made
it without an owner file). A ``lock.d`` with no owner file that is older than that too was left by a
run killed between making it and writing its owner (or by a full disk): it is taken over the same way.

Owner files are read only if they are regular files (not a symlink, FIFO or device: a FIFO's read
would wait forever, ``/dev/zero`` never end), at most :data:`OWNER_MAX` bytes of them. Any other
owner file was not written by sitestack: the lock is refused at once (:class:`LockHeld`, naming the
directory to remove), never taken over, since nothing tells whether a run holds it.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import time
from collections.abc import Callable, Iterator
from typing import Protocol

from sitestack.core.errors import LockHeld, SitestackError

_OWNER = re.compile(r"^pid (\d{1,9}) on (\S+) \(process start ([^,]*), locked at [^)]*\)$")
POLL_S = 0.2
#: The most bytes of an owner file read (an owner line is under 200).
OWNER_MAX = 4096
#: A ``lock.d.break`` older than this (seconds) is a leftover: the takeover it guards takes milliseconds.
BREAK_STALE_S = 60


class InvalidOwner(Exception):
    """An owner file sitestack did not write: not a regular file, or larger than :data:`OWNER_MAX`."""


class LockDirs(Protocol):
    """The file operations the lock needs, as a host provides them (OS calls or shell commands)."""

    name: str

    def lock_acquire(self, path: str, owner: str) -> bool:
        """Make the directories above ``path`` (a lock *file* of an older sitestack where the lock
        directory goes is replaced), then directory ``path`` and in it file ``owner`` with ``owner``;
        False when ``path`` already exists. One command on a host reached through a shell."""

    def lock_owner(self, path: str) -> str | None:
        """The text of owner file ``path``, or None when it does not exist; :class:`InvalidOwner`
        (saying what it is) when it is not a regular file (a symlink is not followed) or holds more
        than :data:`OWNER_MAX` bytes. Never waits on it, never reads more than that."""

    def lock_older(self, path: str, seconds: int) -> bool:
        """Whether ``path`` exists and was last modified more than ``seconds`` ago."""

    def lock_remove(self, path: str) -> None:
        """Remove directory ``path`` and what is in it; nothing when it is gone."""


def process_start(pid: int) -> str:
    """When process ``pid`` started (clock ticks since boot, from /proc); "" where unknown."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            # The command name (field 2) may hold spaces and parentheses: count from the last ")".
            return handle.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def owner_line() -> str:
    """The owner line of a lock taken by this process."""
    locked_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return f"pid {os.getpid()} on {socket.gethostname()} (process start {process_start(os.getpid())}, locked at {locked_at})"


def is_stale(owner: str) -> bool:
    """Whether ``owner`` names a process of this machine that is gone (its pid dead or reused)."""
    match = _OWNER.match(owner.strip())
    if not match or match.group(2) != socket.gethostname():
        return False
    pid, started = int(match.group(1)), match.group(3)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # alive, another user's: the start time still tells a reused pid apart
    now = process_start(pid)
    return bool(started and now and now != started)


@contextlib.contextmanager
def hold(dirs: LockDirs, path: str, *, wait: float = 0,
         report: Callable[[str], None] | None = None) -> Iterator[None]:
    """Hold the lock named ``path`` while the block runs, waiting up to ``wait`` seconds for it.

    When another run holds it, ``report`` (if given) is told once who holds it and that this run
    waits; after ``wait`` seconds :class:`LockHeld` names the holder. The lock is released when
    the block ends, however it ends.
    """
    lock_dir = f"{path}/lock.d"
    deadline = time.monotonic() + wait
    told = False
    while not dirs.lock_acquire(lock_dir, owner_line() + "\n"):
        try:
            held = (dirs.lock_owner(f"{lock_dir}/owner") or "").strip()
        except InvalidOwner as exc:
            raise LockHeld(f"[{dirs.name}] {path} is locked, but its owner file {lock_dir}/owner {exc}: sitestack did not "
                           f"write it; remove {lock_dir} if no run holds the lock") from None
        if held and is_stale(held) and _take_over(dirs, lock_dir, held):
            continue
        # no owner file a minute after the mkdir: its maker died between the two (killed, a full disk)
        if not held and dirs.lock_older(lock_dir, BREAK_STALE_S) and _take_over(dirs, lock_dir, ""):
            continue
        holder = held or "a run that has not written its owner file yet"
        if time.monotonic() >= deadline:
            raise LockHeld(f"[{dirs.name}] {path} is locked by {holder} (remove {lock_dir} if that run is gone)")
        if report is not None and not told:
            report(f"[{dirs.name}] {path} is locked by {holder}: waiting up to {wait:.0f}s for it")
            told = True
        time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))
    try:
        yield
    finally:
        with contextlib.suppress(SitestackError):  # a dropped connection leaves a lock later runs take over
            dirs.lock_remove(lock_dir)


def _owner(dirs: LockDirs, path: str) -> str:
    """The owner line in ``path`` ("" when there is none, or an owner file sitestack did not write)."""
    try:
        return (dirs.lock_owner(path) or "").strip()
    except InvalidOwner:
        return ""


def _take_over(dirs: LockDirs, lock_dir: str, stale: str) -> bool:
    """Remove ``lock_dir`` if its owner is still ``stale``; False when another waiter is doing so."""
    breaker = lock_dir + ".break"
    mine = owner_line() + "\n"
    if not dirs.lock_acquire(breaker, mine) and not (_clear_leftover(dirs, breaker) and dirs.lock_acquire(breaker, mine)):
        return False
    try:
        if _owner(dirs, f"{lock_dir}/owner") == stale:
            dirs.lock_remove(lock_dir)
    finally:
        dirs.lock_remove(breaker)
    return True


def _clear_leftover(dirs: LockDirs, breaker: str) -> bool:
    """Remove ``breaker`` if it was left behind: its maker is a process of this machine that is gone,
    or it is older than :data:`BREAK_STALE_S`. Its owner is read again just before, so that a
    breaker another waiter made meanwhile stays (a second leftover's race of a few microseconds remains)."""
    maker = _owner(dirs, f"{breaker}/owner")
    if not (maker and is_stale(maker)) and not dirs.lock_older(breaker, BREAK_STALE_S):
        return False
    if _owner(dirs, f"{breaker}/owner") != maker:
        return False
    dirs.lock_remove(breaker)
    return True
