"""Files on a site, written and read one way: :func:`write_atomic` (and :func:`write_json`) replace a
file whole, :func:`read_bytes` (:func:`read_text`, :func:`read_json`) read one within a byte cap.

A reader of a file this package writes (``invoke validate``, the guard, a rank reading the progress
records, another member of the group reading the history) sees the old file or the new one whole,
never a part, and a writer killed midway leaves the old file: the content goes to a new temporary
file in the same directory (a unique name, created with ``O_EXCL | O_NOFOLLOW``, so a name someone
planted there is never followed), is synced to disk, then renamed over the file (rename(2) is atomic
within a file system; https://man7.org/linux/man-pages/man2/rename.2.html). Any failure removes the
temporary file.

A file read from outside (a result, check-config.json, a rank's record, a log) may be anything: larger
than any record, a FIFO that never ends, a device. A read here opens without blocking, takes regular
files only, and reads at most its cap, so neither time nor memory depends on what the file is.
Every failure is one :class:`ReadError` whose message names the file. A JSON record is parsed one
way, :func:`parse_json`: finite numbers only, nesting bounded.

Programs of :data:`sitestack.onsite.SINGLE_FILE` ship as one file and cannot import this module; each
that writes a file keeps a writer of its own (and says so). The module runs with Python 3.6 too
(``extend-venv-activate`` uses it with whatever ``python3`` a user's shell finds): no
``from __future__ import annotations``, annotations that need it are strings.
"""

import contextlib
import json
import math
import os
import stat
from typing import Any

#: The largest check-config.json read (the job's configuration: a few KiB; the controller's cap too,
#: ``sitestack.engine.batchjob.CONFIG_MAX``).
CONFIG_MAX = 1 << 20
#: How a read handles a file larger than its cap: an error, its first bytes, or its last bytes.
KEEP = ("all", "head", "tail")


class ReadError(ValueError):
    """A file that cannot be read as asked (missing, not a regular file, over its cap, not JSON, not an
    object). ``path`` and ``reason`` apart, for callers that phrase it their own way; ``str()`` is
    ``PATH: REASON``; ``line``: the line of a JSON syntax error, where there is one."""

    def __init__(self, path: str, reason: str, line: "int | None" = None) -> None:
        super().__init__(f"{path}: {reason}")
        self.path, self.reason, self.line = path, reason, line


def _token() -> str:
    """The unique part of a temporary name (random: two writers, processes or threads, never share one)."""
    return os.urandom(8).hex()


