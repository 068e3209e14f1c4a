"""One point of the tuning sweep, in the ranks (``ddp_check.py --tune PLAN``): the environment check
(recorded, never stopping the point), the process group, then the measurements the plan asks for:
``repeats`` allreduce bus-bandwidth samples at each of its sizes (one sample = the bandwidth check's
timing of ``iters`` allreduces, slowest rank) and ``repeats`` DDP step-time samples (the slowest rank's
mean step time over a few steps of a small model, in ms). Rank 0 writes result.json in the point's
directory with a ``tune`` section; the sweep driver (:mod:`.sweep`) reads it.

Fault injection, for testing the sweep: ``SITESTACK_CHECK_FAULT=hang@R`` makes rank R sleep in the
measurement (the point's time limit passes: a hang), ``crash@R`` makes rank R end itself with SIGSEGV
there (a crash).
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from . import env_check, procgroup
from .bandwidth import allreduce_seconds, bandwidth_row
from .checks import BANDWIDTH, CHECKS, DDP_CHECK, ENVIRONMENT, PROCESS_GROUP
from .runner import finish
from .state import Run
from .verdicts import FAILED, PASSED, SKIPPED, rank_fault

#: The DDP model's width and batch: enough arithmetic per step (about 1.6 GFLOP) that the ranks'
#: threads show in the step time, with gradients small next to it (about 0.5 MiB: one DDP bucket).
WIDTH, BATCH = 256, 2048
#: Steps per DDP sample, after WARMUP_STEPS untimed ones.
STEPS_PER_SAMPLE, WARMUP_STEPS = 4, 2


def run_tune(run: Run, plan: dict[str, Any]) -> int:
    """The point's run; the exit code (0 when every sample was taken)."""
    for name in CHECKS:
        run.set(name, SKIPPED, "not run: a tuning point measures the bandwidth and the DDP step only")
    with run.timed(ENVIRONMENT.name):
        env_check.environment(run)
    if not run.me:
        return finish(run)
    with run.timed(PROCESS_GROUP.name):
        procgroup.process_group(run)
    if not run.pg_ok and run.info.world_size > 1:
        run.ranks = [{**run.me, "problems": run.pre_problems}]
        return finish(run)
    run.ranks = run.all_gather({**run.me, "problems": run.pre_problems})
    with run.timed(ENVIRONMENT.name):
        env_check.environment_after(run)
    environment = run.checks[ENVIRONMENT.name]
    if environment.status == FAILED:  # recorded: a setting may well upset it, and the point is measured all the same
        run.log(f"environment: {environment.summary} (recorded; the point is measured all the same)")
        environment.status, environment.summary = PASSED, f"recorded, not judged at a tuning point: {environment.summary}"
    samples: dict[str, Any] = {"point": os.environ.get("SITESTACK_TUNE_POINT"), "repeats": plan["repeats"],
                               "sizes": list(plan["sizes"]), "busbw_gbs": {}, "step_ms": []}
    run.tune = samples
    with run.timed(BANDWIDTH.name):
        _busbw_samples(run, plan, samples["busbw_gbs"])
    with run.timed(DDP_CHECK.name):
        _step_samples(run, plan, samples["step_ms"])
    return finish(run)


def _inject(run: Run) -> None:
    """The faults ``SITESTACK_CHECK_FAULT`` asks of this rank in the measurement."""
    if rank_fault(run.env, "crash", run.info.rank):
        run.note("crash injected (SITESTACK_CHECK_FAULT)", 0)
        os.kill(os.getpid(), signal.SIGSEGV)
    if rank_fault(run.env, "hang", run.info.rank):
        run.note("hang injected (SITESTACK_CHECK_FAULT)", 0)
        while True:  # until the watchdog ends this rank at the point's deadline
            time.sleep(1)


def _busbw_samples(run: Run, plan: dict[str, Any], out: dict[str, list[float]]) -> None:
    """``repeats`` busbw samples (GB/s, nccl-tests' definition, slowest rank) at each size of the plan."""
    torch, n = run.torch, run.info.world_size
    if n < 2:
        run.set(BANDWIDTH.name, SKIPPED, "a single rank: nothing to measure")
        return
    gpu = run.dev.kind != "cpu"
    iters = run.args.iters or (20 if gpu else 5)
    warmup = run.args.warmup if run.args.warmup is not None else (5 if gpu else 2)
    _inject(run)
    tick = 0
    for size in plan["sizes"]:
        t = torch.zeros(size // 4, dtype=torch.float32, device=run.torch_device())
        samples = []
        for i in range(plan["repeats"]):
            tick += 1
            run.note(f"allreduce {size} bytes, sample {i + 1}", tick)
            seconds = allreduce_seconds(run, t, iters, warmup if i == 0 else 0)
            samples.append(round(bandwidth_row(size, seconds, n)["busbw_gbs"], 6))
        out[str(size)] = samples
        del t
    run.set(BANDWIDTH.name, PASSED, f"{plan['repeats']} busbw samples at each of {len(plan['sizes'])} sizes",
            iters=iters, warmup=warmup)


def _step_samples(run: Run, plan: dict[str, Any], out: list[float]) -> None:
    """``repeats`` DDP step-time samples: the slowest rank's mean over STEPS_PER_SAMPLE steps, in ms."""
    torch, dist = run.torch, run.dist
    from torch.nn.parallel import DistributedDataParallel as DDP  # type: ignore[import-not-found, unused-ignore]

    dev = run.torch_device()
    torch.manual_seed(1234)
    model = torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh(), torch.nn.Linear(WIDTH, WIDTH),
                                torch.nn.Tanh(), torch.nn.Linear(WIDTH, 1)).to(dev)
    ids = [run.dev.index] if run.dev.kind != "cpu" and run.dev.index is not None else None
    net = DDP(model, device_ids=ids) if run.info.world_size > 1 else model
    optim = torch.optim.SGD(net.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(1000 + run.info.rank)
    x, y = torch.randn(BATCH, WIDTH, generator=gen).to(dev), torch.randn(BATCH, 1, generator=gen).to(dev)

    def step() -> None:
        optim.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        optim.step()

    for _ in range(WARMUP_STEPS):
        step()
    for i in range(plan["repeats"]):
        run.note(f"DDP steps, sample {i + 1}", 1000 + i)
        run.sync()
        run.barrier()
        start = time.perf_counter()
        for _ in range(STEPS_PER_SAMPLE):
            step()
        run.sync()
        mean = torch.tensor([(time.perf_counter() - start) / STEPS_PER_SAMPLE], dtype=torch.float64, device=dev)
        if run.info.world_size > 1:
            dist.all_reduce(mean, op=dist.ReduceOp.MAX)
        out.append(round(float(mean.cpu()) * 1000, 4))
    run.set(DDP_CHECK.name, PASSED, f"{plan['repeats']} step-time samples of {STEPS_PER_SAMPLE} DDP steps "
            f"({WIDTH}-wide MLP, batch {BATCH})", steps_per_sample=STEPS_PER_SAMPLE)
