"""The site's history on a host, read and appended through the Host API: ``invoke validate`` records its
run with its regression report, ``invoke tune`` its tuning, ``invoke history`` lists the runs.

The history's format and its writer are the shipped :mod:`sitestack.onsite.history` (installed beside
``ddp_check.py``); here a record is written by running that program on the host (``python3 -E -s -S
history.py append``), so a run on this machine and one over SSH write it the same way, under its lock.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Mapping
from typing import Any

from sitestack.core.errors import SitestackError
from sitestack.core.host import Host
from sitestack.core.report import Reporter
from sitestack.engine import batchjob, regression
from sitestack.model.validation_facts import Regression
from sitestack.onsite import history as shipped
from sitestack.onsite.report_plot import human_bytes

#: The Python that runs the shipped history.py on the host: the host's own, without site hooks.
PYTHON = ("python3", "-E", "-s", "-S")
#: The most runs ``invoke history`` reads from runs/ beside the index (the index holds the rest).
RUNS_MAX = 10000


def history_dir_of(host: Host, validation_dir: str, prefix: str, config: Mapping[str, Any] | None = None) -> str:
    """The history directory the installed job records to (check-config.json ``history_dir``, an absolute
    path), else ``{prefix}/history``. ``config``: the job's configuration as :func:`batchjob.job_config`
    read it (None: read it now)."""
    directory = (batchjob.job_config(host, validation_dir) if config is None else config).get("history_dir")
    return directory if isinstance(directory, str) and directory.startswith("/") else f"{prefix.rstrip('/')}/history"


def read_on(host: Host, history_dir: str) -> tuple[list[dict[str, Any]], list[str]]:
    """(every run of the history on ``host``, oldest first, by :func:`sitestack.onsite.history.read`'s
    rules; warnings, one line each). Each file is read bounded (the index's last ``INDEX_MAX`` bytes, a
    run's first ``RECORD_MAX`` + 1), only where it is a regular file that is no symbolic link: a FIFO
    or device is a warning, never a wait; every record is normalised (the shipped ``normalise``), and
    how many lines and files were skipped is said."""
    warnings: list[str] = []

    def read(path: str, limit: int) -> str | None:
        try:
            return host.read_tail(path, limit, follow=False)
        except SitestackError as exc:
            warnings.append(f"history: skipped: {exc}")
            return None

    found, skipped = shipped.index_records(read(posixpath.join(history_dir, shipped.INDEX), shipped.INDEX_MAX) or "")
    listing = host.probe(["ls", "-1", "--", posixpath.join(history_dir, shipped.RUNS)], timeout=60)
    # the runs the index lacks, the newest RUNS_MAX of them (ls sorts by name: by start time)
    names = [n for n in listing.stdout.splitlines() if n.endswith(".json") and n[:-5] not in found][-RUNS_MAX:] \
        if listing.ok else []
    for name in names:
        if shipped.valid_id(name[:-5]):
            record = shipped.run_record(name, read(posixpath.join(history_dir, shipped.RUNS, name), shipped.RECORD_MAX + 1))
            if record is None:
                skipped += 1
            else:
                found[record["id"]] = record
    if skipped:
        warnings.append(f"history: {skipped} index lines or run files in {history_dir} skipped (torn, not history "
                        "records, or not regular files)")
    return sorted(found.values(), key=lambda r: (r["started"], r["id"])), warnings


def append_on(host: Host, program: str, history_dir: str, record: Mapping[str, Any]) -> str | None:
    """Record ``record`` on ``host`` with the shipped ``program``; None when it was recorded (or was there
    already), else the program's one line (a history this user cannot write)."""
    out = host.probe([*PYTHON, program, "append", "--dir", history_dir, json.dumps(record, sort_keys=True)], timeout=120)
    return None if out.ok else ((out.stderr or out.stdout).strip().splitlines() or ["history.py failed"])[-1]


def after_validation(host: Host, validation_dir: str, prefix: str, result: Mapping[str, Any], out_dir: str,
                     policy: Regression | None, reporter: Reporter,
                     config: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A validation's result against the site's history: the regression report printed (a WARN or FAIL
    prominent), then the run recorded with it (a run the job recorded already is left as it is).
    ``config``: the job's check-config.json as ``invoke validate`` read it (None: read it now)."""
    history_dir = history_dir_of(host, validation_dir, prefix, config)
    try:
        record = shipped.record_from_result(result, "validation", out_dir)
    except shipped.HistoryError as exc:
        reporter.note(f"history: not recorded: {exc}")
        return {"status": "unknown", "lines": [str(exc)], "metrics": {}}
    runs, warnings = read_on(host, history_dir)
    for warning in warnings:
        reporter.note(f"warning: {warning}")
    report = regression.judge(record, runs, policy)
    for line in report["lines"]:
        reporter.note(("!!! " if report["status"] in ("warn", "fail") else "") + line)
    problem = append_on(host, f"{validation_dir}/{posixpath.basename(shipped.__file__)}", history_dir,
                        {**record, "regression": {"status": report["status"], "lines": report["lines"]}})
    reporter.note(f"history: {problem}" if problem else f"history: {record['id']} in {history_dir}")
    return report


def record_tuning(host: Host, history_dir: str, tuning_doc: Mapping[str, Any], validation_dir: str) -> str:
    """Record a tuning (``tuning.json``'s document, section 4 of its format) in the history on ``host``;
    the run id. :class:`SitestackError` (one line) when the history cannot be written."""
    try:
        record = shipped.record_from_result(tuning_doc, "tuning", None)
    except shipped.HistoryError as exc:
        raise SitestackError(f"history: {exc}") from None
    problem = append_on(host, f"{validation_dir}/{posixpath.basename(shipped.__file__)}", history_dir, record)
    if problem:
        raise SitestackError(problem)
    return str(record["id"])


def with_changes(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records, each with ``changes``: what changed in the recorded toolchain since the run before it
    ([] for the first; a stack digest that changed is named too)."""
    out = []
    for i, record in enumerate(records):
        changes: list[str] = []
        if i:
            before = records[i - 1]
            changes = shipped.toolchain_changes(before.get("toolchain"), record.get("toolchain"))
            old, new = (before.get("stack") or {}).get("digest"), (record.get("stack") or {}).get("digest")
            if old != new:
                changes.insert(0, f"stack {str(old or '(none)')[:8]} -> {str(new or '(none)')[:8]}")
        out.append({**record, "changes": changes})
    return out


def row_of(record: Mapping[str, Any]) -> str:
    """One line of ``invoke history``: id, verdict, busbw at its size, compute, start-up, stack, changes."""
    m = record.get("metrics") or {}

    def number(key: str, unit: str) -> str:
        value = m.get(key)
        return f"{value:.3g} {unit}" if isinstance(value, (int, float)) else "-"

    size = m.get("busbw_bytes")
    at = f" at {human_bytes(size)}" if isinstance(size, int) else ""
    regression = record.get("regression") or {}
    verdict = str(record.get("verdict") or "-") + (f" ({regression['status'].upper()})" if regression.get("status")
                                                   in ("warn", "fail") else "")
    stack = str((record.get("stack") or {}).get("digest") or "-")[:8]
    changed = "; ".join(record.get("changes") or []) or "-"
    if record.get("kind") == "tuning":
        return f"{record['id']} [tuning]  {tuning_words(record.get('tuning') or {})}  stack {stack}  changed: {changed}"
    kind = "" if record.get("kind") == "validation" else f" [{record.get('kind')}]"
    return (f"{record['id']}{kind}  {verdict}  busbw {number('busbw_gbs', 'GB/s')}{at}  compute {number('compute_min_gflops', 'GFLOPS')}"
            f"  start-up {number('startup_s', 's')}  stack {stack}  changed: {changed}")


def tuning_words(tuning: Mapping[str, Any]) -> str:
    """A tuning's decision in a few words: what it chose, and whether the stack's module sets it."""
    chosen = ", ".join(f"{k}={v}" for k, v in (tuning.get("chosen") or {}).items()) or "nothing"
    if tuning.get("published") is False:
        return f"chose {chosen}, not published ({tuning.get('unpublished') or 'the sweep was not whole'})"
    return f"chose {chosen}" + (", published" if tuning.get("published") else "")


def list_runs(host: Host, validation_dir: str, prefix: str,
              last: int | None) -> tuple[str, list[dict[str, Any]], list[str]]:
    """(the history directory, its runs oldest first with what changed between them, the last ``last``;
    :func:`read_on`'s warnings)."""
    history_dir = history_dir_of(host, validation_dir, prefix)
    runs, warnings = read_on(host, history_dir)
    records = with_changes(runs)
    return history_dir, records[-last:] if last else records, warnings
