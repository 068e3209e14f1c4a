"""A rank's threads and CPU allowance: torch's thread pools and the OMP/MKL/OpenBLAS settings, the CPUs
it may run on and how many ranks of its host share them, its cgroup's CPU quota, and how the kernel
scheduled it (run, wait for a CPU, or neither: stopped) while it was timed."""

from __future__ import annotations

import contextlib
import os
from typing import Any

from ..fileio import ReadError, read_text

#: The variables that size the thread pools of torch (OpenMP, MKL) and of numpy's BLAS.
#: The most bytes of a /proc or cgroup file read (mountinfo of a node with many mounts: a few hundred KiB).
PROC_MAX = 4 << 20
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def numpy_version() -> str | None:
    """numpy's version in this rank's Python; None when it is not installed, ``broken: ...`` when its
    import fails (torch's ``.numpy()`` and most data loaders need it)."""
    try:
        import numpy  # type: ignore[import-not-found, unused-ignore]
    except ModuleNotFoundError:
        return None
    except Exception as exc:  # a numpy built for another Python or ABI fails in its own way
        return f"broken: {type(exc).__name__}: {exc}".splitlines()[0][:200]
    return str(getattr(numpy, "__version__", "unknown"))


def thread_settings(torch: Any, env: dict[str, str], affinity: list[int]) -> dict[str, Any]:
    """This rank's thread settings: torch's intra-op and inter-op threads, the thread variables as
    set (None when unset), the CPUs it may run on and its cgroup's CPU quota. ``ranks_sharing``
    (ranks of the host whose CPUs overlap these) is filled in once every rank has reported."""
    settings: dict[str, Any] = {"torch_threads": None, "interop_threads": None}
    with contextlib.suppress(Exception):
        settings["torch_threads"] = int(torch.get_num_threads())
    with contextlib.suppress(Exception):
        settings["interop_threads"] = int(torch.get_num_interop_threads())
    settings.update({"env": {var: env.get(var) for var in THREAD_VARS}, "cpus": len(affinity) or None,
                     "ranks_sharing": None, "quota": cpu_quota()})
    return settings


def share_cpus(ranks: list[dict[str, Any]]) -> None:
    """Fill in each rank's ``threads.ranks_sharing``: the ranks of its host (itself included) whose
    CPUs overlap its own (every rank of the host when a rank's CPUs are unknown)."""
    for rank in ranks:
        mine = set(rank.get("affinity") or [])
        peers = [r for r in ranks if r.get("host") == rank.get("host")]
        sharing = sum(1 for r in peers if not mine or not r.get("affinity") or mine & set(r["affinity"]))
        if isinstance(rank.get("threads"), dict):
            rank["threads"]["ranks_sharing"] = sharing


def oversubscription(rank: dict[str, Any]) -> str | None:
    """The rank's threads against its CPUs: ``OMP_NUM_THREADS=32 on rank 0 (torch runs 2): 2 ranks x
    2 threads on 2 CPUs of HOST: thread oversubscription ...`` when the torch threads of the ranks that
    share its CPUs outnumber them, else None. One thread per rank is never too many: more ranks than
    cores is a choice of the job (they then take turns in the compute check)."""
    threads = rank.get("threads") or {}
    count, cpus, sharing = threads.get("torch_threads"), threads.get("cpus"), threads.get("ranks_sharing")
    if not (isinstance(count, int) and isinstance(cpus, int) and isinstance(sharing, int)) or count < 2 \
            or count * sharing <= cpus:
        return None
    env = threads.get("env") or {}
    var = next((v for v in THREAD_VARS[:2] if env.get(v)), None)
    source = f"{var}={env[var]}" if var else "torch.get_num_threads()"
    runs = f" (torch runs {count})" if var and str(env[var]).strip() != str(count) else ""
    return (f"{source} on rank {rank.get('rank')}{runs}: {sharing} rank{'s' if sharing != 1 else ''} x {count} threads "
            f"on {cpus} CPU{'s' if cpus != 1 else ''} of {rank.get('host')}: thread oversubscription (set "
            f"OMP_NUM_THREADS to at most {max(1, cpus // sharing)}, the CPUs per rank)")


