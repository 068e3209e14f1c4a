"""What a Python interpreter offers for building Horovod, printed as one line of JSON.

Run on the site by the build interpreter itself (``python torch_probe.py`` or ``python -c <this
file's text>``); standard library only, so it runs in any interpreter. It prints the
interpreter, its version, and (when torch is installed) torch's version, its CUDA/HIP, the C++
standard torch declares, the build packages it lacks and the NCCL of an nvidia-nccl wheel.
Without torch it prints ``{"error": ...}`` and exits 0: the caller words the refusal.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import re
import sys
from typing import Any

#: Imported by Horovod's setup.py and horovodrun (import names; ``yaml`` is pyyaml).
BUILD_MODULES = ("setuptools", "wheel", "packaging", "psutil", "cloudpickle", "yaml", "cffi")
#: Where torch's headers say which C++ standard they need.
HEADERS = ("include/torch/csrc/api/include/torch/all.h", "include/ATen/ATen.h", "include/c10/macros/Macros.h")


def read(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as handle:
        return handle.read()


def declared_cxx(root: str) -> int | None:
    """The highest C++ standard torch's CMake config or headers require."""
    declared: list[int] = []
    for cfg in glob.glob(os.path.join(root, "share", "cmake", "Torch", "TorchConfig.cmake")):
        declared += [int(x) for x in re.findall(r"CXX_STANDARD\s+(\d+)", read(cfg))]
    for hdr in HEADERS:
        path = os.path.join(root, hdr)
        if os.path.exists(path):
            declared += [int(x) for x in re.findall(r"#\s*error\s+C\+\+(\d+) or later", read(path))]
    return max(declared) if declared else None


def nccl_wheel() -> str | None:
    """The directory of an nvidia-nccl wheel (include/nccl.h) on sys.path, if any."""
    for base in sys.path:
        for sub in ("nvidia/nccl", "nvidia/cu13", "nvidia/cu12"):
            d = os.path.join(base, sub)
            if os.path.exists(os.path.join(d, "include", "nccl.h")):
                return d
    return None


def probe() -> dict[str, Any]:
    out: dict[str, Any] = {"python": sys.executable, "version": ".".join(map(str, sys.version_info[:3])),
                           "vouch": vouchers()}
    # Read torch/version.py instead of importing torch: the import takes seconds, and this probe
    # runs on every (no-op) provision.
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin or not os.path.exists(os.path.join(os.path.dirname(spec.origin), "version.py")):
        out["error"] = "ModuleNotFoundError: No module named 'torch'"
        return out
    root = os.path.dirname(spec.origin)
    out["vouch"] += [root, os.path.join(root, "version.py"), os.path.join(root, "share", "cmake", "Torch"),
                     *(os.path.join(root, h) for h in HEADERS)]
    info: dict[str, Any] = {}
    exec(compile(read(os.path.join(root, "version.py")), "torch/version.py", "exec"), info)
    out.update(torch=info["__version__"], cuda=info.get("cuda"), hip=info.get("hip"), root=root)
    out["declared_cxx"] = declared_cxx(root)
    out["missing"] = [m for m in BUILD_MODULES if importlib.util.find_spec(m) is None]
    nccl = nccl_wheel()
    out["nccl_wheel"] = nccl
    if nccl:
        out["nccl_libs"] = sorted(os.path.basename(p) for p in glob.glob(os.path.join(nccl, "lib", "libnccl.so*")))
        out["vouch"].append(os.path.join(nccl, "lib"))
    return out


def vouchers() -> list[str]:
    """The files this answer depends on, for the caller's probe cache: the interpreter, its
    ``sys.path`` directories (installing or removing a package changes one's mtime) and torch's
    files read here."""
    paths = [sys.executable, os.path.realpath(sys.executable), os.path.join(sys.prefix, "pyvenv.cfg")]
    paths += [os.path.abspath(p) for p in sys.path if p and os.path.isdir(p)]
    return paths


if __name__ == "__main__":
    print(json.dumps(probe()))
