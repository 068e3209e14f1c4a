"""The tuning sweep's installed files: the plan derived from facts.tuning (one factor at a time), the
golden sweep batch scripts, the install step writing them compared before written, and the driver's
handling of what it reads at run time (a bad plan, a point that cannot fit in the job's time)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sitestack.core.step import converge
from sitestack.model.facts import Tuning, TuningVariable
from sitestack.onsite.ddpcheck.tuneplan import PlanError, check_plan
from sitestack.validation import tune_jobs
from tests.fakehost import FakeHost
from tests.onsite_dir import install_programs
from tests.test_validation_jobs import GOLDEN, UPDATE, context, rendered, step_for

LOCAL_TUNE = ["srun", "mpiexec", "torchrun"]


def local_files() -> dict[str, tuple[str, int]]:
    ctx = context("local")
    from sitestack.installs.site_stack import job_inputs
    return tune_jobs.tune_files(job_inputs(ctx, f"{ctx.values['prefix']}/validation", None))


def test_the_local_plan_is_the_default_then_one_point_per_candidate():
    plan = json.loads(local_files()["tune-plan.json"][0])
    facts = context("local").facts
    assert facts.tuning is not None
    assert plan["schema"] == "sitestack-tune-plan/1" and plan["site"] == "local"
    assert plan["sizes"] == [65536, 1048576, 4194304]   # a CPU site's default sizes
    assert plan["repeats"] == facts.tuning.repeats and plan["point_seconds"] == facts.tuning.point_seconds
    assert plan["variables"] == ["OMP_NUM_THREADS"] and plan["notes"]["OMP_NUM_THREADS"]
    assert plan["points"] == [{"id": "p00", "label": "default", "settings": {}},
                              {"id": "p01", "label": "OMP_NUM_THREADS=1", "settings": {"OMP_NUM_THREADS": "1"}},
                              {"id": "p02", "label": "OMP_NUM_THREADS=2", "settings": {"OMP_NUM_THREADS": "2"}},
                              {"id": "p03", "label": "default (again)", "settings": {}}]
    assert check_plan(plan, "tune-plan.json") == plan   # what the driver and the ranks accept


def test_a_grid_of_several_variables_is_one_factor_at_a_time_and_gpu_sizes_default_to_the_reference():
    facts = context("frontier").facts
    tuning = Tuning(variables={"NCCL_NET_GDR_LEVEL": TuningVariable(candidates=("2", "3")),
                               "NCCL_CROSS_NIC": TuningVariable(candidates=("1",)),
                               "NCCL_ALGO": TuningVariable(candidates=("Tree", "Ring"))})
    plan = tune_jobs.tune_plan("frontier", dataclasses.replace(facts, tuning=tuning, env={}))
    assert plan is not None
    assert [p["label"] for p in plan["points"]] == ["default", "NCCL_NET_GDR_LEVEL=2", "NCCL_NET_GDR_LEVEL=3",
                                                    "NCCL_CROSS_NIC=1", "NCCL_ALGO=Tree", "NCCL_ALGO=Ring",
                                                    "default (again)"]
    assert all(len(p["settings"]) == (0 if p["label"].startswith("default") else 1)
               for p in plan["points"])   # 7 points (the default twice), not 12
    reference = (facts.validation.single_node or facts.validation.multi_node).message_bytes  # type: ignore[union-attr]
    assert plan["sizes"] == sorted({1 << 20, 16 << 20, reference})


def test_a_site_without_tuning_gets_no_plan_and_no_sweep_script():
    ctx = context("cirrus")
    assert ctx.facts.tuning is None
    files = step_for(ctx).files()
    assert "tune-plan.json" not in files and not [name for name in files if name.startswith("jobs/tune-")]


@pytest.mark.parametrize("launcher", LOCAL_TUNE)
def test_sweep_script_matches_golden(launcher):
    text = local_files()[f"jobs/tune-{launcher}.sbatch"][0]
    path = GOLDEN / f"local-tune-{launcher}.sbatch"
    if UPDATE:
        path.write_text(text)
    assert path.exists(), f"{path} missing: run with SITESTACK_UPDATE_GOLDEN=1 once and review it"
    assert text == path.read_text(), f"{path} differs from the rendering (SITESTACK_UPDATE_GOLDEN=1 to accept)"
    checked = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr


@pytest.mark.parametrize("launcher", LOCAL_TUNE)
def test_the_sweep_script_is_the_validation_job_with_the_driver_instead_of_the_guard(launcher):
    tune = local_files()[f"jobs/tune-{launcher}.sbatch"][0]
    validate = rendered("local")[f"jobs/validate-{launcher}.sbatch"][0]
    assert "--sweep \"$PLAN\"" in tune and "--guard --out" not in tune and "sitestack-mpi-probe" not in tune
    assert "#SBATCH --output=sitestack-tune-%j.log" in tune and "sitestack-tune-$JOB_ID" in tune
    # the launch line itself is the validation job's (the comments aside)
    launch = validate[validate.index("echo \"sitestack validation: $WORLD_SIZE"):].splitlines()[1:-6]
    code = [line for line in tune.splitlines() if not line.startswith("#")]
    assert "\n".join(line for line in launch if not line.startswith("#")) in "\n".join(code)


def test_the_install_step_plans_writes_and_then_compares_the_plan():
    ctx = context("local")
    step = step_for(ctx)
    step.args = dataclasses.replace(step.args, build_probe=False)
    checked = converge([step], FakeHost(read_only=True), check=True, want_diff=True)
    assert checked[0].status == "changed" and '+  "schema": "sitestack-tune-plan/1",' in checked[0].diff
    host = FakeHost()
    assert converge([step], host)[0].status == "changed"
    base = ctx.values["prefix"] + "/validation"
    assert json.loads(host.files[f"{base}/tune-plan.json"])["points"][0]["id"] == "p00"
    assert f"{base}/jobs/tune-srun.sbatch" in host.files
    writes = len(host.mutations)
    assert converge([step], host)[0].status == "ok" and len(host.mutations) == writes
    host.files[f"{base}/tune-plan.json"] = "{}"
    assert converge([step], host)[0].message == "tune-plan.json differs"


# -- the driver's run-time input ------------------------------------------------------------------

@pytest.fixture
def program(tmp_path: Path) -> Path:
    """The check program as the job installs it (its own directory, no sitestack on the path)."""
    return install_programs(tmp_path / "job") / "ddp_check.py"


def driver(program: Path, plan: Path, out: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-E", "-s", "-S", str(program), "--sweep", str(plan), "--out", str(out),
            "--expect-world-size", "2", "--", "false"]
    return subprocess.run(argv, env={"PATH": os.environ["PATH"], **env}, capture_output=True, text=True, timeout=60)


def test_points_that_cannot_fit_in_the_job_are_recorded_as_not_run(program: Path, tmp_path: Path):
    plan = json.loads(local_files()["tune-plan.json"][0])
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    run = driver(program, path, tmp_path / "out", {"SITESTACK_DEADLINE": f"{time.time() + 15:.0f}", "MASTER_PORT": "25000"})
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[-1] == "sitestack tune: sweep written, exit code 0"
    sweep = json.loads((tmp_path / "out" / "sweep.json").read_text())
    assert sweep["finished"] and [p["status"] for p in sweep["points"]] == ["skipped"] * 4
    assert all(p["cause"].startswith("not run:") and f"needs {plan['point_seconds']}s" in p["cause"] for p in sweep["points"])
    assert not (tmp_path / "out" / "points").exists()


@pytest.mark.parametrize(("edit", "says"), [
    (lambda p: p.update(schema="other/1"), "schema: expected 'sitestack-tune-plan/1'"),
    (lambda p: p.update(repeats=2), "repeats: a whole number from 5 to 100"),
    (lambda p: p.update(sizes=[65536, 3]), "sizes:"),
    (lambda p: p["points"][1]["settings"].update(OMP_NUM_THREADS="1\n2"), "points[1].settings.OMP_NUM_THREADS: a value of one printable line"),
    (lambda p: p["points"][1]["settings"].update(LD_PRELOAD="x.so"), "not one of the plan's variables"),
    (lambda p: p["points"][2].update(id="p01"), "points[2].id: a point id p00..p999, each once"),
    (lambda p: p.update(point_seconds=5), "point_seconds: a number of seconds from 10 to 86400, not 5"),  # NaN: no JSON
    (lambda p: p.update(variables=["OMP_NUM_THREADS", "PATH"]), "variables: PATH: the job itself needs or sets it"),
])
def test_a_plan_that_cannot_run_is_refused_in_one_line(program: Path, tmp_path: Path, edit, says: str):
    plan = json.loads(local_files()["tune-plan.json"][0])
    edit(plan)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    with pytest.raises(PlanError, match=None) as caught:
        check_plan(json.loads(path.read_text()), str(path))
    assert says in str(caught.value)
    run = driver(program, path, tmp_path / "out", {})
    assert run.returncode == 2 and run.stdout == "", run.stdout + run.stderr
    assert run.stderr.strip() == f"sitestack: {caught.value}" and "Traceback" not in run.stderr


def test_a_job_id_that_is_not_a_number_is_refused(program: Path, tmp_path: Path):
    """The points' ports derive from the job's id (pointenv): a bad one is refused before any point runs."""
    path = tmp_path / "plan.json"
    path.write_text(local_files()["tune-plan.json"][0])
    run = driver(program, path, tmp_path / "out", {"SITESTACK_JOB_ID": "1+1"})
    assert run.returncode == 2 and "SITESTACK_JOB_ID must be a whole number" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr and not (tmp_path / "out" / "points").exists()


def test_the_plans_rule_for_variable_names_is_the_playbooks():
    """The shipped driver imports nothing of sitestack: its copy of the rule must be the model's."""
    from sitestack.model.tuning_facts import TUNING_NAME
    from sitestack.onsite.ddpcheck.tuneplan import TUNING_NAME as PLAN_NAME
    assert PLAN_NAME.pattern == TUNING_NAME
