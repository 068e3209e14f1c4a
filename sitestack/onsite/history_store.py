"""Where the site's history is kept, and how it is written and read: one file per run and an index,
append-only. The history directory is ``{prefix}/history`` (check-config.json ``history_dir``)::

    runs/<run id>.json   one record per run: created once (O_EXCL, by a hard link of a complete,
                         fsynced temporary file), never rewritten; a second record of the same run
                         is a no-op
    index.jsonl          one JSON line per run, appended under flock(2) of .lock, fsynced
    .lock                the index's lock

The run id is ``<UTC yyyymmddThhmmssZ>-<kind>-<job id>`` (the run's start), so a run recorded by
the job and again by ``invoke validate`` is one run. Readers skip a torn or foreign line of the
index and take from ``runs/`` what the index lacks (a writer killed between the two, a file system
without flock): the index is a cache of ``runs/``, which ``rebuild`` rewrites.

Modes: the history follows its prefix. Where the prefix directory is group-writable (a site that
shares its installs with a group, facts.install.mode ``group-write``), the history's directories
are 3775 (setgid: the group is kept; sticky: a member removes or replaces only the files
of the runs they recorded, never another's) and the index and lock 0664, so every member of the group that runs
validations appends to it; elsewhere directories are 0755 and files 0644, written by
the prefix's owner and read by every user of the stack. Records hold results and versions, no
secrets: they are readable as the installed stack is.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from .fileio import ReadError, read_bytes, read_text, write_atomic
from .history_record import SCHEMA, HistoryError, load_record, normalise, valid_id

INDEX, LOCK, RUNS = "index.jsonl", ".lock", "runs"
#: The most bytes of a record, of the index, and the seconds to wait for the index's lock.
RECORD_MAX = 1 << 20
INDEX_MAX = 256 << 20
LOCK_WAIT = 30.0
#: The most runs a reader takes from runs/ beside the index (the index holds the rest; more is a lost index).
RUNS_MAX = 10000


def _modes(history_dir: str) -> tuple[int, int]:
    """(directory mode, shared file mode): group-writable where the prefix (the history's parent) is."""
    parent = os.path.dirname(os.path.abspath(history_dir))
    try:
        shared = bool(os.stat(parent).st_mode & 0o020)
    except OSError:
        shared = False
    return (0o3775, 0o664) if shared else (0o755, 0o644)


def _make_dirs(history_dir: str) -> int:
    dir_mode, file_mode = _modes(history_dir)
    for path in (history_dir, os.path.join(history_dir, RUNS)):
        try:
            os.mkdir(path, dir_mode)
            os.chmod(path, dir_mode)  # the umask narrows mkdir's mode, not chmod's
        except FileExistsError:
            if os.path.islink(path) or not os.path.isdir(path):
                raise HistoryError(f"{path} is not a directory") from None
            info = os.stat(path)
            if info.st_uid == os.geteuid() and stat.S_IMODE(info.st_mode) != dir_mode:
                with contextlib.suppress(OSError):  # a history made before, of another mode: the prefix's now
                    os.chmod(path, dir_mode)
    return file_mode


def _create_run(runs: str, record: Mapping[str, Any]) -> bool:
    """runs/<id>.json made whole or not at all, 0644 (its writer's alone to replace, in a sticky directory):
    the first record of a run wins. True when this call created it."""
    text = json.dumps(record, sort_keys=True) + "\n"
    return write_atomic(os.path.join(runs, f"{record['id']}.json"), text, mode=0o644, exclusive=True)


def _open_shared(path: str, flags: int, mode: int) -> int:
    """``path`` opened (made where missing, never through a link) with ``mode`` whatever the umask, where
    it is this user's to change. Without blocking (an ``O_WRONLY`` open of a FIFO waits for a reader for
    ever: the job's guard outlives the job it records), and a regular file only: else an OSError; a file
    with more than one hard link is a :class:`HistoryError`."""
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, mode)
    except OSError as exc:  # ENXIO: a FIFO no one reads, opened for writing without blocking
        raise OSError(errno.EINVAL, "not a regular file", path) if exc.errno == errno.ENXIO else exc from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", path)
    if info.st_nlink > 1:   # a hard link to a file elsewhere (another user's, one outside the history)
        os.close(fd)
        raise HistoryError(f"{path} has {info.st_nlink} hard links: not the history's own file (left as it is)")
    with contextlib.suppress(OSError):
        if info.st_uid == os.geteuid() and stat.S_IMODE(info.st_mode) != mode:
            os.fchmod(fd, mode)
    return fd


