"""One rank's run: what it knows (rank, device, the ranks' reports, the checks so far) and the helpers
every check shares (record a result, gather from all ranks, synchronise the device)."""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import time
import traceback
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

from ..result_schema import Result
from .checks import CHECKS, KEEP_NOT_RUN
from .devices import Device
from .rank_progress import Progress
from .ranks import RankInfo
from .verdicts import FAILED, SKIPPED, Check


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
        self.horovod_server: Any = None  # rank 0's Horovod rendezvous where the launcher gives none
        self.result: Result | None = None
        self.trained: tuple[Any, Any, list[tuple[Any, Any]]] | None = None  # the ddp check's model, for the checkpoint check
        self.tune: dict[str, Any] | None = None  # a tuning point's samples (tune.py), else None
        self.progress: Progress | None = None  # OUT/ranks/rank-R.json, read by the watchdogs
        self.deadline = float("inf")  # the job's deadline (time.monotonic()): past it, the watchdogs report
        self.shared_deadline: float | None = None  # $SITESTACK_DEADLINE (epoch s on rank 0's host), where set
        self.started_mono = time.monotonic()  # when this rank's program started (main sets it before the fork)
        self.me: dict[str, Any] = {}  # this rank's report, once the environment check has loaded torch
        self.pre_problems: list[str] = []  # what this rank alone found wrong (the environment check)

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
            # past the deadline a check fails because the watchdogs are ending the ranks: a symptom, not news
            late = time.monotonic() >= self.deadline
            checks = [asdict(c) for c in self.checks.values()] if self.info.rank == 0 and not late else None
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
        """Mark the checks after ``after`` that have not run skipped with ``reason`` (but those whose
        row keeps "not run": :data:`.checks.KEEP_NOT_RUN`)."""
        later = CHECKS[CHECKS.index(after) + 1:]
        for name in later:
            if self.checks[name].summary == "not run" and name not in KEEP_NOT_RUN:
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



    @property
    def dev(self) -> Device:
        """The device the environment check chose (every later check runs after it)."""
        if self.device is None:
            raise RuntimeError("no device: the environment check has not run")
        return self.device

    def torch_device(self) -> Any:
        """This rank's ``torch.device``."""
        return self.torch.device(self.dev.kind, self.dev.index) if self.dev.index is not None else self.torch.device("cpu")


    def barrier(self) -> None:
        if self.pg_ok and self.info.world_size > 1:
            self.dist.barrier()
