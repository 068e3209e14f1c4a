"""The check program's entry point: options, the rank's watchdog, mpi4py before torch, the run, and an
exit that skips the interpreter's teardown."""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import sys
import time
from typing import Any

from ..fileio import ReadError
from . import envvalues, stacks
from .bandwidth import parse_size
from .guard import guard_main
from .mpi import import_mpi
from .rank_progress import Progress, deadline_from_env, monotonic_deadline, status_dir
from .ranks import discover_rank
from .resources import limit_problems, limits
from .runner import run_checks
from .state import Run
from .sweep import sweep_main
from .tune import run_tune
from .tuneplan import PlanError, load_plan, point_dir, point_of
from .verdicts import job_id_for, load_config
from .watchdog import supervise

DESCRIPTION = "sitestack validation check: prove a PyTorch distributed stack works on this site, and how fast."


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The options; defaults from the environment the batch script sets (``SITESTACK_*``)."""
    env = os.environ
    p = argparse.ArgumentParser(description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="check-config.json written by `invoke install-validation-job`")
    p.add_argument("--out", help="result directory (default: $SITESTACK_VALIDATION_OUT or ./sitestack-validation-<job>)")
    p.add_argument("--expect-world-size", type=int, default=envvalues.whole(env, "SITESTACK_EXPECT_WORLD_SIZE", 1),
                   help="ranks the job asked for; a launcher that says otherwise fails the environment check")
    p.add_argument("--cpu-masks", default=env.get("SITESTACK_CPU_MASKS") or None,
                   help="the mask_cpu list the job bound ranks with, by local rank (0xfe,0xfe00,...)")
    p.add_argument("--init-timeout", type=float, default=envvalues.seconds(env, "SITESTACK_INIT_TIMEOUT", 1) or 180,
                   help="seconds to wait for every rank to join the process group")
    p.add_argument("--time-limit", type=float, default=envvalues.seconds(env, "SITESTACK_TIME_LIMIT", 1) or 480,
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
    p.add_argument("--tune", metavar="PLAN", default=None,
                   help="measure the tuning point $SITESTACK_TUNE_POINT of this plan (tune-plan.json) in OUT/points/<id>")
    args = p.parse_args(argv)
    if not args.out:
        job = env.get("SLURM_JOB_ID") or env.get("SITESTACK_JOB_ID") or "local"
        args.out = env.get("SITESTACK_VALIDATION_OUT") or os.path.join(os.getcwd(), f"sitestack-validation-{job}")
    return args


def main(argv: list[str] | None = None) -> int:
    """One rank: its progress record, its watchdog (before MPI_Init and torch), mpi4py, then the checks."""
    args = parse_args(argv)
    config = load_config(args.config)
    plan = None
    if args.tune:  # one point of the sweep: its own directory under the sweep's
        plan = load_plan(args.tune)
        args.out = point_dir(args.out, point_of(plan, os.environ, args.tune)["id"])
    if args.factor is None:
        args.factor = 4 if args.device == "cpu" or not config.get("gpu_vendor") or config.get("gpu_vendor") == "none" else 2
    started = time.monotonic()  # this rank's start, on its own clock (clocks.py compares the ranks' ages)
    info = discover_rank()
    host = socket.gethostname().split(".")[0]
    meta = {"site": config.get("site", "unknown"), "job_id": job_id_for(args.out, os.environ),
            "job_launcher": os.environ.get("SITESTACK_LAUNCHER"), "started": round(time.time(), 3)}
    deadline = deadline_from_env(os.environ, args.time_limit)  # checked before anything is written
    counted = monotonic_deadline(deadline, args.time_limit)  # no wall clock is compared across hosts
    progress = Progress(args.out, info, host, meta)
    progress.save()
    if not args.no_watchdog:  # before MPI_Init and torch: see "Progress and the watchdogs"
        supervise(progress, args.out, counted, args.time_limit, args.expect_world_size)
    # the watchdog asks for this process's stacks at the deadline (stacks.py)
    progress.data["main_thread"] = stacks.register(status_dir(args.out), info.rank)
    # low limits, before MPI_Init: a rank short of open files may never reach the environment check (faults.py)
    progress.data["limit_problems"] = limit_problems(limits())
    progress.enter("MPI_Init")
    mpi, why, failure = import_mpi(info, args, config)
    progress.enter("import torch")
    run = Run(args, config, info, mpi)
    # past the deadline the watchdogs write the result; without them the rank still does
    run.progress, run.deadline = progress, (float("inf") if args.no_watchdog else counted)
    run.started_mono = started
    if "SITESTACK_DEADLINE" in os.environ and not args.no_watchdog:
        run.shared_deadline = deadline
    if why:
        run.mpi_data["skip"] = why
    if failure:
        run.mpi_data["failure"] = failure
    if mpi is not None:
        run.mpi_data["library_short"] = " ".join(mpi.Get_library_version().strip().splitlines()[0].split())
    return run_tune(run, plan) if plan is not None else run_checks(run)


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


def program(argv: list[str]) -> None:
    """``ddp_check.py [OPTIONS]`` runs one rank; ``ddp_check.py --guard ...`` the guard around the launcher;
    ``ddp_check.py --sweep PLAN ...`` the tuning sweep (:mod:`.sweep`). A variable of the environment
    that is not of its form (:mod:`.envvalues`), or a tuning plan that is not (:mod:`.tuneplan`), ends
    it with one line naming it, exit 2; so does a check-config.json that cannot be read (:mod:`..fileio`)."""
    try:
        if argv[:1] == ["--guard"]:
            sys.exit(guard_main(argv[1:]))
        if argv[:1] == ["--sweep"]:
            sys.exit(sweep_main(argv[1:]))
        code = main(argv)
    except (envvalues.EnvError, PlanError, ReadError) as exc:
        print(f"sitestack: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)
    exit_now(code, sys.modules.get("mpi4py.MPI"))
