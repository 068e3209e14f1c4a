"""A ROCm tree made from Debian's HIP (hipcc, libamdhip64-dev), and a stand-in RCCL header.

A site's ROCm is a prefix like ``/opt/rocm-5.7.1`` with ``include/hip`` and ``lib/libamdhip64.so``.
Debian installs HIP into ``/usr``, and ``/usr`` cannot be given to a configure script: ``-I/usr/include``
breaks GCC's ``#include_next <stdlib.h>`` (docs/netplugin.md). So the twin is a tree whose
``include/`` holds only ``hip/`` (a symlink to ``/usr/include/hip``) and whose ``lib/`` holds
libamdhip64 (symlinks to Debian's).

RCCL is not packaged in Debian 12. :func:`make_rccl_header` writes a stand-in ``include/rccl/rccl.h``
with just what ROCm/aws-ofi-rccl uses of RCCL's header (docs/netplugin.md): the HIP platform macro, the
version macros and the enums ``ncclResult_t``, ``ncclRedOp_t``, ``ncclDataType_t`` with RCCL's values.
"""

from __future__ import annotations

import glob
import hashlib
import os
from pathlib import Path

HIP_INCLUDE = "/usr/include/hip"
HIP_LIBS = "/usr/lib/*-linux-gnu/libamdhip64.so*"

# Stands in for RCCL's rccl.h (ROCm/rccl src/nccl.h.in, NCCL 2.18.3 base as in ROCm 6.0): only what the
# plugin uses of it. Values of the enums are RCCL's.
RCCL_H = """\
/* STAND-IN for RCCL's <rccl/rccl.h>, written by sitestack's tests: Debian packages no RCCL.
 * Only what ROCm/aws-ofi-rccl uses of RCCL (NCCL 2.18.3 base): the HIP platform, version macros, enums. */
#ifndef RCCL_H_
#define RCCL_H_
#ifndef __HIP_PLATFORM_AMD__
#define __HIP_PLATFORM_AMD__
#endif
#include <hip/hip_runtime_api.h>
#define NCCL_MAJOR 2
#define NCCL_MINOR 18
#define NCCL_PATCH 3
#define NCCL_SUFFIX ""
#define NCCL_VERSION(X, Y, Z) (((X) <= 2 && (Y) <= 8) ? (X) * 1000 + (Y) * 100 + (Z) : (X) * 10000 + (Y) * 100 + (Z))
#define NCCL_VERSION_CODE 21803
typedef enum { ncclSuccess = 0, ncclUnhandledCudaError = 1, ncclSystemError = 2, ncclInternalError = 3,
               ncclInvalidArgument = 4, ncclInvalidUsage = 5, ncclRemoteError = 6, ncclInProgress = 7,
               ncclNumResults = 8 } ncclResult_t;
typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4, ncclNumOps = 5,
               ncclMaxRedOp = 0x7fffffff >> 1 } ncclRedOp_t;
typedef enum { ncclInt8 = 0, ncclChar = 0, ncclUint8 = 1, ncclInt32 = 2, ncclInt = 2, ncclUint32 = 3,
               ncclInt64 = 4, ncclUint64 = 5, ncclFloat16 = 6, ncclHalf = 6, ncclFloat32 = 7, ncclFloat = 7,
               ncclFloat64 = 8, ncclDouble = 8, ncclBfloat16 = 9, ncclNumTypes = 10 } ncclDataType_t;
#endif
"""


def have_debian_hip() -> bool:
    """Whether Debian's HIP headers and library are installed (hipcc, libamdhip64-dev)."""
    return os.path.isdir(HIP_INCLUDE) and bool(glob.glob(HIP_LIBS))


def make_rocm(root: Path) -> Path:
    """A ROCm tree at ``root``: ``include/hip`` -> Debian's HIP headers, ``lib/libamdhip64.so*``."""
    if not have_debian_hip():
        raise RuntimeError(f"Debian's HIP is not installed ({HIP_INCLUDE}, {HIP_LIBS}): apt-get install hipcc libamdhip64-dev")
    (root / "include").mkdir(parents=True)
    (root / "lib").mkdir()
    (root / "include" / "hip").symlink_to(HIP_INCLUDE)
    for lib in glob.glob(HIP_LIBS):
        (root / "lib" / os.path.basename(lib)).symlink_to(lib)
    return root


def make_rccl_header(prefix: Path) -> Path:
    """The stand-in ``<prefix>/include/rccl/rccl.h`` (see :data:`RCCL_H`); returns ``prefix``."""
    (prefix / "include" / "rccl").mkdir(parents=True, exist_ok=True)
    (prefix / "include" / "rccl" / "rccl.h").write_text(RCCL_H)
    return prefix


#: The upstream plugin sources the repository carries (tests/data/upstream/README.md), with their sums.
UPSTREAM_SOURCES = {
    "aws-ofi-nccl-1.18.0.tar.gz": "12fd67f05872600c485d74b8e3c3a640d063322371170f3a9c17d67a5a2ca681",
    "aws-ofi-rccl-17d41cb.tar.gz": "f5a56f4cbac08ac6c352cdd77b5b9d45006d5567e1b75681a743f99c07ccf1e3",
}


def upstream_sources() -> Path:
    """``tests/data/upstream/``: git archives of the upstream plugin sources, carried in the repository
    (GitHub cannot be reached from the test machines), each checked against its sum. A missing or
    changed archive is an error: the tests that build the real plugins must not pass without them."""
    folder = Path(__file__).resolve().parent.parent / "data" / "upstream"
    for name, digest in UPSTREAM_SOURCES.items():
        path = folder / name
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing: the repository carries it (tests/data/upstream/README.md)")
        got = hashlib.sha256(path.read_bytes()).hexdigest()
        if got != digest:
            raise ValueError(f"{path}: sha256 {got}, not {digest} (tests/data/upstream/README.md)")
    return folder
