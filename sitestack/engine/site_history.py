"""The site's history on a host, read and appended through the Host API: ``invoke validate`` records its
run with its regression report, ``invoke tune`` its tuning, ``invoke history`` lists the runs.

The history's format, its writer and its reader are the shipped :mod:`sitestack.onsite.history`
(installed beside ``ddp_check.py``); here the history is read and written by running that program
on the host (``python3 -E -s -S history.py list --json`` and ``append``), so a run on this machine and
one over SSH read it with the same rules and write it the same way, under its lock.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Mapping
from typing import Any

from sitestack.core.bounded import output_bounded
from sitestack.core.errors import SitestackError
from sitestack.core.host import Host
from sitestack.core.report import Reporter
from sitestack.engine import batchjob, regression
from sitestack.model.validation_facts import Regression
from sitestack.onsite import history as shipped
from sitestack.onsite.fileio import ReadError, parse_json
from sitestack.onsite.report_plot import human_bytes
from sitestack.onsite.visible import escaped

#: The Python that runs the shipped history.py on the host: the host's own, without site hooks.
PYTHON = ("python3", "-E", "-s", "-S")
#: The most bytes of ``history.py list --json`` read: the index's cap (``INDEX_MAX``, 256 MiB), twice
#: over for the listing's indentation; a program that prints more is refused, not read.
LIST_MAX = 2 * shipped.INDEX_MAX
#: The most characters of one warning the listing brings (a path and a reason).
WARNING_MAX = 4096
#: What to do where the installed program is not this sitestack's.
AGAIN = "install the validation job again (`invoke install-validation-job`)"


def history_dir_of(host: Host, validation_dir: str, prefix: str, config: Mapping[str, Any] | None = None) -> str:
    """The history directory the installed job records to (check-config.json ``history_dir``, an absolute
    path), else ``{prefix}/history``. ``config``: the job's configuration as :func:`batchjob.job_config`
    read it (None: read it now)."""
    directory = (batchjob.job_config(host, validation_dir) if config is None else config).get("history_dir")
    return directory if isinstance(directory, str) and directory.startswith("/") else f"{prefix.rstrip('/')}/history"


def program_of(validation_dir: str) -> str:
    """The shipped history program of the job installed in ``validation_dir`` (its launcher)."""
    return f"{validation_dir}/{posixpath.basename(shipped.__file__)}"


def read_on(host: Host, program: str, history_dir: str) -> tuple[list[dict[str, Any]], list[str]]:
    """(every run of the history on ``host``, oldest first; warnings, one line each), as the shipped
    ``program`` lists them (``history.py list --json``, :func:`sitestack.onsite.history.listing`: the
    files it did not read, how many lines and files it skipped). Read bounded (:data:`LIST_MAX`) and
    checked (:func:`listing_of`). Where ``program`` is not installed: nothing where there is no
    history either, else a :class:`SitestackError` saying to install the validation job."""
    what = f"[{host.name}] {escaped(program)} list"
    out = output_bounded(host, [*PYTHON, program, "list", "--json", "--dir", history_dir], LIST_MAX)
    if len(out.stdout.encode("utf-8", "replace")) > LIST_MAX:
        raise SitestackError(f"{what}: printed more than {LIST_MAX} bytes: not a listing this sitestack reads; {AGAIN}")
    if not out.ok:
        if not host.probe(["test", "-f", program]).ok:
            if not host.exists(history_dir):
                return [], []
            raise SitestackError(f"[{host.name}] {escaped(history_dir)} cannot be read: {escaped(program)} is missing: install the "
                                 "validation job (`invoke install-validation-job`)")
        said = (out.stderr.strip().splitlines() or [f"exit {out.rc}"])[-1]
        raise SitestackError(f"{what}: {escaped(said[:WARNING_MAX])}")
    return listing_of(out.stdout, what)


def listing_of(text: str, what: str) -> tuple[list[dict[str, Any]], list[str]]:
    """The runs and warnings of ``history.py list --json``'s ``text`` (``what`` printed it), each run
    normalised again (the shipped ``normalise``: the controller trusts no type it did not check) and
    the runs oldest first, each warning one printable line; anything else is a :class:`SitestackError`
    naming ``what``: not JSON, not a :data:`~sitestack.onsite.history.LISTING` document, a run that is
    no record, a warning that is no string."""
    try:
        data = parse_json(text, what)
    except ReadError as exc:
        raise SitestackError(f"{what}: {escaped(exc.reason[:200])}; {AGAIN}") from None
    if not isinstance(data, dict) or data.get("schema") != shipped.LISTING:
        raise SitestackError(f"{what}: not a listing of schema {shipped.LISTING}; {AGAIN}")
    runs, warnings = data.get("runs"), data.get("warnings")
    if not isinstance(runs, list) or not isinstance(warnings, list) or not all(isinstance(w, str) for w in warnings):
        raise SitestackError(f"{what}: not a listing of {shipped.LISTING} (`runs` a list of records, `warnings` a "
                             f"list of strings); {AGAIN}")
    records = [shipped.normalise(run) for run in runs]
    for i, record in enumerate(records):
        if record is None:
            raise SitestackError(f"{what}: runs[{i}]: not a history record ({shipped.SCHEMA}); {AGAIN}")
    checked = [r for r in records if r is not None]
    return sorted(checked, key=lambda r: (r["started"], r["id"])), [escaped(w[:WARNING_MAX]) for w in warnings]


def append_on(host: Host, program: str, history_dir: str, record: Mapping[str, Any]) -> str | None:
    """Record ``record`` on ``host`` with the shipped ``program``; None when it was recorded (or was there
    already), else the program's one line (a history this user cannot write)."""
    out = host.probe([*PYTHON, program, "append", "--dir", history_dir, json.dumps(record, sort_keys=True)], timeout=120)
    return None if out.ok else ((out.stderr or out.stdout).strip().splitlines() or ["history.py failed"])[-1]


def after_validation(host: Host, validation_dir: str, prefix: str, result: Mapping[str, Any], out_dir: str,
                     policy: Regression | None, reporter: Reporter,
                     config: Mapping[str, Any] | None = None,
                     fingerprint: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A validation's result against the site's history: the regression report printed (a WARN or FAIL
    prominent), then the run recorded with it (a run the job recorded already is left as it is).
    ``config``: the job's check-config.json as ``invoke validate`` read it (None: read it now);
    ``fingerprint``: the submitting host's, read before the run (:mod:`.host_fingerprint`), kept in the record."""
    history_dir = history_dir_of(host, validation_dir, prefix, config)
    try:
        with_host = {**result, "fingerprint": dict(fingerprint)} if fingerprint else result
        record = shipped.record_from_result(with_host, "validation", out_dir)
    except shipped.HistoryError as exc:
        reporter.note(f"history: not recorded: {exc}")
        return {"status": "unknown", "lines": [str(exc)], "metrics": {}}
    runs, warnings = read_on(host, program_of(validation_dir), history_dir)
    for warning in warnings:
        reporter.note(f"warning: {warning}")
    report = regression.judge(record, runs, policy)
    for line in report["lines"]:
        reporter.note(("!!! " if report["status"] in ("warn", "fail") else "") + line)
    problem = append_on(host, program_of(validation_dir), history_dir,
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
    problem = append_on(host, program_of(validation_dir), history_dir, record)
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
    runs, warnings = read_on(host, program_of(validation_dir), history_dir)
    records = with_changes(runs)
    return history_dir, records[-last:] if last else records, warnings
