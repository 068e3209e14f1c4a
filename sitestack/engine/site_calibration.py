"""A site's calibrated references, kept with its history: read, shown, and written after a passing run.

The on-site half (:mod:`sitestack.onsite.calibration`) says what a calibration holds and how the checks
judge by it. Here, after ``invoke validate`` has read a run's result: a passing run stores its figures
as the site's calibration where the site calibrates (a playbook reference without its figure) and has
none yet, or always with ``--calibrate``; the stored calibration is printed with when and how it was
measured. A failed run never calibrates: a degraded machine must not become its own reference.
"""

from __future__ import annotations

import json
import posixpath
import time
from collections.abc import Mapping
from typing import Any

from sitestack.core.bounded import read_json
from sitestack.core.errors import InputError, SitestackError
from sitestack.core.host import Host
from sitestack.core.report import Reporter
from sitestack.onsite import calibration

HOW = {True: "`invoke validate --calibrate`", False: "the first passing `invoke validate` of the site"}


def calibrates(config: Mapping[str, Any]) -> bool:
    """Whether check-config.json has a reference without its figure (the site calibrates it)."""
    compute = config.get("compute")
    bandwidth = [r for r in (config.get("bandwidth") or {}).values() if isinstance(r, dict)]
    return (isinstance(compute, dict) and compute.get("gflops") is None) \
        or any(r.get("busbw_gbs") is None for r in bandwidth)


def stored(host: Host, history_dir: str) -> tuple[dict[str, Any] | None, str | None]:
    """The calibration on ``host`` (None where there is none), or why its file is not one."""
    path = posixpath.join(history_dir, calibration.FILE)
    try:
        data = read_json(host, path, calibration.MAX_BYTES, "not a calibration: `invoke validate --calibrate` rewrites it")
    except (InputError, SitestackError) as exc:
        return None, str(exc)
    if data is None:
        return None, None
    why = calibration.invalid(data)
    return (None, f"{path}: {why}") if why else (data, None)


def summary(data: Mapping[str, Any]) -> str:
    """``compute 45.2 GFLOPS per rank; single-node busbw 0.71 GB/s at 4194304 B; calibrated on ...``."""
    parts = []
    if data.get("compute"):
        parts.append(f"compute {data['compute']['gflops']:.4g} GFLOPS per rank")
    for key in ("single_node", "multi_node"):
        if data.get(key):
            parts.append(f"{key.replace('_', '-')} busbw {data[key]['busbw_gbs']:.3g} GB/s at {data[key].get('message_bytes')} B")
    return "; ".join(parts + [calibration.how(data)])


def after_validation(host: Host, history_dir: str, result: Mapping[str, Any], config: Mapping[str, Any],
                     run: str, calibrate: bool, reporter: Reporter) -> dict[str, Any] | None:
    """Store the passing ``result``'s figures as the site's calibration where asked (``calibrate``) or
    where the site calibrates and has none; report what is stored. The calibration in force afterwards."""
    previous, why = stored(host, history_dir)
    if why:
        reporter.note(f"warning: calibration: {why}")
    if not (calibrate or (previous is None and calibrates(config))):
        if previous:
            reporter.note(f"calibration: {summary(previous)}")
        return previous
    if result.get("verdict") != "passed":
        reporter.note("calibration: not stored: the run did not pass (a degraded machine is not a reference)")
        return previous
    measured = calibration.figures(result, config)
    if not measured:
        reporter.note("calibration: not stored: the run measured neither compute nor bandwidth")
        return previous
    hosts = result.get("hosts") or []
    data = calibration.document(measured, previous, run, ",".join(str(h) for h in hosts) or host.name,
                                HOW[calibrate], time.time())
    try:
        host.run(["mkdir", "-p", history_dir])
        host.write_text(posixpath.join(history_dir, calibration.FILE), json.dumps(data, indent=2, sort_keys=True) + "\n")
    except (SitestackError, OSError) as exc:  # a history this user cannot write: said, the verdict stands
        reporter.note(f"warning: calibration: not stored in {history_dir}: {exc}")
        return previous
    reporter.note(f"calibration: stored in {history_dir}/{calibration.FILE}: {summary(data)}")
    return data
