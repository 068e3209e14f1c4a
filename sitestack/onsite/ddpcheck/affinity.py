"""The affinity check: each rank's CPU set is what the site intended (the job's masks, or the cores of
the NUMA domain closest to its GPU), and the ranks of a node are not all pinned to one core."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .. import ddp_report
from ..bind_rank import parse_mask as parse_mask  # one mask parser: the binder's, which ships as one file
from ..bind_rank import parse_masks as parse_masks
from .checks import AFFINITY
from .verdicts import FAILED, PASSED

if TYPE_CHECKING:
    from .state import Run


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


def affinity(run: Run) -> None:
    """The affinity check: every rank's CPUs against the job's masks (``--cpu-masks``) or the site's map."""
    masks = parse_masks(run.args.cpu_masks) if run.args.cpu_masks else None
    status, summary, lines = judge_affinity(run.ranks, run.config, masks)
    run.set(AFFINITY.name, status, summary, ranks=lines)


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
                            "(a torchrun agent or task given Slurm's default of one CPU: give its step the node's CPUs, "
                            "or start one task per GPU)")
    if problems:
        return FAILED, problems[0] + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""), lines
    if checked:
        return PASSED, f"all {checked} ranks run on the CPUs the site intended", lines
    return PASSED, "not compared: the site states no CPU binding; ranks are not all pinned to one CPU", lines
