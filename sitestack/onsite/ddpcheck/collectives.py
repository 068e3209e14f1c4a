"""The collectives check: all-reduce (sum), all-gather, reduce-scatter and broadcast give exactly the
right values at every size of the bandwidth sweep, in float32 and in the half types training reduces.

The contract:

- Sizes: those of the bandwidth sweep (:func:`bandwidth.run_sizes`: ``--min-bytes``/``--max-bytes``/
  ``--factor`` and their defaults), each checked once and the largest :data:`REPEATS` times: a library
  can be wrong at large sizes only, and only some of the time (NVIDIA/nccl#2001: all-reduce wrong in
  about 30% of runs at large sizes, fixed by NVIDIA/nccl PR #2053). A size is the bytes of the
  operation's whole buffer in its dtype, as nccl-tests counts them
  (https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md): all-reduce and broadcast the
  buffer, all-gather its output, reduce-scatter its input; at least one element per rank.
- Values: small non-negative integers (:func:`base_period`) whose sum over the ranks is exact in the
  dtype, so the exact result is known and any difference is the library's error. Output buffers start
  at -1 (never a right value), so a call that writes nothing is wrong everywhere.
- Each rank counts the wrong elements of its own result for every operation, dtype, size and
  iteration; one wrong element fails the check, naming the rank, size, dtype, operation and iteration.
- An operation and dtype the backend refuses at its first (smallest) call, with words that say it is
  not supported, is recorded as such with the backend's words and named in the summary; any other
  error fails the check.
- result.json (``checks[collectives].details``): ``sizes``, ``repeats``, ``ops``, ``dtypes``,
  ``unsupported`` ({op: {dtype: reason}}), ``wrong_elements`` (per rank, in all), ``wrong`` (by rank:
  {op: {dtype: {bytes: count}}}, non-zero counts only) and ``problems`` (the first wrong results).

Fault injection (``SITESTACK_CHECK_FAULT``, :func:`verdicts.rank_fault`): ``allreduce@R`` adds 1 to
rank R's all-reduce contributions; ``collective-large@R`` spoils one element of rank R's float32
all-reduce result at the largest size, in its last iteration only; ``collective-half@R`` one element
of rank R's all-gather result in every half type, at every size.
"""

from __future__ import annotations

import re
from typing import Any

from .. import ddp_report
from .bandwidth import run_sizes
from .checks import COLLECTIVES
from .state import Run
from .verdicts import FAILED, PASSED, rank_fault

OPS = ("all-reduce", "all-gather", "reduce-scatter", "broadcast")
HALF = ("bfloat16", "float16")
DTYPES = ("float32", *HALF)
#: Every integer from 0 to 2**p is exact in a binary float with p significand bits (the implicit bit
#: counted): float32 24, float16 11 (IEEE 754 binary16), bfloat16 8
#: (https://cloud.google.com/tpu/docs/bfloat16). A sum of non-negative integers at most this bound is
#: exact in every order the library adds them (each partial sum is smaller), so bf16 sums stay <= 256.
EXACT = {"float32": 1 << 24, "bfloat16": 1 << 8, "float16": 1 << 11}
#: The values' periods: primes, so no power-of-two chunk of the values repeats another rank's (a chunk
#: delivered to the wrong rank or place shows); the first that does not divide the world size, so the
#: sums differ from element to element (no world size is a multiple of all of them).
PERIODS = (251, 257, 263, 269, 271)
#: Iterations at the largest size (once at every other).
REPEATS = 3
#: Wrong results a rank describes one by one (its counts cover the rest).
KEPT = 8
#: What backends say when they lack an operation or dtype (gloo: "ProcessGroupGloo does not support
#: reduce_scatter" before pytorch/pytorch#149869; NCCL: "Unsupported ... dtype").
UNSUPPORTED = re.compile(r"not support|unsupported|not implemented", re.I)


