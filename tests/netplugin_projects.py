"""A stand-in for the RCCL network plugins, for tests that build them for real.

GitHub cannot be reached here, so the tests build a small autotools project with the same
configure interface as ROCm/aws-ofi-rccl (``--with-libfabric --with-hip --with-rccl --with-mpi``,
tests built unless ``--disable-tests``) or aws/aws-ofi-nccl (``--with-rocm --with-hwloc``). Like
them it needs libfabric's and HIP's headers and libraries (Debian: libfabric-dev,
libamdhip64-dev), the fork's flavour includes ``<rccl/rccl.h>``, the aws-ofi-nccl flavour needs
hwloc, and the library exports ``ncclNetPlugin_v<N>`` structs.
"""

from __future__ import annotations

import subprocess
import tarfile
import textwrap
from pathlib import Path

CONFIGURE_AC = """\
AC_INIT([NAME], [VERSION])
AC_CONFIG_AUX_DIR([build-aux])
AC_CONFIG_MACRO_DIR([m4])
AM_INIT_AUTOMAKE([-Wall foreign subdir-objects])
AC_PROG_CC
AM_PROG_AR
LT_INIT([shared disable-static])
AC_CONFIG_HEADERS([config.h])

AC_ARG_WITH([libfabric], [AS_HELP_STRING([--with-libfabric=PATH], [libfabric prefix])],
  [CPPFLAGS="$CPPFLAGS -I$withval/include"; LDFLAGS="$LDFLAGS -L$withval/lib"])
AC_ARG_WITH([HIPOPT], [AS_HELP_STRING([--with-HIPOPT=PATH], [HIP/ROCm prefix])],
  [CPPFLAGS="$CPPFLAGS -I$withval/include"; LDFLAGS="$LDFLAGS -L$withval/lib"])
AC_ARG_WITH([rccl], [AS_HELP_STRING([--with-rccl=PATH], [RCCL prefix (include/rccl/rccl.h)])],
  [CPPFLAGS="$CPPFLAGS -I$withval/include"])
AC_ARG_WITH([hwloc], [AS_HELP_STRING([--with-hwloc=PATH], [hwloc prefix])],
  [CPPFLAGS="$CPPFLAGS -I$withval/include"; LDFLAGS="$LDFLAGS -L$withval/lib"])
AC_ARG_WITH([mpi], [AS_HELP_STRING([--with-mpi=PATH], [MPI prefix (tests only)])],
  [CPPFLAGS="$CPPFLAGS -I$withval/include"; LDFLAGS="$LDFLAGS -L$withval/lib"])
AC_ARG_ENABLE([tests], [AS_HELP_STRING([--disable-tests], [do not build the MPI tests])], [], [enable_tests=yes])

AC_DEFINE([__HIP_PLATFORM_AMD__], [1], [HIP on AMD])
AC_CHECK_HEADERS([rdma/fabric.h hip/hip_runtime_api.h], [], [AC_MSG_ERROR([unable to find required headers])])
AC_SEARCH_LIBS([fi_getinfo], [fabric], [], [AC_MSG_ERROR([unable to find libfabric])])
AC_SEARCH_LIBS([hipPointerGetAttributes], [amdhip64], [], [AC_MSG_ERROR([unable to find libamdhip64])])
HWLOC_CHECK
AS_IF([test "x$enable_tests" != xno],
  [AC_CHECK_HEADERS([mpi.h], [], [AC_MSG_ERROR(["mpi.h not found"])])])
AM_CONDITIONAL([ENABLE_TESTS], [test "x$enable_tests" != xno])
AC_CONFIG_FILES([Makefile])
AC_OUTPUT
"""

HWLOC_CHECK = """\
AC_CHECK_HEADERS([hwloc.h], [], [AC_MSG_ERROR([Could not find the hwloc library])])
AC_SEARCH_LIBS([hwloc_topology_init], [hwloc], [], [AC_MSG_ERROR([Could not find the hwloc library])])"""

MAKEFILE_AM = """\
ACLOCAL_AMFLAGS = -I m4
lib_LTLIBRARIES = LIBS_LA
PLUGIN_SOURCES = plugin.c
LIB_SOURCES
if ENABLE_TESTS
bin_PROGRAMS = nccl_connection
nccl_connection_SOURCES = connection.c
endif
"""

