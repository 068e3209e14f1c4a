"""The host's fingerprint: what a stack depends on but does not install, read on the node it runs on.

The kernel, glibc, the GPU driver and its firmware (where readable), libfabric and its providers, the
Slingshot (CXI) or InfiniBand stack, Slurm, and the site modules loaded with the files they resolved
to. The validation job records it on its first node as part of ``result.json`` ``toolchain``
(:mod:`.ddpcheck.provenance` adds what the ranks loaded: MPI, torch, NCCL/RCCL, Python); ``invoke
validate`` runs this program on the host it submits from (``python3 fingerprint.py --config
check-config.json``, after loading the stack's modules as the job does) and keeps that fingerprint
with the run, so ``invoke validate --if-changed`` compares the submitting host with itself (docs/validation.md).

Every value read from outside (the environment, ``/sys`` and ``/proc``, a command's output) is
bounded and sanitised before it is recorded (:func:`.visible.short_line`): a version is at most
:data:`VALUE_MAX` characters of letters, digits and ``._+-:/@()~``, anything else becomes ``?``; a
command runs with a timeout of :data:`COMMAND_TIMEOUT` seconds and its output is read up to
:data:`READ_MAX` bytes. A value that cannot be read is null, never an error: the history compares
fingerprints, it does not judge them.
"""

from __future__ import annotations

import glob
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

from .fileio import CONFIG_MAX, ReadError, read_json, read_text
from .stack_digest import stack_record
from .visible import NOT_VERSION, short_line

#: The longest value recorded; the most modules; the most bytes read from a file or a command.
VALUE_MAX = 120
LIST_MAX = 200  # a list of names in one value (libfabric's providers)
PATH_MAX = 400
MODULES_MAX = 100
READ_MAX = 4096
#: Seconds a version command (fi_info, srun, ofed_info) may take: a hung file system or controller cannot hold it.
COMMAND_TIMEOUT = 5.0
#: The single-valued fields, in the order a change is named.
KEYS = ("libfabric", "providers", "network", "driver", "firmware", "kernel", "glibc", "slurm")


def clean(text: object, limit: int = VALUE_MAX) -> str | None:
    """``text`` as one short line of a version's characters (None when nothing is left)."""
    return short_line(text, limit, NOT_VERSION)


def names_of(values: list[str] | set[str]) -> str | None:
    """Distinct values, each :func:`clean`, sorted and joined with commas, at most :data:`LIST_MAX` characters."""
    names = sorted({c for c in (clean(v) for v in values) if c})
    return ",".join(names)[:LIST_MAX] or None


def read_small(path: str) -> str | None:
    """The first :data:`READ_MAX` bytes of ``path`` as text (None when unreadable)."""
    try:
        return read_text(path, READ_MAX, keep="head")
    except ReadError:
        return None


def command_output(argv: list[str]) -> str | None:
    """``argv``'s standard output (bounded, within :data:`COMMAND_TIMEOUT`), None when it is not on PATH,
    fails or does not finish."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                              timeout=COMMAND_TIMEOUT, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout[:READ_MAX].decode("utf-8", "replace") if done.returncode == 0 else None


def libfabric_version() -> str | None:
    """libfabric's version from ``fi_info --version`` (``libfabric: 1.15.2.0``), where fi_info is on PATH."""
    match = re.search(r"^libfabric:\s*(\S+)", command_output(["fi_info", "--version"]) or "", re.M)
    return clean(match.group(1)) if match else None


def libfabric_providers() -> str | None:
    """The providers ``fi_info -l`` lists (``cxi:``, ``tcp;ofi_rxm:`` each at the start of a line), sorted,
    comma-separated, a layered provider's ``;`` written ``+`` (``tcp+ofi_rxm``): a provider a site update drops
    (cxi) is a change worth a re-run."""
    names = re.findall(r"^([A-Za-z0-9_;]+):\s*$", command_output(["fi_info", "-l"]) or "", re.M)
    return names_of([n.replace(";", "+") for n in names])


def driver_version(root: str = "/") -> str | None:
    """The GPU driver: AMD's kernel module version (``/sys/module/amdgpu/version``), else ``rocm-smi
    --showdriverversion``; NVIDIA's (``/proc/driver/nvidia/version``: ``... Kernel Module  535.104.05 ...``)."""
    amd = read_small(os.path.join(root, "sys/module/amdgpu/version"))
    if amd and amd.strip():
        return clean(f"amdgpu {amd.strip()}")
    nvidia = read_small(os.path.join(root, "proc/driver/nvidia/version")) or ""
    match = re.search(r"Kernel Module\s+(\d[\w.\-]*)", nvidia)
    if match:
        return clean(f"nvidia {match.group(1)}")
    match = re.search(r"Driver version:\s*(\S+)", command_output(["rocm-smi", "--showdriverversion"]) or "")
    return clean(f"amdgpu {match.group(1)}") if match else None


