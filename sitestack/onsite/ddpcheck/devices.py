"""The device a rank uses and the torch.distributed backend for it (nccl on CUDA and ROCm, xccl or ccl
on Intel XPU, gloo on CPU)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

VISIBLE_VARS = ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "ZE_AFFINITY_MASK")


@dataclass(frozen=True)
class Device:
    """The device a rank uses and the torch.distributed backend for it."""

    kind: str  # cuda, xpu, cpu
    index: int | None
    backend: str  # nccl, xccl, ccl, gloo
    library: str  # NCCL, RCCL, oneCCL, Gloo
    count: int  # devices this rank sees
    physical: int | None  # the node's GPU number (from the *_VISIBLE_DEVICES lists)
    problem: str | None = None

    @property
    def name(self) -> str:
        return self.kind if self.index is None else f"{self.kind}:{self.index}"


def physical_gpu(index: int, env: dict[str, str]) -> int:
    """The node's GPU number behind device ``index``: its entry in a *_VISIBLE_DEVICES list."""
    for var in VISIBLE_VARS:
        value = env.get(var)
        if value:
            entries = [e.strip() for e in value.split(",") if e.strip()]
            if index < len(entries):
                head = entries[index].split(".")[0]  # ZE_AFFINITY_MASK may say card.stack
                if head.isascii() and head.isdigit() and len(head) <= 6:  # int() takes other scripts' digits too
                    return int(head)
    return index


def select_device(torch: Any, local_rank: int, local_world_size: int | None,
                  env: dict[str, str] | None = None, force_cpu: bool = False) -> Device:
    """cuda (NVIDIA or ROCm) -> nccl; xpu -> xccl, else ccl (oneCCL bindings); otherwise cpu -> gloo."""
    env = dict(os.environ if env is None else env)

    def index_for(count: int) -> tuple[int | None, str | None]:
        if count == 1:
            return 0, None
        if local_rank < count:
            return local_rank, None
        return None, (f"local rank {local_rank} but this rank sees only {count} devices: the job gives "
                      f"{local_world_size or '?'} ranks per node more devices than exist")

    if not force_cpu and getattr(torch, "cuda", None) is not None and torch.cuda.is_available():
        count = torch.cuda.device_count()
        index, problem = index_for(count)
        rocm = bool(getattr(torch.version, "hip", None))
        return Device("cuda", index, "nccl", "RCCL" if rocm else "NCCL", count,
                      physical_gpu(index, env) if index is not None else None, problem)
    xpu = getattr(torch, "xpu", None)
    if not force_cpu and xpu is not None and xpu.is_available():
        count = xpu.device_count()
        index, problem = index_for(count)
        dist = torch.distributed
        has_xccl = getattr(dist, "is_xccl_available", lambda: False)()
        backend = "xccl"
        if not has_xccl:
            backend = "ccl"
            try:
                import oneccl_bindings_for_pytorch  # type: ignore[import-not-found, unused-ignore]  # noqa: F401  (registers "ccl")
            except ImportError:
                problem = problem or "XPU without xccl in torch and without oneccl_bindings_for_pytorch: no backend"
        return Device("xpu", index, backend, "oneCCL", count,
                      physical_gpu(index, env) if index is not None else None, problem)
    return Device("cpu", None, "gloo", "Gloo", 0, None)