# -- the cgroup's CPU quota (CFS bandwidth control) -----------------------------------------------------
# cgroup v2: cpu.max "QUOTA PERIOD" or "max PERIOD"; cpu.stat nr_periods, nr_throttled, throttled_usec.
# cgroup v1: cpu.cfs_quota_us (-1: none), cpu.cfs_period_us; cpu.stat nr_periods, nr_throttled,
# throttled_time (ns). https://docs.kernel.org/scheduler/sched-bwc.html


def _cpu_cgroup_dirs() -> list[str]:
    """This process's cgroup directories that may hold a CPU quota, innermost first, up to each
    hierarchy's mount (v1's cpu controller, then v2's unified one); [] where /proc cannot tell."""
    try:
        lines = read_text("/proc/self/cgroup", PROC_MAX, keep="head").splitlines()
        mounts = read_text("/proc/self/mountinfo", PROC_MAX, keep="head").splitlines()
    except ReadError:
        return []
    paths = {}
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3 and (parts[1] == "" and parts[0] == "0" or "cpu" in parts[1].split(",")):
            paths["v2" if parts[1] == "" else "v1"] = parts[2]
    found = []
    for line in mounts:
        before, _, after = line.partition(" - ")
        fields, tail = before.split(), after.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        kind = "v2" if tail[0] == "cgroup2" else "v1" if tail[0] == "cgroup" and "cpu" in tail[2].split(",") else None
        path = paths.get(kind or "")
        root, mount = fields[3], fields[4]
        if path is None or not (path + "/").startswith(root.rstrip("/") + "/"):
            continue
        here = os.path.normpath(mount + "/" + path[len(root.rstrip("/")):])
        while here.startswith(mount):
            found.append(here)
            if here == mount:
                break
            here = os.path.dirname(here)
    return found


def _read(path: str) -> str | None:
    with contextlib.suppress(ReadError):
        return read_text(path, PROC_MAX, keep="head").strip()
    return None


def _level_quota(directory: str) -> tuple[float, str] | None:
    """(CPUs allowed, as the files say) of one cgroup level; None without a limit there."""
    both = _read(os.path.join(directory, "cpu.max"))
    if both is not None:
        words = both.split()
        if len(words) == 2 and words[0].isdigit() and words[1].isdigit() and int(words[1]) > 0:
            return int(words[0]) / int(words[1]), f"cpu.max {both}"
        return None
    quota, period = _read(os.path.join(directory, "cpu.cfs_quota_us")), _read(os.path.join(directory, "cpu.cfs_period_us"))
    if quota and period and quota.isdigit() and period.isdigit() and int(period) > 0:
        return int(quota) / int(period), f"cpu.cfs_quota_us {quota} per cpu.cfs_period_us {period}"
    return None


def cpu_quota() -> dict[str, Any] | None:
    """The tightest CPU quota of this process's cgroups: ``{"cpus": 0.3, "text": ..., "dir": ...}``;
    None without one (or where the cgroup files cannot be read)."""
    best: dict[str, Any] | None = None
    for directory in _cpu_cgroup_dirs():
        level = _level_quota(directory)
        if level and (best is None or level[0] < best["cpus"]):
            best = {"cpus": round(level[0], 3), "text": level[1], "dir": directory}
    return best


def throttling(quota: dict[str, Any] | None) -> tuple[int, int] | None:
    """(periods, periods throttled) so far in the cgroup of ``quota``; None when it cannot be read."""
    if not quota:
        return None
    stat = {}
    for line in (_read(os.path.join(quota["dir"], "cpu.stat")) or "").splitlines():
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            stat[key] = int(value)
    if "nr_periods" not in stat or "nr_throttled" not in stat:
        return None
    return stat["nr_periods"], stat["nr_throttled"]


def sched_seconds() -> tuple[float, float] | None:
    """(seconds run on a CPU, seconds waited runnable for one) of the calling thread so far, from
    /proc/thread-self/schedstat (https://docs.kernel.org/scheduler/sched-stats.html). Time throttled
    by a CFS quota counts as waiting; time stopped (SIGSTOP) counts as neither. None where the
    kernel does not keep them."""
    for path in ("/proc/thread-self/schedstat", "/proc/self/schedstat"):
        words = (_read(path) or "").split()
        if len(words) >= 2 and words[0].isdigit() and words[1].isdigit():
            return int(words[0]) / 1e9, int(words[1]) / 1e9
    return None
