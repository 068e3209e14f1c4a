"""The GPU toolkit facts (``facts.rocm``, ``facts.cuda``): a version and an install directory, each
documented with its own toolkit's examples. Part of :mod:`sitestack.model.facts`, which re-exports
these names."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


def _doc(text: str, **extra: Any) -> dict[str, Any]:
    return {"doc": text, **extra}


@dataclass(frozen=True)
class Toolkit:
    """A GPU toolkit (ROCm or CUDA)."""

    version: str = field(metadata=_doc("toolkit version, e.g. 5.7.1 or 12.1"))
    home: str = field(metadata=_doc("install directory, e.g. /opt/rocm-5.7.1"))


@dataclass(frozen=True)
class Rocm(Toolkit):
    """AMD's ROCm, on an AMD GPU site (collectives: rccl)."""

    version: str = field(metadata=_doc("ROCm version, e.g. 5.7.1 (the rocm/5.7.1 module)"))
    home: str = field(metadata=_doc("ROCm's install directory ($ROCM_PATH), e.g. /opt/rocm-{rocm_version}"))


@dataclass(frozen=True)
class Cuda(Toolkit):
    """NVIDIA's CUDA toolkit, on an NVIDIA GPU site (collectives: nccl)."""

    version: str = field(metadata=_doc("CUDA version, e.g. 12.4 (the cudatoolkit/12.4 module)"))
    home: str = field(metadata=_doc(
        "CUDA's install directory ($CUDA_HOME), e.g. /usr/local/cuda-{cuda_version} or "
        "$NVHPC_ROOT/cuda/{cuda_version} (variables the site's modules set are read after modules.load)"))
