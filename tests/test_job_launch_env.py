"""The validation job and the users' launch helper agree: the job sources the helper where the
playbook installs it, and keeps its own geometry only where none is installed (``--python``, a
playbook without install-launch-env). Both are rendered for each site and run with bash under the
same Slurm job environment (the variables sbatch sets; both expand the host list with sitestack's
one parser, hostlist.py, installed beside them), and every value the job's ranks see must be the same."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from sitestack.actions.launch_env import launch_inputs
from sitestack.installs.site_stack import job_inputs
from sitestack.validation import jobs
from sitestack.validation.launch_helpers import HELPER, HOSTLIST, helper_files
from tests.onsite_dir import install_programs
from tests.test_validation_jobs import SITES, context

NAMES = ("NNODES", "RANKS_PER_NODE", "WORLD_SIZE", "NODELIST", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS",
         "ZE_FLAT_DEVICE_HIERARCHY", "ZE_AFFINITY_MASK", "APPTAINERENV_ZE_FLAT_DEVICE_HIERARCHY")
PRINT = "".join(f'printf "{n}=%s\\n" "${{{n}:-}}"\n' for n in NAMES)

#: What sbatch sets in a job's batch script (the variables the geometry reads).
JOB = {"SLURM_JOB_ID": "4242424", "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "nid[007-008]",
       "SLURM_CPUS_ON_NODE": "96", "SLURM_TASKS_PER_NODE": "1(x2)"}
CASES = {
    "no task count": JOB,
    "--ntasks-per-node=3": {**JOB, "SLURM_NTASKS_PER_NODE": "3", "SLURM_NTASKS": "6", "SLURM_TASKS_PER_NODE": "3(x2)"},
    "--ranks-per-node": {**JOB, "SITESTACK_RANKS_PER_NODE": "1"},
    "Dawn COMPOSITE": {**JOB, "SLURM_GPUS_ON_NODE": "4", "ZE_FLAT_DEVICE_HIERARCHY": "COMPOSITE"},
    "Dawn FLAT": {**JOB, "SLURM_GPUS_ON_NODE": "4", "ZE_FLAT_DEVICE_HIERARCHY": "FLAT"},
}


def geometry(text: str) -> str:
    """The job's lines from reading the hierarchy to MASTER_PORT: what decides the launch; and those that
    pass the user's choices into the container (<RUNTIME>ENV_NAME)."""
    job_id = re.search(r"^JOB_ID=.*$", text, re.M)
    start = text.index("\n# Geometry") + 1
    # the geometry ends where the job's own settings begin (facts.env, caches, logs, container, time limit)
    end = min(i for i in (text.find(f"\n\n# {word}", start) for word in (
        "Site runtime settings", "MIOpen cache", "Collective library logs", "The stack runs in", "Time limit")) if i > 0)
    head = re.search(r"^ZE_HIERARCHY=.*$", text, re.M)
    passed = "".join(m.group(0) + "\n" for m in re.finditer(r"^export (APPTAINER|SINGULARITY)ENV_\w+=.*$", text, re.M))
    assert job_id, text
    return (head.group(0) + "\n" if head else "") + job_id.group(0) + "\n" + text[start:end] + "\n" + passed


def run(script: str, env: dict[str, str], tmp: Path) -> dict[str, str]:
    # the job's directory holds hostlist.py, which the job's own MASTER_ADDR block runs (no helper)
    install_programs(tmp, ("hostlist.py",))
    head = f"set -uo pipefail\nVALIDATION_DIR={tmp}\nPYTHON=/usr/bin/python3\n"
    out = subprocess.run(["bash", "-c", head + script + PRINT], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "USER": "alice", "HOME": "/home/alice", **env}, timeout=60)
    assert out.returncode == 0, out.stderr
    return dict(line.split("=", 1) for line in out.stdout.splitlines())


@pytest.mark.parametrize("name, case", [(name, case) for name in SITES for case in CASES
                                         if name == "dawn" or "Dawn" not in case])  # the ZE hierarchy: Dawn's
def test_the_job_with_the_helper_and_its_own_fallback_agree(name: str, case: str, tmp_path: Path):
    ctx = context(name)
    prefix = ctx.values["prefix"]
    inputs = job_inputs(ctx, f"{prefix}/validation", None)
    assert inputs.launch_env == f"{prefix}/bin/{HELPER}"
    launcher = jobs.validation_of(ctx.facts).launchers[0]
    helper = tmp_path / HELPER
    files = helper_files(launch_inputs(ctx, f"{prefix}/bin"))
    # the helper and the host-list parser it runs, installed side by side in tmp_path
    helper.write_text(files[HELPER][0].replace(f"{prefix}/bin/{HOSTLIST}", str(tmp_path / HOSTLIST)))
    (tmp_path / HOSTLIST).write_text(files[HOSTLIST][0])
    with_helper = geometry(jobs.render_job(inputs, launcher)).replace(inputs.launch_env, str(helper))
    # --python: the job's own geometry (no helper), the fallback
    own = jobs.render_job(job_inputs(ctx, f"{prefix}/validation", "/usr/bin/python3"), launcher)
    assert "LAUNCH_ENV" not in own
    env = CASES[case]
    got, fallback = run(with_helper, env, tmp_path), run(geometry(own), env, tmp_path)
    for key in ("OMP_NUM_THREADS",):  # the fallback sets it only where facts give cores per rank
        if not fallback[key]:
            got.pop(key), fallback.pop(key)
    assert got == fallback
    assert got["MASTER_PORT"] == str(jobs.master_port(4242424)) and got["NODELIST"] == "nid007,nid008"
    if case == "Dawn COMPOSITE":  # Dawn's setup_mpi.sh: 4 cards give 4 ranks x 24 cores with COMPOSITE, 8 x 12 with FLAT
        assert (got["RANKS_PER_NODE"], got["OMP_NUM_THREADS"], got["WORLD_SIZE"]) == ("4", "24", "8")
        assert got["APPTAINERENV_ZE_FLAT_DEVICE_HIERARCHY"] == "COMPOSITE"  # and so inside the image
    if case == "Dawn FLAT":
        assert (got["RANKS_PER_NODE"], got["OMP_NUM_THREADS"], got["WORLD_SIZE"]) == ("8", "12", "16")


def test_without_slurm_both_run_one_node_on_this_host(tmp_path: Path):
    ctx = context("local")
    prefix = ctx.values["prefix"]
    own = jobs.render_job(job_inputs(ctx, f"{prefix}/validation", "/usr/bin/python3"), "srun")
    got = run(geometry(own), {}, tmp_path)
    assert got["NNODES"] == "1" and got["MASTER_ADDR"] and "," not in got["NODELIST"]
