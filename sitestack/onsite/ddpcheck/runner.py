"""The checks for one rank, walked in the table's order (:data:`.checks.ROWS`), and the run's end: every
rank exits with rank 0's verdict."""

from __future__ import annotations

import contextlib
import importlib
import os
import time
from collections.abc import Callable

from .. import ddp_report
from ..result_schema import exit_code
from .checks import ENVIRONMENT, GROUP, PROCESS_GROUP, ROWS, TORCH, WORLD, CheckRow
from .result_file import write_result
from .state import Run
from .verdicts import FAILED, PASSED, verdict


def _torch_loaded(run: Run) -> bool:
    return bool(run.me)


def _world_size_right(run: Run) -> bool:
    """False when the environment check failed because the launcher started another number of
    ranks than the job expects: those ranks cannot meet."""
    expected = run.args.expect_world_size
    return not (run.checks[ENVIRONMENT.name].status == FAILED and run.info.world_size > 1 and expected
                and expected != run.info.world_size)


def _group_started(run: Run) -> bool:
    return run.pg_ok or run.info.world_size == 1


#: How each need of :data:`.checks.CheckRow.needs` is decided (once, before the first row that has it),
#: the reason the checks it blocks are skipped with, and the check that decided it.
NEEDS: dict[str, tuple[Callable[[Run], bool], str, str]] = {
    TORCH: (_torch_loaded, "not run: the environment check could not start torch", ENVIRONMENT.name),
    WORLD: (_world_size_right, "not run: the world size is wrong, so the ranks cannot meet", ENVIRONMENT.name),
    GROUP: (_group_started, "not run: the process group did not start", PROCESS_GROUP.name),
}


def function_of(row: CheckRow) -> Callable[[Run], object]:
    """The row's function (``"module:function"`` of this package), imported on first use."""
    module, _, name = row.function.partition(":")
    found: Callable[[Run], object] = getattr(importlib.import_module(f".{module}", __package__), name)
    return found


def run_checks(run: Run) -> int:
    """Every row in order; a row whose need is unmet is not run, and the first unmet need skips the
    checks after the one that decided it with its reason (a check that cannot run says why); the exit code."""
    # No watchdog thread: the rank's watchdog is its parent process (see supervise)
    decided: dict[str, bool] = {}
    for row in ROWS:
        if not all(_met(run, need, decided) for need in row.needs):
            continue
        if row.caught:
            with run.timed(row.name):
                function_of(row)(run)
        else:
            function_of(row)(run)
    return finish(run)


def _met(run: Run, need: str, decided: dict[str, bool]) -> bool:
    """Whether ``need`` is met, decided at its first asking; when it is not, the checks after the one
    that decided it are skipped with its reason, and the ranks' reports are this rank's alone."""
    if need not in decided:
        test, reason, after = NEEDS[need]
        decided[need] = test(run)
        if not decided[need]:
            run.skip_rest(reason, after)
            if need != TORCH:  # without torch this rank has no report to give
                run.ranks = [{**run.me, "problems": run.pre_problems}]
    return decided[need]


def finish(run: Run) -> int:
    """Rank 0 writes the report; every rank agrees on the exit code and leaves the process group."""
    code = 0
    run.enter("report")
    if time.monotonic() >= run.deadline:
        # the watchdogs are ending the run and write its result (with where each rank was): what this
        # rank saw since the deadline is their doing, so it writes nothing and waits to be ended
        time.sleep(30)
        return 3
    if run.info.rank == 0:
        result = write_result(run)
        code = exit_code(result)
        print(ddp_report.verdict_table(result), flush=True)
        print(f"sitestack validation {result['verdict'].upper()}: {os.path.join(run.args.out, 'summary.md')}",
              flush=True)
    # every rank exits with rank 0's verdict, and its own failure when it failed alone
    mine = verdict(list(run.checks.values()))
    code = max(code, 0 if mine == PASSED or run.info.rank == 0 else 1)
    if run.pg_ok and run.info.world_size > 1:
        flag = run.torch.tensor([code], dtype=run.torch.int32, device=run.torch_device())
        with contextlib.suppress(Exception):
            run.dist.all_reduce(flag, op=run.dist.ReduceOp.MAX)
            code = int(flag.cpu()[0])
    if run.pg_ok:
        with contextlib.suppress(Exception):
            run.dist.destroy_process_group()
    if run.progress is not None:
        run.progress.enter("finished", state="finished", exit_code=code)
    return code
