#!/usr/bin/env python3
"""sitestack validation check: prove a PyTorch distributed stack works on this site, and how fast.

Run one process per rank under any launcher (srun, torchrun, mpiexec from MPICH / Intel MPI /
Open MPI, horovodrun). Every rank runs the checks; rank 0 writes ``result.json``,
``summary.md`` and ``bandwidth.png`` into ``--out`` and every rank exits 0 only when every
check passed (a check that does not apply is ``skipped`` with its reason, which does not fail
the run).

Checks, in order:

1. ``environment``: ranks found under the launcher, world size as the job expects, versions
   (torch, NCCL/RCCL, MPI) the same on every rank and as the site facts say, device per rank.
2. ``process-group``: ``init_process_group`` with the backend for the device (nccl on CUDA
   and ROCm, xccl or ccl on Intel XPU, gloo on CPU); a taken port or a missing rank is named.
3. ``affinity``: each rank's CPU set is what the site intended (the masks or the cores of the
   NUMA domain closest to its GPU), and ranks are not all pinned to one core.
4. ``collectives``: allreduce, allgather and broadcast give exactly the right values.
5. ``ddp``: every rank builds the same initial model; a few DDP steps on synthetic data
   lower the loss; parameters are identical on every rank afterwards.
6. ``checkpoint``: save, resume into a fresh model: the same state, and the same parameters
   after further steps.
7. ``bandwidth``: allreduce sweep; algbw = bytes / time and busbw = algbw * 2(n-1)/n, as
   nccl-tests defines them; compared with the site's reference.
8. ``net-plugin``: with NCCL_DEBUG=INFO logs, every host used the network the site expects
   between nodes (``nccl_log.py``: OFI with its provider, IB, IBext); a socket fallback, a missing
   or failed plugin, a wrong provider or plugin fails with its cause.
9. ``mpi-probe``: the site-built C MPI probe's latency/bandwidth and library.
10. ``mpi4py``: mpi4py sees the same ranks, the right MPI library, a correct allreduce.
11. ``horovod``: an allreduce through Horovod where Horovod is part of the stack.

The program needs torch; mpi4py, Horovod and matplotlib are used when present. It needs
nothing of sitestack: it is installed on the site beside ``ddp_report.py`` and runs in the
site's Python (a container, a conda env, a venv).

Fault injection, for testing this program: ``SITESTACK_CHECK_FAULT=seed@R`` makes rank R build
its model from another seed; ``allreduce@R`` makes rank R contribute a wrong value.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import glob
import hashlib
import itertools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

try:  # imported as part of sitestack (tests, the controller)
    from . import ddp_report, nccl_log
except ImportError:  # run as a script on the site (or from the repository), beside ddp_report.py and nccl_log.py
    import ddp_report  # type: ignore[no-redef, import-not-found, unused-ignore]
    import nccl_log  # type: ignore[no-redef, import-not-found, unused-ignore]

SCHEMA = 1
CHECKS = ("environment", "process-group", "affinity", "collectives", "ddp", "checkpoint", "bandwidth",
          "net-plugin", "mpi-probe", "mpi4py", "horovod")
PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"


# --------------------------------------------------------------------------------------------
# Ranks under every launcher
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RankInfo:
    """Who this process is, and which launcher variables said so."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int | None
    launcher: str
    source: str  # the variables rank and world size came from


def _int(env: dict[str, str], name: str) -> int | None:
    value = env.get(name)
    if value is None or not value.strip():
        return None
    try:
        return int(value.strip())
    except ValueError:
        raise ValueError(f"{name}={value!r} is not an integer") from None


