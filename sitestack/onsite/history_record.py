"""A record of the site's history (schema :data:`SCHEMA`): made from a validation's ``result.json`` or a
tuning document (:func:`record_from_result`), and normalised (:func:`normalise`) whenever one is written
or read, so every reader trusts its types. :func:`toolchain_changes` says what changed between two
records' toolchains. Where records are kept: :mod:`.history_store`; the program: :mod:`.history`.
"""

from __future__ import annotations

import calendar
import contextlib
import math
import os
import re
import statistics
import time
from collections.abc import Mapping
from typing import Any

from .ddpcheck.checks import COMPUTE
from .fileio import ReadError, parse_json
from .fingerprint import KEYS as FINGERPRINT_KEYS
from .visible import short_line

SCHEMA = "sitestack-history/1"
KINDS = ("validation", "tuning")
#: The times a record holds are after the epoch and before 2**33 s (the year 2242), which every clock,
#: ``time.gmtime`` and ``datetime`` take; a time outside is no time of a run.
TIME_MAX = float(1 << 33)
_ID = re.compile(r"\d{8}T\d{6}Z-(validation|tuning)-[A-Za-z0-9_.-]{1,64}")
#: A toolchain's single-valued fields: the host's fingerprint (:mod:`.fingerprint`), then what the ranks loaded.
TOOLCHAIN_KEYS = (*FINGERPRINT_KEYS, "mpi", "torch", "nccl", "python")


class HistoryError(Exception):
    """A history that cannot be written or a result that cannot be recorded: one line for the user."""


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
    """``value`` as one printable line of at most ``limit`` characters (:func:`.visible.short_line`)."""
    return short_line(value, limit)


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
    judged: list[float] = []  # the rate each rank was judged by (on a CPU, on its own CPU time)
    waited = [w for w in [_number(bandwidth.get("cpu_waited_per_s"))] if w is not None]
    for check in _array(result.get("checks")):
        if isinstance(check, dict) and check.get("name") == COMPUTE.name:
            ranks = [r for r in _array(_dict(check.get("details")).get("ranks")) if isinstance(r, dict)]
            rates = [v for v in (_number(r.get("gflops")) for r in ranks) if v is not None]
            judged = [v for v in (_number(r.get("judged_gflops")) for r in ranks) if v is not None]
            waited += [v for v in (_number(r.get("waited_per_s")) for r in ranks) if v is not None]
    startup = _dict(result.get("startup"))
    return {"busbw_gbs": busbw, "busbw_bytes": _whole(size), "cpu_waited": max(waited) if waited else None,
            "compute_gflops": round(statistics.median(rates), 3) if rates else None,
            "compute_min_gflops": round(min(rates), 3) if rates else None,
            "compute_judged_min_gflops": round(min(judged), 3) if judged else None,
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
    toolchain, verdict = _dict(result.get("toolchain")), result.get("verdict")
    return {
        "schema": SCHEMA, "id": run_id(started, kind, result.get("job_id")), "kind": kind,
        "site": _text(result.get("site"), 64), "job_id": _text(result.get("job_id"), 64), "started": round(started, 3),
        "verdict": verdict if verdict in ("passed", "failed") else None, "cause": _text(result.get("cause"), 2000),
        "layout": {"nodes": _whole(result.get("nodes")), "world_size": _whole(result.get("world_size")),
                   "launcher": _text(result.get("job_launcher") or result.get("launcher"), 32),
                   "backend": _text(result.get("backend"), 32), "device": _text(result.get("device"), 32)},
        "stack": {"module": _text(stack.get("module")), "digest": _text(stack.get("digest"), 64)},
        "metrics": metrics_of(result) if kind == "validation" else {},
        "toolchain": host_facts(toolchain, TOOLCHAIN_KEYS),
        "fingerprint": host_facts(result["fingerprint"], FINGERPRINT_KEYS) if isinstance(result.get("fingerprint"), dict) else None,
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


METRIC_KEYS = ("busbw_gbs", "busbw_bytes", "cpu_waited", "compute_gflops", "compute_min_gflops", "compute_judged_min_gflops", "startup_s")
STATUSES = ("ok", "warn", "fail", "unknown")


def _scalar_text(value: Any, limit: int = 200) -> str | None:
    """A string field: a string or number as printable text (:func:`_text`), anything else None."""
    return _text(value, limit) if isinstance(value, (str, int, float)) and not isinstance(value, bool) else None


def host_facts(value: Any, keys: tuple[str, ...]) -> dict[str, Any]:
    """A toolchain (``keys``: :data:`TOOLCHAIN_KEYS`) or a host's fingerprint (``keys``: the fingerprint's)
    as a record holds it: ``modules`` at most 100 texts, ``module_files`` at most 100 module -> file texts,
    each key a text or null."""
    data = _dict(value)
    files = list(_dict(data.get("module_files")).items())[:100]
    return {"modules": [m for m in (_scalar_text(x) for x in _array(data.get("modules"))[:100]) if m],
            "module_files": {str(_text(k)): v for k, v in ((k, _scalar_text(v, 400)) for k, v in files) if v},
            **{k: _scalar_text(data.get(k)) for k in keys}}


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
        "toolchain": host_facts(toolchain, TOOLCHAIN_KEYS),
        "fingerprint": host_facts(data["fingerprint"], FINGERPRINT_KEYS) if isinstance(data.get("fingerprint"), dict) else None,
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


def valid_id(text: str) -> bool:
    """Whether ``text`` is a run id (:func:`run_id`'s form)."""
    return bool(_ID.fullmatch(text))


def load_record(text: str) -> dict[str, Any] | None:
    """The record in ``text`` (one JSON object of :data:`SCHEMA`), normalised (:func:`normalise`); None for anything else."""
    try:
        return normalise(parse_json(text, "record"))
    except ReadError:
        return None



def _module_versions(modules: Any) -> dict[str, str]:
    """``name/version`` modules by name (Lmod's form; a module without a version maps to "")."""
    out: dict[str, str] = {}
    for module in modules or []:
        name, _, version = str(module).rpartition("/")
        out[name or version] = version if name else ""
    return out


def toolchain_changes(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None,
                      keys: tuple[str, ...] = TOOLCHAIN_KEYS) -> list[str]:
    """What changed between two toolchain records (or two fingerprints, ``keys`` theirs), one phrase each:
    ``libfabric 1.15.2.0 -> 1.20.1``, ``module cray-mpich 8.1.27 -> 8.1.29``, ``module craype-x86-trento
    added``, ``module file of cray-mpich/8.1.27 A -> B`` (the same version resolved elsewhere); [] when
    nothing did. A record without ``module_files`` (older ones) names no module file change."""
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
    files_before, files_after = old.get("module_files") or {}, new.get("module_files") or {}
    for module in sorted(set(files_before) & set(files_after)):
        if files_before[module] != files_after[module]:
            changes.append(f"module file of {module} {files_before[module]} -> {files_after[module]}")
    for key in keys:
        if old.get(key) != new.get(key):
            changes.append(f"{key} {old.get(key) or '(none)'} -> {new.get(key) or '(none)'}")
    return changes

