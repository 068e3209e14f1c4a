"""What a run records: the checks, their statuses and the verdict, and the facts about the job that
result.json carries besides the checks (its type and exit code: ../result_schema.py)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..fileio import CONFIG_MAX, ReadError, read_json

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"


@dataclass
class Check:
    """One check's outcome: status, one-line summary, details, seconds."""

    name: str
    status: str = SKIPPED
    summary: str = "not run"
    details: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0


def verdict(checks: list[Check] | list[dict[str, Any]]) -> str:
    """passed when no check failed (and there is at least one), else failed."""
    statuses = [c.status if isinstance(c, Check) else c["status"] for c in checks]
    return FAILED if FAILED in statuses or not statuses else PASSED


#: The variables that decide how the collectives and the network plugin behave: recorded in the report.
RECORDED_PREFIXES = ("NCCL_", "RCCL_", "FI_", "CXI_", "GLOO_", "MIOPEN_", "HSA_", "OMP_NUM_THREADS", "MPICH_", "OMPI_MCA_")


def job_environment(env: dict[str, str], plugin: str | None) -> dict[str, Any]:
    """What the ranks ran with: the modules loaded (Lmod's and Environment Modules' LOADEDMODULES),
    the NCCL_*/FI_*/... settings, and the LD_LIBRARY_PATH entries of the network plugin."""
    words = tuple(w for w in (plugin, "ofi", "libfabric", "nccl-net", "rccl-net", "nccl_net") if w)
    paths = [p for p in env.get("LD_LIBRARY_PATH", "").split(":") if p and any(w in p.lower() for w in words)]
    return {"modules": [m for m in env.get("LOADEDMODULES", "").split(":") if m],
            "variables": {k: v for k, v in sorted(env.items()) if k.startswith(RECORDED_PREFIXES)},
            "plugin_library_path": paths}


def rank_fault(env: dict[str, str], kind: str, rank: int) -> bool:
    """Whether ``SITESTACK_CHECK_FAULT`` asks this rank for fault ``kind`` (``seed@1,allreduce@0``)."""
    for item in (env.get("SITESTACK_CHECK_FAULT") or "").split(","):
        name, _, target = item.strip().partition("@")
        if name == kind and target.strip().isdigit() and int(target) == rank:
            return True
    return False


#: The most bytes of the job's startup.json read (two rank summaries: a few KiB).
STARTUP_MAX = 1 << 20


def read_startup(path: str | None) -> dict[str, Any] | None:
    """The job's start-up timings (``--startup-result``): None without one, a note when unreadable."""
    if not path:
        return None
    try:
        return read_json(path, STARTUP_MAX)
    except ReadError as exc:
        return {"note": str(exc)}


def time_limit_record(limit: float, env: Mapping[str, str]) -> dict[str, Any]:
    """The checks' time limit and where it came from (the batch script says: the job's time left
    from squeue, its own --time, or $SITESTACK_TIME_LIMIT), for result.json."""
    return {"seconds": limit, "from": env.get("SITESTACK_TIME_LIMIT_FROM") or "--time-limit"}


def load_config(path: str | None) -> dict[str, Any]:
    """check-config.json (``{}`` without one); :class:`~..fileio.ReadError` naming it where it is no
    JSON object of at most :data:`~..fileio.CONFIG_MAX` bytes."""
    if not path:
        return {}
    return read_json(path, CONFIG_MAX)


def job_id_for(out: str, env: dict[str, str] | os._Environ[str]) -> str | None:
    """The job id the results directory is named after (``sitestack-validation-<id>``), so the report's
    header matches the directory; else the scheduler's."""
    match = re.fullmatch(r"sitestack-validation-(.+)", os.path.basename(os.path.normpath(out)))
    return match.group(1) if match else (env.get("SLURM_JOB_ID") or env.get("SITESTACK_JOB_ID"))
