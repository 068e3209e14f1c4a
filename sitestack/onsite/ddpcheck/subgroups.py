"""A second process group, as tensor- and pipeline-parallel jobs make (``torch.distributed.new_group``):
the even and the odd ranks where the world has at least two of each, else a second group of every
rank; an all-reduce on each, checked. An error there fails the process-group check naming the group
and the rank; a hang is named by the watchdogs, whose record of each rank says which group it was in."""

from __future__ import annotations

from typing import Any

from .checks import PROCESS_GROUP
from .state import Run
from .verdicts import FAILED, PASSED


def layouts(world: int) -> list[tuple[str, list[int]]]:
    """The subgroups of a world of ``world`` ranks, by name: even and odd ranks from four ranks on (the
    columns of a 2-D mesh of data and model parallelism), else one second group of every rank (a
    group of one rank would run no collective at all); none for a single rank."""
    if world < 2:
        return []
    if world >= 4:
        return [("even", list(range(0, world, 2))), ("odd", list(range(1, world, 2)))]
    return [("second", list(range(world)))]


def subgroups(run: Run) -> None:
    """Every rank builds every subgroup (new_group is collective over the whole world, in one order:
    torch.distributed's docs, "new_group"), all-reduces its rank + 1 in its own, and the ranks'
    outcomes are gathered: rank 0 fails the process-group check with each rank's error."""
    groups = layouts(run.info.world_size)
    if not groups:
        return
    built: list[tuple[str, list[int], Any]] = []
    mine: str | None = None
    for tick, (name, members) in enumerate(groups):
        run.note(f"subgroup {name} of ranks {members}: new_group", tick)
        try:
            built.append((name, members, run.dist.new_group(ranks=members)))
        except Exception as exc:  # noqa: BLE001  (the error, with the group, is the result)
            mine = f"subgroup {name} of ranks {members}: new_group failed: {_first_line(exc)}"
            break
    for name, members, group in built if mine is None else []:
        if run.info.rank in members:
            run.note(f"subgroup {name} of ranks {members}: all_reduce", len(groups))
            mine = _all_reduce(run, group, f"subgroup {name} of ranks {members}", members)
    outcomes = run.all_gather({"rank": run.info.rank, "host": run.host, "error": mine})
    _judge(run, groups, outcomes)


def _all_reduce(run: Run, group: Any, words: str, members: list[int]) -> str | None:
    """One all-reduce of rank + 1 on ``group``: None when it summed right, else what went wrong."""
    tensor = run.torch.tensor([float(run.info.rank + 1)], device=run.torch_device())
    try:
        run.dist.all_reduce(tensor, group=group)
        run.sync()
    except Exception as exc:  # noqa: BLE001
        return f"{words}: all_reduce failed: {_first_line(exc)}"
    want = float(sum(m + 1 for m in members))
    got = float(tensor.cpu()[0])
    return None if got == want else f"{words}: all_reduce got {got:g}, expected {want:g}"


def _judge(run: Run, groups: list[tuple[str, list[int]]], outcomes: list[dict[str, Any]]) -> None:
    """Fail the process-group check with every rank's subgroup error, else add the subgroups to its summary."""
    check = run.checks[PROCESS_GROUP.name]
    errors = [f"rank {o['rank']} on {o['host']}: {o['error']}" for o in outcomes if o.get("error")]
    check.details["subgroups"] = {name: members for name, members in groups}
    if errors:
        run.set(PROCESS_GROUP.name, FAILED, "; ".join(errors[:4]) + (f" (and {len(errors) - 4} more)" if len(errors) > 4 else ""))
    elif check.status == PASSED:
        named = " and ".join(f"{name} {members}" for name, members in groups)
        check.summary += f"; subgroup{'s' if len(groups) > 1 else ''} {named}: all_reduce right"


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0][:400] if str(exc) else type(exc).__name__