@contextlib.contextmanager
def _index_lock(history_dir: str, mode: int) -> Iterator[None]:
    """flock(2) of .lock, waited for at most :data:`LOCK_WAIT` s; where the file system has no flock (ENOLCK,
    ENOSYS, EOPNOTSUPP: some Lustre and NFS mounts) none, and a line appended in one O_APPEND write that
    a reader may find torn skips it (runs/ holds the record either way)."""
    import fcntl

    fd = _open_shared(os.path.join(history_dir, LOCK), os.O_RDWR, mode)
    try:
        end = time.monotonic() + LOCK_WAIT
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno in (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP):
                    break
                if exc.errno not in (errno.EAGAIN, errno.EACCES) or time.monotonic() > end:
                    raise HistoryError(f"{history_dir}/{LOCK}: the index's lock is busy (runs/ has the record)") from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)  # releases the flock


def _locked_append(history_dir: str, line: str, mode: int) -> None:
    with _index_lock(history_dir, mode):
        fd = _open_shared(os.path.join(history_dir, INDEX), os.O_WRONLY | os.O_APPEND, mode)
        try:
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)


def append(history_dir: str, record: Mapping[str, Any]) -> str:
    """Record a run in ``history_dir`` (made where missing); the run id. A run already recorded is left as
    it is (the first record wins). The record is written as :func:`normalise` makes it; :class:`HistoryError`
    (one line) when it is no record or the history cannot be written."""
    normalised = normalise(record)
    if normalised is None:
        raise HistoryError(f"not a history record (schema {SCHEMA}, id <UTC time>-<kind>-<job id>, its kind, "
                           "a start time in seconds since the epoch)")
    record = normalised
    try:
        mode = _make_dirs(history_dir)
        if _create_run(os.path.join(history_dir, RUNS), record):
            _locked_append(history_dir, json.dumps(record, sort_keys=True) + "\n", mode)
    except OSError as exc:
        raise HistoryError(f"{exc.filename or history_dir}: {exc.strerror or exc}") from None
    return str(record["id"])


def newest_lines(path: str, limit: int, warnings: list[str] | None = None) -> str | None:
    """The last ``limit`` bytes of the regular file ``path`` (its newest lines: the index grows at its end;
    a cut first line is left out), never following a link (:func:`.fileio.read_bytes`); None where it
    cannot be read, and then, with ``warnings``, why appended (:func:`_unreadable`)."""
    try:
        data = read_bytes(path, limit + 1, keep="tail", follow=False)
    except ReadError as exc:
        _unreadable(path, exc, warnings)
        return None
    if len(data) > limit:  # cut: its first line is a part of one
        data = data[1:]
        data = data[data.find(b"\n") + 1:]
    return data.decode("utf-8", "replace")


def _unreadable(path: str, exc: ReadError, warnings: list[str] | None) -> None:
    """Why ``path`` was not read, one line appended to ``warnings``: a symbolic link, not a regular
    file (a FIFO, a device: never waited on), unreadable; nothing where it is missing (no history yet,
    a run file removed since the directory was listed)."""
    if warnings is None:
        return
    try:
        info: os.stat_result | None = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError:
        info = None
    if info is not None and stat.S_ISLNK(info.st_mode):
        warnings.append(f"history: skipped: {path} is a symbolic link, not a regular file")
    elif info is not None and not stat.S_ISREG(info.st_mode):
        warnings.append(f"history: skipped: {path} is not a regular file")
    else:
        warnings.append(f"history: skipped: {exc}")