def write_atomic(path: str, content: "str | bytes", *, mode: "int | None" = None, sync: bool = True,
                 exclusive: bool = False) -> bool:
    """Replace ``path`` with ``content`` (text as UTF-8) atomically; True when written.

    ``mode``: the file's permission bits whatever the umask (default: 0o666 less the umask, as
    ``open()`` creates files). ``sync=False`` skips the fsyncs (a few ms each on a busy file system)
    for a record rewritten inside a timed loop: still whole or old for every reader, though a node
    that crashes may lose it. ``exclusive``: create ``path`` only where it does not exist (a hard
    link of the temporary file, which fails when the name is taken): False, and ``path`` left as it
    is, when it was there. OSError propagates, the temporary file removed."""
    directory, name = os.path.split(os.path.abspath(path))
    tmp = os.path.join(directory, f".{name}.{os.getpid()}.{_token()}.tmp")
    data = content.encode("utf-8") if isinstance(content, str) else content
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600 if mode is not None else 0o666)
    try:
        with open(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            if mode is not None:
                os.fchmod(handle.fileno(), mode)
            if sync:
                os.fsync(handle.fileno())
        if exclusive:
            try:
                os.link(tmp, path)
            except FileExistsError:
                return False
            finally:
                os.unlink(tmp)
        else:
            os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if sync:
        _sync_directory(directory)
    return True


def private_dir(path: str) -> str:
    """``path`` as a directory this package writes its own files into (a results directory's ``ranks/``
    and ``checkpoint/``): made private to the user (0700 whatever the umask) where it is not there, or
    taken only if it is a directory (not a link: ``lstat``), owned by the user and writable by no one
    else, since a link someone planted there, or a file they replace, would be followed or read back.
    ``path`` itself; an :class:`OSError` whose message names the directory and why otherwise. Missing
    parents (a results directory the batch script did not make: a rank run on its own) are made 0700."""
    parent = os.path.dirname(path)
    if parent and not os.path.isdir(parent):
        os.makedirs(parent, 0o700, exist_ok=True)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    info = os.lstat(path)
    why = ("is a symbolic link" if stat.S_ISLNK(info.st_mode) else "is not a directory"
           if not stat.S_ISDIR(info.st_mode) else "is owned by another user" if info.st_uid != os.geteuid()
           else f"is writable by others (mode {stat.S_IMODE(info.st_mode):o})" if info.st_mode & 0o022 else None)
    if why is not None:
        raise OSError(f"{path} {why}: sitestack writes only into a directory of its own")
    return path


def _sync_directory(path: str) -> None:
    """fsync(2) of the directory, so the new name is on disk too (where the file system allows it)."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_json(path: str, data: Any, *, indent: "int | None" = 2, sort_keys: bool = False, mode: "int | None" = None,
               sync: bool = True) -> None:
    """``data`` as JSON (a value JSON lacks as its ``str()``, a number that is not finite as ``null``)
    and a newline into ``path``, atomically (:func:`write_atomic`)."""
    try:
        text = json.dumps(data, indent=indent, sort_keys=sort_keys, default=str, allow_nan=False)
    except ValueError:   # a NaN or an infinity somewhere (a rank's record, a diverged loss)
        text = json.dumps(finite(data), indent=indent, sort_keys=sort_keys, default=str, allow_nan=False)
    write_atomic(path, text + "\n", mode=mode, sync=sync)


def finite(data: Any) -> Any:
    """``data`` with every float that is not finite (NaN, an infinity) as None: JSON has no such number
    (RFC 8259, section 6), and ``json.dumps`` would write a bare ``NaN`` that other readers refuse."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: finite(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [finite(v) for v in data]
    return data


def read_bytes(path: str, limit: int, *, keep: str = "all", follow: bool = True) -> bytes:
    """The content of the regular file ``path``, at most ``limit`` bytes. A larger file is a
    :class:`ReadError` (``keep="all"``), or its first ``limit`` bytes (``"head"``: a file of ``/proc``
    or ``/sys``, whose size is not known before it is read) or its last (``"tail"``: a log or an index
    that grows at its end). ``follow=False``: a link at ``path`` is refused (a directory others write
    to). A missing or unreadable file, a FIFO, a device or a directory is a :class:`ReadError`."""
    if keep not in KEEP:
        raise ValueError(f"keep must be one of {', '.join(KEEP)}, not {keep!r}")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | (0 if follow else os.O_NOFOLLOW))
    except OSError as exc:
        raise ReadError(path, f"cannot be read ({exc.strerror or exc})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):  # a FIFO, a device, a directory: nothing to read whole
            os.close(fd)
            raise ReadError(path, "not a regular file")
        with open(fd, "rb") as handle:
            if keep == "tail":
                handle.seek(max(0, info.st_size - limit))
            data = handle.read(limit + 1)
    except OSError as exc:
        raise ReadError(path, f"cannot be read ({exc.strerror or exc})") from None
    if len(data) <= limit:
        return data
    if keep == "all":
        raise ReadError(path, f"larger than {limit} bytes")
    return data[:limit] if keep == "head" else data[-limit:]


def read_text(path: str, limit: int, *, keep: str = "all", follow: bool = True) -> str:
    """:func:`read_bytes` as UTF-8 text, a byte that is not UTF-8 as U+FFFD (logs and ``/proc``
    files are not always UTF-8)."""
    return read_bytes(path, limit, keep=keep, follow=follow).decode("utf-8", "replace")


#: The deepest nesting of arrays and objects a record may have (sitestack writes a few levels):
#: deeper is refused before it can cost a RecursionError, here or in whatever walks the value later.
DEPTH_MAX = 32


def _no_constant(name: str) -> Any:
    # json.loads takes NaN, Infinity and -Infinity, which JSON (RFC 8259, section 6) has not
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    number = float(text)
    if number in (float("inf"), float("-inf")):  # 1e999: a float too large, read as infinity
        raise ValueError(f"{text[:40]} is not a finite number")
    return number


def parse_json(text: "str | bytes", path: str) -> Any:
    """The JSON value of ``text`` (a record read from ``path``): finite numbers only (``NaN`` and
    ``Infinity`` and ``1e999`` refused), nested at most :data:`DEPTH_MAX` deep. A :class:`ReadError` naming the file
    otherwise, with the line and column where the parser gives them. The one JSON parser of what
    sitestack reads back, controller and site alike."""
    try:
        data = json.loads(text.decode("utf-8") if isinstance(text, bytes) else text, parse_constant=_no_constant,
                          parse_float=_finite)
    except UnicodeDecodeError as exc:
        raise ReadError(path, f"not JSON (not UTF-8 at byte {exc.start})") from None
    except ValueError as exc:  # JSONDecodeError names the line and column
        raise ReadError(path, f"not JSON ({str(exc)[:200]})", getattr(exc, "lineno", None)) from None
    except RecursionError:
        raise ReadError(path, f"not JSON this program reads (nested more than {DEPTH_MAX} deep)") from None
    if _depth(data) > DEPTH_MAX:
        raise ReadError(path, f"not JSON this program reads (nested more than {DEPTH_MAX} deep)")
    return data


def _depth(data: Any) -> int:
    """How deeply arrays and objects nest in ``data`` (a scalar: 0), without recursion."""
    deepest, todo = 0, [(data, 1)]
    while todo:
        value, level = todo.pop()
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else None
        if children is None:
            continue
        deepest = max(deepest, level)
        if level > DEPTH_MAX:
            break
        todo.extend((child, level + 1) for child in children)
    return deepest


def read_json(path: str, limit: int, *, follow: bool = True) -> "dict[str, Any]":
    """The JSON object in ``path`` (at most ``limit`` bytes of UTF-8); a :class:`ReadError` naming the
    file otherwise: unreadable (:func:`read_bytes`), not JSON (:func:`parse_json`: with the line and
    column, a number that is not finite, nested too deeply), or another JSON value than an object."""
    data = parse_json(read_bytes(path, limit, follow=follow), path)
    if not isinstance(data, dict):
        raise ReadError(path, f"not a JSON object (a JSON {type(data).__name__})")
    return data
