"""Which net plugin a communication library opens in a given environment: real NCCL where it can run here,
a stand-in loader for RCCL, which cannot.

**Real NCCL.** NCCL up to 2.21 opens its net plugin inside ``ncclInit()``, which ``ncclGetUniqueId()``
calls before any GPU is touched (NVIDIA/nccl v2.18.3-1 src/init.cc); the ``nvidia-nccl-cu12`` wheels of
PyPI carry ``libnccl.so.2``, which loads on a machine without a GPU or driver. :func:`real_init` loads it
with ctypes, calls ``ncclGetUniqueId`` with ``NCCL_DEBUG=INFO`` in the environment given, and returns
NCCL's own log: "NET/Plugin: Loaded net plugin NAME (vN)", "No plugin found", the dlerror.

**Stand-in for RCCL** (ROCm's RCCL needs ROCm's runtime, which Debian does not have): :func:`stand_in_init`
follows one row of ``sources/comm/libraries.yml`` (the file names tried, path first or not; the API
versions looked up) with the same ``dlopen(RTLD_NOW | RTLD_LOCAL)`` and ``dlsym`` calls, and prints NCCL's
lines. It can only be as right as the table, so :func:`agrees_with_real` is run against the real NCCL of
the same rule on every test run (tests/test_comm_oracle.py): a table row that misreads the loader fails
there first.

**Plugins.** :func:`stub_plugin` compiles a minimal plugin that exports ``ncclNetPlugin_vN`` structs
whose ``name`` field (the first member of every version's struct, NVIDIA/nccl src/include/nccl_net.h)
says which file it is, so a log names the file that was opened.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

from sitestack.model.comm_libraries import Loader

#: Where the NCCL libraries are kept between test runs (about 200 MB per wheel).
CACHE = Path(os.environ.get("SITESTACK_TEST_NCCL", Path.home() / ".cache" / "sitestack" / "test-nccl"))

#: NCCL's debug settings: its INIT and NET lines on stderr.
DEBUG = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}

_REAL = r"""
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
unique = ctypes.create_string_buffer(128)
sys.exit(lib.ncclGetUniqueId(unique))
"""

_STAND_IN = r"""
import ctypes, os, sys
names, apis, who = sys.argv[1].split("|"), [int(v) for v in sys.argv[2].split(",")], sys.argv[3]
say = lambda text: print(f"stand-in:{os.getpid()}:{os.getpid()} [0] NCCL INFO {text}", file=sys.stderr)
for name in names:
    try:
        lib = ctypes.CDLL(name, mode=os.RTLD_NOW | os.RTLD_LOCAL)
    except OSError as exc:
        say(f"NET/Plugin : Plugin load ({name}) returned 2 : {exc}")
        continue
    for api in apis:
        try:
            struct = ctypes.c_char_p.in_dll(lib, f"ncclNetPlugin_v{api}")
        except ValueError:
            continue
        say(f"NET/Plugin: {who} stand-in opened {name}")
        say(f"NET/Plugin: Loaded net plugin {struct.value.decode()} (v{api})")
        sys.exit(0)
    say("NET/Plugin: Failed to find ncclNetPlugin symbol")
    sys.exit(0)
say(f"NET/Plugin : No plugin found ({names[-1]}), using internal implementation [{who} stand-in]")
"""


def nccl_library(version: str) -> Path:
    """``libnccl.so.2`` of ``nvidia-nccl-cu12==version`` from PyPI, downloaded once into :data:`CACHE`."""
    target = CACHE / version / "libnccl.so.2"
    if target.is_file():
        return target
    wheels = CACHE / version / "wheel"
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--disable-pip-version-check",
                    "-d", str(wheels), f"nvidia-nccl-cu12=={version}"], check=True, capture_output=True, text=True)
    (wheel,) = wheels.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        member = next(n for n in archive.namelist() if n.endswith("/libnccl.so.2"))
        partial = target.with_suffix(".partial")
        partial.write_bytes(archive.read(member))
        partial.rename(target)
    wheel.unlink()
    return target


def _run(argv: list[str], env: dict[str, str]) -> str:
    out = subprocess.run(argv, env={"PATH": "/usr/bin:/bin", **env, **DEBUG}, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"{argv[:3]} exited {out.returncode}: {out.stderr[-2000:]}"
    return out.stdout + out.stderr


def real_init(library: Path, env: dict[str, str]) -> str:
    """NCCL's log of ``ncclGetUniqueId()`` with ``library`` (a real libnccl.so.2) in environment ``env``."""
    return _run([sys.executable, "-c", _REAL, str(library)], env)


def stand_in_init(loader: Loader, apis: tuple[int, ...], env: dict[str, str]) -> str:
    """The log the stand-in loader writes for ``loader``'s rule (looking up ``apis``) in ``env``."""
    names = loader.opens(env.get("NCCL_NET_PLUGIN"))
    who = f"{loader.library} {loader.rocm or loader.versions}"
    return _run([sys.executable, "-c", _STAND_IN, "|".join(names), ",".join(map(str, apis)), who], env)


def stub_plugin(path: Path, name: str, apis: tuple[int, ...] = (5,)) -> Path:
    """A plugin library at ``path`` whose ``ncclNetPlugin_vN`` (each of ``apis``) registers ``name``.
    Only v5 by default: NCCL <= 2.21 prints "Loaded net plugin NAME" for every version but its newest."""
    source = path.with_suffix(".c")
    path.parent.mkdir(parents=True, exist_ok=True)
    structs = "\n".join(f"struct plugin ncclNetPlugin_v{v} = {{ \"{name}\", init, devices }};" for v in apis)
    source.write_text(
        "/* name first, init second: the layout of every ncclNet_vN_t (NVIDIA/nccl src/include/nccl_net.h) */\n"
        "typedef void (*logger_t)(void);\n"
        "struct plugin { const char* name; int (*init)(logger_t); int (*devices)(int*); void* rest[24]; };\n"
        "static int init(logger_t l) { (void)l; return 0; }\n"
        "static int devices(int* n) { *n = 0; return 0; }\n" + structs + "\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(path), str(source)], check=True)
    source.unlink()
    return path
