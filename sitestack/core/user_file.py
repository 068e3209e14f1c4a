"""The one rule for a file the user names on the command line (``--json FILE``, ``job-template --output FILE``).

- ``-`` is stdout.
- Anything else must be a regular file or not exist yet, in a directory that exists. A directory,
  a symbolic link (dangling or not), a character or block device (``/dev/null``, ``/dev/full``),
  a FIFO or a socket is refused with one message naming the option, the path and what it is:
  written through, a link would put the bytes somewhere the user did not name, a device would be
  replaced by a file when sitestack runs as root, and a FIFO would block the run forever with no
  reader. ``/dev/stdout`` is a link, so it is refused too: ``-`` says stdout.
- The target is checked when the options are (:func:`check`, before anything runs) and again when
  it is written (:func:`write`), with ``lstat`` (links are not followed either time). A name ending
  in ``/``, a ``~user`` that does not exist and a name too long for its temporary file are refused then too.
- The write is atomic: the bytes go to a new temporary file in the target's directory, opened
  ``O_CREAT | O_EXCL | O_NOFOLLOW`` (it cannot be a planted link or someone else's file), flushed
  with fsync, given the target's permission bits (a new file: the caller's mode less the umask; never
  set-user-ID, set-group-ID or sticky), and renamed
  over the target (``os.replace``, rename(2): atomic within one file system). A reader sees the
  old file or the new one, never a part.
- A write that fails (disk full, read-only file system, quota, permission) is one message,
  ``OPTION: cannot write PATH: No space left on device``, exit 1; the temporary file is removed
  and the target is as it was.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
import sys
from pathlib import Path

from sitestack.core.errors import InputError
from sitestack.core.files import atomic_stream
from sitestack.core.quoting import control_problem

#: What stands for stdout instead of a file name.
STDOUT = "-"

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symbolic link"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"))


def kind(mode: int) -> str:
    """What a non-regular file is, in words (``a symbolic link``); ``a regular file`` otherwise."""
    return next((name for test, name in _KINDS if test(mode)), "a regular file" if stat.S_ISREG(mode) else "not a file")


def check(option: str, value: str | None) -> Path | None:
    """``value`` of ``option`` as the target to write, refused (InputError naming the option and the
    path) unless it is ``-``, a regular file, or a new name in a directory that exists and is writable.
    None (the option not given) and ``-`` give None."""
    if value is None or value == STDOUT:
        return None
    problem = control_problem(value) if value else "empty (name a file, or - for stdout)"
    if problem:
        raise InputError(option, problem)
    if value.endswith("/"):
        raise InputError(option, f"{value} names a directory: name a regular file (or - for stdout)")
    try:
        path = Path(value).expanduser()
    except RuntimeError:   # ~name of a user that does not exist
        raise InputError(option, f"cannot write {value}: no such user's home directory") from None
    if len(os.fsencode(_temporary_name(path))) > 255:   # NAME_MAX of Linux file systems
        raise InputError(option, f"cannot write {value}: {os.strerror(errno.ENAMETOOLONG)}")
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        info = None
    except OSError as exc:   # ENOTDIR (a parent is a file), EACCES, ENAMETOOLONG, ELOOP
        raise InputError(option, f"cannot write {value}: {exc.strerror}") from None
    if info is not None and not stat.S_ISREG(info.st_mode):
        raise InputError(option, f"{value} is {kind(info.st_mode)}: name a regular file (or - for stdout)")
    parent = path.parent
    if not parent.is_dir():
        raise InputError(option, f"cannot write {value}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):   # EROFS too (access(2)), for root as for users
        read_only = os.statvfs(parent).f_flag & os.ST_RDONLY
        reason = os.strerror(errno.EROFS if read_only else errno.EACCES)
        raise InputError(option, f"cannot write {value}: {reason} (directory {parent})")
    return path


def write(option: str, value: str | None, text: str, mode: int = 0o644) -> None:
    """Write ``text`` (UTF-8) to the target ``value`` of ``option`` (``-``: stdout; None: nothing) by
    the module's rule. A new file gets ``mode`` less the umask; an existing one keeps its mode."""
    if value is None:
        return
    if value == STDOUT:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    path = check(option, value)
    assert path is not None
    try:
        _replace(option, path, text.encode("utf-8"), mode)
    except OSError as exc:
        raise InputError(option, f"cannot write {value}: {exc.strerror or exc}") from None


def _replace(option: str, path: Path, data: bytes, mode: int) -> None:
    """The write itself, by the one atomic writer (:func:`sitestack.core.files.atomic_stream`: a new
    temporary file, O_EXCL, fsynced, given its mode, renamed over ``path``, removed on any failure),
    with the mode the target keeps (:func:`_mode_for`, which refuses a target no longer regular)."""
    with atomic_stream(path, _mode_for(option, path, mode)) as handle:
        handle.write(data)


def _temporary_name(path: Path) -> str:
    """A name as long as the temporary file's beside ``path`` at most (atomic_stream's ``.NAME.XXXXXXXX.tmp``
    is 14 bytes longer; this is 18): what the length check of :func:`check` measures."""
    return f".{path.name}.{secrets.token_hex(6)}.tmp"


def _mode_for(option: str, path: Path, mode: int) -> int:
    """The existing target's mode, or ``mode`` less the umask for a new file; a target that is no
    longer a regular file (replaced since :func:`check`) is refused as check refuses it."""
    try:
        before = os.lstat(path)
    except FileNotFoundError:
        return mode & ~_umask()
    if not stat.S_ISREG(before.st_mode):
        raise InputError(option, f"{path} is {kind(before.st_mode)}: name a regular file (or - for stdout)")
    return stat.S_IMODE(before.st_mode) & 0o777   # never set-user-ID, set-group-ID or sticky: a document


def _umask() -> int:
    """The process's umask (read by setting it and putting it back: there is no getter before 3.13)."""
    current = os.umask(0o022)
    os.umask(current)
    return current


__all__ = ["STDOUT", "check", "kind", "write"]
