"""What the run ran on, for the site's history: the toolchain (the host's fingerprint, :mod:`..fingerprint`:
modules and their files, libfabric and its providers, the network stack, GPU driver and firmware, kernel,
glibc, Slurm; and what the ranks loaded: MPI, torch, NCCL/RCCL, Python), the stack's digest and how long
the ranks took to start.

Every value is bounded and sanitised before it is recorded (:func:`..fingerprint.clean`). A value that
cannot be read is null, never an error: the history compares toolchains, it does not judge them.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Mapping
from typing import Any

from ..fingerprint import clean as clean
from ..fingerprint import fingerprint
from ..stack_digest import manifest_digest as manifest_digest
from ..stack_digest import stack_record as stack_record

#: The variable the guard sets for the launcher it starts: when it started it (epoch seconds).
LAUNCH_START = "SITESTACK_LAUNCH_START"


def toolchain(env: Mapping[str, str], first: Mapping[str, Any], probe: object = None) -> dict[str, Any]:
    """The toolchain record (``result.json`` ``toolchain``): ``first`` is rank 0's report (torch, NCCL/RCCL
    and the MPI library mpi4py loaded); ``probe`` the MPI probe's result, whose library names the MPI
    where no rank loaded one (torchrun)."""
    mpi = first.get("mpi_library")
    library = str(probe.get("library") or "").strip() if isinstance(probe, dict) else ""
    if not mpi and library:
        mpi = library.splitlines()[0]
    nccl = first.get("nccl")
    return {
        **fingerprint(env),
        "mpi": clean(mpi),
        "torch": clean(first.get("torch")),
        "nccl": clean(f"{first.get('library') or 'NCCL'} {nccl}") if nccl else None,
        "python": clean(first.get("python") or sys.version.split()[0]),
    }


def ready_seconds(env: Mapping[str, str], ready_at: object, now: float | None = None) -> float | None:
    """Seconds from the launcher's start (:data:`LAUNCH_START`, set by the guard) to ``ready_at`` (when
    every rank was in the process group); None when either is missing or not a time of this run."""
    now = time.time() if now is None else now
    try:
        start = float(env.get(LAUNCH_START) or "nan")
        ready = float(ready_at)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    if not (math.isfinite(start) and math.isfinite(ready)) or not (now - 7 * 86400 < start <= ready <= now + 60):
        return None
    return round(ready - start, 3)
