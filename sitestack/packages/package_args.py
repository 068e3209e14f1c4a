"""The ``package:`` arguments of the recipes with hooks (sitestack/packages/__init__.py), apart from
the hooks: the build tasks take some of them as command-line options (``build-rccl-plugin --rocm``,
``build-horovod --gpu-operations``) with these fields' docs as their help, and the command line loads
this module without the hooks' imports."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass(frozen=True)
class PluginArgs:
    """The step arguments the plugin adds to a recipe install."""

    rocm: str | None = field(default=None, metadata={"doc": "ROCm release to build for, e.g. 5.7.1 (default: facts.rocm.version)"})
    rocm_home: str | None = field(default=None, metadata={"doc": (
        "ROCm/HIP prefix (default: facts.rocm.home for that release, else /opt/rocm-<rocm>)")})
    cuda: str | None = field(default=None, metadata={"doc": (
        "CUDA release to build for, e.g. 13.0 (default: facts.cuda.version where the site has no facts.rocm)")})
    cuda_home: str | None = field(default=None, metadata={"doc": (
        "CUDA prefix with include/cuda.h and lib64/ (default: facts.cuda.home for that release, else "
        "/usr/local/cuda-<cuda>)")})
    nccl: str | None = field(default=None, metadata={"doc": (
        "version of the NCCL the stack uses, e.g. 2.18.3 (CUDA builds): the plugin's API versions are checked against it "
        "(plugin_apis in sources/comm/libraries.yml)")})
    rccl_home: str | None = field(default=None, metadata={"doc": (
        "prefix with include/rccl/rccl.h, for an RCCL outside ROCm (default: from the ROCm release)")})
    libfabric: str | None = field(default=None, metadata={"doc": (
        "libfabric prefix (may use $VARIABLES of the site modules; default: pkg-config's; system prefixes are not passed)")})
    hwloc: str | None = field(default=None, metadata={"doc": "hwloc prefix (aws-ofi-nccl; default: pkg-config's)"})
    mpi_home: str | None = field(default=None, metadata={"doc": (
        "MPI prefix for --with-mpi (default: the recipe's per MPI flavour, e.g. $MPICH_DIR on Cray)")})
    tests: bool = field(default=False, metadata={"doc": "build the plugin's MPI test programs too"})


@dataclass(frozen=True)
class HorovodArgs:
    """The step arguments Horovod adds to a recipe install."""

    gpu_operations: str | None = field(default=None, metadata={"doc": (
        "HOROVOD_GPU_OPERATIONS: NCCL, MPI or none (default: NCCL where the site has NCCL/RCCL, else none)")})
    nccl_home: str | None = field(default=None, metadata={"doc": (
        "NCCL with include/nccl.h and lib/ (CUDA sites; may use $VARIABLES set by the site modules; "
        "default: the nvidia-nccl wheel of the interpreter)")})
    cpu_operations: Literal["MPI", "GLOO", "CCL"] | None = field(default=None, metadata={"doc": (
        "HOROVOD_CPU_OPERATIONS: the default for CPU tensors, MPI, GLOO or CCL (default: Horovod's choice)")})
    cuda_stubs: str | None = field(default=None, metadata={"doc": (
        "directory with the CUDA driver stub libcuda.so, for hosts without a GPU driver (CUDA sites; may use "
        "$VARIABLES set by the site modules; default: <facts.cuda.home>/lib64/stubs)")})
