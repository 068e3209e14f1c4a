"""The compute check: every rank's rate on a fixed workload (float32 matrix products on its device),
timed in windows long enough for CPU quotas, judged against the other ranks (DDP runs at the pace of
its slowest rank) and against the site's reference; a slow rank is named with its likely cause."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Mapping
from typing import Any

from .. import calibration
from . import threads
from .checks import COMPUTE
from .state import Run
from .verdicts import FAILED, PASSED

#: A rank this many times slower than the median of the other ranks fails.
SLOW_RANK_FACTOR = 1.5
#: Each rank is timed in this many windows of at least WINDOW_SECONDS and judged by their median.
#: CFS bandwidth control runs a cgroup at full speed for its quota, then stops it until the period
#: (100 ms by default) ends (https://docs.kernel.org/scheduler/sched-bwc.html): a window of two
#: periods or more cannot hide inside the quota, and 5 of them give 1 s of work per rank.
WINDOWS = 5
WINDOW_SECONDS = 0.2
#: The matrix size on a CPU and on a GPU: ~0.3 ms per product on one core; on a GPU large enough
#: that the product, not its launch, is timed.
CPU_SIZE, GPU_SIZE = 192, 2048
PRODUCTS_PER_STEP = 8


def turns(ranks: list[dict[str, Any]]) -> list[int]:
    """Each rank's turn (by rank). Ranks time at once, under the same load of the machine, as they
    train, unless there are more of them than CPUs: on a CPU device, ranks of a host whose CPUs
    overlap take turns when they outnumber those CPUs (more ranks than cores by design), so they do
    not slow each other; on a GPU, ranks that share one take turns. More threads than CPUs is not
    hidden: it slows the ranks as it slows their training."""
    taken: dict[tuple[str, int], list[dict[str, Any]]] = {}
    out = []
    for rank in sorted(ranks, key=lambda r: r["rank"]):
        turn = 0
        while _crowded(rank, taken.get((rank.get("host", ""), turn), [])):
            turn += 1
        taken.setdefault((rank.get("host", ""), turn), []).append(rank)
        out.append(turn)
    return out


def _crowded(rank: dict[str, Any], members: list[dict[str, Any]]) -> bool:
    """Whether ``rank`` would compete with the ranks of its host already timed in one turn."""
    if not members:
        return False
    if not str(rank.get("device", "cpu")).startswith("cpu"):
        return any(rank.get("physical_gpu") is None or m.get("physical_gpu") == rank.get("physical_gpu")
                   for m in members)
    mine = set(rank.get("affinity") or [])
    near = [m for m in members if not mine or not m.get("affinity") or mine & set(m["affinity"])]
    if not near or not mine or any(not m.get("affinity") for m in near):
        return bool(near)
    return len(near) + 1 > len(mine.union(*(set(m["affinity"]) for m in near)))


def _threads(rank: dict[str, Any]) -> int:
    count = (rank.get("threads") or {}).get("torch_threads")
    return count if isinstance(count, int) and count > 0 else 1


def _workload(run: Run) -> tuple[Any, float]:
    """(one step of work, its float operations): PRODUCTS_PER_STEP chained products ``tanh(b @ a)``."""
    torch = run.torch
    n = CPU_SIZE if run.dev.kind == "cpu" else GPU_SIZE
    a = torch.randn(n, n, device=run.torch_device()) / n ** 0.5  # tanh keeps the chain bounded

    def step() -> None:
        b = a
        for _ in range(PRODUCTS_PER_STEP):
            b = torch.tanh(b @ a)
        run.sync()

    return step, PRODUCTS_PER_STEP * 2.0 * n ** 3


def _window(step: Any, flops: float, usable: int) -> dict[str, float | None]:
    """Steps until WINDOW_SECONDS have passed: GFLOPS; GFLOPS per the process's CPU time, times the
    CPUs its threads can use (what it reaches with those CPUs to itself: another process's load
    does not change it, more threads than CPUs or a slower CPU does); and the seconds this thread
    ran on a CPU and waited for one, per second of the window (None where the kernel does not say)."""
    sched0 = threads.sched_seconds()
    cpu0, start = time.process_time(), time.perf_counter()
    steps, elapsed = 0, 0.0
    while elapsed < WINDOW_SECONDS:
        step()
        steps += 1
        elapsed = time.perf_counter() - start
    cpu = max(time.process_time() - cpu0, 1e-6)
    sched1 = threads.sched_seconds()
    ran = waited = None
    if sched0 is not None and sched1 is not None:
        ran, waited = (sched1[0] - sched0[0]) / elapsed, (sched1[1] - sched0[1]) / elapsed
    return {"gflops": steps * flops / elapsed / 1e9, "own": steps * flops * usable / cpu / 1e9, "ran": ran, "waited": waited}


def measure(run: Run) -> dict[str, Any]:
    """This rank's record: the medians of its windows (GFLOPS, GFLOPS on its own CPU time, CPU time
    it ran and waited per second), each window's GFLOPS, its cgroup's CPU quota and the periods
    throttled while timed. Ranks that compete take turns window by window, so a change in the
    machine's load falls on all of them."""
    step, flops = _workload(run)
    step()  # the first products allocate and start the thread pool: not timed
    me = run.ranks[run.info.rank] if len(run.ranks) == run.info.world_size else run.me
    # the CPUs its threads can use: its own, shared with the ranks that run on them too
    shared = (me.get("threads") or {}).get("ranks_sharing") or 1
    usable = max(1, min(_threads(me), len(me.get("affinity") or []) // shared or _threads(me)))
    quota = threads.cpu_quota()
    before = threads.throttling(quota)
    slots = turns(run.ranks) if len(run.ranks) == run.info.world_size else [0] * run.info.world_size
    mine, windows = slots[run.info.rank], []
    for index in range(WINDOWS):
        for turn in range(max(slots) + 1):
            run.barrier()
            if turn == mine:
                run.note(f"window {index + 1} of {WINDOWS}", index)
                windows.append(_window(step, flops, usable))
    run.barrier()
    after = threads.throttling(quota)
    quota = threads.cpu_quota() or quota  # a quota set while it was timed counts too

    def median(key: str) -> float | None:
        values = [value for w in windows if (value := w[key]) is not None]
        return round(statistics.median(values), 3) if values else None

    return {"rank": run.info.rank, "host": run.host, "device": run.dev.kind, "turn": mine, "threads": usable,
            "gflops": median("gflops"), "gflops_own": median("own"), "windows": [round(w["gflops"] or 0, 3) for w in windows],
            "ran_per_s": median("ran"), "waited_per_s": median("waited"), "quota": quota,
            "throttled": [after[0] - before[0], after[1] - before[1]] if before and after else None}


def _throttled(record: dict[str, Any]) -> bool:
    """Whether the rank's cgroup quota is below the CPUs its threads use, or held it back in more
    than a quarter of the quota periods while it was timed."""
    quota, throttled = record.get("quota"), record.get("throttled")
    return bool(quota and quota["cpus"] < (record.get("threads") or 1)
                or throttled and throttled[1] > 0.25 * max(1, throttled[0]))


def _stopped(record: dict[str, Any]) -> bool:
    """Whether a CPU rank neither ran nor waited for a CPU for 30% of the time (stopped by a signal)."""
    ran, waited = record.get("ran_per_s"), record.get("waited_per_s")
    return record.get("device") == "cpu" and ran is not None and waited is not None and ran + waited <= 0.7


def likely_cause(rank: dict[str, Any], record: dict[str, Any]) -> str:
    """What a slow rank's record suggests: thread oversubscription, its cgroup's CPU quota, other
    processes on its CPUs, being stopped, or else a slower CPU or GPU."""
    over = threads.oversubscription(rank)
    if over:
        return over
    count, quota, throttled = _threads(rank), record.get("quota"), record.get("throttled")
    if quota and _throttled(record):
        during = f", throttled in {throttled[1]} of {throttled[0]} periods while timed" if throttled else ""
        return (f"CPU quota: its cgroup allows {quota['cpus']:g} CPUs ({quota['text']}) for {count} "
                f"thread{'s' if count != 1 else ''}{during}")
    ran, waited = record.get("ran_per_s") or 0.0, record.get("waited_per_s") or 0.0
    if waited >= 0.3:
        return (f"a shared CPU: it waited for a CPU {waited:.2f} s per second and ran {ran:.2f} s (other processes "
                "or ranks run on its CPUs, or a CPU quota it cannot see)")
    if _stopped(record):
        return (f"it ran only {ran:.2f} s per second and did not wait for a CPU: it was stopped part of the time "
                "(SIGSTOP, cpulimit, a debugger) or throttled by a quota it cannot see")
    if record.get("device") != "cpu":
        return "its GPU is slower or shared: another process on it, lower clocks (power or thermal capping), another model"
    return "it had its CPU and computed slower: CPU frequency (power or thermal capping), another CPU model, another BLAS"


def judged_rate(record: dict[str, Any]) -> float:
    """The rate a rank is judged by. On a CPU: GFLOPS on its own CPU time, as long as its cgroup did
    not throttle it and it was not stopped: the load other processes put on a shared machine falls
    on every rank at random and is not the stack's fault, while a quota or a stop is the rank's.
    Otherwise (and on a GPU): GFLOPS by the clock."""
    if record.get("device") == "cpu" and record.get("gflops_own") and not _throttled(record) and not _stopped(record):
        return float(record["gflops_own"])
    return float(record.get("gflops") or 0.0)


def judge_balance(records: list[dict[str, Any]], ranks: list[dict[str, Any]]) -> list[str]:
    """Each rank SLOW_RANK_FACTOR or more slower (:func:`judged_rate`) than the median of the other
    ranks, slowest first, named with host, ratio and likely cause; [] when the ranks are in balance."""
    if len(records) < 2:
        return []
    found = []
    for i, record in enumerate(records):
        mine = judged_rate(record)
        others = statistics.median(judged_rate(r) for j, r in enumerate(records) if j != i)
        if mine <= 0 or others / mine >= SLOW_RANK_FACTOR:
            ratio = others / mine if mine > 0 else float("inf")
            found.append((ratio, f"slow rank: rank {i} on {record['host']} is {ratio:.1f}x slower than the other ranks "
                          f"({mine:.3g} GFLOPS against a median of {others:.3g}; limit {SLOW_RANK_FACTOR:g}x): "
                          f"{likely_cause(ranks[i], record)}; every DDP step waits for it"))
    return [text for _, text in sorted(found, key=lambda f: -f[0])]


def judge_reference(records: list[dict[str, Any]], ranks: list[dict[str, Any]],
                    reference: dict[str, Any] | None) -> tuple[list[str], dict[str, Any] | None]:
    """Each rank below the site's reference (``gflops`` times 1 + ``lower``; :func:`judged_rate`),
    slowest first, with its likely cause; and the comparison for result.json (None without one)."""
    if not reference:
        return [], None
    minimum = reference["gflops"] * (1 + reference.get("lower", -0.67))
    compared = {**reference, "minimum_gflops": round(minimum, 3)}
    below = sorted((r for r in records if judged_rate(r) < minimum), key=judged_rate)
    source = f"; {reference['source']}" if reference.get("source") else ""
    who = "every rank" if len(below) == len(records) > 1 else "rank"
    return [f"{who} below the site's compute reference: rank {r['rank']} on {r['host']} reaches {judged_rate(r):.3g} "
            f"GFLOPS, {reference['gflops'] / max(judged_rate(r), 1e-9):.1f}x below {reference['gflops']:g} (minimum "
            f"{minimum:.3g}{source}): {likely_cause(ranks[r['rank']], r)}" for r in below], compared


def read_reference(config: dict[str, Any], environ: Mapping[str, str] | None = None
                   ) -> tuple[dict[str, Any] | None, str | None, str | None]:
    """check-config.json's ``compute`` reference (None without one), or why it is not one, and a note on
    why a calibrating site's run is not judged against one. Without ``gflops`` the site calibrates: the
    figure comes from the calibration kept with its history (:func:`calibration.reference`)."""
    given = config.get("compute")
    if given is None:
        return None, None, None
    def number(value: Any) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)

    figure = given.get("gflops") if isinstance(given, dict) else None
    if isinstance(given, dict) and (figure is None or number(figure) and figure > 0) \
            and number(given.get("lower", -0.67)) and -1 < given.get("lower", -0.67) <= 0:
        reference, note = calibration.reference(given, COMPUTE.name, "gflops", config, environ)
        return reference, None, note
    return None, (f"check-config.json: compute is not a reference ({str(given)[:120]}): expected "
                  "{\"gflops\": a positive number (or null: calibrated), \"lower\": a fraction in (-1, 0], "
                  "\"source\": text}"), None


def compute(run: Run) -> None:
    """The compute check: every rank timed, judged against the others and the site's reference."""
    records = run.all_gather(measure(run))
    for record in records:  # the rate each rank is judged by, for the history and a calibration
        record["judged_gflops"] = round(judged_rate(record), 3)
    ranks = run.ranks if len(run.ranks) == len(records) else [{} for _ in records]
    problems = judge_balance(records, ranks)
    reference, wrong, note = read_reference(run.config)
    off, compared = judge_reference(records, ranks, reference)
    problems += off + ([wrong] if wrong else [])
    details = {"ranks": records, "reference": compared, "reference_note": note, "windows": WINDOWS,
               "window_seconds": WINDOW_SECONDS,
               "definition": "GFLOPS = 2 n^3 per float32 n x n product / seconds, the median of the windows; "
                             "judged on a CPU per the rank's own CPU time (unless throttled or stopped)"}
    if problems:
        run.set(COMPUTE.name, FAILED, problems[0] + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""),
                problems=problems, **details)
        return
    run.set(COMPUTE.name, PASSED, passed_summary(records, compared, note), **details)


def passed_summary(records: list[dict[str, Any]], compared: dict[str, Any] | None, note: str | None = None) -> str:
    """One line for ranks in balance and above the reference: their rates, and the CPU they waited for."""
    rates = [judged_rate(r) for r in records]
    clock = [float(r.get("gflops") or 0.0) for r in records]
    text = f"{len(records)} rank{'s' if len(records) != 1 else ''} at {min(rates):.3g}-{max(rates):.3g} GFLOPS"
    waited = max((r.get("waited_per_s") or 0.0 for r in records), default=0.0)
    if waited >= 0.1:
        text += (f" on their own CPU time ({min(clock):.3g}-{max(clock):.3g} by the clock: they waited up to "
                 f"{waited:.2f} s per second for a CPU that other processes used)")
    source = f"; {compared['source']}" if compared and compared.get("source") else ""
    judged = (f"at least {compared['minimum_gflops']:.3g} (reference {compared['gflops']:g}{source})" if compared
              else note or "not judged against a reference: the site has none")
    return f"{text}, within {SLOW_RANK_FACTOR:g}x of each other; {judged}"