PLUGIN_C = """\
#include "config.h"
#include <stddef.h>
#include <rdma/fabric.h>
#include <hip/hip_runtime_api.h>
RCCL_INCLUDE

typedef struct {
    const char *name;
    int (*init)(void *logger);
    int (*devices)(int *ndev);
} plugin_t;

static int plugin_init(void *logger)
{
    (void)logger;
    return fi_version() >= FI_VERSION(1, 0) ? 0 : 2;
}

static int plugin_devices(int *ndev)
{
    hipPointerAttribute_t attr;
    *ndev = hipPointerGetAttributes(&attr, NULL) == hipSuccess ? 1 : 0;
    return 0;
}

#define EXPORT(v) __attribute__((visibility("default"))) const plugin_t ncclNetPlugin_v##v = \\
    { "AWS Libfabric", plugin_init, plugin_devices };
EXPORTS
"""

CONNECTION_C = """\
#include <mpi.h>
int main(int argc, char **argv) { MPI_Init(&argc, &argv); MPI_Finalize(); return 0; }
"""

RCCL_H = """\
/* Just enough of RCCL's rccl.h for the stand-in plugin: what aws-ofi-rccl uses of it. */
#ifndef RCCL_H_
#define RCCL_H_
#include <hip/hip_runtime_api.h>
#define NCCL_MAJOR 2
#define NCCL_MINOR 17
#define NCCL_PATCH 1
#define NCCL_SUFFIX ""
#define NCCL_VERSION_CODE 21701
#define NCCL_VERSION(X, Y, Z) (((X) <= 2 && (Y) <= 8) ? (X) * 1000 + (Y) * 100 + (Z) : (X) * 10000 + (Y) * 100 + (Z))
typedef enum { ncclSuccess = 0, ncclUnhandledCudaError = 1, ncclSystemError = 2, ncclInternalError = 3,
               ncclInvalidArgument = 4 } ncclResult_t;
typedef enum { ncclInt8 = 0, ncclFloat32 = 7 } ncclDataType_t;
typedef enum { ncclSum = 0 } ncclRedOp_t;
#endif
"""

FLAVOURS = {
    # the ROCm fork: --with-hip, --with-rccl, <rccl/rccl.h>, lib/librccl-net.so, v5 only
    "aws-ofi-rccl": {"hip": "hip", "rccl": True, "hwloc": False, "libs": ["librccl-net"], "exports": [5]},
    # aws-ofi-nccl >= 1.18 with ROCm: --with-rocm, --with-hwloc, librccl-net(-ofi).so, v2..v11
    "aws-ofi-nccl": {"hip": "rocm", "rccl": False, "hwloc": True, "libs": ["librccl-net", "librccl-net-ofi"],
                     "exports": list(range(2, 12))},
}


def make_plugin_tree(root: Path, flavour: str, version: str, *, bootstrapped: bool = False) -> Path:
    """The project's source tree ``<root>/<flavour>-<version>/`` (a checkout: no configure, unless
    ``bootstrapped``, like a release tarball)."""
    spec = FLAVOURS[flavour]
    tree = root / f"{flavour}-{version}"
    tree.mkdir(parents=True)
    (tree / "m4").mkdir()
    configure = (CONFIGURE_AC.replace("NAME", flavour).replace("VERSION", version).replace("HIPOPT", spec["hip"])
                 .replace("HWLOC_CHECK", HWLOC_CHECK if spec["hwloc"] else ""))
    (tree / "configure.ac").write_text(configure)
    la = [f"{name}.la" for name in spec["libs"]]
    sources = "\n".join(f"{name.replace('-', '_')}_la_SOURCES = $(PLUGIN_SOURCES)" for name in spec["libs"])
    (tree / "Makefile.am").write_text(MAKEFILE_AM.replace("LIBS_LA", " ".join(la)).replace("LIB_SOURCES", sources))
    exports = "\n".join(f"EXPORT({v})" for v in spec["exports"])
    include = "#include <rccl/rccl.h>" if spec["rccl"] else ""
    (tree / "plugin.c").write_text(PLUGIN_C.replace("RCCL_INCLUDE", include).replace("EXPORTS", exports))
    (tree / "connection.c").write_text(CONNECTION_C)
    if bootstrapped:
        subprocess.run(["autoreconf", "-fi"], cwd=tree, check=True, capture_output=True)
    return tree


def make_plugin_tarball(root: Path, flavour: str, version: str, *, bootstrapped: bool = False) -> Path:
    tree = make_plugin_tree(root / "trees", flavour, version, bootstrapped=bootstrapped)
    out = root / f"{flavour}-{version}.tar.gz"
    with tarfile.open(out, "w:gz") as tar:
        tar.add(tree, arcname=tree.name)
    return out


def make_rccl_stub(root: Path) -> Path:
    """A prefix with include/rccl/rccl.h (Debian packages no RCCL)."""
    (root / "include" / "rccl").mkdir(parents=True)
    (root / "include" / "rccl" / "rccl.h").write_text(RCCL_H)
    return root


__all__ = ["make_plugin_tarball", "make_plugin_tree", "make_rccl_stub", "textwrap"]
