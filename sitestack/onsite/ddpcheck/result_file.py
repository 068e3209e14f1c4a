"""Rank 0's report: result.json, summary.md and the plot, with a fault a watchdog reported."""

from __future__ import annotations

import os
import re
import time
from dataclasses import asdict
from typing import Any

from .. import ddp_report
from ..result_schema import Result, build_result
from .checks import CHECKS, PROCESS_GROUP
from .faults import LOST_PEER, apply_fault
from .provenance import ready_seconds, stack_record, toolchain
from .rank_progress import read_fault
from .state import Run
from .verdicts import FAILED, job_environment, job_id_for, read_startup, time_limit_record, verdict


def write_result(run: Run) -> Result:
    """Rank 0: result.json, summary.md and the plot (bandwidth.png, or bandwidth.svg without matplotlib) in
    OUT, each written atomically (a reported fault applied); the result."""
    os.makedirs(run.args.out, exist_ok=True)
    checks = [asdict(run.checks[name]) for name in CHECKS]
    fault = await_fault(run, checks)
    if fault:
        apply_fault(checks, fault)
    hosts = sorted({r["host"] for r in run.ranks}) if run.ranks else [run.host]
    first = run.ranks[0] if run.ranks else run.me
    plugin = (run.config.get("network") or {}).get("net_plugin")
    result = build_result(
        site=run.config.get("site", "unknown"), job_id=job_id_for(run.args.out, run.env), launcher=run.info.launcher,
        job_launcher=run.env.get("SITESTACK_LAUNCHER"), started=run.start,
        backend=run.device.backend if run.device else None, device=run.device.kind if run.device else None,
        world_size=run.info.world_size, hosts=hosts, torch=first.get("torch"), verdict=verdict(checks),
        checks=checks, fault=fault, ranks=run.ranks, bandwidth=run.bandwidth,
        mpi={k: v for k, v in run.mpi_data.items() if k in ("probe", "mpi4py")},
        startup={**(read_startup(run.args.startup_result) or {}),
                 "ready_s": ready_seconds(run.env, run.checks[PROCESS_GROUP.name].details.get("ready_at"))},
        stack=stack_record(run.config), toolchain=toolchain(run.env, first, run.mpi_data.get("probe")),
        job_environment=first.get("setting") or job_environment(run.env, plugin),
        time_limit=time_limit_record(run.args.time_limit, run.env), tune=run.tune)  # tune: a tuning point's samples
    # each file atomically, the plot (PNG, or SVG without matplotlib) before the result that names it
    ddp_report.write_report(result, run.args.out)
    run.result = result
    return result


def await_fault(run: Run, checks: list[dict[str, Any]]) -> dict[str, Any] | None:
    """A fault a watchdog reported (a rank killed or crashed). When a check failed because a peer
    went away, wait briefly for that rank's watchdog to say what happened to it."""
    fault = read_fault(run.args.out)
    # faults.LOST_PEER's messages, and any other that names a peer: worth a brief wait for its watchdog
    lost = re.compile(LOST_PEER.pattern + r"|peer", re.I)
    if fault is None and run.info.world_size > 1 and any(
            c["status"] == FAILED and lost.search(c["summary"]) for c in checks):
        end = time.time() + 3.0
        while fault is None and time.time() < end:
            time.sleep(0.2)
            fault = read_fault(run.args.out)
    return fault
