"""A site's validation facts (``facts.validation``): which launchers the validation job runs under,
its geometry, and the references it is judged against (allreduce bus bandwidth, the compute check's
rate per rank). Part of :mod:`sitestack.model.facts`, which re-exports these names."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from sitestack.onsite.launchers import LAUNCHERS


def _doc(text: str, **extra: Any) -> dict[str, Any]:
    return {"doc": text, **extra}


@dataclass(frozen=True)
class BusBandwidth:
    """A reference allreduce bus bandwidth (busbw as nccl-tests defines it) the validation job must reach."""

    busbw_gbs: float | None = field(default=None, metadata=_doc(
        "reference busbw in GB/s (1e9 bytes/s) at message_bytes; absent: calibrated, measured on the site's own "
        "machines (the first passing `invoke validate`, or `invoke validate --calibrate`) and kept with its history"))
    lower: float = field(default=-0.05, metadata=_doc(
        "lowest accepted value as a fraction of the reference, ReFrame style: -0.05 accepts 95% and up"))
    message_bytes: int = field(default=134217728, metadata=_doc(
        "message size the reference is for; the job compares its sweep's row of that size (or its largest)"))
    source: str = field(default="", metadata=_doc("where the number comes from"))

    def check(self) -> str | None:
        if self.busbw_gbs is not None and self.busbw_gbs <= 0:
            return "busbw_gbs must be positive"
        if not -1.0 < self.lower <= 0.0:
            return f"lower must be in (-1, 0], not {self.lower}"
        if self.message_bytes < 4:
            return "message_bytes must be at least 4"
        return None


@dataclass(frozen=True)
class ComputeRate:
    """A reference rate for the validation job's compute check: what one rank reaches on its workload."""

    gflops: float | None = field(default=None, metadata=_doc(
        "GFLOPS one rank reaches on the check's workload (chained float32 products of 192x192 matrices on a CPU, "
        "2048x2048 on a GPU; on a CPU per the rank's own CPU time), with the job's ranks per node and threads; "
        "absent: calibrated, measured on the site's own machines (the first passing `invoke validate`, or "
        "`invoke validate --calibrate`) and kept with its history"))
    lower: float = field(default=-0.67, metadata=_doc(
        "lowest accepted value as a fraction of the reference: -0.67 accepts a third and up (3x slower fails)"))
    source: str = field(default="", metadata=_doc("where the number comes from"))

    def check(self) -> str | None:
        if self.gflops is not None and self.gflops <= 0:
            return "gflops must be positive"
        if not -1.0 < self.lower <= 0.0:
            return f"lower must be in (-1, 0], not {self.lower}"
        return None


@dataclass(frozen=True)
class Regression:
    """How `invoke validate` compares a run with the site's recent healthy runs (docs/history.md)."""

    window: int = field(default=10, metadata=_doc(
        "the healthy runs compared with: the last this many passed runs of the same stack digest and layout",
        min=2, max=1000))
    min_runs: int = field(default=3, metadata=_doc(
        "fewer healthy runs than this: the comparison is unknown (said so), never WARN or FAIL", min=2, max=1000))
    fail: float = field(default=-0.3, metadata=_doc(
        "FAIL (exit 1) when a metric is worse than the healthy runs' median beyond their spread and by this fraction "
        "or more: -0.3 fails busbw or compute 30% lower, start-up 30% longer; a smaller drop beyond the spread WARNs"))
    floor: float = field(default=0.05, metadata=_doc(
        "the least spread, as a fraction of the median: a drop smaller than this never WARNs (runs this close "
        "agree by chance)"))

    def check(self) -> str | None:
        if self.min_runs > self.window:
            return f"min_runs ({self.min_runs}) must be at most window ({self.window})"
        if not -1.0 < self.fail < 0.0:
            return f"fail must be in (-1, 0), not {self.fail}"
        if not 0.0 <= self.floor < 1.0:
            return f"floor must be in [0, 1), not {self.floor}"
        return None


@dataclass(frozen=True)
class Validation:
    """The validation DDP job: which launchers get a batch script, its geometry, the bandwidth and compute rate to reach."""

    launchers: tuple[str, ...] = field(default=(), metadata=_doc(
        "launchers to install a batch script for (srun, mpiexec, torchrun, horovodrun); the first is "
        "the one `invoke validate` submits (default: mpi.launcher)"))
    ranks_per_node: int | None = field(default=None, metadata=_doc(
        "ranks per node of the job (default: gpu.per_node, or 2 on a CPU-only site)", min=1, max=1024))
    sbatch_tasks: bool = field(default=True, metadata=_doc(
        "whether the batch script asks for tasks in #SBATCH lines (legacy Cirrus rejects them: false)"))
    bind: Literal["mask", "gpu-closest", "launcher"] | None = field(default=None, metadata=_doc(
        "how ranks are bound to cores: mask (srun --cpu-bind=mask_cpu, masks derived from gpu.cpu_bind), "
        "gpu-closest (srun -c<cores_per_gpu> --gpus-per-task=1 --gpu-bind=closest), launcher (left to the "
        "launcher); default: mask where gpu.cpu_bind is set, else launcher"))
    single_node: BusBandwidth | None = field(default=None, metadata=_doc(
        "allreduce busbw reference for a one-node run; null: measured and reported, not judged"))
    multi_node: BusBandwidth | None = field(default=None, metadata=_doc(
        "allreduce busbw reference for a run on two or more nodes; null: measured and reported, not judged"))
    compute: ComputeRate | None = field(default=None, metadata=_doc(
        "the compute check's reference rate per rank; null: measured and reported, judged only rank against rank"))
    regression: Regression | None = field(default=None, metadata=_doc(
        "how a run is compared with the site's history of healthy runs (WARN, FAIL); null: the defaults"))

    def check(self) -> str | None:
        for launcher in self.launchers:
            if launcher not in LAUNCHERS:
                return f"launchers: {launcher!r} is not one of {', '.join(LAUNCHERS)}"
        if len(set(self.launchers)) != len(self.launchers):
            return "launchers: each launcher once"
        if self.ranks_per_node is not None and self.ranks_per_node < 1:
            return "ranks_per_node must be >= 1"
        return None
