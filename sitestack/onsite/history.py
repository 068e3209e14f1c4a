"""The site's history of validation and tuning runs: the program, and the one module callers import.

Standard library only: installed beside ``ddp_check.py``, run by the validation job at its end
(``python3 history.py record --config check-config.json OUT/result.json``), and run on the host by
sitestack, which reads the history (``invoke history``, ``invoke validate``'s regression report) with
``list --json`` and writes it (``invoke validate``, ``invoke tune``) with ``append``; sitestack
imports it for a record's form (:func:`record_from_result`, :func:`normalise`)::

    history.py record  (--dir D | --config C) [--kind K] RESULT.json
    history.py append  (--dir D | --config C) RECORD_JSON
    history.py list    (--dir D | --config C) [--json]    (--json: one document, :func:`listing`)
    history.py rebuild (--dir D | --config C)

A record, and what changed between two: :mod:`.history_record`; where records are kept, how they are
written and read: :mod:`.history_store`. Their names callers use are imported here, so a caller imports
this module alone.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping
from typing import Any

from .fileio import CONFIG_MAX, ReadError, read_json
from .history_record import KINDS as KINDS
from .history_record import SCHEMA as SCHEMA
from .history_record import TIME_MAX as TIME_MAX
from .history_record import TOOLCHAIN_KEYS as TOOLCHAIN_KEYS
from .history_record import HistoryError as HistoryError
from .history_record import load_record as load_record
from .history_record import metrics_of as metrics_of
from .history_record import normalise as normalise
from .history_record import record_from_result as record_from_result
from .history_record import run_id as run_id
from .history_record import toolchain_changes as toolchain_changes
from .history_record import valid_id as valid_id
from .history_store import INDEX as INDEX
from .history_store import INDEX_MAX as INDEX_MAX
from .history_store import RECORD_MAX as RECORD_MAX
from .history_store import RUNS as RUNS
from .history_store import RUNS_MAX as RUNS_MAX
from .history_store import append as append
from .history_store import index_records as index_records
from .history_store import read as read
from .history_store import rebuild as rebuild
from .history_store import run_record as run_record
from .history_store import scan as scan

#: The schema of ``list --json``'s document (:func:`listing`).
LISTING = "sitestack-history-list/1"


def _history_dir(args: argparse.Namespace) -> str:
    """``--dir``, or check-config.json's (``--config``) ``history_dir``, an absolute path."""
    if args.dir:
        return str(args.dir)
    try:
        directory = read_json(args.config, CONFIG_MAX).get("history_dir")
    except ReadError as exc:
        raise HistoryError(str(exc)) from None
    # absolute and normalised (no ".", ".." or "//"): the directory the installer wrote, not one a changed
    # configuration walks out of the prefix with
    if not isinstance(directory, str) or not directory.startswith("/") or directory.startswith("//") \
            or os.path.normpath(directory) != directory:
        raise HistoryError(f"{args.config}: history_dir is not an absolute path without '.', '..' or '//'")
    return directory


def _record(args: argparse.Namespace) -> int:
    """A validation's result.json (or a tuning document) recorded."""
    try:
        result = read_json(args.result, RECORD_MAX * 16)
    except ReadError as exc:
        raise HistoryError(str(exc)) from None
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


def listing(directory: str, records: list[dict[str, Any]], warnings: list[str], skipped: int) -> dict[str, Any]:
    """What ``list --json`` prints, a document of :data:`LISTING`: ``history_dir``, ``runs`` (:func:`scan`'s
    records, oldest first) and ``warnings``, one line each (the files not read, then how many index
    lines and run files were skipped): sitestack's ``invoke history`` and ``invoke validate`` read it."""
    counted = [f"history: {skipped} index lines or run files in {directory} skipped (torn, not history records, "
               "or not regular files)"] if skipped else []
    return {"schema": LISTING, "history_dir": directory, "runs": records, "warnings": [*warnings, *counted]}


def _list(args: argparse.Namespace) -> int:
    """The records (each normalised (:func:`normalise`): every printed text printable), one line each or
    with ``--json`` one document (:func:`listing`); on stderr the files not read and how many lines and
    files were skipped."""
    directory = _history_dir(args)
    warnings: list[str] = []
    records, skipped = scan(directory, warnings)
    if args.json:
        print(json.dumps(listing(directory, records, warnings, skipped), indent=2, sort_keys=True))
    for r in [] if args.json else records:
        m = r["metrics"]
        print(f"{r['id']}  {r['verdict'] or '-'}  busbw {m.get('busbw_gbs')}  compute {m.get('compute_min_gflops')}  "
              f"start-up {m.get('startup_s')}  stack {(r['stack']['digest'] or '-')[:8]}")
    for warning in warnings:
        print(f"sitestack {warning}", file=sys.stderr)
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
            s.add_argument("--json", action="store_true", help="the records and the warnings as one JSON document")
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
