"""The sweep driver on a shared, hostile node: each point's port is free and of the sweep's own range
(never another job's MASTER_PORT), a multi-node torchrun point gets its own rendezvous, a container site's
ranks get the point's settings inside the image, a stuck guard is ended with everything it started, and
the sweep job asks for the time its plan needs. The driver runs as the job installs it, with a launcher
that records what each point hands it (argv and environment)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from sitestack.model.container_facts import runtime_of
from sitestack.model.facts import Tuning, TuningVariable
from sitestack.model.slurmtime import slurm_time
from sitestack.onsite.ddpcheck import pointenv, sweep
from sitestack.validation import tune_jobs
from sitestack.validation.jobs import time_limit
from tests.test_tune_sweep_jobs import local_files, program  # noqa: F401 (a fixture)
from tests.test_validation_jobs import context

#: A launcher that records, per point, its arguments and its environment.
RECORDER = ("import json, os, sys; json.dump({'argv': sys.argv[1:], 'env': dict(os.environ)}, "
            "open(os.path.join(os.environ['RECORD'], os.environ['SITESTACK_TUNE_POINT'] + '.json'), 'w'))")


def run_driver(program: Path, tmp_path: Path, launcher: list[str], env: dict[str, str],  # noqa: F811
               extra: tuple[str, ...] = ()) -> dict[str, dict]:
    """The driver on the local plan with ``launcher``; each point's record (argv, env) by point id."""
    tmp_path.mkdir(exist_ok=True)
    plan = tmp_path / "plan.json"
    plan.write_text(local_files()["tune-plan.json"][0])
    record = tmp_path / "record"
    record.mkdir()
    argv = [sys.executable, "-E", "-s", "-S", str(program), "--sweep", str(plan), "--out", str(tmp_path / "out"),
            "--expect-world-size", "2", *extra, "--", sys.executable, "-c", RECORDER, *launcher]
    run = subprocess.run(argv, env={"PATH": os.environ["PATH"], "RECORD": str(record),
                                    "SITESTACK_DEADLINE": f"{time.time() + 3000:.0f}", **env},
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    return {p.stem: json.loads(p.read_text()) for p in sorted(record.glob("p*.json"))}


def test_points_take_free_ports_of_their_own_range_never_the_next_jobs(program: Path, tmp_path: Path):  # noqa: F811
    # a job whose block nothing on this node holds now: an earlier sweep's sockets may hold another block
    # in TIME_WAIT for a minute, and the driver rightly steps over those too
    job_id = next(j for j in range(1, pointenv.PORT_SPAN // pointenv.PORT_BLOCK) if not any(
        pointenv.port_taken(pointenv.PORT_BASE + j * pointenv.PORT_BLOCK + i) for i in range(10)))
    first = pointenv.PORT_BASE + job_id * pointenv.PORT_BLOCK   # where point p00 of the job starts looking
    with socket.socket() as held:   # another job's rank holds that port on this node
        held.bind(("0.0.0.0", first))
        held.listen()
        points = run_driver(program, tmp_path, [], {"SITESTACK_JOB_ID": str(job_id), "MASTER_PORT": str(20000 + job_id)})
    ports = [int(p["env"]["MASTER_PORT"]) for p in points.values()]
    assert len(points) == 4 and len(set(ports)) == 4, ports
    # jobs 9, 10, ... have MASTER_PORT 20009, 20010, ...: the validation range is never a point's
    assert all(pointenv.PORT_BASE <= port < pointenv.PORT_BASE + pointenv.PORT_SPAN < 32768 for port in ports), ports
    assert first not in ports and ports[0] == first + 1, ports


def rendered_rdzv() -> list[str]:
    """torchrun's rendezvous options as the installed sweep script's bash expands them on two nodes."""
    script = local_files()["jobs/tune-torchrun.sbatch"][0]
    line = next(x for x in script.splitlines() if x.strip().startswith("RDZV=(--nnodes="))
    shell = f'NNODES=2 MASTER_ADDR=nodeA MASTER_PORT=20123 JOB_ID=123\n{line}\nprintf "%s\\0" "${{RDZV[@]}}"'
    out = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, check=True).stdout
    return out.split("\0")[:-1]


def test_each_multi_node_torchrun_point_has_its_own_rendezvous(program: Path, tmp_path: Path):  # noqa: F811
    rdzv = rendered_rdzv()
    assert "--rdzv-endpoint=nodeA:20123" in rdzv and "--rdzv-id=123" in rdzv, rdzv
    launcher = [*rdzv, "--nproc-per-node=2", "/v/ddp_check.py", "--rdzv-id=script-option"]
    points = run_driver(program, tmp_path, launcher, {"SITESTACK_JOB_ID": "123"})
    seen = set()
    for pid, point in points.items():
        args = point["argv"]
        port = point["env"]["MASTER_PORT"]
        assert f"--rdzv-endpoint=nodeA:{port}" in args and f"--rdzv-id=123-{pid}" in args, args
        assert args[-1] == "--rdzv-id=script-option"   # the script's own arguments are left alone
        seen.add((port, f"123-{pid}"))
    assert len(seen) == len(points) == 4


