"""``--json FILE`` (or ``--json -``): a task's outcome or data as one JSON document, for scripts and CI.

The schema is documented in docs/cli.md; :data:`SCHEMA_VERSION` changes when a field changes
meaning or goes away (new fields may appear without a change). The file is written after the run
by the one rule for files the user names (:mod:`sitestack.core.user_file`: a regular file or a new
one, written whole; ``-`` is stdout), so a reader never sees half a document.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sitestack.core import user_file
from sitestack.core.redact import redact, redact_data
from sitestack.core.report import HostRun
from sitestack.onsite.visible import printable

if TYPE_CHECKING:  # the validation outcome's module imports the report renderers: not for a provision
    from sitestack.engine.validate import Outcome

#: The version of the document's shape (docs/cli.md).
SCHEMA_VERSION = 1


def check_target(value: str | None) -> None:
    """``--json``: ``-`` or a regular file (or a new one) in a directory that exists; refused before
    anything runs (:func:`sitestack.core.user_file.check`)."""
    user_file.check("--json", value)


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
            "log": outcome.log if outcome else None, "verdict": result["verdict"] if result else None, "result": result,
            "regression": outcome.regression if outcome else None,
            "error": error, "exit_code": outcome.code if outcome else 1,
            **({"stacks": outcome.stacks} if outcome is not None and outcome.stacks is not None else {})}


def write(target: str | None, document: Mapping[str, Any]) -> None:
    """Write ``document`` to ``target`` (``-``: stdout; None: nothing) by the one rule of
    :mod:`sitestack.core.user_file`; a failed write is one message naming ``--json``. A new file is
    private (0600), as the run's logs are; no secret in any document (an index URL's
    credentials are ***: :mod:`sitestack.core.redact`)."""
    user_file.write("--json", target, json.dumps(redact_data(document), indent=2, default=str) + "\n", mode=0o600)


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
            print(printable(redact(line)))   # a listed name may hold any character: shown, never acted on
    write(target, data_document(command, data))
