"""``result.json``: the document a validation job leaves for the controller, typed once.

Rank 0 writes it when the checks finish (:mod:`.ddpcheck.result_file`); a watchdog or the guard
writes it in the ranks' place when the run did not finish (:mod:`.ddpcheck.faults`). Both build it
with :func:`build_result`, so a fault's result has every key a finished run's has, each of the same
type (a section the writer could not know is empty). Every reader checks a document read back with
:func:`problem` (``invoke validate``, the guard, a tuning sweep) and then holds a :class:`Result`.

:data:`SCHEMA` is the document's ``schema`` field. It changes when a field is added, removed or
changes its type, and a reader refuses a document of another version (one written by an older or
newer validation job: re-install the job with the same sitestack):

- 1: the first version; a fault's result lacked ``startup``, ``stack``, ``toolchain`` and
  ``job_environment``.
- 2: every result has every field of :class:`Result` (``tune`` only a tuning point's).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, TypedDict

from .fileio import ReadError, parse_json, read_bytes

SCHEMA = 2
#: The largest result.json read back (a run's is a few KiB, a tuning point's a few tens of KiB).
MAX_BYTES = 16 << 20
#: A check's statuses, and the run's verdicts (ddpcheck/verdicts.py names them for the checks).
STATUSES = ("passed", "failed", "skipped")
VERDICTS = ("passed", "failed")


class CheckRecord(TypedDict):
    """One check's outcome (``checks[]``): ddpcheck/verdicts.py ``Check`` as a JSON object."""

    name: str
    status: str  # one of STATUSES
    summary: str
    details: dict[str, Any]
    seconds: float


class _Fields(TypedDict):
    schema: int
    site: str
    job_id: str | None
    launcher: str | None  # the launcher ranks.py detected
    job_launcher: str | None  # the batch script's launcher ($SITESTACK_LAUNCHER)
    started: float | None  # epoch seconds
    backend: str | None  # None: the run ended before torch picked a device
    device: str | None
    world_size: int
    nodes: int
    hosts: list[str]
    torch: str | None
    verdict: str  # one of VERDICTS
    cause: str | None  # the first failed check's "name: summary", or the fault's cause
    fault: dict[str, Any] | None  # what a watchdog or the guard reported (ddpcheck/faults.py)
    checks: list[CheckRecord]
    ranks: list[dict[str, Any]]
    bandwidth: dict[str, Any]
    mpi: dict[str, Any]
    startup: dict[str, Any]
    stack: dict[str, Any]
    toolchain: dict[str, Any]
    job_environment: dict[str, Any]
    elapsed_s: float
    time_limit: dict[str, Any]
    artefacts: dict[str, Any]


class Result(_Fields, total=False):
    """The whole document; ``tune`` only in a tuning point's (``ddp_check.py --tune``)."""

    tune: dict[str, Any]


_NONE = type(None)
_NUMBER = (int, float)
#: The JSON types of each field, checked when a document is read back: the :class:`Result` above, at run time.
FIELDS: dict[str, tuple[type, ...]] = {
    "schema": (int,), "site": (str,), "job_id": (str, _NONE), "launcher": (str, _NONE),
    "job_launcher": (str, _NONE), "started": (*_NUMBER, _NONE), "backend": (str, _NONE), "device": (str, _NONE),
    "world_size": (int,), "nodes": (int,), "hosts": (list,), "torch": (str, _NONE), "verdict": (str,),
    "cause": (str, _NONE), "fault": (dict, _NONE), "checks": (list,), "ranks": (list,), "bandwidth": (dict,),
    "mpi": (dict,), "startup": (dict,), "stack": (dict,), "toolchain": (dict,), "job_environment": (dict,),
    "elapsed_s": _NUMBER, "time_limit": (dict,), "artefacts": (dict,),
}
OPTIONAL: dict[str, tuple[type, ...]] = {"tune": (dict,)}
CHECK_FIELDS: dict[str, tuple[type, ...]] = {"name": (str,), "status": (str,), "summary": (str,), "details": (dict,),
                                             "seconds": _NUMBER}
#: The report files a result names (``artefacts``); the plot names itself once drawn (ddp_report.py).
ARTEFACTS = {"json": "result.json", "markdown": "summary.md", "plot": None}


