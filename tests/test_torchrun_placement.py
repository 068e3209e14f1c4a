"""torchrun placed as srun places ranks: the agents' CPUs, each rank's own CPUs (onsite/bind_rank.py), the
launchers' own options (facts.scheduler.launcher_options), and `invoke job-template --launcher torchrun`;
for real on the test Slurm cluster with 2 ranks per node."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sitestack.actions import ACTIONS
from sitestack.actions.launch_env import launch_inputs
from sitestack.core.errors import InputError
from sitestack.core.shipped import single_file
from sitestack.engine import playbook as pb
from sitestack.model.context import RunContext, RunOptions
from sitestack.onsite import bind_rank
from sitestack.validation import jobs
from sitestack.validation.launch_helpers import BIND_RANK, render_job_template
from tests.conftest import run_invoke
from tests.test_launch_env import STAND_IN_MODULE, TRAIN
from tests.test_validation_jobs import LUMI_MASKS, context, job_inputs
from tests.test_validation_run import assert_report, checks_of, validate

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden" / "launch"
UPDATE = os.environ.get("SITESTACK_UPDATE_GOLDEN") == "1"


# -- the binder's rule ------------------------------------------------------------------------------------

def test_each_local_rank_gets_its_mask_or_its_block_of_the_agents_cpus():
    masks = bind_rank.parse_masks("0x3,0xc")
    assert [bind_rank.rank_cpus(r, 2, set(range(8)), masks) for r in (0, 1)] == [{0, 1}, {2, 3}]
    with pytest.raises(ValueError, match="lists 2 masks, local rank 2 has none"):
        bind_rank.rank_cpus(2, 3, set(range(8)), masks)
    assert [bind_rank.rank_cpus(r, 4, set(range(16)), cores_per_rank=3) for r in range(2)] == [{0, 1, 2}, {3, 4, 5}]
    # an equal share, in the order of the CPU numbers (a cpuset need not start at 0)
    assert [bind_rank.rank_cpus(r, 2, {8, 9, 10, 11}) for r in (0, 1)] == [{8, 9}, {10, 11}]
    # more ranks than CPUs share them round the list
    assert [bind_rank.rank_cpus(r, 3, {0, 1}) for r in range(3)] == [{0}, {1}, {0}]


@pytest.mark.parametrize("argv, message", [
    (["--cores-per-rank", "0", "true"], "--cores-per-rank: '0' is not a whole number >= 1"),
    (["--cpu-masks", "0xzz", "true"], "not a hex CPU mask: '0xzz'"),
    (["--cpu-masks"], "--cpu-masks needs a value"),
    (["--"], "no COMMAND to run"),
])
def test_a_bad_argument_is_one_line_naming_it(argv, message, tmp_path):
    program = tmp_path / "bind_rank.py"
    program.write_text(single_file("bind_rank"))
    out = subprocess.run([sys.executable, str(program), *argv], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and out.stderr.startswith(f"bind_rank: {message} (usage:"), out.stderr
    assert len(out.stderr.splitlines()) == 1


def test_the_rank_runs_pinned_in_the_binders_place(tmp_path):
    """Run for real: the command replaces the binder (same pid) and runs on its local rank's CPUs."""
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip("needs 2 CPUs to tell the ranks apart")
    program = tmp_path / "bind_rank.py"
    program.write_text(single_file("bind_rank"))
    report = "import os; print(os.getpid(), sorted(os.sched_getaffinity(0)))"
    seen = []
    for local in (0, 1):
        env = {**os.environ, "LOCAL_RANK": str(local), "LOCAL_WORLD_SIZE": "2"}
        proc = subprocess.Popen([sys.executable, str(program), "--", sys.executable, "-c", report], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        stdout, stderr = proc.communicate(timeout=30)
        assert proc.returncode == 0 and not stderr, stderr
        pid, cpus = stdout.split(" ", 1)
        assert int(pid) == proc.pid
        seen.append(json.loads(cpus))
    share = len(allowed) // 2
    assert seen == [allowed[:share], allowed[share:2 * share]]


# -- the rendered jobs ------------------------------------------------------------------------------------

def test_the_torchrun_job_binds_ranks_with_the_srun_jobs_masks():
    """LUMI: the agents get the node's CPUs, each rank its mask of the srun job's list, which the affinity
    check compares; the tuning sweep's torchrun script places them the same way."""
    inputs = job_inputs(context("lumi"), "/appl/validation", None)
    torchrun, srun = jobs.render_job(inputs, "torchrun"), jobs.render_job(inputs, "srun")
    assert f"CPU_MASKS={LUMI_MASKS}" in torchrun and f"CPU_MASKS={LUMI_MASKS}" in srun
    assert 'BIND_ARGS=(--cpu-masks "$CPU_MASKS")' in torchrun and 'CHECK_ARGS+=(--cpu-masks "$CPU_MASKS")' in torchrun
    assert '--ntasks-per-node=1 --cpus-per-task="$AGENT_CPUS")' in torchrun
    assert "AGENT_CPUS=${SLURM_CPUS_ON_NODE:-$(( RANKS_PER_NODE * 7 ))}" in torchrun
    assert '"$VALIDATION_DIR/bind_rank.py" "${BIND_ARGS[@]}" -- "$PYTHON" -u "$VALIDATION_DIR/ddp_check.py"' in torchrun
    frontier = jobs.render_job(job_inputs(context("frontier"), "/appl/validation", None), "torchrun")
    assert "BIND_ARGS=(--cores-per-rank 7)" in frontier


def test_launcher_options_reach_their_launcher_only_quoted(tmp_path):
    text = (ROOT / "playbooks" / "local.yml").read_text()
    opts = ("    launcher_options:\n      torchrun: [--cpu-bind=none, \"--comment=a b;$(id)\"]\n"
            "      srun: [--mem-bind=local]\n")
    playbook = tmp_path / "local.yml"
    playbook.write_text(text.replace('    time: "00:10:00"\n', '    time: "00:10:00"\n' + opts, 1))
    site = pb.load(path=playbook)
    ctx = RunContext.resolve(site, home="/home/u", user="u", account="a", prefix="/p", options=RunOptions(),
                             actions=ACTIONS)
    inputs = job_inputs(context("local"), "/p/validation", None)
    inputs = jobs.JobInputs(**{**inputs.__dict__, "facts": ctx.facts})
    torchrun, srun = jobs.render_job(inputs, "torchrun"), jobs.render_job(inputs, "srun")
    assert "--cpus-per-task=\"$AGENT_CPUS\" --cpu-bind=none '--comment=a b;$(id)')" in torchrun
    assert "--mem-bind=local" in srun and "--cpu-bind=none" not in srun and "--mem-bind" not in torchrun
    template = render_job_template(launch_inputs(ctx, "/p/bin"), "torchrun")
    assert "--cpu-bind=none '--comment=a b;$(id)' \\" in template
    for bad, message in (("      srunn: [--x]\n", "'srunn' is not a launcher (srun, mpiexec, torchrun, horovodrun)"),
                         ("      srun: [\"--a\\n--b\"]\n", "srun")):
        playbook.write_text(text.replace('    time: "00:10:00"\n', '    time: "00:10:00"\n    launcher_options:\n'
                                         + bad, 1))
        with pytest.raises(InputError, match="launcher_options") as raised:
            pb.load(path=playbook)
        assert message in str(raised.value) and "local.yml" in str(raised.value)


@pytest.mark.parametrize("site", ["local", "lumi"])
def test_job_template_torchrun_matches_golden(site):
    """The torchrun form, reviewed once per site (SITESTACK_UPDATE_GOLDEN=1 rewrites it)."""
    ctx = RunContext.resolve(pb.load(site), home="/home/u", user="u", account="proj", prefix="/opt/sitestack-golden",
                             options=RunOptions(), actions=ACTIONS)
    text = render_job_template(launch_inputs(ctx, "/opt/sitestack-golden/bin"), "torchrun")
    path = GOLDEN / f"{site}-job-template-torchrun.sh"
    if UPDATE:
        path.write_text(text)
    assert text == path.read_text(), f"{path} differs from the rendering (SITESTACK_UPDATE_GOLDEN=1 to accept)"
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0
    assert f"/opt/sitestack-golden/bin/{BIND_RANK}" in text


def test_job_template_refuses_an_unknown_launcher():
    result = run_invoke("job-template", "--site", "local", "--launcher", "horovodrun")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "--launcher: must be srun, mpiexec or torchrun, not 'horovodrun'" in result.stderr, result.stderr


# -- for real on the test Slurm cluster -------------------------------------------------------------------

@pytest.mark.integration
def test_the_torchrun_job_gives_each_rank_its_own_cpu_on_the_cluster(installed_local_job, slurm_cluster, tmp_path):
    """2 ranks on the node under srun-started agents: the affinity check passes, each rank on its own CPU."""
    result, out = validate(installed_local_job, tmp_path, "--launcher", "torchrun", "--ranks-per-node", "2",
                           env=slurm_cluster.env)
    assert result.returncode == 0, result.stdout + result.stderr + slurm_cluster.logs()
    assert "submitted validate-torchrun.sbatch to Slurm as job" in result.stdout
    data = assert_report(out)
    assert data["launcher"] == "torchrun" and data["world_size"] == 2
    assert checks_of(data)["affinity"]["status"] == "passed"
    cpus = [tuple(r["affinity"]) for r in sorted(data["ranks"], key=lambda r: r["local_rank"])]
    assert all(len(c) == 1 for c in cpus) and len(set(cpus)) == 2, cpus


@pytest.mark.integration
def test_job_template_torchrun_runs_on_the_cluster(slurm_cluster, validation_python, tmp_path_factory, tmp_path):
    """`invoke job-template --launcher torchrun` as users get it: helpers installed by provision, srun agents,
    c10d at the job's MASTER_PORT, each rank bound by sitestack-bind-rank."""
    python, env = validation_python
    prefix = tmp_path_factory.mktemp("torchrun") / "prefix"
    installed = run_invoke("provision", "--site", "local", "--prefix", str(prefix), "--tags", "launch")
    assert installed.returncode == 0 and (prefix / "bin" / BIND_RANK).exists(), installed.stdout + installed.stderr
    job = tmp_path / "job.sh"
    result = run_invoke("job-template", "--site", "local", "--prefix", str(prefix), "--launcher", "torchrun",
                        "--output", str(job))
    assert result.returncode == 0, result.stderr
    module = prefix / "modules" / "pytorch" / "2.13.0-cpu.lua"
    module.parent.mkdir(parents=True, exist_ok=True)
    module.write_text(STAND_IN_MODULE.format(bin=Path(python).parent))
    (tmp_path / "train.py").write_text(TRAIN.replace('"port", os.environ["MASTER_PORT"],',
                                                     '"cpus", sorted(os.sched_getaffinity(0)),'))
    out = slurm_cluster.sbatch_wait("--nodes=1", "--ntasks-per-node=2", f"--chdir={tmp_path}",
                                    f"--output={tmp_path}/job.out", str(job), timeout=300, env=env)
    log = (tmp_path / "job.out").read_text() if (tmp_path / "job.out").exists() else ""
    assert out.returncode == 0, out.stderr + log + slurm_cluster.logs()
    job_id = int(out.stdout.split()[-1])
    assert "2 tasks on 1 nodes" in log and f":{jobs.master_port(job_id)}\n" in log, log
    lines = sorted(line for line in log.splitlines() if line.startswith("rank "))
    assert [line.split(" cpus ")[0] for line in lines] == [f"rank {r} local {r} of 2 sum 3" for r in (0, 1)], log
    cpus = {line.split(" cpus ")[1] for line in lines}
    assert len(cpus) == 2 and all(c.count(",") == 0 for c in cpus), log
