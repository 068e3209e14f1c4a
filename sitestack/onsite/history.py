"""The site's history of validation and tuning runs: one file per run and an index, append-only.

Standard library only: installed beside ``ddp_check.py``, run by the validation job at its end
(``python3 history.py record --config check-config.json OUT/result.json``) and imported by sitestack
(``invoke validate``, ``invoke tune``, ``invoke history``). Layout of a history directory
(``{prefix}/history``, check-config.json ``history_dir``)::

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

import argparse
import calendar
import contextlib
import errno
import json
import math
import os
import re
import stat
import statistics
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from .ddpcheck.checks import COMPUTE

SCHEMA = "sitestack-history/1"
KINDS = ("validation", "tuning")
INDEX, LOCK, RUNS = "index.jsonl", ".lock", "runs"
#: The most bytes of a record, of the index, and the seconds to wait for the index's lock.
RECORD_MAX = 1 << 20
INDEX_MAX = 256 << 20
LOCK_WAIT = 30.0
#: The times a record holds are after the epoch and before 2**33 s (the year 2242), which every clock,
#: ``time.gmtime`` and ``datetime`` take; a time outside is no time of a run.
TIME_MAX = float(1 << 33)
_ID = re.compile(r"\d{8}T\d{6}Z-(validation|tuning)-[A-Za-z0-9_.-]{1,64}")
TOOLCHAIN_KEYS = ("libfabric", "driver", "kernel", "slurm", "mpi", "torch", "nccl", "python")


class HistoryError(Exception):
    """A history that cannot be written or a result that cannot be recorded: one line for the user."""


# -- records -------------------------------------------------------------------------------------
def run_id(started: float, kind: str, job_id: object) -> str:
    """``<UTC yyyymmddThhmmssZ>-<kind>-<job id>`` (the job id's unsafe characters become ``_``)."""
    if kind not in KINDS:
        raise HistoryError(f"kind must be one of {', '.join(KINDS)}, not {kind!r}")
    job = re.sub(r"[^A-Za-z0-9_.-]", "_", str(job_id or "none"))[:64].lstrip(".") or "none"
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(started)) + f"-{kind}-{job}"


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _text(value: Any, limit: int = 200) -> str | None:
    if value is None:
        return None
    line = " ".join(str(value).split())
    return re.sub(r"[^\x20-\x7e]", "?", line)[:limit] or None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _time(value: Any) -> float | None:
    number = _number(value)
    return number if number is not None and 0 < number < TIME_MAX else None


def _amount(value: Any) -> float | None:
    """A measured amount (GB/s, GFLOPS, seconds): finite, not negative, below 1e15."""
    number = _number(value)
    return number if number is not None and 0 <= number < 1e15 else None


