"""What the run ran on, for the site's history: the toolchain (modules, libfabric, GPU driver, kernel,
Slurm, MPI, torch, NCCL/RCCL, Python), the stack's digest and how long the ranks took to start.

Every value read from outside (the environment, ``/sys`` and ``/proc``, a command's output) is
bounded and sanitised before it is recorded: a version is at most :data:`VALUE_MAX` characters of
letters, digits and ``._+-:/@()~``, anything else becomes ``?``; a command runs with a timeout of
:data:`COMMAND_TIMEOUT` seconds and its output is read up to :data:`READ_MAX` bytes. A value that
cannot be read is null, never an error: the history compares toolchains, it does not judge them.
"""

from __future__ import annotations

import hashlib
import json
import math
import platform
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from typing import Any

from ..fileio import ReadError, read_json, read_text
from ..visible import NOT_VERSION, short_line

#: The longest value recorded; the most modules; the most bytes read from a file or a command.
VALUE_MAX = 120
MODULES_MAX = 100
READ_MAX = 4096
#: The largest stack manifest read (a manifest of a few hundred packages is well under 1 MiB).
MANIFEST_MAX = 64 << 20
#: Seconds a version command (fi_info, srun) may take: a hung file system or controller cannot hold the report.
COMMAND_TIMEOUT = 5.0
#: The variable the guard sets for the launcher it starts: when it started it (epoch seconds).
LAUNCH_START = "SITESTACK_LAUNCH_START"


def clean(text: object, limit: int = VALUE_MAX) -> str | None:
    """``text`` as one short line of a version's characters (None when nothing is left)."""
    return short_line(text, limit, NOT_VERSION)


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
    text = command_output(["fi_info", "--version"]) or ""
    match = re.search(r"^libfabric:\s*(\S+)", text, re.M)
    return clean(match.group(1)) if match else None


def driver_version() -> str | None:
    """The GPU driver: AMD's kernel module version (``/sys/module/amdgpu/version``), NVIDIA's
    (``/proc/driver/nvidia/version``: ``NVRM version: NVIDIA UNIX ... Kernel Module  535.104.05 ...``)."""
    amd = read_small("/sys/module/amdgpu/version")
    if amd and amd.strip():
        return clean(f"amdgpu {amd.strip()}")
    nvidia = read_small("/proc/driver/nvidia/version") or ""
    match = re.search(r"Kernel Module\s+(\d[\w.\-]*)", nvidia)
    return clean(f"nvidia {match.group(1)}") if match else None


def slurm_version(env: Mapping[str, str]) -> str | None:
    """Slurm's version: ``SLURM_VERSION`` where set, else ``srun --version`` (``slurm 22.05.8``)."""
    if env.get("SLURM_VERSION"):
        return clean(env["SLURM_VERSION"])
    text = command_output(["srun", "--version"]) or ""
    match = re.search(r"slurm(?:-wlm)?\s+(\S+)", text)
    return clean(match.group(1)) if match else None


def toolchain(env: Mapping[str, str], first: Mapping[str, Any], probe: object = None) -> dict[str, Any]:
    """The toolchain record (``result.json`` ``toolchain``): ``first`` is rank 0's report (torch, NCCL/RCCL
    and the MPI library mpi4py loaded); ``probe`` the MPI probe's result, whose library names the MPI
    where no rank loaded one (torchrun)."""
    mpi = first.get("mpi_library")
    library = str(probe.get("library") or "").strip() if isinstance(probe, dict) else ""
    if not mpi and library:
        mpi = library.splitlines()[0]
    modules = [clean(m, 200) for m in env.get("LOADEDMODULES", "").split(":") if m.strip()][:MODULES_MAX]
    nccl = first.get("nccl")
    return {
        "modules": [m for m in modules if m],
        "libfabric": libfabric_version(),
        "driver": driver_version(),
        "kernel": clean(platform.release()),
        "slurm": slurm_version(env),
        "mpi": clean(mpi),
        "torch": clean(first.get("torch")),
        "nccl": clean(f"{first.get('library') or 'NCCL'} {nccl}") if nccl else None,
        "python": clean(first.get("python") or sys.version.split()[0]),
    }


def ready_seconds(env: Mapping[str, str], ready_at: object, now: float | None = None) -> float | None:
    """Seconds from the launcher's start (:data:`LAUNCH_START`, set by the guard) to ``ready_at`` (when
    every rank was in the process group); None when either is missing or not a time of this run."""
    now = time.time() if now is None else now
    try:
        start = float(env.get(LAUNCH_START) or "nan")
        ready = float(ready_at)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    if not (math.isfinite(start) and math.isfinite(ready)) or not (now - 7 * 86400 < start <= ready <= now + 60):
        return None
    return round(ready - start, 3)


def stack_record(config: Mapping[str, Any]) -> dict[str, Any]:
    """The stack the run validated: its module from check-config.json, and the plan digest of the manifest
    check-config.json names, read now (null where it is not readable): the history compares what ran, and
    the installed job's files do not depend on whether the stack was made before them."""
    stack: dict[str, Any] = config["stack"] if isinstance(config.get("stack"), dict) else {}
    return {"module": clean(stack.get("module"), 200), "digest": manifest_digest(stack.get("manifest"))}


def manifest_digest(path: object) -> str | None:
    """The plan digest of the stack manifest at ``path`` (sitestack.installs.venv_manifest.plan_digest:
    sha256 of the plan as sorted, indented JSON, 16 hex digits); None when there is none to read."""
    if not isinstance(path, str) or not path.startswith("/"):
        return None
    try:
        plan = read_json(path, MANIFEST_MAX).get("plan")
    except ReadError:
        return None
    if isinstance(plan, dict):
        text = json.dumps(plan, indent=2, sort_keys=True) + "\n"
        return hashlib.sha256(text.encode()).hexdigest()[:16]
    return None