def test_a_container_site_gets_each_points_settings_inside_the_image(program: Path, tmp_path: Path):  # noqa: F811
    inherited = {"OMP_NUM_THREADS": "9", "SINGULARITYENV_OMP_NUM_THREADS": "9", "APPTAINERENV_OMP_NUM_THREADS": "9"}
    points = run_driver(program, tmp_path, [], inherited, extra=("--container-env", "APPTAINERENV_"))
    default, one = points["p00"]["env"], points["p01"]["env"]
    assert not {k for k in default if k.endswith("OMP_NUM_THREADS")}, default   # the true default, in the image too
    assert one["OMP_NUM_THREADS"] == one["APPTAINERENV_OMP_NUM_THREADS"] == "1"
    assert "SINGULARITYENV_OMP_NUM_THREADS" not in one
    # on a site without an image nothing is set under a prefix, and an inherited one is still unset
    plain = run_driver(program, tmp_path / "plain", [], inherited)["p01"]["env"]
    assert plain["OMP_NUM_THREADS"] == "1" and not {k for k in plain if k.endswith("ENV_OMP_NUM_THREADS")}


def test_lumis_sweep_tells_the_driver_its_runtimes_prefix():
    ctx = context("lumi")
    assert ctx.facts.container is not None
    from sitestack.installs.site_stack import job_inputs
    files = tune_jobs.tune_files(job_inputs(ctx, f"{ctx.values['prefix']}/validation", None))
    scripts = [text for name, (text, _) in files.items() if name.startswith("jobs/tune-")]
    prefix = runtime_of(ctx.facts.container).env_var("")
    assert prefix in pointenv.CONTAINER_PREFIXES
    assert scripts and all(f"--container-env {prefix} --)" in text for text in scripts)
    assert "--container-env" not in local_files()["jobs/tune-srun.sbatch"][0]


FAKE_GUARD = """\
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
own = subprocess.Popen(["sleep", "300"], start_new_session=True)   # the launcher, as the guard starts it
group = subprocess.Popen(["sleep", "300"])                          # anything else in the guard's group
with open(os.environ["PIDS"], "w") as handle:
    handle.write(f"{own.pid} {group.pid}")
while True:
    time.sleep(1)
"""


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def test_a_stuck_guard_is_ended_with_the_launcher_and_all_it_started(tmp_path: Path, monkeypatch):
    fake = tmp_path / "guard.py"
    fake.write_text(textwrap.dedent(FAKE_GUARD))
    monkeypatch.setattr(sweep, "PROGRAM", str(fake))
    monkeypatch.setattr(sweep, "GUARD_GRACE", 0)
    monkeypatch.setattr(sweep, "DRIVER_GRACE", 1)
    monkeypatch.setenv("PIDS", str(tmp_path / "pids"))
    plan = {"variables": [], "point_seconds": 2, "repeats": 3, "sizes": [64]}
    args = argparse.Namespace(out=str(tmp_path / "out"), config=None, expect_world_size=2, container_env=None)
    point = {"id": "p00", "label": "default", "settings": {}}
    pids: list[int] = []
    try:
        record, _ = sweep.run_point(args, plan, point, 30999, time.time() + 100, ["true"])
        pids = [int(p) for p in (tmp_path / "pids").read_text().split()]
        assert record["status"] == "hung" and "did not end" in record["cause"], record
        end = time.monotonic() + 10
        while any(alive(p) for p in pids) and time.monotonic() < end:
            time.sleep(0.2)
        assert not [p for p in pids if alive(p)], "a process of the point outlived its guard"
    finally:
        for pid in pids:
            if alive(pid):
                os.kill(pid, 9)


def test_the_sweep_job_asks_for_the_time_its_plan_needs():
    facts = context("local").facts
    assert facts.tuning is not None
    many = Tuning(variables={"OMP_NUM_THREADS": TuningVariable(candidates=tuple(str(n) for n in range(1, 9)))},
                  point_time="00:01:00")
    big = dataclasses.replace(facts, tuning=many, scheduler=dataclasses.replace(facts.scheduler, max_job_time=None))
    seconds = tune_jobs.tune_job_seconds(big)
    points = len(many.points())
    # every point to its time limit and the guard's grace after it, within the job's own deadline
    assert time_limit(seconds) >= points * (60 + 20) + 60 and seconds % 60 == 0
    assert seconds > 600   # more than the validation job's 10 minutes
    from sitestack.installs.site_stack import job_inputs
    ctx = context("local")
    inputs = dataclasses.replace(job_inputs(ctx, f"{ctx.values['prefix']}/validation", None), facts=big)
    script = tune_jobs.render_tune_job(inputs, "srun")
    assert f"#SBATCH --time={slurm_time(seconds)}\n" in script
    assert f"SITESTACK_TIME_LIMIT={time_limit(seconds)}\n" in script
    # a short plan keeps the validation job's time; a scheduler's limit caps it
    assert tune_jobs.tune_job_seconds(facts) == 600
    capped = dataclasses.replace(big, scheduler=dataclasses.replace(facts.scheduler, max_job_time="00:20:00"))
    assert tune_jobs.tune_job_seconds(capped) == min(seconds, 1200)
