"""CPU masks per rank, derived from ``gpu.cpu_bind`` (never typed in).

Local rank *g* drives GPU unit *g* and gets every usable core of the NUMA domain / CCD
closest to that unit: the cores ``cores_per_numa * numa .. + cores_per_numa - 1`` minus the
site's reserved cores, plus their SMT siblings (``core + node_cores * t``) when
``threads_per_core`` > 1. On LUMI-G (GCD->CCD ``[6,7,2,3,0,1,4,5]``, 8 cores per CCD, core 0 of
each CCD reserved) this gives ``0xfe << 8*CCD(g)``, the masks of LUMI's own job scripts and
ReFrame checks. Masks are printed zero-padded to the width of the node's CPU set, in local
rank order, for ``srun --cpu-bind=mask_cpu:``. The check program (:mod:`sitestack.onsite.ddp_check`)
parses them back on the site (``parse_masks``) and prints CPU sets (``cpu_list``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sitestack.model.site import Facts


@dataclass(frozen=True)
class Binding:
    """The facts the masks are derived from (``gpu.cpu_bind`` plus ``node.cores``)."""

    gpu_to_numa: tuple[int, ...]
    cores_per_numa: int
    node_cores: int
    reserved_cores: tuple[int, ...] = ()
    threads_per_core: int = 1

    @classmethod
    def from_facts(cls, facts: Facts) -> Binding | None:
        """The binding of a site, or None without ``gpu.cpu_bind``."""
        bind = facts.gpu.cpu_bind
        if bind is None:
            return None
        return cls(tuple(bind.gpu_to_numa), bind.cores_per_numa, facts.node.cores,
                   tuple(bind.reserved_cores), bind.threads_per_core)

    def check(self) -> None:
        numas = self.node_cores // self.cores_per_numa if self.cores_per_numa else 0
        if self.cores_per_numa < 1 or self.node_cores % self.cores_per_numa:
            raise ValueError(f"node cores {self.node_cores} are not a multiple of cores_per_numa {self.cores_per_numa}")
        for gpu, numa in enumerate(self.gpu_to_numa):
            if not 0 <= numa < numas:
                raise ValueError(f"GPU {gpu} -> NUMA {numa}, but the node has NUMA domains 0..{numas - 1}")
        if self.threads_per_core < 1:
            raise ValueError("threads_per_core must be >= 1")


def cores_for_gpu(binding: Binding, gpu: int) -> list[int]:
    """The usable physical cores closest to GPU unit ``gpu``."""
    binding.check()
    numa = binding.gpu_to_numa[gpu]
    first = numa * binding.cores_per_numa
    reserved = set(binding.reserved_cores)
    cores = [c for c in range(first, first + binding.cores_per_numa) if c not in reserved]
    if not cores:
        raise ValueError(f"every core of NUMA {numa} (GPU {gpu}) is reserved")
    return cores


def cpus_for_gpu(binding: Binding, gpu: int) -> list[int]:
    """The logical CPUs a rank on GPU unit ``gpu`` may use (cores and their SMT siblings)."""
    cores = cores_for_gpu(binding, gpu)
    return sorted(c + binding.node_cores * t for t in range(binding.threads_per_core) for c in cores)


def mask(cpus: Iterable[int]) -> int:
    value = 0
    for cpu in cpus:
        value |= 1 << cpu
    return value


def format_mask(value: int, width: int) -> str:
    """``0x`` and ``width`` hex digits (Slurm accepts either; zero-padding shows the layout)."""
    return f"0x{value:0{width}x}"


def rank_masks(binding: Binding) -> list[str]:
    """One mask per local rank (= GPU unit), zero-padded to the node's logical CPU count."""
    width = max(1, -(-binding.node_cores * binding.threads_per_core // 4))
    return [format_mask(mask(cpus_for_gpu(binding, g)), width) for g in range(len(binding.gpu_to_numa))]