def firmware_version(root: str = "/") -> str | None:
    """The GPUs' firmware: AMD's VBIOS versions (``/sys/class/drm/card*/device/vbios_version``, the amdgpu
    driver's sysfs file), else NVIDIA's (``nvidia-smi --query-gpu=vbios_version``); distinct values, sorted."""
    cards = sorted(glob.glob(os.path.join(root, "sys/class/drm/card[0-9]*/device/vbios_version")))[:64]
    found = {v.strip() for v in (read_small(p) for p in cards) if v and v.strip()}
    if not found:
        text = command_output(["nvidia-smi", "--query-gpu=vbios_version", "--format=csv,noheader"]) or ""
        found = {line.strip() for line in text.splitlines()[:64] if line.strip()}
    return names_of(found)


def network_stack(root: str = "/") -> str | None:
    """The Slingshot or InfiniBand stack: the CXI driver's module version (``/sys/module/cxi_ss1/version``,
    HPE's cxi-driver) and how many CXI devices ``/sys/class/cxi`` has; else ``ofed_info -s``
    (``MLNX_OFED_LINUX-5.8-1.0.1.1:``); else the InfiniBand devices ``/sys/class/infiniband`` lists."""
    cxi = sorted(os.path.basename(p) for p in glob.glob(os.path.join(root, "sys/class/cxi/cxi*")))
    version = next((v.strip() for v in (read_small(os.path.join(root, f"sys/module/{m}/version"))
                                        for m in ("cxi_ss1", "cxi_core")) if v and v.strip()), "")
    if cxi or version:
        return clean(f"cxi {version or '(version unreadable)'} ({len(cxi)} devices)")
    ofed = (command_output(["ofed_info", "-s"]) or "").strip().rstrip(":")
    if ofed:
        return clean(ofed)
    ib = sorted(os.path.basename(p) for p in glob.glob(os.path.join(root, "sys/class/infiniband/*")))[:32]
    return "ib " + str(names_of(ib)) if ib else None


def slurm_version(env: Mapping[str, str]) -> str | None:
    """Slurm's version: ``SLURM_VERSION`` where set, else ``srun --version`` (``slurm 22.05.8``)."""
    if env.get("SLURM_VERSION"):
        return clean(env["SLURM_VERSION"])
    match = re.search(r"slurm(?:-wlm)?\s+(\S+)", command_output(["srun", "--version"]) or "")
    return clean(match.group(1)) if match else None


def glibc_version() -> str | None:
    """The C library (``os.confstr("CS_GNU_LIBC_VERSION")``: ``glibc 2.36``); None on another libc."""
    try:
        return clean(os.confstr("CS_GNU_LIBC_VERSION"))
    except (ValueError, OSError, AttributeError):
        return None


def loaded_modules(env: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
    """(the modules loaded, ``name/version`` as ``LOADEDMODULES`` lists them; each one's module file as
    ``_LMFILES_`` resolves it, by position): both Lmod and Environment Modules keep the two lists in step."""
    names = [clean(m, 200) for m in env.get("LOADEDMODULES", "").split(":")[:MODULES_MAX * 4] if m.strip()]
    files = [f for f in env.get("_LMFILES_", "").split(":")[:MODULES_MAX * 4] if f.strip()]
    modules = [m for m in names if m][:MODULES_MAX]
    paths: dict[str, str] = {}
    if len(files) == len([m for m in names if m]):
        for name, path in zip(modules, files):
            text = short_line(path, PATH_MAX)
            if text:
                paths[name] = text
    return modules, paths


def fingerprint(env: Mapping[str, str], root: str = "/") -> dict[str, Any]:
    """The host's fingerprint: ``modules`` (list), ``module_files`` (module -> file) and one text or null
    for each of :data:`KEYS`. ``root``: where ``/sys`` and ``/proc`` are (a test's own tree)."""
    modules, files = loaded_modules(env)
    return {"modules": modules, "module_files": files, "libfabric": libfabric_version(),
            "providers": libfabric_providers(), "network": network_stack(root), "driver": driver_version(root),
            "firmware": firmware_version(root), "kernel": clean(platform.release()), "glibc": glibc_version(),
            "slurm": slurm_version(env)}


def main(argv: list[str] | None = None) -> int:
    """``fingerprint.py [--config check-config.json]``: prints ``{"fingerprint": {...}, "stack": {...}}``
    (the stack the installed job validates, its digest read now: :func:`.stack_digest.stack_record`)."""
    args = list(sys.argv[1:] if argv is None else argv)
    stack: dict[str, Any] = {}
    if args[:1] == ["--config"] and len(args) == 2:
        try:
            stack = stack_record(read_json(args[1], CONFIG_MAX))
        except ReadError as exc:
            print(f"fingerprint.py: {exc}", file=sys.stderr)
            return 1
    elif args:
        print("usage: fingerprint.py [--config check-config.json]", file=sys.stderr)
        return 2
    print(json.dumps({"fingerprint": fingerprint(os.environ), "stack": stack}, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
