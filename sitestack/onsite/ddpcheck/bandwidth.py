"""The bandwidth check: an allreduce sweep; algbw = bytes / time and busbw = algbw * 2(n-1)/n, as
nccl-tests defines them (https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md),
compared with the site's reference."""

from __future__ import annotations

import argparse
import re
import time
from typing import Any

from .. import calibration, ddp_report
from . import threads
from .checks import BANDWIDTH
from .state import Run
from .verdicts import FAILED, PASSED, SKIPPED


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
    """One row of the sweep: time in us, algbw and busbw in GB/s (nccl-tests' definitions)."""
    algbw = size_bytes / seconds / 1e9
    return {"bytes": size_bytes, "time_us": seconds * 1e6, "algbw_gbs": algbw, "busbw_gbs": algbw * bus_factor(op, n)}


def judge_bandwidth(rows: list[dict[str, float]], reference: dict[str, Any] | None, nodes: int,
                    note: str | None = None) -> tuple[str, str, dict[str, Any] | None]:
    """Compare the sweep with the site's reference for this node count (ReFrame-style lower bound);
    ``note``: why a site that calibrates has no reference for this run."""
    if not rows:
        return FAILED, "no bandwidth measured", None
    peak = max(rows, key=lambda r: r["busbw_gbs"])
    kind = "multi-node" if nodes > 1 else "single-node"
    if not reference:
        return PASSED, (f"peak busbw {peak['busbw_gbs']:.3g} GB/s at {ddp_report.human_bytes(peak['bytes'])}; "
                        f"{note or f'not judged: the site has no {kind} reference'}"), None
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
                    f"({kind} reference {reference['busbw_gbs']:.3g} GB/s"
                    f"{'; ' + reference['source'] if reference.get('calibrated') else ''})"), compared


def cpu_waited(before: tuple[float, float] | None, after: tuple[float, float] | None, seconds: float) -> float | None:
    """Seconds a rank waited for a CPU per second of the sweep (from :func:`threads.sched_seconds`), None
    where the kernel does not say. Over gloo on a CPU the allreduce is CPU work: a rank that waits for a
    CPU another process holds measures that process, and the history says so (engine/regression.py)."""
    if before is None or after is None or seconds <= 0:
        return None
    return round(max(0.0, after[1] - before[1]) / seconds, 3)


def parse_size(text: str) -> int:
    """``4K``, ``64M``, ``1GiB`` in bytes (powers of 1024); an argparse error otherwise."""
    # stripped first: spaces around the number matched by the pattern would be tried at each split of a run of them
    match = re.fullmatch(r"(\d+)\s*([kKmMgG]?)(?:i?[bB])?", text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 4K, 64M)")
    return int(match.group(1)) * {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[match.group(2).lower()]


def sweep_sizes(lo: int, hi: int, factor: int) -> list[int]:
    """Message sizes from ``lo`` (at least 4 bytes) to ``hi``, each ``factor`` times the last."""
    sizes, size = [], max(4, lo)
    while size <= hi:
        sizes.append(size)
        size *= factor
    return sizes


def allreduce_seconds(run: Run, tensor: Any, iters: int, warmup: int) -> float:
    """One timing: ``warmup`` allreduces of ``tensor``, then the mean time of ``iters`` more, as the
    slowest rank saw it (the slowest rank sets the time, as for a job)."""
    torch, dist = run.torch, run.dist
    for _ in range(warmup):
        dist.all_reduce(tensor)
    run.sync()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(tensor)
    run.sync()
    elapsed = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64, device=run.torch_device())
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed.cpu())


def run_sizes(run: Run) -> list[int]:
    """The sweep's message sizes for this run: ``--min-bytes``/``--max-bytes``/``--factor``, by default
    8 B-256 MiB on a GPU and 4 KiB-4 MiB on CPU, the largest raised to the site's reference sizes
    (the collectives check verifies the same sizes)."""
    gpu = run.dev.kind != "cpu"
    lo, hi = run.args.min_bytes, run.args.max_bytes
    if hi is None:
        hi = 256 << 20 if gpu else 4 << 20
        hi = max([hi] + [r.get("message_bytes") or hi for r in (run.config.get("bandwidth") or {}).values() if r])
    if lo is None:
        lo = 8 if gpu else 4 << 10
    return sweep_sizes(lo, hi, run.args.factor)


def bandwidth_sweep(run: Run) -> None:
    """The bandwidth check: an allreduce sweep timed by the slowest rank, judged against the site's reference."""
    torch, n = run.torch, run.info.world_size
    if n < 2:
        run.set(BANDWIDTH.name, SKIPPED, "a single rank: nothing to measure")
        return
    gpu = run.dev.kind != "cpu"
    refs = run.config.get("bandwidth") or {}
    iters = run.args.iters or (20 if gpu else 5)
    warmup = run.args.warmup if run.args.warmup is not None else (5 if gpu else 2)
    dev = run.torch_device()
    rows = []
    sched0, start = threads.sched_seconds(), time.perf_counter()
    for size in run_sizes(run):
        t = torch.zeros(size // 4, dtype=torch.float32, device=dev)
        rows.append(bandwidth_row(size, allreduce_seconds(run, t, iters, warmup), n))
        del t
    waited = cpu_waited(sched0, threads.sched_seconds(), time.perf_counter() - start)
    waits = [w for w in run.all_gather(waited) if w is not None]
    nodes = len({r["host"] for r in run.ranks})
    key = "multi_node" if nodes > 1 else "single_node"
    reference, note = calibration.reference(refs.get(key), key, "busbw_gbs", run.config)
    status, summary, compared = judge_bandwidth(rows, reference, nodes, note)
    run.bandwidth = {"op": "allreduce", "dtype": "float32", "ranks": n, "nodes": nodes, "iters": iters,
                     "warmup": warmup, "rows": rows, "reference": compared,
                     "cpu_waited_per_s": max(waits) if waits else None,
                     "definition": "algbw = bytes / time; busbw = algbw * 2(n-1)/n (nccl-tests)"}
    run.set(BANDWIDTH.name, status, summary, peak_busbw_gbs=max(r["busbw_gbs"] for r in rows))