def build_result(*, site: str, job_id: str | None, launcher: str | None, job_launcher: str | None,
                 started: float | None, backend: str | None, device: str | None, world_size: int,
                 hosts: list[str], torch: str | None, verdict: str, checks: list[dict[str, Any]],
                 fault: dict[str, Any] | None, ranks: list[dict[str, Any]], time_limit: dict[str, Any],
                 bandwidth: dict[str, Any] | None = None, mpi: dict[str, Any] | None = None,
                 startup: dict[str, Any] | None = None, stack: dict[str, Any] | None = None,
                 toolchain: dict[str, Any] | None = None, job_environment: dict[str, Any] | None = None,
                 plot_note: str | None = None, tune: dict[str, Any] | None = None) -> Result:
    """The one way a result is made. The writer passes what it knows; a section it does not know is
    empty ({}). A fault makes the verdict ``failed`` and is the cause; otherwise the cause is the first
    failed check's. ``nodes`` is the number of ``hosts``; ``elapsed_s`` the time since ``started``."""
    failed = next((c for c in checks if c["status"] == "failed"), None)
    cause = fault["cause"] if fault else (f"{failed['name']}: {failed['summary']}" if failed else None)
    result: Result = {
        "schema": SCHEMA, "site": site, "job_id": job_id, "launcher": launcher, "job_launcher": job_launcher,
        "started": round(started, 3) if started is not None else None, "backend": backend, "device": device,
        "world_size": world_size, "nodes": len(hosts), "hosts": hosts, "torch": torch,
        "verdict": "failed" if fault else verdict, "cause": cause, "fault": fault,
        "checks": [_check_record(c) for c in checks], "ranks": ranks, "bandwidth": bandwidth or {}, "mpi": mpi or {},
        "startup": startup or {}, "stack": stack or {}, "toolchain": toolchain or {},
        "job_environment": job_environment or {},
        "elapsed_s": max(0.0, round(time.time() - started, 2)) if started is not None else 0.0,
        "time_limit": time_limit,
        "artefacts": {**ARTEFACTS, **({"plot_note": plot_note} if plot_note else {})},
    }
    if tune is not None:
        result["tune"] = tune
    return result


def _check_record(check: Mapping[str, Any]) -> CheckRecord:
    return {"name": check["name"], "status": check["status"], "summary": check["summary"],
            "details": check.get("details") or {}, "seconds": check.get("seconds") or 0.0}


def _kind(value: object) -> str:
    return "null" if value is None else f"a JSON {type(value).__name__}"


def _wrong(value: object, types: tuple[type, ...]) -> bool:
    """Whether ``value`` is none of ``types`` (a bool is no number here, though Python calls it an int)."""
    return not isinstance(value, types) or (isinstance(value, bool) and bool not in types)


def problem(data: object) -> str | None:
    """Why ``data`` (a parsed ``result.json``) is no :class:`Result` of :data:`SCHEMA`, in a few words
    naming the field; None when it is one."""
    if not isinstance(data, dict):
        return f"{_kind(data)}, not an object"
    if data.get("schema") != SCHEMA:
        return (f"schema {data.get('schema')!r}, not {SCHEMA}: written by another version of the validation job "
                "(re-install the job)")
    for key, types in (*FIELDS.items(), *((k, t) for k, t in OPTIONAL.items() if k in data)):
        if key not in data:
            return f"no `{key}`"
        if _wrong(data[key], types):
            return f"`{key}` is {_kind(data[key])}, not {' or '.join(t.__name__ for t in types)}"
    if data["verdict"] not in VERDICTS:
        return f"`verdict` is {data['verdict']!r}, not {' or '.join(VERDICTS)}"
    for i, check in enumerate(data["checks"]):
        if not isinstance(check, dict):
            return f"`checks[{i}]` is {_kind(check)}, not an object"
        for key, types in CHECK_FIELDS.items():
            if key not in check or _wrong(check[key], types):
                return f"`checks[{i}].{key}` is {_kind(check.get(key)) if key in check else 'missing'}"
        if check["status"] not in STATUSES:
            return f"`checks[{i}].status` is {check['status']!r}, not {', '.join(STATUSES)}"
    return None


def as_result(data: object) -> tuple[Result | None, str]:
    """(``data`` as a :class:`Result`, ""), or (None, :func:`problem`'s words)."""
    why = problem(data)
    if why is not None or not isinstance(data, dict):
        return None, why or "not an object"
    result: Result = data  # type: ignore[assignment]  # checked field by field above
    return result, ""


def parse_result(text: str | bytes) -> tuple[Result | None, str]:
    """(the :class:`Result` in ``text``, ""), or (None, why it is none: not JSON, or :func:`problem`)."""
    try:
        data = parse_json(text, "result")
    except ReadError as exc:  # names the line and column, a number that is not finite, nesting too deep
        return None, exc.reason
    return as_result(data)


def load_result(path: str) -> tuple[Result | None, str]:
    """:func:`parse_result` of the file ``path``, read bounded (at most :data:`MAX_BYTES`)."""
    try:
        raw = read_bytes(path, MAX_BYTES)
    except ReadError as exc:
        return None, exc.reason
    return parse_result(raw)


def exit_code(result: Mapping[str, Any] | None, rc: int | None = None, timed_out: bool = False) -> int:
    """The validation's exit code, decided here only: the job's own non-zero code ``rc`` where it has one
    (the launcher's, a signal's), else 0 when the verdict is ``passed`` and 1 otherwise (no result, a
    failed check, a fault); 3 for a run the guard timed out that had no other code. Every rank, the guard
    and the job exit with it; ``invoke validate`` exits 0 only where it is 0 (and 1 otherwise)."""
    code = rc or (0 if result is not None and result.get("verdict") == "passed" else 1)
    return code or (3 if timed_out else 0)