def discover_rank(env: dict[str, str] | None = None) -> RankInfo:
    """Rank, world size and local rank from the launcher's environment.

    The order matters: a launcher started inside a Slurm job inherits the job's
    ``SLURM_PROCID=0`` and ``SLURM_NTASKS``, and an MPICH Hydra ``mpiexec`` starts its proxies
    through ``srun``, so the launcher's own variables win over Slurm's.
    """
    env = dict(os.environ if env is None else env)

    def pick(launcher: str, rank: str, size: str, local: str | None, local_size: str | None) -> RankInfo | None:
        r, n = _int(env, rank), _int(env, size)
        if r is None or n is None:
            return None
        lr = _int(env, local) if local else None
        ln = _int(env, local_size) if local_size else None
        if lr is None:
            lr = r if n == 1 else _local_from_slurm(env, r)
        return RankInfo(r, n, lr, ln, launcher, f"{rank}/{size}")

    if env.get("TORCHELASTIC_RUN_ID") is not None or env.get("TORCHELASTIC_RESTART_COUNT") is not None:
        found = pick("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
        if found:
            return found
    found = pick("horovodrun", "HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE")
    if found:
        return found
    found = pick("mpirun (Open MPI)", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                 "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE")
    if found:
        return found
    if "PMI_RANK" in env and "MPI_LOCALRANKID" in env:  # MPICH / Intel MPI Hydra
        found = pick("mpiexec (Hydra)", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")
        if found:
            return found
    if "PALS_RANKID" in env:  # HPE Cray PALS mpiexec
        found = pick("mpiexec (PALS)", "PALS_RANKID", "PMI_SIZE", "PALS_LOCAL_RANKID", None)
        if found:
            return found
    if env.get("SLURM_STEP_ID") is not None and "SLURM_PROCID" in env:
        size = "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in env else "SLURM_NTASKS"
        found = pick("srun", "SLURM_PROCID", size, "SLURM_LOCALID", None)
        if found:
            tpn = _tasks_on_this_node(env)
            return RankInfo(found.rank, found.world_size, found.local_rank, tpn, "srun", found.source)
    if "PMI_RANK" in env:  # a PMI launcher without Hydra's local variables
        found = pick("mpiexec (PMI)", "PMI_RANK", "PMI_SIZE", None, None)
        if found:
            return found
    found = pick("env", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    if found:
        return found
    return RankInfo(0, 1, 0, 1, "none", "single process (no launcher variables)")


def _local_from_slurm(env: dict[str, str], rank: int) -> int:
    local = _int(env, "SLURM_LOCALID")
    return local if local is not None else 0


def _tasks_on_this_node(env: dict[str, str]) -> int | None:
    """SLURM_STEP_TASKS_PER_NODE ('4(x2),3') for this node (SLURM_NODEID)."""
    text = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    node = _int(env, "SLURM_NODEID") or 0
    if not text:
        return None
    counts: list[int] = []
    for part in text.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not match:
            return None
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts[node] if node < len(counts) else None


# --------------------------------------------------------------------------------------------
# Device and backend
# --------------------------------------------------------------------------------------------

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
                if head.isdigit():
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


# --------------------------------------------------------------------------------------------
# CPU affinity
# --------------------------------------------------------------------------------------------

def parse_mask(text: str) -> set[int]:
    """The CPUs of one hex mask (``0xfe``, ``fe``, or Linux's comma-grouped ``00ff,fe000000``)."""
    digits = text.strip().lower().removeprefix("0x").replace(",", "")
    if not digits or any(c not in "0123456789abcdef" for c in digits):
        raise ValueError(f"not a hex CPU mask: {text!r}")
    value = int(digits, 16)
    return {bit for bit in range(value.bit_length()) if value >> bit & 1}


def parse_masks(text: str) -> list[set[int]]:
    """The CPU sets of a ``mask_cpu`` list, one per local rank (``0xfe,0xfe00``)."""
    return [parse_mask(part) for part in text.split(",") if part.strip()]


def cpu_list(cpus: Iterable[int]) -> str:
    """``{1, 2, 3, 5}`` -> ``1-3,5`` (the format of taskset -c); ``(none)`` for no CPUs."""
    return ddp_report.cpu_list(cpus, empty="(none)")


def expected_cpus(rank: dict[str, Any], config: dict[str, Any], masks: list[set[int]] | None) -> tuple[set[int] | None, str]:
    """The CPUs this rank should have and why; None when the site states no binding."""
    local = rank["local_rank"]
    if masks is not None:
        if local >= len(masks):
            return set(), f"--cpu-masks lists {len(masks)} masks, local rank {local} has none"
        return masks[local], "the job's mask_cpu list"
    bind = config.get("cpu_bind")
    if bind:
        gpu = rank.get("physical_gpu")
        if gpu is None:
            gpu = local
        gpu_cpus = bind["gpu_cpus"]
        if gpu >= len(gpu_cpus):
            return set(), f"GPU {gpu} is not in the site's GPU->NUMA map ({len(gpu_cpus)} GPUs)"
        return set(gpu_cpus[gpu]), f"the usable cores closest to GPU {gpu} (gpu.cpu_bind)"
    return None, "the site states no CPU binding (gpu.cpu_bind)"


def judge_affinity(ranks: list[dict[str, Any]], config: dict[str, Any], masks: list[set[int]] | None) -> tuple[str, str, list[str]]:
    """(status, summary, per-rank lines) for the affinity check."""
    bind = config.get("cpu_bind") or {}
    node_cores = bind.get("node_cores")
    problems, lines, checked = [], [], 0
    for rank in ranks:
        have = set(rank["affinity"])
        want, why = expected_cpus(rank, config, masks)
        rank["expected_cpus"] = cpu_list(want) if want is not None else None
        if want is None:
            lines.append(f"rank {rank['rank']} on {rank['host']}: CPUs {cpu_list(have)}")
            continue
        checked += 1
        folded = {c % node_cores for c in have} if node_cores and masks is None else have
        ok = folded == want if masks is None else have == want
        lines.append(f"rank {rank['rank']} on {rank['host']}: CPUs {cpu_list(have)}, expected {cpu_list(want)} ({why})")
        if not ok:
            problems.append(f"rank {rank['rank']} on {rank['host']} runs on CPUs {cpu_list(have)}, "
                            f"expected {cpu_list(want)} ({why})")
    by_host: dict[str, list[dict[str, Any]]] = {}
    for rank in ranks:
        by_host.setdefault(rank["host"], []).append(rank)
    for host, members in by_host.items():
        sets = {tuple(sorted(r["affinity"])) for r in members}
        if len(members) > 1 and len(sets) == 1 and len(next(iter(sets))) == 1:
            problems.append(f"all {len(members)} ranks on {host} are pinned to the same CPU {next(iter(sets))[0]} "
                            "(the torchrun pitfall OLCF describes: launch with srun, one task per GPU)")
    if problems:
        return FAILED, problems[0] + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""), lines
    if checked:
        return PASSED, f"all {checked} ranks run on the CPUs the site intended", lines
    return PASSED, "not compared: the site states no CPU binding; ranks are not all pinned to one CPU", lines


# --------------------------------------------------------------------------------------------
# NCCL / RCCL logs: which network did each host use? (read by nccl_log.py, shipped beside this file)
# --------------------------------------------------------------------------------------------

def judge_net_plugin(log_text: str, *, hosts: int, plugin: str | None, provider: str | None,
                     transport: str | None = None) -> tuple[str, str, list[str]]:
    """(status, summary, evidence) from NCCL_DEBUG=INFO output of a run on ``hosts`` nodes.

    ``nccl_log`` names the network each host used and, against the site's expectation
    (``transport``: ofi, ib, ibext, socket or None; default ofi where a ``plugin`` is expected),
    the cause when it is not that one. The job writes the logs itself, so a host without
    evidence fails. One node uses no network between nodes: skipped. A TCP socket fallback
    fails whether or not the site names a network.
    """
    lines, version = nccl_log.parse(log_text)
    reports = nccl_log.classify(lines)
    evidence = [e for r in reports for e in r.evidence[:3]]
    nodes = max(hosts, len([r for r in reports if r.host != nccl_log.NO_HOST]))
    if nodes < 2:
        seen = f"; the log shows {nccl_log.summary(reports)}" if reports else ""
        return SKIPPED, f"single-node run: the network plugin is only used between nodes{seen}", evidence
    expect = nccl_log.Expectation(transport or ("ofi" if plugin else None), provider, plugin, multi_node=True, strict=True)
    verdict = nccl_log.judge(reports, expect, version)
    sockets = any("socket" in r.transports for r in reports)
    status = FAILED if verdict.status == nccl_log.FAIL or (verdict.status == nccl_log.WARN and sockets) else PASSED
    notes = "".join(f" ({n})" for n in verdict.notes)
    return status, ("warning: " if verdict.status == nccl_log.WARN and status == PASSED else "") + verdict.cause + notes, evidence


# --------------------------------------------------------------------------------------------
# Bandwidth (nccl-tests definitions)
# --------------------------------------------------------------------------------------------

#: A rank this many times slower than the median of the others fails the ddp check: DDP runs at the
#: pace of its slowest rank. Healthy ranks sharing a busy node differ by well under 2x here; a rank
#: held to 10% of a CPU is ~10x slower.
SLOW_RANK_FACTOR = 3.0


def judge_balance(seconds: list[float], hosts: list[str] | None = None) -> str | None:
    """Why the ranks are out of balance (naming the slowest rank), or None."""
    if len(seconds) < 2:
        return None
    slowest = max(range(len(seconds)), key=lambda i: seconds[i])
    others = sorted(s for i, s in enumerate(seconds) if i != slowest)
    median = others[len(others) // 2]
    if median <= 0 or seconds[slowest] < SLOW_RANK_FACTOR * median:
        return None
    where = f" on {hosts[slowest]}" if hosts else ""
    return (f"slow rank: rank {slowest}{where} is {seconds[slowest] / median:.1f}x slower than the other ranks "
            f"(a fixed computation took {seconds[slowest]:.3g}s against a median of {median:.3g}s; limit "
            f"{SLOW_RANK_FACTOR:g}x): it is throttled or shares its CPU/GPU, and every DDP step waits for it")


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' busbw correction: allreduce 2(n-1)/n; allgather/reducescatter (n-1)/n; broadcast 1."""
    if n < 1:
        raise ValueError("n must be >= 1")
    if op == "allreduce":
        return 2 * (n - 1) / n
    if op in ("allgather", "reducescatter", "alltoall"):
        return (n - 1) / n
    if op in ("broadcast", "reduce"):
        return 1.0
    raise ValueError(f"unknown collective {op!r}")


def bandwidth_row(size_bytes: int, seconds: float, n: int, op: str = "allreduce") -> dict[str, float]:
    algbw = size_bytes / seconds / 1e9
    return {"bytes": size_bytes, "time_us": seconds * 1e6, "algbw_gbs": algbw, "busbw_gbs": algbw * bus_factor(op, n)}


def judge_bandwidth(rows: list[dict[str, float]], reference: dict[str, Any] | None, nodes: int) -> tuple[str, str, dict[str, Any] | None]:
    """Compare the sweep with the site's reference for this node count (ReFrame-style lower bound)."""
    if not rows:
        return FAILED, "no bandwidth measured", None
    peak = max(rows, key=lambda r: r["busbw_gbs"])
    kind = "multi-node" if nodes > 1 else "single-node"
    if not reference:
        return PASSED, (f"peak busbw {peak['busbw_gbs']:.3g} GB/s at {ddp_report.human_bytes(peak['bytes'])}; "
                        f"not judged: the site has no {kind} reference"), None
    target = reference["message_bytes"]
    row = next((r for r in rows if r["bytes"] == target), None)
    note = ""
    if row is None:
        row = max(rows, key=lambda r: r["bytes"])
        note = f" (the sweep's largest size; the reference is for {ddp_report.human_bytes(target)})"
    minimum = reference["busbw_gbs"] * (1 + reference.get("lower", -0.05))
    compared = {**reference, "minimum_gbs": minimum, "measured_gbs": row["busbw_gbs"], "at_bytes": row["bytes"], "kind": kind}
    where = f"at {ddp_report.human_bytes(row['bytes'])}{note}"
    if row["busbw_gbs"] < minimum:
        return FAILED, (f"busbw {row['busbw_gbs']:.3g} GB/s {where} is below {minimum:.3g} GB/s "
                        f"({kind} reference {reference['busbw_gbs']:.3g} GB/s {reference.get('lower', -0.05):+.0%}"
                        f"{'; ' + reference['source'] if reference.get('source') else ''})"), compared
    return PASSED, (f"busbw {row['busbw_gbs']:.3g} GB/s {where} >= {minimum:.3g} GB/s "
                    f"({kind} reference {reference['busbw_gbs']:.3g} GB/s)"), compared


def parse_size(text: str) -> int:
    match = re.fullmatch(r"\s*(\d+)\s*([kKmMgG]?)(?:i?[bB])?\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 4K, 64M)")
    return int(match.group(1)) * {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[match.group(2).lower()]


def sweep_sizes(lo: int, hi: int, factor: int) -> list[int]:
    sizes, size = [], max(4, lo)
    while size <= hi:
        sizes.append(size)
        size *= factor
    return sizes


# --------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------

@dataclass
class Check:
    name: str
    status: str = SKIPPED
    summary: str = "not run"
    details: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0


def verdict(checks: list[Check] | list[dict[str, Any]]) -> str:
    statuses = [c.status if isinstance(c, Check) else c["status"] for c in checks]
    return FAILED if FAILED in statuses or not statuses else PASSED


def exit_code(result: dict[str, Any]) -> int:
    """0 only when every check passed (or did not apply)."""
    return 0 if result.get("verdict") == PASSED else 1


#: The variables that decide how the collectives and the network plugin behave: recorded in the report.
RECORDED_PREFIXES = ("NCCL_", "RCCL_", "FI_", "CXI_", "GLOO_", "MIOPEN_", "HSA_", "OMP_NUM_THREADS", "MPICH_", "OMPI_MCA_")


def job_environment(env: dict[str, str], plugin: str | None) -> dict[str, Any]:
    """What the ranks ran with: the modules loaded (Lmod's and Environment Modules' LOADEDMODULES),
    the NCCL_*/FI_*/... settings, and the LD_LIBRARY_PATH entries of the network plugin."""
    words = tuple(w for w in (plugin, "ofi", "libfabric", "nccl-net", "rccl-net", "nccl_net") if w)
    paths = [p for p in env.get("LD_LIBRARY_PATH", "").split(":") if p and any(w in p.lower() for w in words)]
    return {"modules": [m for m in env.get("LOADEDMODULES", "").split(":") if m],
            "variables": {k: v for k, v in sorted(env.items()) if k.startswith(RECORDED_PREFIXES)},
            "plugin_library_path": paths}


def rank_fault(env: dict[str, str], kind: str, rank: int) -> bool:
    """Whether ``SITESTACK_CHECK_FAULT`` asks this rank for fault ``kind`` (``seed@1,allreduce@0``)."""
    for item in (env.get("SITESTACK_CHECK_FAULT") or "").split(","):
        name, _, target = item.strip().partition("@")
        if name == kind and target.strip().isdigit() and int(target) == rank:
            return True
    return False


# --------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------

class Run:
    """One rank's run of every check."""

    def __init__(self, args: argparse.Namespace, config: dict[str, Any], info: RankInfo, mpi: Any) -> None:
        self.args, self.config, self.info, self.mpi = args, config, info, mpi
        self.env = dict(os.environ)
        self.checks = {name: Check(name) for name in CHECKS}
        self.start = time.time()
        self.host = socket.gethostname().split(".")[0]
        self.torch: Any = None
        self.dist: Any = None
        self.device: Device | None = None  # chosen by the environment check, which runs first
        self.ranks: list[dict[str, Any]] = []
        self.bandwidth: dict[str, Any] = {}
        self.mpi_data: dict[str, Any] = {}
        self.pg_ok = False
        self.result: dict[str, Any] | None = None
        self.progress: Progress | None = None  # OUT/ranks/rank-R.json, read by the watchdogs

    # -- helpers ------------------------------------------------------------------------------
    def log(self, text: str) -> None:
        print(f"[rank {self.info.rank}/{self.info.world_size} {self.host}] {text}", flush=True)

    def set(self, name: str, status: str, summary: str, **details: Any) -> None:
        check = self.checks[name]
        check.status, check.summary = status, summary
        check.details.update(details)

    def enter(self, phase: str) -> None:
        """Record the phase for the watchdogs (rank 0 also its checks so far: a watchdog that ends
        the run reports them)."""
        if self.progress is not None:
            checks = [asdict(c) for c in self.checks.values()] if self.info.rank == 0 else None
            self.progress.enter(phase, checks)

    def note(self, detail: str, tick: int) -> None:
        """Where in the current phase this rank is (``tick`` orders it): a hang names the rank behind."""
        if self.progress is not None:
            self.progress.data.update(detail=detail, tick=tick)
            self.progress.save()

    @contextlib.contextmanager
    def timed(self, name: str) -> Iterator[None]:
        self.enter(name)
        start = time.perf_counter()
        try:
            yield
        except Exception as exc:  # a check that crashes fails with its error, the run goes on
            self.set(name, FAILED, f"{type(exc).__name__}: {exc}".splitlines()[0][:400],
                     traceback=traceback.format_exc(limit=6))
        finally:
            # a check may run in parts (environment: before and after the process group): time them all
            self.checks[name].seconds = round(self.checks[name].seconds + time.perf_counter() - start, 3)

    def skip_rest(self, reason: str, after: str) -> None:
        later = CHECKS[CHECKS.index(after) + 1:]
        for name in later:
            if self.checks[name].summary == "not run" and name not in ("mpi-probe", "mpi4py", "horovod"):
                self.set(name, SKIPPED, reason)

    def all_gather(self, obj: Any) -> list[Any]:
        if self.info.world_size == 1 or not self.pg_ok:
            return [obj]
        out: list[Any] = [None] * self.info.world_size
        self.dist.all_gather_object(out, obj)
        return out

    def sync(self) -> None:
        if self.device and self.device.kind == "cuda":
            self.torch.cuda.synchronize()
        elif self.device and self.device.kind == "xpu":
            self.torch.xpu.synchronize()

    # -- 1. environment ----------------------------------------------------------------------
    def environment(self) -> None:
        import torch  # type: ignore[import-not-found, unused-ignore]
        import torch.distributed as dist  # type: ignore[import-not-found, unused-ignore]

        self.torch, self.dist = torch, dist
        self.device = select_device(torch, self.info.local_rank, self.info.local_world_size, self.env,
                                    force_cpu=self.args.device == "cpu")
        if self.device.kind == "cuda" and self.device.index is not None:
            torch.cuda.set_device(self.device.index)
        elif self.device.kind == "xpu" and self.device.index is not None:
            torch.xpu.set_device(self.device.index)
        nccl = None
        if self.device.kind == "cuda":
            with contextlib.suppress(Exception):
                version = torch.cuda.nccl.version()
                nccl = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
        try:
            affinity = sorted(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            affinity = []
        if self.device.kind == "cpu" and not self.env.get("OMP_NUM_THREADS"):
            # CPU ranks share the node's cores: one torch thread pool per core, not per rank
            share = len(affinity) // max(1, self.info.local_world_size or 1) if affinity else 1
            torch.set_num_threads(max(1, share))
        device_name = None
        if self.device.kind == "cuda" and self.device.index is not None:
            with contextlib.suppress(Exception):
                device_name = torch.cuda.get_device_name(self.device.index)
        me = {
            "rank": self.info.rank, "local_rank": self.info.local_rank, "world_size": self.info.world_size,
            "local_world_size": self.info.local_world_size, "launcher": self.info.launcher,
            "source": self.info.source, "host": self.host, "pid": os.getpid(),
            "python": sys.version.split()[0], "torch": torch.__version__,
            "hip": getattr(torch.version, "hip", None), "cuda": getattr(torch.version, "cuda", None),
            "nccl": nccl, "device": self.device.name, "device_name": device_name,
            "device_count": self.device.count, "physical_gpu": self.device.physical,
            "backend": self.device.backend, "library": self.device.library,
            "affinity": affinity, "mpi_library": self.mpi_data.get("library_short"),
            "visible": {v: self.env[v] for v in VISIBLE_VARS if v in self.env},
            "master": f"{self.env.get('MASTER_ADDR', '?')}:{self.env.get('MASTER_PORT', '?')}",
            "fault": self.env.get("SITESTACK_CHECK_FAULT") or None,
            "setting": job_environment(self.env, (self.config.get("network") or {}).get("net_plugin")),
        }
        self.me = me
        if self.progress is not None:  # a result a watchdog writes later names them (fault_result)
            self.progress.data.update(backend=self.device.backend, device=self.device.name, torch=torch.__version__)
            self.progress.save()
        self.log(f"launcher {self.info.launcher} ({self.info.source}), local rank {self.info.local_rank}, "
                 f"device {self.device.name} ({self.device.library}), CPUs {cpu_list(affinity)}, torch {torch.__version__}")
        problems = []
        expected = self.args.expect_world_size
        if expected and expected != self.info.world_size:
            problems.append(f"the job expects {expected} ranks but the launcher ({self.info.launcher}, "
                            f"{self.info.source}) says world size {self.info.world_size}")
        if not 0 <= self.info.rank < self.info.world_size:
            problems.append(f"rank {self.info.rank} is outside world size {self.info.world_size}")
        if self.device.problem:
            problems.append(self.device.problem)
        want_torch = self.config.get("torch_version")
        if want_torch and torch.__version__.split("+")[0] != want_torch:
            problems.append(f"torch {torch.__version__} here, the site facts say {want_torch}")
        if self.config.get("gpu_vendor") not in (None, "none") and self.device.kind == "cpu" and self.args.device != "cpu":
            problems.append(f"the site has {self.config['gpu_vendor']} GPUs but torch sees none on {self.host}")
        self.pre_problems = problems
        if problems:
            self.set("environment", FAILED, problems[0], problems=problems)
        else:  # what this rank alone can tell; the comparison across ranks needs the process group
            self.set("environment", PASSED, f"rank {self.info.rank} of {self.info.world_size} under "
                     f"{self.info.launcher}, {self.device.name} with {self.device.backend}, torch {torch.__version__} "
                     "(not compared across ranks: the process group did not start)")

    def environment_after(self) -> None:
        """With every rank's report: ranks unique, world consistent, versions equal."""
        ranks = self.ranks
        problems = list(self.checks["environment"].details.get("problems", []))
        for r in ranks:
            if r["rank"] != self.info.rank and r.get("problems"):
                problems.extend(f"rank {r['rank']}: {p}" for p in r["problems"])
        seen = sorted(r["rank"] for r in ranks)
        if seen != list(range(len(ranks))):
            problems.append(f"ranks are not 0..{len(ranks) - 1}: {seen}")
        sizes = sorted({r["world_size"] for r in ranks})
        if sizes != [len(ranks)]:
            problems.append(f"ranks disagree on the world size: {sizes} for {len(ranks)} ranks")
        by_host: dict[str, list[int]] = {}
        for r in ranks:
            by_host.setdefault(r["host"], []).append(r["local_rank"])
        for host, locals_ in by_host.items():
            if len(set(locals_)) != len(locals_):
                problems.append(f"duplicate local ranks on {host}: {sorted(locals_)}")
            if self.device and self.device.kind != "cpu":
                devices = [r["physical_gpu"] for r in ranks if r["host"] == host]
                if len(set(devices)) != len(devices):
                    problems.append(f"ranks on {host} share GPUs: {devices}")
        for key in ("torch", "nccl", "hip", "cuda", "python", "backend", "mpi_library"):
            values = sorted({str(r.get(key)) for r in ranks})
            if len(values) > 1:
                problems.append(f"ranks run different {key} versions: {', '.join(values)}")
        master = self.env.get("MASTER_ADDR")
        nodelist = self.env.get("SLURM_JOB_NODELIST")
        if master and nodelist and self.info.launcher != "torchrun":
            with contextlib.suppress(ValueError):
                first_node = first_host(nodelist)
                if first_node != master and first_node.split(".")[0] != master.split(".")[0]:
                    problems.append(f"MASTER_ADDR is {master}, but the first host of {nodelist} is {first_node}")
        first = ranks[0]
        versions = [f"torch {first['torch']}"]
        if first.get("nccl"):
            versions.append(f"{first['library']} {first['nccl']}")
        if first.get("mpi_library"):
            versions.append(first["mpi_library"])
        hosts = sorted(by_host)
        summary = (f"{len(ranks)} ranks on {len(hosts)} node{'s' if len(hosts) != 1 else ''} under "
                   f"{first['launcher']}, {first['device'].split(':')[0]} with {first['backend']}; {', '.join(versions)}")
        details = {"hosts": hosts, "versions": versions}
        if problems:
            self.set("environment", FAILED, problems[0] + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""),
                     problems=problems, **details)
        else:
            self.set("environment", PASSED, summary, **details)

    # -- 2. process group ----------------------------------------------------------------------
    def process_group(self) -> bool:
        from datetime import timedelta

        env = self.env
        agent_store = env.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        addr = env.get("MASTER_ADDR")
        port = env.get("MASTER_PORT")
        if self.info.world_size == 1 and (not addr or not port):
            # One rank started without a launcher (python ddp_check.py on one GPU): a process group
            # of one still initialises the backend (NCCL, XCCL, gloo) and runs every collective.
            addr, port = "127.0.0.1", str(free_port())
            os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = addr, port
        if not addr or not port:
            self.set("process-group", FAILED, "MASTER_ADDR and MASTER_PORT are not set: the batch script sets them "
                     "from the first host of the node list and the job id")
            return False
        if self.info.rank == 0 and not agent_store:
            busy = port_in_use(int(port))
            if busy:
                self.set("process-group", FAILED, f"MASTER_PORT {port} is already in use on {self.host} ({busy}): "
                         "another job or process holds it; the job derives the port from SLURM_JOB_ID, so a clash "
                         "means a stray process or a fixed port elsewhere")
                return False
        timeout = timedelta(seconds=self.args.init_timeout)
        kwargs: dict[str, Any] = {"backend": self.dev.backend, "init_method": "env://", "rank": self.info.rank,
                                  "world_size": self.info.world_size, "timeout": timeout}
        if self.dev.kind == "cuda" and self.dev.index is not None:
            kwargs["device_id"] = self.torch.device("cuda", self.dev.index)
        start = time.perf_counter()
        # the store's own timeout does not cover a port held by a process that accepts and never answers
        stuck = threading.Timer(self.args.init_timeout + 15, self.on_stuck_init, args=(addr, port))
        stuck.daemon = True
        stuck.start()
        try:
            try:
                self.dist.init_process_group(**kwargs)
            except TypeError:  # torch without device_id
                kwargs.pop("device_id", None)
                self.dist.init_process_group(**kwargs)
        except Exception as exc:  # noqa: BLE001  (every failure becomes a reason)
            self.set("process-group", FAILED, explain_init_failure(exc, addr, port, self.info, self.args.init_timeout),
                     error=str(exc)[:2000])
            return False
        finally:
            stuck.cancel()
        self.pg_ok = True
        self.set("process-group", PASSED, f"{self.dev.backend} process group of {self.info.world_size} ranks via "
                 f"{'torchrun rendezvous' if agent_store else f'{addr}:{port}'} in {time.perf_counter() - start:.2f}s")
        return True

    # -- 4. collectives ------------------------------------------------------------------------
    def collectives(self) -> None:
        torch, dist, n, rank = self.torch, self.dist, self.info.world_size, self.info.rank
        dev = self.torch_device()
        errors = []
        value = float(rank + 1) + (1.0 if rank_fault(self.env, "allreduce", rank) else 0.0)
        t = torch.full((4096,), value, dtype=torch.float32, device=dev)
        dist.all_reduce(t)
        want = n * (n + 1) / 2
        got = t.cpu()
        if not bool((got == want).all()):
            wrong = got[got != want]
            errors.append(f"allreduce(sum) gave {float(wrong[0]):g}, expected {want:g} on {int(wrong.numel())} of {got.numel()} elements")
        chunk = torch.arange(8, dtype=torch.float32, device=dev) + 8 * rank
        parts = [torch.empty_like(chunk) for _ in range(n)]
        dist.all_gather(parts, chunk)
        gathered = torch.cat([p.cpu() for p in parts])
        if not torch.equal(gathered, torch.arange(8 * n, dtype=torch.float32)):
            errors.append(f"allgather gave {gathered[:16].tolist()}..., expected 0..{8 * n - 1}")
        root = n - 1
        b = torch.full((1024,), 42.0 + root if rank == root else -1.0, device=dev)
        dist.broadcast(b, src=root)
        if not bool((b.cpu() == 42.0 + root).all()):
            errors.append(f"broadcast from rank {root} gave {float(b.cpu()[0]):g}, expected {42.0 + root:g}")
        reports = self.all_gather(errors)
        bad = [(i, e) for i, errs in enumerate(reports) for e in errs]
        if bad:
            ranks = sorted({i for i, _ in bad})
            self.set("collectives", FAILED, f"{bad[0][1]} (wrong on rank{'s' if len(ranks) > 1 else ''} "
                     f"{', '.join(map(str, ranks))})", errors=[f"rank {i}: {e}" for i, e in bad])
        else:
            self.set("collectives", PASSED, f"allreduce, allgather and broadcast exact on all {n} ranks")

    @property
    def dev(self) -> Device:
        """The device the environment check chose (every later check runs after it)."""
        if self.device is None:
            raise RuntimeError("no device: the environment check has not run")
        return self.device

    def torch_device(self) -> Any:
        """This rank's ``torch.device``."""
        return self.torch.device(self.dev.kind, self.dev.index) if self.dev.index is not None else self.torch.device("cpu")

    # -- 5. DDP and 6. checkpoint ----------------------------------------------------------------
    def _model(self, seed: int) -> Any:
        torch = self.torch
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
        return model.to(self.torch_device())

    def _fingerprint(self, module: Any) -> str:
        digest = hashlib.sha256()
        for tensor in module.state_dict().values():
            digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
        return digest.hexdigest()[:16]

    def _batches(self, steps: int) -> list[tuple[Any, Any]]:
        torch = self.torch
        gen = torch.Generator().manual_seed(7)
        w_true = torch.randn(32, 1, generator=gen)
        data = torch.Generator().manual_seed(1000 + self.info.rank)
        dev = self.torch_device()
        out = []
        for _ in range(steps):
            x = torch.randn(64, 32, generator=data)
            y = torch.tanh(x @ w_true / 4) + 0.01 * torch.randn(64, 1, generator=data)
            out.append((x.to(dev), y.to(dev)))
        return out

    def _compute_seconds(self) -> float:
        """This rank's time for a fixed piece of work (the median of 5 repeats of 96 matrix products,
        each ~25 ms of CPU: longer than a CFS quota period's share, so a throttled rank cannot hide in
        one). The ranks of a node take turns (all nodes at once), so ranks that share cores by
        design (more ranks than cores) do not slow each other; a rank throttled, or sharing its
        CPU/GPU with something else, takes longer, and holds back every DDP step."""
        torch = self.torch
        a = torch.randn(192, 192, device=self.torch_device()) / 14
        per_node: dict[str, int] = {}
        for r in self.ranks:
            per_node[r["host"]] = per_node.get(r["host"], 0) + 1
        mine = 0.0
        for turn in range(max(per_node.values(), default=1)):
            self.barrier()
            if turn != self.info.local_rank:
                continue
            times = []
            for _ in range(5):
                self.sync()
                start = time.perf_counter()
                b = a
                for _ in range(96):
                    b = torch.tanh(b @ a)
                self.sync()
                times.append(time.perf_counter() - start)
            mine = round(sorted(times)[len(times) // 2], 6)
        self.barrier()
        return mine

    def ddp(self) -> tuple[Any, Any, list[tuple[Any, Any]]]:
        torch, dist = self.torch, self.dist
        from torch.nn.parallel import DistributedDataParallel as DDP  # type: ignore[import-not-found, unused-ignore]

        seed = 1234 + (1 if rank_fault(self.env, "seed", self.info.rank) else 0)
        model = self._model(seed)
        prints = self.all_gather(self._fingerprint(model))
        differ = [i for i, p in enumerate(prints) if p != prints[0]]
        problems = []
        if differ:
            problems.append(f"rank{'s' if len(differ) > 1 else ''} {', '.join(map(str, differ))} built different initial "
                            f"parameters than rank 0 (fingerprint {prints[differ[0]]} vs {prints[0]}); DDP would silently "
                            "overwrite them: check that every node runs the same torch and code")
        compute = self.all_gather(self._compute_seconds())
        slow = judge_balance(compute, [r["host"] for r in self.ranks] if len(self.ranks) == len(compute) else None)
        if slow:
            problems.insert(0, slow)
            self.set("ddp", FAILED, slow, compute_seconds=compute)
            self.enter("ddp")  # a watchdog that ends the (slow) run reports it
        ids = [self.dev.index] if self.dev.kind != "cpu" and self.dev.index is not None else None
        ddp_model = DDP(model, device_ids=ids) if self.info.world_size > 1 else model
        optim = torch.optim.SGD(ddp_model.parameters(), lr=0.1, momentum=0.9)
        batches = self._batches(self.args.steps + 2)
        losses = []
        for step, (x, y) in enumerate(batches[: self.args.steps], 1):
            self.note(f"step {step} forward", 2 * step)
            optim.zero_grad()
            loss = torch.nn.functional.mse_loss(ddp_model(x), y)
            self.note(f"step {step} backward", 2 * step + 1)
            loss.backward()
            optim.step()
            mean = loss.detach().clone()
            if self.info.world_size > 1:
                dist.all_reduce(mean)
                mean /= self.info.world_size
            losses.append(float(mean.cpu()))
        after = self.all_gather(self._fingerprint(model))
        differ_after = [i for i, p in enumerate(after) if p != after[0]]
        if differ_after:
            problems.append(f"parameters differ across ranks after {self.args.steps} DDP steps (ranks "
                            f"{', '.join(map(str, differ_after))} vs rank 0): gradients were not averaged")
        decreased = len(losses) >= 2 and losses[-1] < 0.9 * losses[0]
        if not decreased:
            problems.append(f"loss did not decrease: {losses[0]:.4g} -> {losses[-1]:.4g} over {len(losses)} steps")
        details = {"losses": losses, "initial_fingerprints": prints, "final_fingerprint": after[0],
                   "compute_seconds": compute}
        if problems:
            self.set("ddp", FAILED, problems[0], problems=problems, **details)
        else:
            self.set("ddp", PASSED, f"loss {losses[0]:.4g} -> {losses[-1]:.4g} in {len(losses)} steps; parameters "
                     f"identical on all {self.info.world_size} ranks ({after[0]})", **details)
        return ddp_model, optim, batches[self.args.steps:]

    def checkpoint(self, ddp_model: Any, optim: Any, more: list[tuple[Any, Any]]) -> None:
        torch = self.torch
        from torch.nn.parallel import DistributedDataParallel as DDP  # type: ignore[import-not-found, unused-ignore]

        model = ddp_model.module if hasattr(ddp_model, "module") else ddp_model
        directory = os.path.join(self.args.out, "checkpoint")
        path = os.path.join(directory, "ddp.pt")
        if self.info.rank == 0:
            os.makedirs(directory, exist_ok=True)
            torch.save({"model": model.state_dict(), "optim": optim.state_dict()}, path + ".tmp")
            os.replace(path + ".tmp", path)
        self.barrier()
        state = torch.load(path, map_location=self.torch_device(), weights_only=True)
        fresh = self._model(99)
        fresh.load_state_dict(state["model"])
        fresh_ddp = DDP(fresh, device_ids=[self.dev.index] if self.dev.kind != "cpu" and self.dev.index is not None else None) \
            if self.info.world_size > 1 else fresh
        fresh_optim = torch.optim.SGD(fresh_ddp.parameters(), lr=0.1, momentum=0.9)
        fresh_optim.load_state_dict(state["optim"])
        problems = []
        if self._fingerprint(fresh) != self._fingerprint(model):
            problems.append("the resumed model differs from the saved one")
        for a, b in zip(optim.state_dict()["state"].values(), fresh_optim.state_dict()["state"].values()):
            if not torch.equal(a["momentum_buffer"].cpu(), b["momentum_buffer"].cpu()):
                problems.append("the resumed optimizer state (momentum) differs from the saved one")
                break
        for net, opt in ((ddp_model, optim), (fresh_ddp, fresh_optim)):
            for x, y in more:
                opt.zero_grad()
                torch.nn.functional.mse_loss(net(x), y).backward()
                opt.step()
        for p, q in zip(model.parameters(), fresh.parameters()):
            # the state right after loading is compared exactly (above); two DDP instances may sum
            # gradients in another order, so the next steps agree to rounding only
            same = torch.allclose(p, q, rtol=1e-5, atol=1e-6)
            if not same:
                problems.append(f"after {len(more)} more steps the resumed run diverges from the original "
                                f"(max difference {float((p - q).abs().max()):.3g})")
                break
        reports = self.all_gather(problems)
        bad = [(i, p) for i, ps in enumerate(reports) for p in ps]
        self.barrier()
        if self.info.rank == 0:
            with contextlib.suppress(OSError):
                os.remove(path)
                os.rmdir(directory)
        if bad:
            self.set("checkpoint", FAILED, f"rank {bad[0][0]}: {bad[0][1]}", problems=[f"rank {i}: {p}" for i, p in bad])
        else:
            self.set("checkpoint", PASSED, f"saved and resumed: same parameters and optimizer state, and the same "
                     f"parameters after {len(more)} more steps on all ranks")

    def barrier(self) -> None:
        if self.pg_ok and self.info.world_size > 1:
            self.dist.barrier()

    # -- 7. bandwidth ------------------------------------------------------------------------------
    def bandwidth_sweep(self) -> None:
        torch, dist, n = self.torch, self.dist, self.info.world_size
        if n < 2:
            self.set("bandwidth", SKIPPED, "a single rank: nothing to measure")
            return
        gpu = self.dev.kind != "cpu"
        lo, hi = self.args.min_bytes, self.args.max_bytes
        refs = self.config.get("bandwidth") or {}
        if hi is None:
            hi = 256 << 20 if gpu else 4 << 20
            hi = max([hi] + [r["message_bytes"] for r in refs.values() if r])
        if lo is None:
            lo = 8 if gpu else 4 << 10
        iters = self.args.iters or (20 if gpu else 5)
        warmup = self.args.warmup if self.args.warmup is not None else (5 if gpu else 2)
        dev = self.torch_device()
        rows = []
        for size in sweep_sizes(lo, hi, self.args.factor):
            t = torch.zeros(size // 4, dtype=torch.float32, device=dev)
            for _ in range(warmup):
                dist.all_reduce(t)
            self.sync()
            dist.barrier()
            start = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(t)
            self.sync()
            elapsed = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64, device=dev)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank sets the time, as for a job
            rows.append(bandwidth_row(size, float(elapsed.cpu()), n))
            del t
        nodes = len({r["host"] for r in self.ranks})
        reference = refs.get("multi_node" if nodes > 1 else "single_node")
        status, summary, compared = judge_bandwidth(rows, reference, nodes)
        self.bandwidth = {"op": "allreduce", "dtype": "float32", "ranks": n, "nodes": nodes, "iters": iters,
                          "warmup": warmup, "rows": rows, "reference": compared,
                          "definition": "algbw = bytes / time; busbw = algbw * 2(n-1)/n (nccl-tests)"}
        self.set("bandwidth", status, summary, peak_busbw_gbs=max(r["busbw_gbs"] for r in rows))

    # -- 8. net plugin -----------------------------------------------------------------------------
    def net_plugin(self) -> None:
        pattern = self.args.nccl_log or os.path.join(self.args.out, "nccl", "*.log")
        files = sorted(glob.glob(pattern))
        text = ""
        for path in files:
            with contextlib.suppress(OSError), open(path, encoding="utf-8", errors="replace") as handle:
                text += handle.read()
        hosts = len({r["host"] for r in self.ranks}) if self.ranks else 1
        net = self.config.get("network") or {}
        if self.dev.backend != "nccl" and not self.args.nccl_log:
            self.set("net-plugin", SKIPPED, f"backend {self.dev.backend} does not use NCCL/RCCL network plugins")
            return
        expect = net.get("nccl_expect") or {}
        status, summary, evidence = judge_net_plugin(text, hosts=hosts, plugin=expect.get("plugin", net.get("net_plugin")),
                                                     provider=expect.get("provider", net.get("libfabric_provider")),
                                                     transport=expect.get("transport"))
        self.set("net-plugin", status, summary, evidence=evidence, logs=[os.path.relpath(f, self.args.out) for f in files])

    # -- 9. MPI probe, 10. mpi4py --------------------------------------------------------------------
    def mpi_probe(self) -> None:
        path = self.args.mpi_probe_result
        if not path:
            self.set("mpi-probe", SKIPPED, "the MPI probe was not run (not installed, or no MPI launcher for this job)")
            return
        try:
            with open(path, encoding="utf-8") as handle:
                data = json.load(handle)
        except (OSError, ValueError) as exc:
            log = os.path.splitext(path)[0] + ".log"
            self.set("mpi-probe", FAILED, f"the MPI probe left no result ({exc.__class__.__name__}: {exc}); see {log}")
            return
        self.mpi_data["probe"] = data
        want = (self.config.get("mpi") or {}).get("library_match")
        library = str(data.get("library", "")).strip()
        first_line = " ".join(library.splitlines()[0].split()) if library else "?"
        problems = []
        if want and want not in library:
            problems.append(f"the probe ran on \"{first_line}\", the site expects {want}")
        if int(data.get("size", 0)) < 2:
            problems.append(f"the probe ran with {data.get('size')} rank(s): the MPI launcher did not start 2")
        if not data.get("allreduce_ok", False):
            problems.append("MPI_Allreduce gave a wrong sum")
        bw = data.get("bandwidth") or []
        peak = max((b["mb_s"] for b in bw), default=0.0)
        hosts = data.get("hosts") or []
        where = f"{hosts[0]} <-> {hosts[-1]}" if hosts else "?"
        if problems:
            self.set("mpi-probe", FAILED, problems[0], problems=problems)
        else:
            self.set("mpi-probe", PASSED, f"{first_line}: latency "
                     f"{data.get('latency_us', 0):.3g} us, bandwidth {peak:.4g} MB/s ({where})")

    def mpi4py_check(self) -> None:
        if self.mpi is None and self.mpi_data.get("failure"):
            self.set("mpi4py", FAILED, self.mpi_data["failure"])
            return
        if self.mpi is None:
            reason = self.mpi_data.get("skip") or "mpi4py is not installed in this stack"
            self.set("mpi4py", SKIPPED, reason)
            return
        MPI = self.mpi
        comm = MPI.COMM_WORLD
        size, rank = comm.Get_size(), comm.Get_rank()
        lines = MPI.Get_library_version().strip().splitlines()
        library = " ".join(lines[0].split()) if lines else "?"
        problems = []
        if size != self.info.world_size:
            problems.append(f"mpi4py sees {size} rank(s), the launcher {self.info.launcher} started "
                            f"{self.info.world_size}: the MPI library cannot talk to this launcher's PMI "
                            "(srun --mpi=..., or the MPI is not the one mpi4py was built with)")
        want = (self.config.get("mpi") or {}).get("library_match")
        if want and want not in library:
            problems.append(f"mpi4py uses \"{library[:120]}\", the site expects {want}")
        total = comm.allreduce(rank, op=MPI.SUM) if size > 1 else 0
        if total != size * (size - 1) // 2:
            problems.append(f"MPI allreduce of ranks gave {total}, expected {size * (size - 1) // 2}")
        latency = bandwidth = None
        stats: dict[str, Any] = {}
        if size > 1 and not problems:
            stats, bandwidth = mpi_pingpong(MPI, comm, rank, size)
            latency = stats.get("median_us")
        reports = self.all_gather(problems) if self.pg_ok else [problems]
        bad = [(i, p) for i, ps in enumerate(reports) for p in ps]
        details = {"library": library[:120], "size": size, "latency_us": latency, "latency": stats,
                   "bandwidth_mb_s": bandwidth}
        self.mpi_data["mpi4py"] = details
        if bad:
            self.set("mpi4py", FAILED, f"rank {bad[0][0]}: {bad[0][1]}", problems=[f"rank {i}: {p}" for i, p in bad], **details)
        else:
            extra = f"; ping-pong {ddp_report.latency_text(stats)}, {bandwidth:.4g} MB/s at 1 MiB" if stats else ""
            self.set("mpi4py", PASSED, f"{library[:60]}, {size} ranks, allreduce exact{extra}", **details)

    # -- 11. Horovod ---------------------------------------------------------------------------------
    def horovod(self) -> None:
        try:
            import horovod.torch as hvd  # type: ignore[import-not-found, unused-ignore]
        except ImportError:
            self.set("horovod", SKIPPED, "skipped: Horovod not in this stack")
            return
        torch = self.torch
        hvd.init()
        size, rank = hvd.size(), hvd.rank()
        problems = []
        if size != self.info.world_size:
            problems.append(f"Horovod sees {size} ranks, the launcher started {self.info.world_size}")
        t = torch.tensor([float(rank + 1)])
        if self.dev.kind == "cuda":
            t = t.cuda()
        total = hvd.allreduce(t, op=hvd.Sum, name="sitestack.check")
        if float(total.cpu()[0]) != size * (size + 1) / 2:
            problems.append(f"Horovod allreduce gave {float(total.cpu()[0]):g}, expected {size * (size + 1) / 2:g}")
        builds = [name for name, fn in (("MPI", "mpi_built"), ("Gloo", "gloo_built"), ("NCCL", "nccl_built"))
                  if callable(getattr(hvd, fn, None)) and getattr(hvd, fn)()]
        if problems:
            self.set("horovod", FAILED, problems[0], problems=problems)
        else:
            self.set("horovod", PASSED, f"{size}-rank allreduce exact (Horovod built with {', '.join(builds) or '?'})")
        # stop Horovod's background thread now: the process leaves through os._exit (see exit_now)
        with contextlib.suppress(Exception):
            hvd.shutdown()

    # -- the whole run -------------------------------------------------------------------------------
    def run(self) -> int:
        # No watchdog thread: the rank's watchdog is its parent process (see supervise)
        with self.timed("environment"):
            self.environment()
        if not hasattr(self, "me"):  # torch itself did not load
            self.skip_rest("not run: the environment check could not start torch", "environment")
            return self.finish()
        if self.checks["environment"].status == FAILED and self.info.world_size > 1 and self.args.expect_world_size \
                and self.args.expect_world_size != self.info.world_size:
            self.skip_rest("not run: the world size is wrong, so the ranks cannot meet", "environment")
            self.ranks = [{**self.me, "problems": self.pre_problems}]
            return self.finish()
        with self.timed("process-group"):
            self.process_group()
        if not self.pg_ok and self.info.world_size > 1:
            self.skip_rest("not run: the process group did not start", "process-group")
            self.ranks = [{**self.me, "problems": self.pre_problems}]
            with self.timed("mpi-probe"):
                self.mpi_probe()
            return self.finish()
        self.ranks = self.all_gather({**self.me, "problems": self.pre_problems})
        with self.timed("environment"):
            self.environment_after()
        with self.timed("affinity"):
            masks = parse_masks(self.args.cpu_masks) if self.args.cpu_masks else None
            status, summary, lines = judge_affinity(self.ranks, self.config, masks)
            self.set("affinity", status, summary, ranks=lines)
        with self.timed("collectives"):
            self.collectives()
        ddp_state = None
        with self.timed("ddp"):
            ddp_state = self.ddp()
        with self.timed("checkpoint"):
            if ddp_state is None:
                self.set("checkpoint", SKIPPED, "not run: the DDP check did not finish")
            else:
                self.checkpoint(*ddp_state)
        with self.timed("bandwidth"):
            self.bandwidth_sweep()
        with self.timed("net-plugin"):
            self.barrier()
            self.net_plugin()
        with self.timed("mpi-probe"):
            self.mpi_probe()
        with self.timed("mpi4py"):
            self.mpi4py_check()
        with self.timed("horovod"):
            self.horovod()
        return self.finish()

    def on_stuck_init(self, addr: str, port: str) -> None:
        self.set("process-group", FAILED, f"rank {self.info.rank} did not get through init_process_group in "
                 f"{self.args.init_timeout + 15:.0f}s: {addr}:{port} accepts connections but does not answer as rank 0's "
                 "store (another process holds MASTER_PORT?)")
        self.skip_rest("not run: the process group did not start", "process-group")
        with contextlib.suppress(Exception):
            if self.info.rank == 0:
                self.ranks = self.ranks or [{**self.me, "problems": self.pre_problems}]
                self.write_result()
        self.log(self.checks["process-group"].summary)
        os._exit(1)

    def finish(self) -> int:
        code = 0
        self.enter("report")
        if self.info.rank == 0:
            result = self.write_result()
            code = exit_code(result)
            print(ddp_report.verdict_table(result), flush=True)
            print(f"sitestack validation {result['verdict'].upper()}: {os.path.join(self.args.out, 'summary.md')}",
                  flush=True)
        # every rank exits with rank 0's verdict, and its own failure when it failed alone
        mine = verdict(list(self.checks.values()))
        code = max(code, 0 if mine == PASSED or self.info.rank == 0 else 1)
        if self.pg_ok and self.info.world_size > 1:
            flag = self.torch.tensor([code], dtype=self.torch.int32, device=self.torch_device())
            with contextlib.suppress(Exception):
                self.dist.all_reduce(flag, op=self.dist.ReduceOp.MAX)
                code = int(flag.cpu()[0])
        if self.pg_ok:
            with contextlib.suppress(Exception):
                self.dist.destroy_process_group()
        if self.progress is not None:
            self.progress.enter("finished", state="finished", exit_code=code)
        return code

    def write_result(self) -> dict[str, Any]:
        os.makedirs(self.args.out, exist_ok=True)
        checks = [asdict(self.checks[name]) for name in CHECKS]
        fault = self.await_fault(checks)
        if fault:
            apply_fault(checks, fault)
        hosts = sorted({r["host"] for r in self.ranks}) if self.ranks else [self.host]
        first = self.ranks[0] if self.ranks else getattr(self, "me", {})
        failed = next((c for c in checks if c["status"] == FAILED), None)
        result = {
            "schema": SCHEMA,
            "site": self.config.get("site", "unknown"),
            "job_id": job_id_for(self.args.out, self.env),
            "launcher": self.info.launcher,
            "job_launcher": self.env.get("SITESTACK_LAUNCHER"),
            "backend": self.device.backend if self.device else None,
            "device": self.device.kind if self.device else None,
            "world_size": self.info.world_size,
            "nodes": len(hosts),
            "hosts": hosts,
            "torch": first.get("torch"),
            "verdict": FAILED if fault else verdict(checks),
            "cause": fault["cause"] if fault else (f"{failed['name']}: {failed['summary']}" if failed else None),
            "fault": fault,
            "checks": checks,
            "ranks": self.ranks,
            "bandwidth": self.bandwidth,
            "mpi": {k: v for k, v in self.mpi_data.items() if k in ("probe", "mpi4py")},
            "startup": read_startup(self.args.startup_result),
            "job_environment": first.get("setting") or job_environment(self.env, (self.config.get("network") or {}).get("net_plugin")),
            "elapsed_s": round(time.time() - self.start, 2),
            "time_limit": time_limit_record(self.args.time_limit, self.env),
            "artefacts": {"json": "result.json", "markdown": "summary.md", "plot": "bandwidth.png"},
        }
        note = ddp_report.write_plot(result, os.path.join(self.args.out, "bandwidth.png"))
        if note:
            result["artefacts"]["plot"] = None
            result["artefacts"]["plot_note"] = note
        ddp_report.write_json(result, os.path.join(self.args.out, "result.json"))
        with open(os.path.join(self.args.out, "summary.md"), "w", encoding="utf-8") as handle:
            handle.write(ddp_report.markdown(result))
        self.result = result
        return result

    def await_fault(self, checks: list[dict[str, Any]]) -> dict[str, Any] | None:
        """A fault a watchdog reported (a rank killed or crashed). When a check failed because a peer
        went away, wait briefly for that rank's watchdog to say what happened to it."""
        fault = read_fault(self.args.out)
        lost = re.compile(r"closed by peer|reset by peer|broken pipe|connection closed|peer|EOF|unexpected end", re.I)
        if fault is None and self.info.world_size > 1 and any(
                c["status"] == FAILED and lost.search(c["summary"]) for c in checks):
            end = time.time() + 3.0
            while fault is None and time.time() < end:
                time.sleep(0.2)
                fault = read_fault(self.args.out)
        return fault


def read_startup(path: str | None) -> dict[str, Any] | None:
    """The job's start-up timings (``--startup-result``): None without one, a note when unreadable."""
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError) as exc:
        return {"note": f"cannot read {path}: {exc}"}
    return data if isinstance(data, dict) else {"note": f"{path} holds no JSON object"}


# -- Slurm host lists ---------------------------------------------------------------------------------
# ``nid[001-004,007],nid010`` -> ``nid001 nid002 nid003 nid004 nid007 nid010``. The batch script asks
# ``scontrol show hostnames`` where it can; this parser reads a node list without Slurm (inside a
# container, in tests). Slurm's hostlist syntax: comma-separated entries, each a name with zero or more
# bracketed range lists (``rack[1-2]-node[01-02]`` is the product of both); ranges keep their zero
# padding; commas inside brackets do not split entries (the bug of LUMI's ``get-master``, which splits
# on every comma first).

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


class NodelistError(ValueError):
    """A host list that is not valid Slurm syntax."""


def split_entries(nodelist: str) -> list[str]:
    """Split a host list on the commas that are outside brackets."""
    entries: list[str] = []
    current: list[str] = []
    depth = 0
    for char in nodelist.strip():
        if char == "[":
            depth += 1
            if depth > 1:
                raise NodelistError(f"nested brackets in {nodelist!r}")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise NodelistError(f"unbalanced ']' in {nodelist!r}")
        if char == "," and depth == 0:
            entries.append("".join(current))
            current = []
        else:
            current.append(char)
    if depth:
        raise NodelistError(f"unbalanced '[' in {nodelist!r}")
    entries.append("".join(current))
    if any(not e.strip() for e in entries):
        raise NodelistError(f"empty host name in {nodelist!r}")
    return [e.strip() for e in entries]


def _expand_ranges(body: str, whole: str) -> list[str]:
    out: list[str] = []
    for part in body.split(","):
        match = _RANGE.match(part.strip())
        if not match:
            raise NodelistError(f"bad range {part!r} in {whole!r}")
        lo_text, hi_text = match.group(1), match.group(2)
        if hi_text is None:
            out.append(lo_text)
            continue
        lo, hi = int(lo_text), int(hi_text)
        if hi < lo:
            raise NodelistError(f"range {part!r} runs backwards in {whole!r}")
        if hi - lo > 100_000:
            raise NodelistError(f"range {part!r} is implausibly large in {whole!r}")
        width = len(lo_text) if lo_text.startswith("0") or len(lo_text) == len(hi_text) else 0
        out.extend(str(n).zfill(width) for n in range(lo, hi + 1))
    return out


def expand_entry(entry: str, whole: str | None = None) -> list[str]:
    """All host names of one entry: ``a[1-2]b[3,5]`` -> ``a1b3 a1b5 a2b3 a2b5``."""
    whole = whole or entry
    choices: list[list[str]] = []
    for piece in re.split(r"(\[[^\]]*\])", entry):
        if piece.startswith("["):
            choices.append(_expand_ranges(piece[1:-1], whole))
        elif piece:
            if "]" in piece or "[" in piece:
                raise NodelistError(f"stray bracket in {whole!r}")
            choices.append([piece])
    return ["".join(parts) for parts in itertools.product(*choices)]


def expand_nodelist(nodelist: str) -> list[str]:
    """Every host of a Slurm host list, in order, duplicates kept (as scontrol does)."""
    if not nodelist or not nodelist.strip():
        raise NodelistError("empty node list")
    hosts: list[str] = []
    for entry in split_entries(nodelist):
        hosts.extend(expand_entry(entry, nodelist))
    return hosts


def first_host(nodelist: str) -> str:
    """The first host of a host list: where rank 0 runs, hence MASTER_ADDR."""
    return expand_entry(split_entries(nodelist)[0], nodelist)[0]


def free_port() -> int:
    """A TCP port nobody listens on now, on this host."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def port_in_use(port: int) -> str | None:
    """Why ``port`` cannot be listened on here (as the c10d store would), or None when it is free."""
    for family, addr in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue
        with sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((addr, port))
                sock.listen(1)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return f"bind: {os.strerror(exc.errno)}"
                continue
            return None
    return None


def explain_init_failure(exc: BaseException, addr: str, port: str, info: RankInfo, timeout: float) -> str:
    text = str(exc)
    low = text.lower()
    if "eaddrinuse" in low or "address already in use" in low:
        return f"MASTER_PORT {port} on {addr} is already in use: another job or process holds it"
    joined = re.search(r"(\d+)/(\d+) clients joined", text)
    if joined or "timed out" in low or "timeout" in low:
        seen = f" ({joined.group(1)} of {joined.group(2)} ranks joined)" if joined else ""
        return (f"timed out after {timeout:.0f}s waiting for {info.world_size} ranks at {addr}:{port}{seen}: "
                f"the launcher started fewer ranks than the world size {info.world_size} ({info.source}) says, "
                "or a rank cannot reach MASTER_ADDR")
    if "connection refused" in low or "econnrefused" in low:
        return f"cannot connect to {addr}:{port}: rank 0 is not listening there (MASTER_ADDR wrong, or rank 0 failed)"
    if "name or service not known" in low or "getaddrinfo" in low:
        return f"MASTER_ADDR {addr} does not resolve on this host"
    return f"init_process_group failed: {text.splitlines()[0] if text else type(exc).__name__}"


#: Latency samples whose maximum is this many times their median are flagged as noisy.
NOISE_FACTOR = ddp_report.NOISE_FACTOR


def latency_stats(samples_us: list[float]) -> dict[str, Any]:
    """min/median/max of latency samples (us) and whether they are noisy (the maximum far above the
    median: another process shared the CPU, or the network was busy)."""
    ordered = sorted(samples_us)
    if not ordered:
        return {}
    median = ordered[len(ordered) // 2]
    return {"min_us": ordered[0], "median_us": median, "max_us": ordered[-1], "samples": len(ordered),
            "noisy": bool(median > 0 and ordered[-1] > NOISE_FACTOR * median)}


def mpi_pingpong(MPI: Any, comm: Any, rank: int, size: int) -> tuple[dict[str, Any], float | None]:
    """Latency (8 B, half round trips, us: min/median/max of 200) and bandwidth (1 MiB, MB/s) between
    rank 0 and the last rank."""
    peer = size - 1
    samples: list[float] = []
    bandwidth = None
    for index, (nbytes, iters) in enumerate(((8, 200), (1 << 20, 20))):
        buf = bytearray(nbytes)
        comm.Barrier()
        start = MPI.Wtime()
        for _ in range(iters):
            begin = MPI.Wtime()
            if rank == 0:
                comm.Send([buf, MPI.BYTE], dest=peer, tag=7)
                comm.Recv([buf, MPI.BYTE], source=peer, tag=7)
            elif rank == peer:
                comm.Recv([buf, MPI.BYTE], source=0, tag=7)
                comm.Send([buf, MPI.BYTE], dest=0, tag=7)
            if index == 0:
                samples.append((MPI.Wtime() - begin) / 2 * 1e6)
        half = (MPI.Wtime() - start) / iters / 2
        if index == 1:
            bandwidth = nbytes / half / 1e6
    result: tuple[dict[str, Any], float | None] = comm.bcast((latency_stats(samples), bandwidth), root=0)
    return result


# --------------------------------------------------------------------------------------------
# Progress and the watchdogs: separate processes, so they need no GIL and exist before MPI_Init
# --------------------------------------------------------------------------------------------
# A Python thread cannot time out a rank frozen by SIGSTOP, a rank whose other thread spins in an
# MPI call holding the GIL, or a hang inside MPI_Init (the thread would start after it). So every
# rank forks before it imports mpi4py or torch: the parent is the rank's watchdog (standard library
# only, it sleeps and polls), the child runs the checks and records its phase in
# OUT/ranks/rank-R.json as it goes. At the deadline the watchdog SIGKILLs its child (SIGKILL ends a
# stopped process too); when the child dies by a signal nobody asked for, the watchdog names it.
# The first watchdog with something to say writes result.json (an O_EXCL lock elects it).
# `ddp_check.py --guard -- LAUNCHER ...` wraps the whole job step the same way, for what happens
# before any rank's watchdog exists (a launcher or a Python start-up that hangs) and for ranks a
# launcher leaves behind.

#: Where a rank can be, in order: before the checks, the checks, and after them.
PHASES = ("startup", "MPI_Init", "import torch", *CHECKS, "report", "finished")
#: The check a fault in a phase before the checks belongs to.
PHASE_CHECK = {"startup": "environment", "MPI_Init": "mpi4py", "import torch": "environment"}
PHASE_WORDS = {"startup": "at start-up", "MPI_Init": "inside MPI_Init (importing mpi4py)",
               "import torch": "while importing torch", "report": "while writing the report",
               "finished": "after finishing"}
#: Signals that mean the process crashed rather than was killed.
CRASH_SIGNALS = ("SIGBUS", "SIGSEGV", "SIGILL", "SIGFPE", "SIGABRT", "SIGSYS")
#: Seconds between the ranks' deadline and the guard's: the ranks' watchdogs speak first.
GUARD_GRACE = 20.0


def status_dir(out: str) -> str:
    return os.path.join(out, "ranks")


def phase_words(phase: str, detail: str | None = None) -> str:
    return PHASE_WORDS.get(phase, f"during {phase}") + (f" ({detail})" if detail else "")


def where(d: dict[str, Any]) -> str:
    """What a rank was doing, from its progress record: "during ddp (step 1 forward)"."""
    return phase_words(str(d.get("phase", "?")), d.get("detail"))


def state_of(d: dict[str, Any]) -> str:
    """Where a rank was, after its name: "was in the ddp check (step 1 forward)", "had finished"."""
    phase, detail = str(d.get("phase", "?")), d.get("detail")
    if phase == "finished":
        return "had finished"
    words = {"startup": "starting up", "MPI_Init": "inside MPI_Init (importing mpi4py)",
             "import torch": "importing torch", "report": "writing the report"}.get(phase, f"in the {phase} check")
    return f"was {words}" + (f" ({detail})" if detail else "")


def waited(d: dict[str, Any]) -> str:
    return "had finished" if d.get("phase") == "finished" else f"waited {where(d)}"


class Progress:
    """This rank's progress: OUT/ranks/rank-R.json, rewritten atomically at every phase."""

    def __init__(self, out: str, info: RankInfo, host: str, meta: dict[str, Any]) -> None:
        self.path = os.path.join(status_dir(out), f"rank-{info.rank}.json")
        self.data: dict[str, Any] = {
            "rank": info.rank, "world_size": info.world_size, "local_rank": info.local_rank, "host": host,
            "launcher": info.launcher, "pid": os.getpid(), "watchdog": None, "phase": "startup",
            "since": round(time.time(), 3), "state": "running", **meta}

    def enter(self, phase: str, checks: list[dict[str, Any]] | None = None, **extra: Any) -> None:
        if phase != self.data.get("phase"):
            self.data.update(detail=None, tick=0)
        self.data.update(phase=phase, since=round(time.time(), 3), **extra)
        if checks is not None:
            self.data["checks"] = checks
        self.save()

    def save(self) -> None:
        with contextlib.suppress(OSError):
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            ddp_report.write_json(self.data, self.path)


def read_progress(out: str) -> dict[int, dict[str, Any]]:
    """Every rank's last recorded progress, by rank."""
    ranks: dict[int, dict[str, Any]] = {}
    for path in glob.glob(os.path.join(status_dir(out), "rank-*.json")):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError), open(path, encoding="utf-8") as handle:
            data = json.load(handle)
            ranks[int(data["rank"])] = data
    return ranks


def read_fault(out: str) -> dict[str, Any] | None:
    with contextlib.suppress(OSError, ValueError), open(os.path.join(status_dir(out), "fault.json"), encoding="utf-8") as f:
        fault: dict[str, Any] = json.load(f)
        return fault
    return None


def time_limit_record(limit: float, env: Mapping[str, str]) -> dict[str, Any]:
    """The checks' time limit and where it came from (the batch script says: the job's time left
    from squeue, its own --time, or $SITESTACK_TIME_LIMIT), for result.json."""
    return {"seconds": limit, "from": env.get("SITESTACK_TIME_LIMIT_FROM") or "--time-limit"}


def deadline_from_env(env: dict[str, str] | os._Environ[str], limit: float) -> float:
    """The job's deadline (epoch seconds): $SITESTACK_DEADLINE, set once by the batch script, so every
    rank and the guard share it; else ``limit`` seconds from now."""
    with contextlib.suppress(KeyError, ValueError, TypeError):
        return float(env["SITESTACK_DEADLINE"])
    return time.time() + limit


def proc_state(pid: int) -> str | None:
    """The kernel's state letter of ``pid`` (R, S, D, T stopped, t traced, Z), None when gone."""
    with contextlib.suppress(OSError, IndexError), open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
        return handle.read().rsplit(")", 1)[1].split()[0]
    return None


def sampled_state(pid: int, samples: int = 37, every: float = 0.0137) -> str | None:
    """The process state over half a second (at an odd interval, so a duty cycle cannot alias it):
    ``T`` when stopped throughout (frozen), ``throttled``
    when it was stopped and ran in turns (a SIGSTOP/SIGCONT duty cycle, as cpulimit does), else the
    state last seen."""
    seen = []
    for _ in range(samples):
        seen.append(proc_state(pid))
        time.sleep(every)
    stopped = sum(1 for s in seen if s in ("T", "t"))
    if stopped == len(seen):
        return "T"
    if stopped:
        return "throttled"
    return seen[-1]


def _proc_table() -> dict[int, tuple[int, int, str]]:
    """pid -> (parent pid, session id, start time) of every process we can see."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError), open(f"/proc/{entry}/stat", encoding="utf-8") as h:
            fields = h.read().rsplit(")", 1)[1].split()
            table[int(entry)] = (int(fields[1]), int(fields[3]), fields[19])
    return table


def descendants(root: int, table: dict[int, tuple[int, int, str]] | None = None) -> dict[int, str]:
    """``root`` and every process below it: pid -> start time (to tell a reused pid apart)."""
    table = table if table is not None else _proc_table()
    found = {root: table[root][2]} if root in table else {}
    grew = True
    while grew:
        grew = False
        for pid, (ppid, _sid, start) in table.items():
            if ppid in found and pid not in found:
                found[pid] = start
                grew = True
    return found


def kill_all(pids: dict[int, str]) -> None:
    """SIGKILL each process that is still the one we saw (same start time)."""
    table = _proc_table()
    for pid, start in pids.items():
        if pid != os.getpid() and table.get(pid, (0, 0, ""))[2] == start:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def describe_fault(kind: str, ranks: dict[int, dict[str, Any]], limit: float, expected: int | None,
                   culprit: int | None = None, rc: int | None = None, launcher: str = "the launcher") -> str:
    """The one-line cause of a run that did not finish: who, where, and in which phase."""
    def who(r: int) -> str:
        return f"rank {r} on {ranks[r].get('host', '?')}"

    size = max([expected or 0, *(int(d.get("world_size") or 0) for d in ranks.values()), len(ranks)])
    missing = [r for r in range(size) if r not in ranks]
    never = (f"; rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} never reached the check program "
             "(hung or died at start-up: the launcher, the Python start-up or a site hook)") if missing else ""
    others = [r for r in sorted(ranks) if r != culprit]
    where_others = "; ".join(f"{who(r)} {state_of(ranks[r])}" for r in others[:4])
    if kind == "killed" and culprit is not None:
        d = ranks[culprit]
        sig = str(d.get("signal", "?"))
        verb = f"crashed with {sig} ({d.get('signal_text', '')})" if sig in CRASH_SIGNALS else f"was killed by {sig}"
        return f"{who(culprit)} {verb} {where(d)}" + (f"; {where_others}" if where_others else "") + never
    if kind == "exited":
        head = f"{launcher} exited with code {rc} before a result was written"
        if not ranks:
            return f"{head}: no rank reached the check program (it failed at start-up: see the job log)"
        states = "; ".join(f"{who(r)} {d.get('state', 'running')} {where(d)}"
                           for r, d in sorted(ranks.items())[:4])
        return f"{head}: {states}{never}"
    head = f"the time limit of {limit:.0f}s passed"
    first = ranks.get(0) or {}
    found = next((c for c in first.get("checks") or [] if c.get("status") == FAILED), None)
    if found:  # what the run had already found is the likelier cause: say it first
        head = f"{found['name']}: {found['summary']}; then {head}"
    throttled = [r for r, d in sorted(ranks.items()) if d.get("proc_state") == "throttled"]
    if throttled:
        head += (f" ({', '.join(who(r) for r in throttled)} was stopped and continued in turns: held to a fraction "
                 "of a CPU)")
    if not ranks:
        return (f"{head} before any rank reached the check program: the job hung at start-up (the launcher, the "
                "Python start-up or a site hook)")
    stopped = [r for r, d in sorted(ranks.items()) if d.get("proc_state") in ("T", "t")]
    if stopped:
        rest = [r for r in sorted(ranks) if r not in stopped]
        rest_words = "; ".join(f"{who(r)} {waited(ranks[r])}" for r in rest[:4])
        return (f"{head}: {', '.join(who(r) for r in stopped)} was frozen (stopped by SIGSTOP) "
                f"{where(ranks[stopped[0]])}" + (f"; {rest_words}" if rest_words else "") + never)
    order = {p: i for i, p in enumerate(PHASES)}

    def key(d: dict[str, Any]) -> tuple[int, int]:
        return order.get(d.get("phase", ""), 0), int(d.get("tick") or 0)

    earliest = min(key(d) for d in ranks.values())
    behind = [r for r, d in sorted(ranks.items()) if key(d) == earliest]
    phase = PHASES[earliest[0]]
    if len(behind) == len(ranks) and not missing:
        return f"{head}: all {len(ranks)} ranks hung {where(ranks[behind[0]])} (ranks {', '.join(map(str, behind))})"
    ahead = "; ".join(f"{who(r)} {waited(ranks[r])}" for r in sorted(ranks) if r not in behind)
    if missing:
        return f"{head}:{never[1:]}" + (f"; {', '.join(who(r) for r in sorted(ranks))} waited "
                                        f"{phase_words(phase)}" if ranks else "")
    return f"{head}: {', '.join(who(r) for r in behind)} hung {where(ranks[behind[0]])}" + (f"; {ahead}" if ahead else "")


def report_fault(out: str, fault: dict[str, Any]) -> bool:
    """Write ``fault.json``, result.json and summary.md for a run that did not finish; only the
    first caller writes (O_EXCL), so the first fault seen is the one reported. True when written."""
    try:
        os.makedirs(status_dir(out), exist_ok=True)
        fd = os.open(os.path.join(status_dir(out), "fault.lock"), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except OSError:
        return False
    os.close(fd)
    fault = {**fault, "at": round(time.time(), 3)}
    ddp_report.write_json(fault, os.path.join(status_dir(out), "fault.json"))
    with contextlib.suppress(OSError):
        result = fault_result(out, fault)
        ddp_report.write_json(result, os.path.join(out, "result.json"))
        with open(os.path.join(out, "summary.md"), "w", encoding="utf-8") as handle:
            handle.write(ddp_report.markdown(result))
    return True


def apply_fault(checks: list[dict[str, Any]], fault: dict[str, Any]) -> None:
    """Mark the check of the fault's phase failed with its cause, and the checks never run as such."""
    target = PHASE_CHECK.get(fault.get("phase", ""), fault.get("phase", ""))
    for check in checks:
        if check["name"] == target and check["status"] != FAILED:
            check.update(status=FAILED, summary=fault["cause"])
        elif check["summary"] == "not run" or (check["status"] == SKIPPED and check["summary"].startswith("not run")):
            check.update(status=SKIPPED, summary=f"not run: the run ended early ({fault['kind']})")


def fault_result(out: str, fault: dict[str, Any]) -> dict[str, Any]:
    """result.json of a run a watchdog or the guard ended: rank 0's checks as far as they got."""
    ranks = read_progress(out)
    first = ranks.get(0) or (next(iter(ranks.values())) if ranks else {})
    checks = [dict(c) for c in first.get("checks") or [asdict(Check(name)) for name in CHECKS]]
    apply_fault(checks, fault)
    hosts = sorted({str(d.get("host")) for d in ranks.values()})
    return {
        "schema": SCHEMA, "site": first.get("site") or fault.get("site") or "unknown",
        "job_id": first.get("job_id") or fault.get("job_id"), "launcher": first.get("launcher"),
        "job_launcher": first.get("job_launcher"), "backend": first.get("backend"), "device": first.get("device"),
        "world_size": max([int(d.get("world_size") or 0) for d in ranks.values()] + [fault.get("expected") or 0]),
        "nodes": len(hosts), "hosts": hosts, "torch": first.get("torch"), "verdict": FAILED, "cause": fault["cause"],
        "fault": fault, "checks": checks,
        "ranks": [{k: v for k, v in d.items() if k != "checks"} for _, d in sorted(ranks.items())],
        "bandwidth": {}, "mpi": {}, "elapsed_s": max(0.0, round(time.time() - float(first.get("started") or time.time()), 2)),
        # the watchdogs and the guard run in the job's environment: the limit the batch script set
        "time_limit": time_limit_record(float(os.environ.get("SITESTACK_TIME_LIMIT") or fault.get("limit_s") or 0),
                                        os.environ),
        "artefacts": {"json": "result.json", "markdown": "summary.md", "plot": None,
                      "plot_note": "the run did not finish"},
    }


def supervise(progress: Progress, out: str, deadline: float, limit: float, expected: int | None) -> None:
    """Fork: the child returns (it runs the checks); the parent watches it and never returns."""
    if not hasattr(os, "fork"):
        return
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    parent = os.getpid()
    child = os.fork()
    if child == 0:
        _die_with(parent)
        progress.data.update(pid=os.getpid(), watchdog=parent)
        progress.save()
        return
    _watch(child, progress, out, deadline, limit, expected)


def _die_with(parent: int) -> None:
    """PR_SET_PDEATHSIG: a launcher that SIGKILLs the watchdog (Hydra does, when another rank
    fails) takes the rank with it, so no rank is left behind (prctl(2))."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG = 1
    if os.getppid() != parent:
        os._exit(1)


def _watch(child: int, progress: Progress, out: str, deadline: float, limit: float, expected: int | None) -> None:
    asked: list[int] = []

    def forward(sig: int, _frame: Any) -> None:  # the launcher's TERM/INT reach the rank, and are not faults
        asked.append(sig)
        with contextlib.suppress(OSError):
            os.kill(child, sig)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, forward)
    status = 0
    while True:
        try:
            pid, status = os.waitpid(child, os.WNOHANG)
        except ChildProcessError:
            os._exit(1)
        if pid:
            break
        if time.time() >= deadline:
            _time_out(child, progress, out, limit, expected)
        time.sleep(0.2)
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        ranks = read_progress(out)
        mine = ranks.get(progress.data["rank"], progress.data)
        # a rank that dies because the deadline ended another one is not the fault: that watchdog reports
        late = time.time() >= deadline - 1 or any(d.get("state") == "timed out" for d in ranks.values())
        if not asked and not late and mine.get("phase") != "finished":
            progress.data = dict(mine)  # the worker's record, with rank 0's checks so far
            name = signal.Signals(number).name
            progress.data.update(state="crashed" if name in CRASH_SIGNALS else "killed", signal=name,
                                 signal_text=signal.strsignal(number) or "")
            progress.save()
            ranks = read_progress(out)
            cause = describe_fault("killed", ranks, limit, expected, culprit=progress.data["rank"])
            report_fault(out, {"kind": progress.data["state"], "cause": cause, "rank": progress.data["rank"],
                               "host": progress.data["host"], "phase": mine.get("phase"),
                               "signal": progress.data["signal"], "expected": expected})
            print(f"sitestack watchdog: {cause}", file=sys.stderr, flush=True)
        os._exit(128 + number)
    os._exit(os.WEXITSTATUS(status))


def _time_out(child: int, progress: Progress, out: str, limit: float, expected: int | None) -> None:
    """The deadline passed: record where the rank was, kill it, and (first watchdog only) report."""
    progress.data = dict(read_progress(out).get(progress.data["rank"], progress.data))
    progress.data.update(state="timed out", proc_state=sampled_state(child))
    progress.save()
    kill_all(descendants(child))
    with contextlib.suppress(ChildProcessError):
        os.waitpid(child, 0)
    time.sleep(1.0)  # the other ranks' watchdogs record their state too
    ranks = read_progress(out)
    cause = describe_fault("timeout", ranks, limit, expected)
    if report_fault(out, {"kind": "timeout", "cause": cause, "phase": _earliest(ranks), "expected": expected,
                          "limit_s": limit}):
        print(f"sitestack watchdog: {cause}", file=sys.stderr, flush=True)
    os._exit(3)


def _earliest(ranks: dict[int, dict[str, Any]]) -> str:
    order = {p: i for i, p in enumerate(PHASES)}
    stopped = [d for d in ranks.values() if d.get("proc_state") in ("T", "t")]
    pool = stopped or list(ranks.values())
    return min((str(d.get("phase", "startup")) for d in pool), key=lambda p: order.get(p, 0), default="startup")


def guard_main(argv: list[str]) -> int:
    """``ddp_check.py --guard --out OUT [--config C] [--expect-world-size N] -- LAUNCHER ARGS...``:
    run the job step in its own session; at the deadline (+GUARD_GRACE) kill everything in it;
    write a result when no rank did; print the verdict and a last line that points at what exists."""
    p = argparse.ArgumentParser(prog="ddp_check.py --guard")
    p.add_argument("--out", required=True)
    p.add_argument("--config")
    p.add_argument("--expect-world-size", type=int, default=None)
    p.add_argument("--time-limit", type=float, default=float(os.environ.get("SITESTACK_TIME_LIMIT") or 480))
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("no command to run after --")
    deadline = deadline_from_env(os.environ, args.time_limit) + GUARD_GRACE
    config = load_config(args.config) if args.config else {}
    start = time.time()
    try:
        proc = subprocess.Popen(command, start_new_session=True)
    except OSError as exc:
        proc = None
        rc: int | None = 127
        print(f"sitestack: cannot start {command[0]}: {exc}", file=sys.stderr, flush=True)
    seen: dict[int, str] = {}

    def stop(sig: int, _frame: Any) -> None:
        if proc is not None:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, sig)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, stop)
    timed_out = False
    ended: float | None = None
    if proc is not None:
        last_scan = 0.0
        while proc.poll() is None:
            now = time.time()
            if now - last_scan > 1.0:  # remember the step's processes: ranks a launcher orphans are found later
                seen.update(descendants(proc.pid))
                last_scan = now
            if ended is None and os.path.exists(os.path.join(status_dir(args.out), "fault.json")):
                # a rank's watchdog reported a rank killed or timed out: the others cannot finish
                # without it; give the launcher a few seconds to end them itself
                ended = now
                deadline = min(deadline, now + 5.0)
            if now >= deadline:
                timed_out = ended is None
                seen.update(descendants(proc.pid))
                kill_all(seen)
                break
            time.sleep(0.25)
        rc = proc.wait()
        kill_all(seen)  # whatever the launcher left running
        if rc < 0:  # the launcher ended by a signal: the shell's way of saying so
            rc = 128 - rc
    result_path = os.path.join(args.out, "result.json")
    if not os.path.exists(result_path):
        ranks = read_progress(args.out)
        limit = deadline - GUARD_GRACE - start
        kind = "timeout" if timed_out else "exited"
        cause = describe_fault(kind, ranks, limit, args.expect_world_size, rc=rc, launcher=os.path.basename(command[0]))
        report_fault(args.out, {"kind": kind, "cause": cause, "phase": _earliest(ranks) if ranks else "startup",
                                "expected": args.expect_world_size, "site": config.get("site"),
                                "job_id": os.environ.get("SLURM_JOB_ID") or os.environ.get("SITESTACK_JOB_ID"),
                                "launcher_exit_code": rc})
    result: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError), open(result_path, encoding="utf-8") as handle:
        result = json.load(handle)
    code = rc if rc else exit_code(result)
    if timed_out:
        code = code or 3
    if result:
        if proc is None or rc or timed_out or result.get("fault"):  # the ranks did not print the table themselves
            print(ddp_report.verdict_table(result), flush=True)
        summary = os.path.join(args.out, "summary.md")
        where = f"summary: {summary}" if os.path.exists(summary) else f"result: {result_path}"
        print(f"sitestack validation: {str(result.get('verdict', '?')).upper()}, exit code {code}; {where}", flush=True)
    else:
        print(f"sitestack validation: no result was written (exit code {code}); see this log", flush=True)
    return code


# --------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    env = os.environ
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="check-config.json written by `invoke install-validation-job`")
    p.add_argument("--out", help="result directory (default: $SITESTACK_VALIDATION_OUT or ./sitestack-validation-<job>)")
    p.add_argument("--expect-world-size", type=int, default=int(env.get("SITESTACK_EXPECT_WORLD_SIZE") or 0) or None,
                   help="ranks the job asked for; a launcher that says otherwise fails the environment check")
    p.add_argument("--cpu-masks", default=env.get("SITESTACK_CPU_MASKS") or None,
                   help="the mask_cpu list the job bound ranks with, by local rank (0xfe,0xfe00,...)")
    p.add_argument("--init-timeout", type=float, default=float(env.get("SITESTACK_INIT_TIMEOUT") or 180),
                   help="seconds to wait for every rank to join the process group")
    p.add_argument("--time-limit", type=float, default=float(env.get("SITESTACK_TIME_LIMIT") or 480),
                   help="seconds after which the watchdog ends a stuck run with a result naming where each rank was "
                        "(the batch script derives it from the job's --time; $SITESTACK_DEADLINE, when set, is the "
                        "deadline itself)")
    p.add_argument("--no-watchdog", action="store_true", help="run the checks without the watchdog process")
    p.add_argument("--steps", type=int, default=20, help="DDP training steps")
    p.add_argument("--min-bytes", type=parse_size, default=None, help="smallest allreduce of the sweep (default 8 on GPU, 4K on CPU)")
    p.add_argument("--max-bytes", type=parse_size, default=None, help="largest allreduce (default 256M on GPU, 4M on CPU)")
    p.add_argument("--factor", type=int, default=None, help="size step of the sweep (default 2 on GPU, 4 on CPU)")
    p.add_argument("--iters", type=int, default=None, help="timed iterations per size (default 20 on GPU, 5 on CPU)")
    p.add_argument("--warmup", type=int, default=None, help="warm-up iterations per size (default 5 on GPU, 2 on CPU)")
    p.add_argument("--device", choices=("auto", "cpu"), default="auto", help="cpu: use gloo on CPU even where GPUs exist")
    p.add_argument("--mpi-probe-result", default=None, help="JSON the MPI probe step wrote")
    p.add_argument("--startup-result", default=None,
                   help="JSON the job wrote: `import torch` seconds from the shared prefix and from node-local storage")
    p.add_argument("--nccl-log", default=None, help="NCCL_DEBUG=INFO log file(s) (a glob) to judge; default OUT/nccl/*.log")
    p.add_argument("--no-mpi", action="store_true", help="do not import mpi4py")
    args = p.parse_args(argv)
    if not args.out:
        job = env.get("SLURM_JOB_ID") or env.get("SITESTACK_JOB_ID") or "local"
        args.out = env.get("SITESTACK_VALIDATION_OUT") or os.path.join(os.getcwd(), f"sitestack-validation-{job}")
    return args


def load_config(path: str | None) -> dict[str, Any]:
    if not path:
        return {}
    with open(path, encoding="utf-8") as handle:
        config: dict[str, Any] = json.load(handle)
    return config


def job_id_for(out: str, env: dict[str, str] | os._Environ[str]) -> str | None:
    """The job id the results directory is named after (``sitestack-validation-<id>``), so the report's
    header matches the directory; else the scheduler's."""
    match = re.fullmatch(r"sitestack-validation-(.+)", os.path.basename(os.path.normpath(out)))
    return match.group(1) if match else (env.get("SLURM_JOB_ID") or env.get("SITESTACK_JOB_ID"))


def mpi4py_failure(exc: BaseException, wanted: bool) -> str:
    """Why mpi4py cannot be used, in one line: missing, or broken (with the loader's own words)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, ModuleNotFoundError) and exc.name in ("mpi4py", None):
        where = "the site's stack includes it, but " if wanted else ""
        return f"mpi4py is missing: {where}this Python cannot import it ({text})"
    return f"mpi4py is broken: importing mpi4py.MPI failed with {type(exc).__name__}: {text[:300]}"


def import_mpi(info: RankInfo, args: argparse.Namespace, config: dict[str, Any]) -> tuple[Any, str | None, str | None]:
    """(mpi4py's MPI module, why it is not used, why that is a failure), imported before torch
    (cray-mpich's NIC_POLICY check needs that order). Where the site's stack includes mpi4py
    (check-config.json ``stack.includes``), a missing or broken mpi4py fails the mpi4py check:
    under a launcher that starts no MPI ranks its library is still loaded, without MPI_Init."""
    wanted = "mpi4py" in ((config.get("stack") or {}).get("includes") or [])
    if args.no_mpi:
        return None, "mpi4py not used (--no-mpi)", None
    if info.launcher in ("torchrun", "none", "env"):
        why = f"the launcher ({info.launcher}) starts no MPI ranks: run the srun or mpiexec job for the MPI checks"
        if wanted:
            try:
                import mpi4py  # type: ignore[import-not-found, unused-ignore]

                mpi4py.rc.initialize = mpi4py.rc.finalize = False  # load libmpi, do not start MPI
                from mpi4py import MPI  # type: ignore[import-not-found, unused-ignore]  # noqa: F401
            except Exception as exc:  # noqa: BLE001  (a broken mpi4py is a finding, not a crash)
                return None, None, mpi4py_failure(exc, wanted)
        return None, why, None
    try:
        from mpi4py import MPI  # type: ignore[import-not-found, unused-ignore]
    except Exception as exc:  # noqa: BLE001  (a missing or broken mpi4py is a finding, not a crash)
        failure = mpi4py_failure(exc, wanted)
        if wanted or not isinstance(exc, ModuleNotFoundError):
            return None, None, failure
        return None, "mpi4py is not installed in this stack (the site's stack does not include it)", None
    return MPI, None, None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    config = load_config(args.config)
    if args.factor is None:
        args.factor = 4 if args.device == "cpu" or not config.get("gpu_vendor") or config.get("gpu_vendor") == "none" else 2
    info = discover_rank()
    host = socket.gethostname().split(".")[0]
    meta = {"site": config.get("site", "unknown"), "job_id": job_id_for(args.out, os.environ),
            "job_launcher": os.environ.get("SITESTACK_LAUNCHER"), "started": round(time.time(), 3)}
    progress = Progress(args.out, info, host, meta)
    progress.save()
    if not args.no_watchdog:  # before MPI_Init and torch: see "Progress and the watchdogs"
        supervise(progress, args.out, deadline_from_env(os.environ, args.time_limit), args.time_limit,
                  args.expect_world_size)
    progress.enter("MPI_Init")
    mpi, why, failure = import_mpi(info, args, config)
    progress.enter("import torch")
    run = Run(args, config, info, mpi)
    run.progress = progress
    if why:
        run.mpi_data["skip"] = why
    if failure:
        run.mpi_data["failure"] = failure
    if mpi is not None:
        run.mpi_data["library_short"] = " ".join(mpi.Get_library_version().strip().splitlines()[0].split())
    return run.run()


def exit_now(code: int, mpi: Any = None) -> None:
    """End the process with `code` without running the interpreter's teardown.

    The checks are over and the result is written; what is left is the teardown of torch's C++
    state (Gloo's and c10d's worker threads, CUDA/NCCL handles). Under load that teardown can
    destroy a still-joinable std::thread or take the GIL in a dying interpreter, which aborts the
    process ("terminate called without an active exception", exit 6) after a run that passed, even
    after destroy_process_group: pytorch/pytorch#190489 and the discussion in #179291. So flush
    what the run printed, end MPI while this rank is still whole (the launcher counts a rank that
    leaves without MPI_Finalize as failed), then leave through os._exit.
    """
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if mpi is not None:
        with contextlib.suppress(Exception):
            if mpi.Is_initialized() and not mpi.Is_finalized():
                mpi.Finalize()
    os._exit(code)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--guard"]:
        sys.exit(guard_main(sys.argv[2:]))
    exit_now(main(), sys.modules.get("mpi4py.MPI"))
