"""A site's tuning facts (``facts.tuning``): the runtime settings ``invoke tune`` measures instead of
setting them untried, each with its candidate values, and how the sweep job measures them (message
sizes, repeats per point, each point's time limit, the gain a setting must show). Part of
:mod:`sitestack.model.facts`, which re-exports these names.

The sweep is one factor at a time: a default point with every tuning variable unset, then one point
per (variable, candidate) with only that variable set, in playbook order, then the default again (a
full product of 4 variables with 3 values each would be 81 job steps).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sitestack.core.quoting import SHELL_NAME
from sitestack.core.redact import has_secret
from sitestack.model.slurmtime import SLURM_TIME, SLURM_TIME_DOC, slurm_seconds

#: Names the job itself needs or sets, which the sweep cannot unset and set at every point: the
#: process's own (PATH, the loader's and Python's), the launchers' and the ranks' (Slurm, PMI, Open MPI,
#: torchrun), the modules', the job's and its launch helper's (geometry, master address and port, NCCL's
#: logs, MIOpen's caches, the device hierarchy, the container's binds and passed-in values) and
#: sitestack's own, except ``SITESTACK_CHECK_FAULT`` (the check's fault injection, which the tests sweep).
RESERVED_NAMES = (
    "PATH", "LD_LIBRARY_PATH", "LD_PRELOAD", "PYTHONPATH", "PYTHONHOME", "HOME", "USER", "TMPDIR",
    "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
    "ROLE_RANK", "NODELIST", "NNODES", "TASKS_PER_NODE", "CPUS_PER_TASK", "CPU_MASKS", "MODULEPATH",
    "LOADEDMODULES", "NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE", "NCCL_NET", "MIOPEN_USER_DB_PATH",
    "MIOPEN_CUSTOM_CACHE_DIR", "ZE_FLAT_DEVICE_HIERARCHY", "ZE_AFFINITY_MASK", "SINGULARITY_BINDPATH",
    "APPTAINER_BINDPATH", "MPI_LOCALRANKID")
#: Prefixes of such names (``SLURM_JOB_ID``, ``PMI_RANK``, ``OMPI_COMM_WORLD_RANK``, ...).
RESERVED_PREFIXES = ("SLURM_", "PMI_", "OMPI_", "LMOD_", "TORCHELASTIC_", "SINGULARITYENV_", "APPTAINERENV_",
                     "SITESTACK_")
#: The one sitestack variable a sweep may try: the check's fault injection (docs/tuning.md).
FAULT_VARIABLE = "SITESTACK_CHECK_FAULT"
#: A tuning variable's name: an environment variable's, none of the reserved ones.
TUNING_NAME = (rf"(?={FAULT_VARIABLE}$|(?!(?:{'|'.join(RESERVED_NAMES)})$|{'|'.join(RESERVED_PREFIXES)}))"
               + SHELL_NAME.pattern)
#: Seconds of a sweep job besides its points: modules, the launch helper, the driver's start-up.
SWEEP_START_UP = 60
#: Seconds the guard waits past a point's deadline before it ends the point (ddpcheck.guard.GUARD_GRACE).
GUARD_GRACE = 20


def _doc(text: str, **extra: Any) -> dict[str, Any]:
    return {"doc": text, **extra}


@dataclass(frozen=True)
class TuningVariable:
    """One environment variable the sweep tries: its candidate values and where the advice comes from."""

    candidates: tuple[str, ...] = field(metadata=_doc(
        "values to measure against the default (the variable unset), each in its own point of the sweep"))
    note: str = field(default="", metadata=_doc("why it is worth trying, and the source's warning, quoted"))

    def check(self) -> str | None:
        if not self.candidates:
            return "candidates: at least one value to try (the default, unset, is always measured)"
        for value in self.candidates:
            if value == "":
                return "candidates: an empty value is the default (the variable unset), which is always measured"
            if "$" in value:
                # the sweep sets the value as written (no shell expands it) and the module must set what was measured
                return f"candidates: {value!r}: a candidate is measured as written, without $VARIABLES"
        repeated = sorted({v for v in self.candidates if self.candidates.count(v) > 1})
        if repeated:
            return f"candidates: {', '.join(repr(v) for v in repeated)} repeated (each value is one point of the sweep)"
        return None


@dataclass(frozen=True)
class Tuning:
    """The settings ``invoke tune`` measures on the site, and how its sweep job measures them."""

    variables: Mapping[str, TuningVariable] = field(metadata=_doc(
        "environment variables to try (NCCL_*, FI_*, OMP_NUM_THREADS, ...), in the order the sweep runs them; "
        "none of them may also be in env (a tuned setting is set only after a measurement)",
        key_pattern=TUNING_NAME, key_doc=(
            "an environment variable name (letters, digits, _) other than one the job itself needs or sets, which "
            "the sweep would unset at every point (" + ", ".join(RESERVED_NAMES) + ", "
            + ", ".join(f"{p}*" for p in RESERVED_PREFIXES) + f" but {FAULT_VARIABLE})")))
    sizes: tuple[int, ...] = field(default=(), metadata=_doc(
        "allreduce message sizes in bytes measured at each point (default: GPU 1 MiB, 16 MiB and the "
        "validation reference size; CPU 64 KiB, 1 MiB and 4 MiB)"))
    repeats: int = field(default=5, metadata=_doc(
        "timed samples per size (and of the DDP step) at each point; the spread is taken from them. At least 5: "
        "fewer let noise pass for a gain (docs/tuning.md, \"How often noise wins\")", min=5, max=100))
    point_time: str = field(default="00:02:00", metadata=_doc(
        "each point's own time limit under the hang guard (a point past it is recorded as hung)",
        pattern=SLURM_TIME, pattern_doc=SLURM_TIME_DOC))
    min_gain: float = field(default=0.03, metadata=_doc(
        "a candidate is chosen only when it beats the default by at least this fraction and beyond the noise "
        "(docs/tuning.md)", min=0.0, max=1.0))

    def check(self) -> str | None:
        if not self.variables:
            return "variables: at least one variable to try"
        bad = [size for size in self.sizes if size <= 0 or size % 4]
        if bad:
            return f"sizes: {bad[0]} is not a positive multiple of 4 (float32 elements)"
        if len(set(self.sizes)) != len(self.sizes):
            return "sizes: each size once"
        if slurm_seconds(self.point_time) < 10:
            return f"point_time: {self.point_time!r} is too short for a point to start (at least 10 seconds)"
        for name, variable in self.variables.items():
            secret = next((v for v in variable.candidates if has_secret(f"{name}={v}")), None)
            if secret is not None:
                return (f"variables.{name}: a candidate holds a credential, and the module files and job scripts "
                        "it would go into are readable by every user")
        return None

    @property
    def point_seconds(self) -> int:
        """Each point's time limit in seconds."""
        return slurm_seconds(self.point_time)

    def sweep_seconds(self) -> int:
        """The wall time a sweep job needs for every point to run to its time limit, in whole minutes:
        each point's ``point_seconds`` and the guard's grace after it, the job's start-up, and the margin
        the job keeps before its end (a tenth of it, at least a minute, and the guard's grace:
        ``sitestack.validation.jobs.time_limit``)."""
        need = len(self.points()) * (self.point_seconds + GUARD_GRACE) + SWEEP_START_UP
        total = max(need + 60 + GUARD_GRACE, -(-(need + GUARD_GRACE) * 10 // 9))
        return -(-total // 60) * 60

    def points(self) -> list[tuple[str, dict[str, str]]]:
        """The one-factor-at-a-time grid: (label, settings) with the default (nothing set) first, then one
        point per (variable, candidate) in playbook order, then the default again. The default brackets
        the sweep so that a drift during it (another job's load arriving, a node warming up) shows in the
        default's own samples and widens the noise a candidate must beat, instead of passing for a gain."""
        out: list[tuple[str, dict[str, str]]] = [("default", {})]
        for name, variable in self.variables.items():
            out += [(f"{name}={value}", {name: value}) for value in variable.candidates]
        return [*out, ("default (again)", {})]
