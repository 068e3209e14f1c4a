"""The tuning sweep job for real on this machine: the plan the install step writes, then the sweep
(``jobs/tune-<launcher>.sbatch``) with real gloo ranks, without a scheduler (mpiexec, run with bash) and
on the test Slurm cluster (sbatch, one srun job step per point), with candidates that hang, crash and
fail for real: each is recorded with its cause, and the sweep goes on to its end."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from sitestack.engine import playbook as pb
from sitestack.model.facts import Tuning, TuningVariable
from sitestack.validation.tune_jobs import tune_plan

pytestmark = pytest.mark.integration


def plan_file(tmp_path: Path, repeats: int = 5, point_time: str = "00:00:40", **variables: list[str]) -> tuple[Path, dict]:
    """A plan from the local site's facts with ``variables`` (name -> candidates) to try, as the install
    step derives it (tune_plan), with short points and two message sizes."""
    facts = pb.load("local").facts
    tuning = Tuning(variables={k: TuningVariable(candidates=tuple(v)) for k, v in variables.items()},
                    sizes=(65536, 1048576), repeats=repeats, point_time=point_time)
    plan = tune_plan("local", dataclasses.replace(facts, tuning=tuning))
    assert plan is not None
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    return path, plan


def assert_sweep(out: Path, plan: dict, expected: dict[str, str]) -> dict:
    """sweep.json: every point of the plan with the status ``expected`` gives it (by label), causes for
    the points that did not measure, ``repeats`` samples per size for those that did."""
    sweep = json.loads((out / "sweep.json").read_text())
    assert sweep["schema"] == "sitestack-sweep/1" and sweep["finished"] is True and sweep["plan"] == plan
    assert [p["id"] for p in sweep["points"]] == [p["id"] for p in plan["points"]]
    got = {p["label"]: p for p in sweep["points"]}
    assert {label: p["status"] for label, p in got.items()} == expected, json.dumps(sweep["points"], indent=1)
    for point in sweep["points"]:
        assert (out / "points" / point["id"] / "result.json").is_file()
        if point["status"] == "ok":
            assert point["cause"] is None
            assert sorted(point["busbw_gbs"]) == sorted(str(s) for s in plan["sizes"])
            assert all(len(v) == plan["repeats"] and min(v) > 0 for v in point["busbw_gbs"].values())
            assert len(point["step_ms"]) == plan["repeats"] and min(point["step_ms"]) > 0
        else:
            assert point["cause"] and point["busbw_gbs"] == {} and point["step_ms"] == []
    assert sweep["backend"] == "gloo" and sweep["device"] == "cpu" and sweep["world_size"] == 2
    return sweep


def test_the_sweep_without_a_scheduler_records_a_crash_and_goes_on(installed_local_job, tmp_path):
    job = installed_local_job
    assert (job["dir"] / "tune-plan.json").is_file() and (job["dir"] / "jobs" / "tune-mpiexec.sbatch").is_file()
    path, plan = plan_file(tmp_path, OMP_NUM_THREADS=["2"], SITESTACK_CHECK_FAULT=["crash@1"])
    out = tmp_path / "out"
    env = {**os.environ, **job["env"], "SITESTACK_PYTHON": job["python"], "SITESTACK_VALIDATION_OUT": str(out),
           "SITESTACK_TUNE_PLAN": str(path), "SITESTACK_CHECK_FAULT": "seed@0"}   # unset by the driver at every point
    for name in ("SLURM_JOB_ID", "SLURM_JOB_NODELIST"):
        env.pop(name, None)
    run = subprocess.run(["bash", str(job["dir"] / "jobs" / "tune-mpiexec.sbatch")], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=400)
    log = run.stdout + run.stderr
    assert run.returncode == 0, log
    assert run.stdout.rstrip().splitlines()[-1] == "sitestack tune: sweep written, exit code 0"
    sweep = assert_sweep(out, plan, {"default": "ok", "default (again)": "ok", "OMP_NUM_THREADS=2": "ok",
                                     "SITESTACK_CHECK_FAULT=crash@1": "crashed"})
    crash = sweep["points"][2]
    assert "rank 1" in crash["cause"] and "SIGSEGV" in crash["cause"], crash
    # each point had its own port, of the sweep's range (30000-32699), not the validation job's
    ports = [int(json.loads((out / "points" / p["id"] / "result.json").read_text())["ranks"][0]["master"].rsplit(":", 1)[1])
             for p in sweep["points"] if p["status"] == "ok"]
    assert len(set(ports)) == len(ports) == 3 and all(30000 <= port <= 32699 for port in ports), ports
    # the job's SITESTACK_CHECK_FAULT (seed@0) was unset for the default point: it passed its ddp
    assert sweep["points"][0]["settings"] == {}


def wait_for(cluster, job_id: str, timeout: float = 420) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not cluster.run("squeue", "-h", "-j", job_id).stdout.strip():
            return
        time.sleep(2)
    cluster.run("scancel", job_id)
    pytest.fail(f"the sweep job {job_id} did not end in {timeout}s:\n{cluster.logs()}")


def test_the_sweep_on_slurm_records_hung_crashed_and_failed_points(installed_local_job, slurm_cluster, tmp_path):
    job = installed_local_job
    path, plan = plan_file(tmp_path, OMP_NUM_THREADS=["1", "2"], SITESTACK_CHECK_FAULT=["hang@1", "crash@1"],
                           GLOO_SOCKET_IFNAME=["nosuch"])
    env = {**job["env"], **slurm_cluster.env, "SITESTACK_PYTHON": job["python"], "SITESTACK_TUNE_PLAN": str(path)}
    sub = subprocess.run(["sbatch", "--parsable", f"--chdir={tmp_path}", str(job["dir"] / "jobs" / "tune-srun.sbatch")],
                         env={**os.environ, **env}, capture_output=True, text=True, timeout=60)
    assert sub.returncode == 0, sub.stderr
    job_id = sub.stdout.strip().split(";")[0]
    wait_for(slurm_cluster, job_id)
    log = (tmp_path / f"sitestack-tune-{job_id}.log").read_text()
    assert log.rstrip().splitlines()[-1] == "sitestack tune: sweep written, exit code 0", log[-4000:]
    out = tmp_path / f"sitestack-tune-{job_id}"
    sweep = assert_sweep(out, plan, {"default": "ok", "default (again)": "ok", "OMP_NUM_THREADS=1": "ok", "OMP_NUM_THREADS=2": "ok",
                                     "SITESTACK_CHECK_FAULT=hang@1": "hung", "SITESTACK_CHECK_FAULT=crash@1": "crashed",
                                     "GLOO_SOCKET_IFNAME=nosuch": "failed"})
    assert sweep["launcher"] == "srun" and sweep["job_id"] == job_id and sweep["nodes"] == 1
    points = {p["label"]: p for p in sweep["points"]}
    hang = points["SITESTACK_CHECK_FAULT=hang@1"]
    assert "time limit of 40s passed" in hang["cause"] and "rank 1" in hang["cause"], hang
    assert "SIGSEGV" in points["SITESTACK_CHECK_FAULT=crash@1"]["cause"]
    assert "nosuch" in points["GLOO_SOCKET_IFNAME=nosuch"]["cause"], points["GLOO_SOCKET_IFNAME=nosuch"]
    # what the threads did to the DDP step here (reported, not asserted: speed is the benchmarks')
    medians = {label: sorted(p["step_ms"])[len(p["step_ms"]) // 2] for label, p in points.items() if p["status"] == "ok"}
    print("DDP step ms (median):", medians)
