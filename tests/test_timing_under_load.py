"""The checks that judge time, run while other processes keep every CPU of the machine busy (one busy
loop per CPU, as another user's job or another test run on a shared node): a healthy job still passes
every check, the compute check included; the regression judgement compares its compute rate with
healthy runs made under the same load (like with like); and a rank held to 10% of
a CPU still fails the compute check, and the rate it is judged by falls far below the healthy runs', so
none of this passes by judging nothing.

Why they hold (docs/validation.md, docs/history.md): the compute check judges a CPU rank on its own
CPU time (sitestack/onsite/ddpcheck/compute.py: judged_rate), which another process's load does not
change while a stop or a quota does; the regression judgement compares that same rate (the slowest
rank's), only with runs of the same stack and layout, names a drop beyond the healthy runs' own spread
and FAILs only 30% below the worst of them (sitestack/engine/regression.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sitestack.engine import regression
from sitestack.onsite import history
from tests.test_faults import HEALTHY_LIMIT, assert_fault, duty_cycle, run_job
from tests.test_history_e2e import HOG_SESSION

pytestmark = pytest.mark.integration

#: Healthy runs under the load: the first five are the history the last one is judged against (five: their
#: spread, which the judgement allows, is what this load does to a healthy run here).
HEALTHY_RUNS = 6


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` (/proc/PID/stat fields 14 and 15, proc(5))."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.fixture(scope="module")
def cpu_hogs() -> Iterator[list[subprocess.Popen[bytes]]]:
    """One ``while True: pass`` process per CPU this process may run on, each in a session of its own as
    another user's process is (HOG_SESSION), running while the module's tests run (each has used CPU
    time before the first test starts), killed afterwards."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], **HOG_SESSION) for _ in os.sched_getaffinity(0)]
    try:
        deadline = time.monotonic() + 30
        while not all(cpu_seconds(h.pid) > 0.05 for h in hogs):
            assert time.monotonic() < deadline, "the CPU hogs did not start running"
            time.sleep(0.05)
        yield hogs
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def compute_records(result: dict) -> list[dict]:
    return next(c for c in result["checks"] if c["name"] == "compute")["details"]["ranks"]


def record_of(result: dict, n: int) -> dict:
    """The history record ``invoke validate`` would append for ``result`` (sitestack/onsite/history.py)."""
    return history.record_from_result({**result, "job_id": f"hog-{n}"}, "validation", None)


@pytest.fixture(scope="module")
def healthy(installed_local_job, cpu_hogs, tmp_path_factory) -> list:
    """HEALTHY_RUNS runs of the healthy job (mpiexec, 2 ranks) under the hogs, one after the other."""
    runs = [run_job(installed_local_job, tmp_path_factory.mktemp(f"hogged-{n}"), SITESTACK_TIME_LIMIT=str(HEALTHY_LIMIT))
            for n in range(HEALTHY_RUNS)]
    assert all(h.poll() is None for h in cpu_hogs), "a CPU hog ended before the runs did"
    return runs


def test_a_healthy_job_passes_every_check_beside_a_cpu_hog(healthy) -> None:
    for run in healthy:
        assert run.rc == 0 and run.result and run.result["verdict"] == "passed", run.log[-4000:]
        assert not run.left, run.left
        checks = {c["name"]: c for c in run.result["checks"]}
        assert checks["compute"]["status"] == "passed", checks["compute"]["summary"]
    # the load was there: the ranks waited for a CPU, and their rate by the clock fell below their own
    records = [r for run in healthy for r in compute_records(run.result)]
    assert max(r["waited_per_s"] for r in records) >= 0.2, records
    assert min(r["gflops"] / r["gflops_own"] for r in records) < 0.8, records
    print(f"under {os.cpu_count()} hogs: {[round(run.seconds, 1) for run in healthy]} s per run; compute "
          f"{[(r['gflops'], r['gflops_own'], r['waited_per_s']) for r in records]} (clock, own, waited)")


def test_regression_compares_a_healthy_run_with_runs_under_the_same_load(healthy) -> None:
    """The last healthy run is judged against the ones before it, all under the hogs: of the same stack
    and layout, every one of them and only those, named exactly where the slowest rank's judged rate (on
    its own CPU time) fell beyond their spread, and never a FAIL: the load that comes and goes on the
    machine does not move that rate (seen by the clock: 31% below the median when the load average rose
    from 5 to 83 during the last run, which failed the old judgement by the clock)."""
    records = [record_of(run.result, n) for n, run in enumerate(healthy)]
    report = regression.judge(records[-1], records[:-1])
    compute = report["metrics"]["compute_judged_min_gflops"]
    assert compute["runs"] == HEALTHY_RUNS - 1, report
    named = compute["status"] in ("warn", "fail")
    assert named == (compute["median"] - compute["value"] > compute["spread"]), report["lines"]
    assert report["status"] != "fail", report["lines"]
    print("\n".join(report["lines"]))


def test_a_stopped_rank_still_fails_beside_a_cpu_hog(installed_local_job, healthy, cpu_hogs, tmp_path) -> None:
    """Rank 1 held to 10% of a CPU (SIGSTOP/SIGCONT): the compute check names it, and its rate by the
    clock is far below the healthy runs under the same load, named where beyond their spread."""
    stop = threading.Event()
    try:
        run = run_job(installed_local_job, tmp_path, during=duty_cycle(10, stop))
    finally:
        stop.set()
    assert all(h.poll() is None for h in cpu_hogs), "a CPU hog ended before the run did"
    assert_fault(run, "compute: slow rank: rank 1 on", "slower than the other ranks", "stopped part of the time")
    baseline = [record_of(r.result, n) for n, r in enumerate(healthy)]
    report = regression.judge(record_of(run.result, len(baseline)), baseline)
    compute = report["metrics"]["compute_judged_min_gflops"]
    # judged by the clock (it was stopped), the stopped rank is far below the healthy runs made under the same load ...
    assert compute["runs"] == HEALTHY_RUNS and compute["value"] < 0.5 * compute["median"], report
    # ... and named wherever that is beyond their spread: other work that came and went on the machine
    # while the healthy runs ran widens it (seen: load average 60, healthy runs 29-61 GFLOPS), by design
    if compute["median"] - compute["value"] > compute["spread"]:
        assert compute["status"] in ("warn", "fail"), report["lines"]
    print("\n".join(report["lines"]), f"(spread {compute['spread']:.3g})")
