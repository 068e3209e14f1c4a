"""The cores a run may use on a host: the CPU affinity mask, capped by the Slurm allocation.

``nproc`` counts the CPUs of the affinity mask (``sched_getaffinity``), which cgroup cpusets
and Slurm's ``task/affinity`` plugin already narrow. Inside a Slurm job without that plugin the
mask may be the whole node, so the job's own count caps it: ``SLURM_CPUS_PER_TASK`` (given with
``--cpus-per-task``), else ``SLURM_CPUS_ON_NODE`` (the CPUs the job has on this node)
(https://slurm.schedmd.com/sbatch.html#SECTION_OUTPUT-ENVIRONMENT-VARIABLES). A value that is
not a positive whole number is not used.

Both forms give the same count: :data:`CORES_SH` (a shell expression, for probes on any host)
and :func:`local_cores` (this process, no command).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

#: Prints the usable cores (POSIX sh): nproc, capped by the Slurm job's count inside a job.
CORES_SH = (r'n=$(nproc 2>/dev/null || echo 1); '
            r'if [ -n "${SLURM_JOB_ID:-}" ]; then c=${SLURM_CPUS_PER_TASK:-${SLURM_CPUS_ON_NODE:-}}; '
            r'case $c in (""|*[!0-9]*|0*) ;; (*) [ "$c" -lt "$n" ] && n=$c;; esac; fi; echo "$n"')


def slurm_cap(environ: Mapping[str, str]) -> int | None:
    """The Slurm job's CPU count in ``environ`` (None: not in a job, or no usable count)."""
    if not environ.get("SLURM_JOB_ID"):
        return None
    value = environ.get("SLURM_CPUS_PER_TASK") or environ.get("SLURM_CPUS_ON_NODE") or ""
    return int(value) if value.isdigit() and not value.startswith("0") else None


def local_cores(environ: Mapping[str, str] | None = None) -> int:
    """The cores this process may use (at least 1): its affinity mask, capped by a Slurm job's count."""
    try:
        count = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        count = os.cpu_count() or 1
    cap = slurm_cap(os.environ if environ is None else environ)
    return max(1, min(count, cap) if cap else count)