def _array(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _whole(value: Any) -> int | None:
    number = _number(value)
    return int(number) if number is not None and number == int(number) and 0 <= number < 1 << 31 else None


def _texts(value: Any) -> dict[str, str | None]:
    """A mapping of names to texts (a tuning's chosen settings, its evidence), bounded."""
    items = list(value.items())[:100] if isinstance(value, dict) else []
    return {str(_text(k, 128)): _text(v, 1000) for k, v in items}


def metrics_of(result: Mapping[str, Any]) -> dict[str, Any]:
    """The numbers the history compares: busbw at the reference size (the largest size measured where the
    site has no reference), the ranks' compute rate by the clock (median and slowest: DDP runs at the
    slowest rank's pace, and a node shared with other work slows it by the clock), the start-up time."""
    bandwidth = _dict(result.get("bandwidth"))
    rows = [r for r in _array(bandwidth.get("rows")) if isinstance(r, dict) and _number(r.get("busbw_gbs")) is not None]
    reference = _dict(bandwidth.get("reference"))
    busbw = size = None
    if _number(reference.get("measured_gbs")) is not None:
        busbw, size = _number(reference.get("measured_gbs")), reference.get("at_bytes")
    elif rows:
        row = max(rows, key=lambda r: _number(r.get("bytes")) or 0)
        busbw, size = _number(row["busbw_gbs"]), row.get("bytes")
    rates: list[float] = []
    for check in _array(result.get("checks")):
        if isinstance(check, dict) and check.get("name") == COMPUTE.name:
            ranks = _array(_dict(check.get("details")).get("ranks"))
            rates = [v for v in (_number(r.get("gflops")) for r in ranks if isinstance(r, dict)) if v is not None]
    startup = _dict(result.get("startup"))
    return {"busbw_gbs": busbw, "busbw_bytes": _whole(size),
            "compute_gflops": round(statistics.median(rates), 3) if rates else None,
            "compute_min_gflops": round(min(rates), 3) if rates else None,
            "startup_s": _number(startup.get("ready_s"))}


def _started(result: Mapping[str, Any], result_path: str | None) -> float:
    """When the run started: the result's ``started``, else the earliest rank's, else the result file's time."""
    times = [_number(result.get("started"))] + [_number(r.get("started")) for r in _array(result.get("ranks"))
                                                if isinstance(r, dict)]
    known = [t for t in times if t is not None and 0 < t < TIME_MAX]
    if known:
        return min(known)
    with contextlib.suppress(ValueError, TypeError, OverflowError):  # a tuning document's UTC date
        known.append(calendar.timegm(time.strptime(str(result.get("date")), "%Y-%m-%dT%H:%M:%SZ")))
    with contextlib.suppress(OSError, TypeError):
        known.append(os.stat(result_path or "").st_mtime)
    for started in known:
        if _time(started) is not None:
            return started
    raise HistoryError("the result says nothing of when the run started (or a time before 1970 or after 2242)")


def _tuning(doc: Mapping[str, Any]) -> dict[str, Any]:
    """A tuning's part of a record: the settings chosen and their evidence, and whether the decision was
    published (the stack's module sets it) or why not (a sweep cut short keeps its decision to itself)."""
    published = doc.get("published")
    return {"chosen": _texts(doc.get("chosen")), "evidence": _texts(doc.get("evidence")),
            "published": published if isinstance(published, bool) else None,
            "unpublished": _text(doc.get("unpublished"), 400)}


def record_from_result(result: Mapping[str, Any], kind: str, results_dir: str | None,
                       result_path: str | None = None) -> dict[str, Any]:
    """A history record (schema :data:`SCHEMA`) of a validation's ``result.json`` (or a tuning document)."""
    if not isinstance(result, Mapping):
        raise HistoryError("a result is a JSON object")
    started = _started(result, result_path)
    stack = _dict(result.get("stack"))
    toolchain = _dict(result.get("toolchain"))
    verdict = result.get("verdict")
    return {
        "schema": SCHEMA, "id": run_id(started, kind, result.get("job_id")), "kind": kind,
        "site": _text(result.get("site"), 64), "job_id": _text(result.get("job_id"), 64), "started": round(started, 3),
        "verdict": verdict if verdict in ("passed", "failed") else None, "cause": _text(result.get("cause"), 2000),
        "layout": {"nodes": _whole(result.get("nodes")), "world_size": _whole(result.get("world_size")),
                   "launcher": _text(result.get("job_launcher") or result.get("launcher"), 32),
                   "backend": _text(result.get("backend"), 32), "device": _text(result.get("device"), 32)},
        "stack": {"module": _text(stack.get("module")), "digest": _text(stack.get("digest"), 64)},
        "metrics": metrics_of(result) if kind == "validation" else {},
        "toolchain": {"modules": [m for m in (_text(x) for x in _array(toolchain.get("modules"))) if m][:100],
                      **{k: _text(toolchain.get(k)) for k in TOOLCHAIN_KEYS}},
        "results": _text(results_dir or result.get("results"), 4096),
        "regression": None,
        "tuning": _tuning(result) if kind == "tuning" else None,
        **(run_context(result, started) if kind == "validation" else {}),
    }


def run_context(result: Mapping[str, Any], started: float) -> dict[str, Any]:
    """What a performance log says of a run besides its numbers (sitestack/engine/perflog.py): when it
    ended, its hosts, and the busbw reference it was judged against (ReFrame's ``[reference, lower,
    upper]``, thresholds as fractions), only where the measured size is the reference's."""
    elapsed = _number(result.get("elapsed_s"))
    reference = _dict(_dict(result.get("bandwidth")).get("reference"))
    busbw, lower = _number(reference.get("busbw_gbs")), _number(reference.get("lower"))
    same_size = reference.get("at_bytes") == reference.get("message_bytes")
    listed = result.get("hosts")
    hosts = [h for h in (_text(x, 255) for x in listed[:4096]) if h] if isinstance(listed, list) else []
    return {"ended": round(started + elapsed, 3) if elapsed is not None and elapsed >= 0 else None,
            "hosts": hosts or None,
            "references": {"busbw_gbs": [busbw, lower, None]} if busbw and lower is not None and same_size else {}}


METRIC_KEYS = ("busbw_gbs", "busbw_bytes", "compute_gflops", "compute_min_gflops", "startup_s")
STATUSES = ("ok", "warn", "fail", "unknown")


def _scalar_text(value: Any, limit: int = 200) -> str | None:
    """A string field: a string or number as printable text (:func:`_text`), anything else None."""
    return _text(value, limit) if isinstance(value, (str, int, float)) and not isinstance(value, bool) else None


def normalise(data: Any) -> dict[str, Any] | None:
    """The record in ``data`` with every field a reader uses of its type, or None when ``data`` is no
    record: not an object of :data:`SCHEMA`, no run id, a ``kind`` other than its id's, no start time
    between the epoch and :data:`TIME_MAX`. Every record read (:func:`load_record`) or written
    (:func:`append`) passes here, so readers (``list``, sitestack's ``invoke history``, the regression
    alarms, the perflog) trust the types: texts printable and bounded (:func:`_text`), numbers finite
    and in range (times in (0, 2**33), amounts not negative), objects objects, lists lists. Fields a
    record lacks stay absent (``ended``, ``hosts``, ``references``, ``exit_code``, a metric); others
    of a foreign type become null; fields no reader knows are dropped."""
    if not isinstance(data, Mapping) or data.get("schema") != SCHEMA:
        return None
    match = _ID.fullmatch(data["id"]) if isinstance(data.get("id"), str) else None
    started = _time(data.get("started"))
    if match is None or data.get("kind") != match.group(1) or started is None:
        return None
    layout, stack, toolchain = _dict(data.get("layout")), _dict(data.get("stack")), _dict(data.get("toolchain"))
    metrics, regression, tuning = _dict(data.get("metrics")), data.get("regression"), data.get("tuning")
    verdict = data.get("verdict")
    record: dict[str, Any] = {
        "schema": SCHEMA, "id": match.group(0), "kind": match.group(1), "started": started,
        "site": _scalar_text(data.get("site"), 64), "job_id": _scalar_text(data.get("job_id"), 64),
        "verdict": verdict if verdict in ("passed", "failed") else None, "cause": _scalar_text(data.get("cause"), 2000),
        "layout": {"nodes": _whole(layout.get("nodes")), "world_size": _whole(layout.get("world_size")),
                   **{k: _scalar_text(layout.get(k), 32) for k in ("launcher", "backend", "device")}},
        "stack": {"module": _scalar_text(stack.get("module")), "digest": _scalar_text(stack.get("digest"), 64)},
        "metrics": {k: (_whole if k == "busbw_bytes" else _amount)(metrics[k]) for k in METRIC_KEYS if k in metrics},
        "toolchain": {"modules": [m for m in (_scalar_text(x) for x in _array(toolchain.get("modules"))[:100]) if m],
                      **{k: _scalar_text(toolchain.get(k)) for k in TOOLCHAIN_KEYS}},
        "results": _scalar_text(data.get("results"), 4096),
        "regression": {"status": regression.get("status") if regression.get("status") in STATUSES else "unknown",
                       "lines": [t for t in (_scalar_text(x, 2000) for x in _array(regression.get("lines"))[:50]) if t]}
        if isinstance(regression, dict) else None,
        "tuning": _tuning(tuning) if isinstance(tuning, dict) else None,
    }
    return {**record, **_context(data)}


def _context(data: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`run_context`'s fields of a record and its ``exit_code``, those it has, normalised."""
    out: dict[str, Any] = {}
    if "ended" in data:
        out["ended"] = _time(data["ended"])
    if "hosts" in data:
        hosts = [h for h in (_scalar_text(x, 255) for x in _array(data["hosts"])[:4096]) if h]
        out["hosts"] = hosts or None
    if "references" in data:
        busbw = _array(_dict(data["references"]).get("busbw_gbs"))
        triple = [_number(v) for v in busbw] if len(busbw) == 3 else []
        out["references"] = {"busbw_gbs": triple} if triple and triple[0] is not None else {}
    if "exit_code" in data:
        code = data["exit_code"]
        out["exit_code"] = code if isinstance(code, int) and not isinstance(code, bool) and -256 < code < 256 else None
    return out


# -- writing -------------------------------------------------------------------------------------
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


def _fsync_dir(path: str) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _create_run(runs: str, record: Mapping[str, Any], mode: int) -> bool:
    """runs/<id>.json made whole or not at all: a complete temporary file, hard-linked to its name (the link
    fails when the run is already there). True when this call created it."""
    final = os.path.join(runs, f"{record['id']}.json")
    tmp = os.path.join(runs, f".{record['id']}.{os.getpid()}.{time.monotonic_ns()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        os.write(fd, (json.dumps(record, sort_keys=True) + "\n").encode())
        os.fchmod(fd, 0o644)
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, final)
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp)
    _fsync_dir(runs)
    return True


def _open_shared(path: str, flags: int, mode: int) -> int:
    """``path`` opened (made where missing, never through a link) with ``mode`` whatever the umask, where
    it is this user's to change."""
    fd = os.open(path, flags | os.O_CREAT | os.O_NOFOLLOW, mode)
    with contextlib.suppress(OSError):
        if os.fstat(fd).st_uid == os.geteuid() and stat.S_IMODE(os.fstat(fd).st_mode) != mode:
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
        if _create_run(os.path.join(history_dir, RUNS), record, mode):
            _locked_append(history_dir, json.dumps(record, sort_keys=True) + "\n", mode)
    except OSError as exc:
        raise HistoryError(f"{exc.filename or history_dir}: {exc.strerror or exc}") from None
    return str(record["id"])


# -- reading -------------------------------------------------------------------------------------
def valid_id(text: str) -> bool:
    """Whether ``text`` is a run id (:func:`run_id`'s form)."""
    return bool(_ID.fullmatch(text))


def load_record(text: str) -> dict[str, Any] | None:
    """The record in ``text`` (one JSON object of :data:`SCHEMA`), normalised (:func:`normalise`); None for anything else."""
    try:
        return normalise(json.loads(text))
    except (ValueError, RecursionError):
        return None


def _read_bounded(path: str, limit: int) -> str | None:
    """The last ``limit`` bytes of the regular file ``path`` (its newest lines: the index grows at its end;
    a cut first line is left out), never following a link or opening a FIFO or device; None otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):  # a FIFO or device is no history file
            return None
        if info.st_size <= limit:
            return handle.read(limit).decode("utf-8", "replace")
        handle.seek(info.st_size - limit)
        data = handle.read(limit)
        return data[data.find(b"\n") + 1:].decode("utf-8", "replace")


def read(history_dir: str) -> list[dict[str, Any]]:
    """Every run recorded in ``history_dir``, oldest first (by start, then id): the index's lines (a torn
    or foreign line skipped), and from runs/ what the index lacks. [] where there is no history."""
    return scan(history_dir)[0]


def scan(history_dir: str) -> tuple[list[dict[str, Any]], int]:
    """(:func:`read`'s records, how many index lines and runs/ files were skipped: torn, foreign, not
    normalised (:func:`normalise`), not regular files, larger than :data:`RECORD_MAX`)."""
    found, skipped = index_records(_read_bounded(os.path.join(history_dir, INDEX), INDEX_MAX) or "")
    runs, more = _runs(history_dir, set(found))
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
    return sorted(records, key=lambda r: (_number(r.get("started")) or 0.0, r["id"]))


def _runs(history_dir: str, known: set[str]) -> tuple[dict[str, dict[str, Any]], int]:
    """(the records of runs/ but those of ``known`` ids, how many run files were skipped)."""
    found, skipped = {}, 0
    with contextlib.suppress(OSError):
        for name in os.listdir(os.path.join(history_dir, RUNS)):
            if name.endswith(".json") and name[:-5] not in known and _ID.fullmatch(name[:-5]):
                record = run_record(name, _read_bounded(os.path.join(history_dir, RUNS, name), RECORD_MAX + 1))
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
        # a new file, never one another member of the group planted at this name (a link to follow)
        tmp = os.path.join(history_dir, f".{INDEX}.{os.getpid()}.{time.monotonic_ns()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.writelines(json.dumps(r, sort_keys=True) + "\n" for r in records)
                handle.flush()
                os.fchmod(handle.fileno(), mode)
                os.fsync(handle.fileno())
            os.replace(tmp, os.path.join(history_dir, INDEX))
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    return len(records)


# -- comparing -------------------------------------------------------------------------------------
def _module_versions(modules: Any) -> dict[str, str]:
    """``name/version`` modules by name (Lmod's form; a module without a version maps to "")."""
    out: dict[str, str] = {}
    for module in modules or []:
        name, _, version = str(module).rpartition("/")
        out[name or version] = version if name else ""
    return out


def toolchain_changes(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> list[str]:
    """What changed between two toolchain records, one phrase each: ``libfabric 1.15.2.0 -> 1.20.1``,
    ``module cray-mpich 8.1.27 -> 8.1.29``, ``module craype-x86-trento added``; [] when nothing did."""
    old, new = old or {}, new or {}
    changes = []
    before, after = _module_versions(old.get("modules")), _module_versions(new.get("modules"))
    for name in sorted(set(before) | set(after)):
        if name not in after:
            changes.append(f"module {name}{'/' + before[name] if before[name] else ''} removed")
        elif name not in before:
            changes.append(f"module {name}{'/' + after[name] if after[name] else ''} added")
        elif before[name] != after[name]:
            changes.append(f"module {name} {before[name] or '(no version)'} -> {after[name] or '(no version)'}")
    for key in TOOLCHAIN_KEYS:
        if old.get(key) != new.get(key):
            changes.append(f"{key} {old.get(key) or '(none)'} -> {new.get(key) or '(none)'}")
    return changes


# -- the command line ---------------------------------------------------------------------------
def _history_dir(args: argparse.Namespace) -> str:
    if args.dir:
        return str(args.dir)
    try:
        with open(args.config, encoding="utf-8") as handle:
            directory = json.load(handle).get("history_dir")
    except (OSError, ValueError, AttributeError) as exc:
        raise HistoryError(f"{args.config}: {exc}") from None
    if not isinstance(directory, str) or not directory.startswith("/"):
        raise HistoryError(f"{args.config}: history_dir is not an absolute path")
    return directory


def _record(args: argparse.Namespace) -> int:
    text = _read_bounded(args.result, RECORD_MAX * 16)
    if text is None:
        raise HistoryError(f"{args.result}: cannot be read")
    try:
        result = json.loads(text)
    except ValueError as exc:
        raise HistoryError(f"{args.result}: not JSON ({exc})") from None
    if not isinstance(result, dict):
        raise HistoryError(f"{args.result}: not a JSON object")
    record = record_from_result(result, args.kind, os.path.dirname(os.path.abspath(args.result)), args.result)
    return _report(_history_dir(args), record)


def _report(directory: str, record: Mapping[str, Any]) -> int:
    there = os.path.exists(os.path.join(directory, RUNS, f"{record.get('id')}.json"))
    run = append(directory, record)
    print(f"sitestack history: {run} {'was recorded already' if there else 'recorded'} in {directory}")
    return 0


def _append(args: argparse.Namespace) -> int:
    """A record made elsewhere (``invoke validate`` with its regression, ``invoke tune``), given as JSON text."""
    record = load_record(args.record)
    if record is None:
        raise HistoryError(f"not a history record (schema {SCHEMA})")
    return _report(_history_dir(args), record)


def _list(args: argparse.Namespace) -> int:
    """The records (each normalised (:func:`normalise`): every printed text printable), and on stderr how many were skipped."""
    records, skipped = scan(_history_dir(args))
    if args.json:
        print(json.dumps(records, indent=2, sort_keys=True))
    for r in [] if args.json else records:
        m = r["metrics"]
        print(f"{r['id']}  {r['verdict'] or '-'}  busbw {m.get('busbw_gbs')}  compute {m.get('compute_min_gflops')}  "
              f"start-up {m.get('startup_s')}  stack {(r['stack']['digest'] or '-')[:8]}")
    if skipped:
        print(f"sitestack history: {skipped} index lines or run files skipped (torn, not history records, or "
              "not regular files)", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``record [--dir D | --config C] [--kind K] RESULT.json``, ``append (--dir D | --config C) RECORD_JSON``,
    ``list (--dir D | --config C) [--json]``, ``rebuild (--dir D | --config C)``. A history that cannot be written is one line on stderr, exit 1."""
    p = argparse.ArgumentParser(prog="history.py", description="the site's history of validation and tuning runs")
    sub = p.add_subparsers(dest="command", required=True)
    for name in ("record", "append", "list", "rebuild"):
        s = sub.add_parser(name)
        where = s.add_mutually_exclusive_group(required=True)
        where.add_argument("--dir", help="the history directory ({prefix}/history)")
        where.add_argument("--config", help="check-config.json, whose history_dir it is")
        if name == "record":
            s.add_argument("--kind", choices=KINDS, default="validation")
            s.add_argument("result", help="result.json of the run")
        if name == "append":
            s.add_argument("record", help="the record, as JSON text")
        if name == "list":
            s.add_argument("--json", action="store_true", help="the records as a JSON list")
    args = p.parse_args(argv)
    try:
        if args.command in ("record", "append"):
            return _record(args) if args.command == "record" else _append(args)
        if args.command == "rebuild":
            print(f"sitestack history: {rebuild(_history_dir(args))} runs indexed")
            return 0
        return _list(args)
    except HistoryError as exc:
        print(f"sitestack history: not recorded: {exc}" if args.command in ("record", "append") else f"sitestack history: {exc}",
              file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"sitestack history: {exc.filename or ''}: {exc.strerror or exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
