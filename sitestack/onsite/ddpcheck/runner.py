"""The order of the checks for one rank, and its end: every rank exits with rank 0's verdict."""

from __future__ import annotations

import contextlib
import os
import time

from .. import ddp_report
from ..result_schema import exit_code
from . import bandwidth, collectives, compute, env_check, horovodcheck, mpichecks, netplugin, procgroup, training
from .affinity import judge_affinity, parse_masks
from .libraries import judge_libraries, record_libraries, record_libraries_again
from .result_file import write_result
from .state import Run
from .verdicts import FAILED, PASSED, SKIPPED, verdict


def run_checks(run: Run) -> int:
    """Every check in order (a check that cannot run is skipped with its reason); the exit code."""
    # No watchdog thread: the rank's watchdog is its parent process (see supervise)
    with run.timed("environment"):
        env_check.environment(run)
    if not run.me:  # torch itself did not load
        run.skip_rest("not run: the environment check could not start torch", "environment")
        return finish(run)
    if run.checks["environment"].status == FAILED and run.info.world_size > 1 and run.args.expect_world_size \
            and run.args.expect_world_size != run.info.world_size:
        run.skip_rest("not run: the world size is wrong, so the ranks cannot meet", "environment")
        run.ranks = [{**run.me, "problems": run.pre_problems}]
        return finish(run)
    with run.timed("process-group"):
        procgroup.process_group(run)
    if not run.pg_ok and run.info.world_size > 1:
        run.skip_rest("not run: the process group did not start", "process-group")
        run.ranks = [{**run.me, "problems": run.pre_problems}]
        with run.timed("mpi-probe"):
            mpichecks.mpi_probe(run)
        return finish(run)
    with run.timed("environment"):
        record_libraries(run)
    run.ranks = run.all_gather({**run.me, "problems": run.pre_problems})
    with run.timed("environment"):
        env_check.environment_after(run)
        judge_libraries(run)
    with run.timed("affinity"):
        masks = parse_masks(run.args.cpu_masks) if run.args.cpu_masks else None
        status, summary, lines = judge_affinity(run.ranks, run.config, masks)
        run.set("affinity", status, summary, ranks=lines)
    with run.timed("compute"):
        compute.compute(run)
    with run.timed("collectives"):
        collectives.collectives(run)
    with run.timed("environment"):  # the libraries NCCL/RCCL open at their first collective (libraries.py)
        record_libraries_again(run)
    ddp_state = None
    with run.timed("ddp"):
        ddp_state = training.ddp(run)
    with run.timed("checkpoint"):
        if ddp_state is None:
            run.set("checkpoint", SKIPPED, "not run: the DDP check did not finish")
        else:
            training.checkpoint(run, *ddp_state)
    with run.timed("bandwidth"):
        bandwidth.bandwidth_sweep(run)
    with run.timed("net-plugin"):
        run.barrier()
        netplugin.net_plugin(run)
    with run.timed("mpi-probe"):
        mpichecks.mpi_probe(run)
    with run.timed("mpi4py"):
        mpichecks.mpi4py_check(run)
    with run.timed("horovod"):
        horovodcheck.horovod(run)
    return finish(run)


def finish(run: Run) -> int:
    """Rank 0 writes the report; every rank agrees on the exit code and leaves the process group."""
    code = 0
    run.enter("report")
    if time.time() >= run.deadline:
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
