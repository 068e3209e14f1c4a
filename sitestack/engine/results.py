"""``--json FILE`` (or ``--json -``): a task's outcome or data as one JSON document, for scripts and CI.

The schema is documented in docs/cli.md; :data:`SCHEMA_VERSION` changes when a field changes
meaning or goes away (new fields may appear without a change). The file is written whole
(a temporary file renamed over it), after the run, so a reader never sees half a document.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sitestack.core.errors import InputError
from sitestack.core.files import atomic_write
from sitestack.core.quoting import control_problem
from sitestack.core.redact import redact, redact_data
from sitestack.core.report import HostRun
from sitestack.engine.validate import Outcome

#: The version of the document's shape (docs/cli.md).
SCHEMA_VERSION = 1


def check_target(value: str | None) -> None:
    """``--json``: ``-`` or a file path whose directory exists; refused before anything runs."""
    if value is None or value == "-":
        return
    problem = control_problem(value) if value else "empty"
    if problem:
        raise InputError("--json", problem)
    parent = Path(value).expanduser().resolve().parent
    if not parent.is_dir():
        raise InputError("--json", f"{value!r}: directory {parent} does not exist")
    if Path(value).is_dir():
        raise InputError("--json", f"{value!r} is a directory")


def host_document(run: HostRun) -> dict[str, Any]:
    """One host: its status, error, time, the recap's numbers and each step's result."""
    status = "failed" if run.failed else "changed" if run.changed else "ok"
    return {
        "host": run.host,
        "status": status,
        "error": run.error,
        "elapsed": round(run.elapsed, 3),
        "counts": run.counts(),
        "steps": [{"step": r.step, "handler": r.handler, "status": r.status, "message": r.message,
                   "elapsed": round(r.elapsed, 3), "diff": bool(r.diff), "probed": r.probed}
                  for r in run.results],
    }


def run_document(command: str, site: str, runs: Sequence[HostRun], *, code: int, check: bool,
                 log_dir: Path | None) -> dict[str, Any]:
    """The document of a playbook run (provision, the build and stack tasks)."""
    return {
        "schema_version": SCHEMA_VERSION,
        "command": command,
        "site": site,
        "check": check,
        "log_dir": str(log_dir) if log_dir is not None else None,
        "hosts": [host_document(r) for r in runs],
        "recap": {r.host: r.counts() for r in runs},
        "exit_code": code,
    }


def validate_document(site: str, outcome: Outcome | None, error: str | None = None) -> dict[str, Any]:
    """The document of ``invoke validate``: the job, where its results are, the verdict; or the
    error that ended it (exit code 1)."""
    result = outcome.result if outcome is not None else None
    return {"schema_version": SCHEMA_VERSION, "command": "validate", "site": site,
            "job_id": outcome.job_id if outcome else None, "results_dir": outcome.out_dir if outcome else None,
            "log": outcome.log if outcome else None, "verdict": (result or {}).get("verdict"), "result": result,
            "error": error, "exit_code": outcome.code if outcome else 1}


def write(target: str | None, document: Mapping[str, Any]) -> None:
    """Write ``document`` to ``target`` (``-``: stdout); nothing for None."""
    if target is None:
        return
    # no secret in any document: an index URL's credentials and the like are *** (sitestack.core.redact)
    text = json.dumps(redact_data(document), indent=2, default=str) + "\n"
    if target == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    # private, as the run's logs are; a stream (/dev/stdout, a FIFO) is written to, never replaced
    atomic_write(Path(target).expanduser(), text.encode(), mode=0o600)


def data_document(command: str, data: Mapping[str, Any]) -> dict[str, Any]:
    """The document of a task that prints data (sites, recipes, actions, show-site, checksum,
    installed, nccl-log): ``schema_version``, ``command``, then the task's own fields."""
    return {"schema_version": SCHEMA_VERSION, "command": command, **data}


def emit(target: str | None, command: str, data: Mapping[str, Any], human: Iterable[str]) -> None:
    """The one way a data-printing task prints: its ``human`` lines on stdout unless ``--json -``;
    with ``--json FILE`` (or ``-``) also :func:`data_document` there. ``target`` was checked
    (:func:`check_target`) before the task did its work."""
    if target != "-":
        for line in human:
            print(redact(line))
    write(target, data_document(command, data))