def base_period(dtype: str, world: int) -> list[int]:
    """One period of rank 0's values (rank r's are these rotated by r: element k is
    ``base[(k + r) % len(base)]``), chosen so the sum over ``world`` ranks stays <= :data:`EXACT`."""
    bound = EXACT[dtype]
    top = min(bound // world, PERIODS[0] - 1)  # `world` ranks adding at most `top` each stay within the bound
    if top >= 1:
        period = next(p for p in PERIODS if world % p)
        return [j % (top + 1) for j in range(period)]
    # more ranks than exact integers: a 1 from every `step`-th rank at each element, at most `bound` of them;
    # a step that is odd (chunks of a power-of-two length still differ) and does not divide the world size
    step = -(-world // bound) | 1
    while world % step == 0:
        step += 2
    return [int(j % step == 0) for j in range(step)]


def summed_period(base: list[int], world: int) -> list[int]:
    """The period of the sum over ``world`` ranks (rank r's values: ``base`` rotated by r)."""
    length = len(base)
    cycles, rest = divmod(world, length)
    return [cycles * sum(base) + sum(base[(k + j) % length] for j in range(rest)) for k in range(length)]


def repeats(size: int, largest: int) -> int:
    return REPEATS if size == largest else 1


def spoiled(env: dict[str, str], rank: int, where: tuple[str, str, int, int], largest: int) -> bool:
    """Whether the test kit's faults spoil this rank's result at ``where`` (op, dtype, size, iteration)."""
    if rank_fault(env, "collective-large", rank) and where == ("all-reduce", "float32", largest, REPEATS):
        return True
    return rank_fault(env, "collective-half", rank) and where[0] == "all-gather" and where[1] in HALF


# -- one rank ------------------------------------------------------------------------------------------

def tile(period: Any, start: int, count: int) -> Any:
    """``count`` values of the periodic sequence ``period`` from its element ``start`` on."""
    length = period.numel()
    return period.roll(-(start % length)).repeat(-(-count // length))[:count]


class Values:
    """The period tensors of one dtype on the rank's device: reduced (what a rank adds), their sum,
    and plain (all-gather and broadcast, which add nothing)."""

    def __init__(self, run: Run, dtype: str) -> None:
        torch, n = run.torch, run.info.world_size
        self.dtype = getattr(torch, dtype)
        self.itemsize = int(torch.empty(0, dtype=self.dtype).element_size())

        def tensor(values: list[int]) -> Any:
            return torch.tensor(values, dtype=self.dtype, device=run.torch_device())

        base = base_period(dtype, n)
        self.reduced, self.sums, self.plain = tensor(base), tensor(summed_period(base, n)), tensor(base_period(dtype, 1))


def newest(dist: Any, *names: str) -> Any:
    """The first of ``names`` this torch.distributed has: the one-buffer all-gather and reduce-scatter
    that FSDP calls, by their newest names (torch 2.13 warns that ``all_gather_into_tensor`` and
    ``reduce_scatter_tensor`` are deprecated for ``*_single``)."""
    return next((getattr(dist, name) for name in names if hasattr(dist, name)), getattr(dist, names[-1]))


def call(run: Run, op: str, values: Values, size: int) -> tuple[Any, Any]:
    """One collective of ``size`` bytes: (this rank's result, the exact result)."""
    torch, dist, n, r = run.torch, run.dist, run.info.world_size, run.info.rank
    count = max(1, size // values.itemsize)
    chunk = max(1, count // n)  # all-gather's output and reduce-scatter's input hold n chunks

    def unset(length: int) -> Any:
        return torch.full((length,), -1, dtype=values.dtype, device=run.torch_device())

    if op == "all-reduce":
        got = tile(values.reduced, r, count)
        if rank_fault(run.env, "allreduce", r):
            got += 1
        dist.all_reduce(got)
        return got, tile(values.sums, 0, count)
    if op == "reduce-scatter":
        got = unset(chunk)
        newest(dist, "reduce_scatter_single", "reduce_scatter_tensor")(got, tile(values.reduced, r, n * chunk))
        return got, tile(values.sums, r * chunk, chunk)
    if op == "all-gather":
        got = unset(n * chunk)
        newest(dist, "all_gather_single", "all_gather_into_tensor")(got, tile(values.plain, r * chunk, chunk))
        return got, tile(values.plain, 0, n * chunk)
    want, root = tile(values.plain, 0, count), n - 1  # broadcast from the last rank: not rank 0's default
    got = want.clone() if r == root else unset(count)
    dist.broadcast(got, src=root)
    return got, want


def wrong_elements(got: Any, want: Any) -> dict[str, Any] | None:
    """None when ``got`` is ``want`` exactly; else how many elements differ and the first."""
    differ = got != want
    wrong = int(differ.count_nonzero())
    if not wrong:
        return None
    first = int(differ.nonzero()[0][0])
    return {"wrong": wrong, "elements": int(got.numel()), "index": first,
            "got": float(got[first]), "expected": float(want[first])}


def check_rank(run: Run, sizes: list[int]) -> dict[str, Any]:
    """This rank's findings: wrong counts {op: {dtype: {bytes: n}}}, the first wrong results, and
    the operations and dtypes the backend does not support."""
    report: dict[str, Any] = {"wrong": {}, "first": [], "unsupported": {}}
    for index, dtype in enumerate(DTYPES):
        values = Values(run, dtype)
        for tick, size in enumerate(sizes, start=index * len(sizes)):
            # where a hang happened, for the watchdogs (one note per size: each is a file written)
            run.note(f"{dtype} at {ddp_report.human_bytes(size)}", tick)
            for op in OPS:
                if dtype in report["unsupported"].get(op, {}):
                    continue
                for iteration in range(1, repeats(size, sizes[-1]) + 1):
                    try:
                        got, want = call(run, op, values, size)
                    except (RuntimeError, ValueError, TypeError) as exc:
                        if size != sizes[0] or not UNSUPPORTED.search(str(exc)):
                            raise
                        report["unsupported"].setdefault(op, {})[dtype] = str(exc).strip().splitlines()[0][:200]
                        break
                    where = (op, dtype, size, iteration)
                    if spoiled(run.env, run.info.rank, where, sizes[-1]):
                        got[got.numel() // 2] = -1
                    record(report, where, wrong_elements(got, want), repeats(size, sizes[-1]))
    return report


def record(report: dict[str, Any], where: tuple[str, str, int, int], found: dict[str, Any] | None,
           iterations: int) -> None:
    """Add one wrong result (``found``) to the rank's report."""
    if found is None:
        return
    op, dtype, size, iteration = where
    by_size = report["wrong"].setdefault(op, {}).setdefault(dtype, {})
    by_size[str(size)] = by_size.get(str(size), 0) + found["wrong"]
    if len(report["first"]) < KEPT:
        report["first"].append({"op": op, "dtype": dtype, "bytes": size, "iteration": iteration,
                                "iterations": iterations, **found})


# -- the verdict ---------------------------------------------------------------------------------------

def describe(rank: int, found: dict[str, Any]) -> str:
    """``rank 1: all-reduce float32 at 4 MiB, iteration 3 of 3: 1 of 1048576 elements wrong (...)``."""
    return (f"rank {rank}: {found['op']} {found['dtype']} at {ddp_report.human_bytes(found['bytes'])}, iteration "
            f"{found['iteration']} of {found['iterations']}: {found['wrong']} of {found['elements']} elements "
            f"wrong (element {found['index']} is {found['got']:g}, expected {found['expected']:g})")


def total(counts: dict[str, Any]) -> int:
    return sum(c for by_dtype in counts.values() for by_size in by_dtype.values() for c in by_size.values())


def judge(reports: list[dict[str, Any]], sizes: list[int], backend: str) -> tuple[str, str, dict[str, Any]]:
    """The check's status, summary and details from every rank's report (:func:`check_rank`), by rank."""
    unsupported: dict[str, dict[str, str]] = {}
    for report in reports:
        for op, reasons in report["unsupported"].items():
            unsupported.setdefault(op, {}).update(reasons)
    wrong = [total(report["wrong"]) for report in reports]
    problems = [describe(rank, found) for rank, report in enumerate(reports) for found in report["first"]]
    details = {"sizes": sizes, "repeats": {str(size): repeats(size, sizes[-1]) for size in sizes}, "ops": list(OPS),
               "dtypes": list(DTYPES), "unsupported": unsupported, "wrong_elements": wrong,
               "wrong": {str(rank): report["wrong"] for rank, report in enumerate(reports) if report["wrong"]},
               "problems": problems}
    lacking = "; ".join(f"{op} in {', '.join(reasons)} not supported by {backend} ({next(iter(reasons.values()))})"
                        for op, reasons in unsupported.items())
    if not sizes:
        return FAILED, "no sizes to check: the bandwidth sweep is empty (--min-bytes above --max-bytes)", details
    if any(wrong):
        ranks = [str(rank) for rank, count in enumerate(wrong) if count]
        more = f"; {sum(wrong)} wrong elements in all, on rank{'s' if len(ranks) > 1 else ''} {', '.join(ranks)}"
        return FAILED, problems[0] + (more if sum(wrong) > 1 or len(problems) > 1 else ""), details
    span = (f"{len(sizes)} sizes {ddp_report.human_bytes(sizes[0])}-{ddp_report.human_bytes(sizes[-1])} "
            f"({REPEATS} times at {ddp_report.human_bytes(sizes[-1])})")
    summary = f"{', '.join(OPS)} exact in {', '.join(DTYPES)} at {span} on all {len(reports)} ranks"
    return PASSED, summary + (f"; {lacking}" if lacking else ""), details


def collectives(run: Run) -> None:
    """The collectives check (this module's contract): every rank checks its results, rank 0 judges."""
    sizes = run_sizes(run)
    reports = run.all_gather(check_rank(run, sizes))
    status, summary, details = judge(reports, sizes, run.dev.backend)
    run.set(COLLECTIVES.name, status, summary, **details)