def _run_file(path: str, warnings: list[str] | None) -> str | None:
    """A run file's first :data:`RECORD_MAX` + 1 bytes as text (a larger file is no record:
    :func:`run_record` refuses it); None where it is not read (:func:`_unreadable`)."""
    try:
        return read_text(path, RECORD_MAX + 1, keep="head", follow=False)
    except ReadError as exc:
        _unreadable(path, exc, warnings)
        return None


def read(history_dir: str) -> list[dict[str, Any]]:
    """Every run recorded in ``history_dir``, oldest first (by start, then id): the index's lines (a torn
    or foreign line skipped), and from runs/ what the index lacks. [] where there is no history."""
    return scan(history_dir)[0]


def scan(history_dir: str, warnings: list[str] | None = None) -> tuple[list[dict[str, Any]], int]:
    """(:func:`read`'s records, how many index lines and runs/ files were skipped: torn, foreign, not
    normalised (:func:`normalise`), not regular files, larger than :data:`RECORD_MAX`). Of the runs
    the index lacks, the newest :data:`RUNS_MAX`. With ``warnings``, each file there that was not
    read is one line appended (:func:`_unreadable`)."""
    found, skipped = index_records(newest_lines(os.path.join(history_dir, INDEX), INDEX_MAX, warnings) or "")
    runs, more = _runs(history_dir, set(found), RUNS_MAX, warnings)
    found.update(runs)
    return _ordered(found.values()), skipped + more


def index_records(text: str) -> tuple[dict[str, dict[str, Any]], int]:
    """(the records of an index's ``text`` by id, the first of an id winning; how many lines were skipped)."""
    found: dict[str, dict[str, Any]] = {}
    skipped = 0
    for line in text.splitlines():
        record = load_record(line)
        if record is not None:
            found.setdefault(record["id"], record)
        elif line.strip():
            skipped += 1
    return found, skipped


def run_record(name: str, text: str | None) -> dict[str, Any] | None:
    """The record of runs/``name`` whose ``text`` was read (None: not read), or None: a file of another
    name, too large, no record, or the record of another run."""
    record = load_record(text) if text is not None and len(text) <= RECORD_MAX else None
    return record if record is not None and name == f"{record['id']}.json" else None


def _ordered(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(records, key=lambda r: (r["started"], r["id"]))  # normalised: a float, an id


def _runs(history_dir: str, known: set[str], most: int | None = None,
          warnings: list[str] | None = None) -> tuple[dict[str, dict[str, Any]], int]:
    """(the records of runs/ but those of ``known`` ids, the newest ``most`` of them (by name: by start
    time; None: all), how many run files were skipped)."""
    found, skipped = {}, 0
    try:
        names = sorted(n for n in os.listdir(os.path.join(history_dir, RUNS))
                       if n.endswith(".json") and n[:-5] not in known and valid_id(n[:-5]))
    except OSError:
        names = []
    for name in names[-most:] if most else names:
        record = run_record(name, _run_file(os.path.join(history_dir, RUNS, name), warnings))
        if record is None:
            skipped += 1
        else:
            found[record["id"]] = record
    return found, skipped


def rebuild(history_dir: str) -> int:
    """Rewrite the index from runs/ (under its lock, atomically); the number of runs."""
    records = _ordered(_runs(history_dir, set())[0].values())
    mode = _modes(history_dir)[1]
    with _index_lock(history_dir, mode):
        # a new file (never one another member of the group planted at its temporary name), then renamed
        write_atomic(os.path.join(history_dir, INDEX), "".join(json.dumps(r, sort_keys=True) + "\n" for r in records),
                     mode=mode)
    return len(records)

