"""A site's calibration: the compute and bandwidth references measured on the site's own machines,
kept beside its history (``<history_dir>/calibration.json``) and used where the playbook gives no fixed
figure (``validation.compute`` without ``gflops``, ``validation.single_node``/``multi_node`` without
``busbw_gbs``).

Standard library only: the check program reads it on-site (:func:`reference`); sitestack writes it
(:mod:`sitestack.engine.site_calibration`, with :func:`figures` and :func:`document`) after a passing
run: the first passing run of a site without one, or ``invoke validate --calibrate``. A calibration run (``SITESTACK_CALIBRATE=1`` in the job's
environment) is judged rank against rank only: the stored figures it replaces do not judge it.

The figures (docs/validation.md "Compute references", "Bandwidth references"):

- compute: the median over the ranks of the rate each rank is judged by (on a CPU its GFLOPS on its own
  CPU time, so a process running beside the calibration does not lower it; by the clock on a GPU);
- bandwidth: the allreduce busbw at the reference's message size (the sweep's largest where it has
  none), per node kind (``single_node`` for one node, ``multi_node`` for more).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Mapping
from typing import Any

from .ddpcheck.checks import COMPUTE
from .fileio import ReadError, read_json

FILE = "calibration.json"
SCHEMA = "sitestack-calibration/1"
#: The most a calibration file may hold (one is a few hundred bytes).
MAX_BYTES = 64 << 10
#: The environment variable that makes a run a calibration run (judged rank against rank only).
CALIBRATING = "SITESTACK_CALIBRATE"


def path_of(history_dir: str) -> str:
    return os.path.join(history_dir, FILE)


def load(history_dir: str | None) -> tuple[dict[str, Any] | None, str | None]:
    """The stored calibration (None where there is none), or why the file is not one."""
    if not history_dir:
        return None, None
    path = path_of(history_dir)
    if not os.path.lexists(path):
        return None, None
    try:
        data = read_json(path, MAX_BYTES)
    except (OSError, ReadError) as exc:
        return None, f"{path}: not read ({exc})"
    why = invalid(data)
    return (None, f"{path}: {why}") if why else (data, None)


def invalid(data: Any) -> str | None:
    """Why ``data`` is not a calibration document; None when it is."""
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        return f"not a calibration (expected schema {SCHEMA})"
    for key, field in ((COMPUTE.name, "gflops"), ("single_node", "busbw_gbs"), ("multi_node", "busbw_gbs")):
        entry = data.get(key)
        if entry is not None and not (isinstance(entry, dict) and _positive(entry.get(field))):
            return f"{key}.{field} is not a positive number"
    if not isinstance(data.get("measured"), (int, float)) or isinstance(data.get("measured"), bool):
        return "measured is not a time"
    return None


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 and value == value \
        and value != float("inf")


def how(data: Mapping[str, Any]) -> str:
    """When, where and how the figures were measured, in words (for the reference's ``source``)."""
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(float(data["measured"])))
    return f"calibrated on {data.get('host') or 'this site'} at {when} by run {data.get('run') or '?'} ({data.get('how') or '?'})"


def reference(given: Mapping[str, Any] | None, key: str, field: str, config: Mapping[str, Any],
              environ: Mapping[str, str] | None = None) -> tuple[dict[str, Any] | None, str | None]:
    """The reference a check judges by: ``given`` (check-config.json's) where it states ``field``;
    where it does not (the site calibrates), the stored calibration's ``key`` entry with ``given``'s
    other keys (``lower``, ``message_bytes``) and a ``source`` saying when and how it was measured.
    (None, a note) when there is none yet, on a calibration run, or the file is not a calibration."""
    if not given or given.get(field) is not None:
        return (dict(given) if given else None), None
    if (environ if environ is not None else os.environ).get(CALIBRATING) == "1":
        return None, "not judged against a reference: this run calibrates it"
    stored, why = load(config.get("history_dir"))
    entry = (stored or {}).get(key)
    if why:
        return None, f"not judged against a reference: {why}"
    if not entry:
        return None, ("not judged against a reference: none calibrated yet (the first passing run calibrates, "
                      "or `invoke validate --calibrate`)")
    assert stored is not None
    return {**given, field: entry[field], "source": how(stored), "calibrated": stored["measured"]}, None


def figures(result: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
    """The references a passing run measured: ``compute`` (median over the ranks of their judged rates)
    and ``single_node`` or ``multi_node`` (busbw at the reference's size, or the largest measured)."""
    out: dict[str, Any] = {}
    for check in result.get("checks") or []:
        if isinstance(check, dict) and check.get("name") == COMPUTE.name:
            ranks = (check.get("details") or {}).get("ranks") or []
            rates = [r["judged_gflops"] for r in ranks if isinstance(r, dict) and _positive(r.get("judged_gflops"))]
            if rates:
                out[COMPUTE.name] = {"gflops": round(statistics.median(rates), 3), "ranks": len(rates),
                                  "range": [round(min(rates), 3), round(max(rates), 3)]}
    bandwidth = result.get("bandwidth") or {}
    rows = [r for r in bandwidth.get("rows") or [] if isinstance(r, dict) and _positive(r.get("busbw_gbs"))]
    if rows:
        key = "multi_node" if (bandwidth.get("nodes") or 1) > 1 else "single_node"
        size = ((config.get("bandwidth") or {}).get(key) or {}).get("message_bytes")
        row = next((r for r in rows if r.get("bytes") == size), max(rows, key=lambda r: r.get("bytes") or 0))
        out[key] = {"busbw_gbs": round(row["busbw_gbs"], 4), "message_bytes": row.get("bytes"),
                    "ranks": bandwidth.get("ranks"), "nodes": bandwidth.get("nodes")}
    return out


def document(measured: Mapping[str, Any], previous: Mapping[str, Any] | None, run: str, host: str,
             how_text: str, when: float) -> dict[str, Any]:
    """The calibration to store: ``measured`` (:func:`figures`) over ``previous`` (an entry this run
    did not measure, such as the other node kind, is kept)."""
    kept = {k: v for k, v in (previous or {}).items() if k in (COMPUTE.name, "single_node", "multi_node")}
    return {"schema": SCHEMA, **kept, **measured, "measured": round(when, 3), "run": run, "host": host,
            "how": how_text}

