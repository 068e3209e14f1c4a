"""The validation job rendered from each site's facts: golden batch scripts, the check config, the
install-validation-job action in check mode and applied (to an in-memory host)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import jinja2
import pytest

from sitestack.actions import ACTIONS
from sitestack.actions.validation_job import InstallValidationJob
from sitestack.core import schema
from sitestack.core.errors import InputError
from sitestack.core.step import converge
from sitestack.engine import playbook as pb
from sitestack.installs.site_stack import job_inputs
from sitestack.model.context import RunContext
from sitestack.model.site import Facts
from sitestack.validation import jobs
from tests.fakehost import FakeHost

GOLDEN = Path(__file__).resolve().parent / "golden" / "jobs"
UPDATE = os.environ.get("SITESTACK_UPDATE_GOLDEN") == "1"
SITES = ["lumi", "frontier", "dawn", "cirrus", "local"]
LUMI_MASKS = ("0x00fe000000000000,0xfe00000000000000,0x0000000000fe0000,0x00000000fe000000,"
              "0x00000000000000fe,0x000000000000fe00,0x000000fe00000000,0x0000fe0000000000")


def context(name: str, **options) -> RunContext:
    """A run context for ``name`` as a fixed user (golden files must not depend on who runs the tests)."""
    site = pb.load(name)
    values = site.placeholder_values(home="/home/alice", user="alice", account="proj123", prefix=None)
    resolved = site.resolved_facts(values)
    facts = schema.build(Facts, resolved, site.path, line=0, key="facts")
    return RunContext(site=site, facts=facts, resolved=resolved, values=values, options=pb.Options(**options), actions=ACTIONS)


def step_for(ctx: RunContext) -> InstallValidationJob:
    spec = next(s for s in ctx.site.steps if s.action == "install-validation-job")
    return InstallValidationJob.from_spec(spec, ctx)


def rendered(name: str) -> dict[str, tuple[str, int]]:
    ctx = context(name)
    return jobs.job_files(job_inputs(ctx, f"{ctx.values['prefix']}/validation", None))


def golden_cases():
    for name in SITES:
        for launcher in jobs.validation_of(pb.load(name).facts).launchers:
            yield name, launcher


@pytest.mark.parametrize("name, launcher", list(golden_cases()))
def test_batch_script_matches_golden(name, launcher):
    text = rendered(name)[f"jobs/{jobs.script_name(launcher)}"][0]
    path = GOLDEN / f"{name}-{launcher}.sbatch"
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"{path} missing: run with SITESTACK_UPDATE_GOLDEN=1 once and review it"
    assert text == path.read_text(), f"{path} differs from the rendering (SITESTACK_UPDATE_GOLDEN=1 to accept)"


@pytest.mark.parametrize("name, launcher", list(golden_cases()))
def test_batch_scripts_are_valid_bash_without_timestamps(name, launcher):
    text = rendered(name)[f"jobs/{jobs.script_name(launcher)}"][0]
    out = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert not re.search(r"\d\d:\d\d:\d\d", re.sub(r"#SBATCH --time=\S+", "", text)), "timestamp"
    assert "{" + "{" not in text and "{%" not in text
    # one implementation of the geometry, port and host list: the users' launch helper, which every
    # site's playbook installs (install-launch-env)
    assert ". \"$LAUNCH_ENV\"" in text and "MASTER_PORT=" not in text and "scontrol" not in text
    assert "LAUNCH_ENV=" + f"{context(name).values['prefix']}/bin/sitestack-launch-env" in text


def test_lumi_job_uses_srun_with_the_derived_masks_and_never_forces_a_plugin_name():
    text = rendered("lumi")["jobs/validate-srun.sbatch"][0]
    assert f"CPU_MASKS={LUMI_MASKS}\n" in text
    assert "--cpu-bind=mask_cpu:$CPU_MASKS" in text and "--cpus-per-task" not in text
    # the name a plugin registers varies by release ("AWS Libfabric", "Libfabric", "OFI"): forcing one stops
    # every job of a site whose plugin says another; the net-plugin check judges the logs instead
    assert "export NCCL_NET=" not in text and "NCCL_NET=" not in text.replace("NCCL_NET_PLUGIN", "")
    assert 'export NCCL_DEBUG_FILE="$OUT/nccl/%h.%p.log"' in text
    # the MIOpen caches are the helper's (per node and job), made on every node by the job
    # made private on every node (runtime_checks: refused where another user made it first)
    assert 'sitestack "${MIOPEN_USER_DB_PATH}" "${MIOPEN_CUSTOM_CACHE_DIR}" || exit 1' in text
    assert "_sitestack_private_dir" in text and "trap sitestack_miopen_end EXIT" in text
    assert "export MIOPEN_USER_DB_PATH" not in text
    assert "singularity exec \"$SIF\"" in text and "torchrun" not in text


def test_frontier_uses_srun_closest_gpu_binding_not_torchrun():
    text = rendered("frontier")["jobs/validate-srun.sbatch"][0]
    assert "--cpus-per-task=7 --gpus-per-task=1 --gpu-bind=closest" in text
    assert "torch.distributed.run" not in text and "module load PrgEnv-gnu/8.5.0" in text


def test_dawn_derives_ranks_from_the_flat_hierarchy_and_uses_hydra():
    text = rendered("dawn")["jobs/validate-mpiexec.sbatch"][0]
    assert "ZE_HIERARCHY=${ZE_FLAT_DEVICE_HIERARCHY:-FLAT}" in text
    # the hierarchy chosen at submission is exported before the helper derives the ranks from it
    assert text.index("export ZE_FLAT_DEVICE_HIERARCHY=$ZE_HIERARCHY") < text.index('. "$LAUNCH_ENV"')
    # the site's FLAT is the default of the geometry, not exported again after it (facts.env)
    assert 'export ZE_FLAT_DEVICE_HIERARCHY="FLAT"' not in text
    assert "export ZE_AFFINITY_MASK=$(seq -s, 0 $(( RANKS_PER_NODE - 1 )))" in text
    assert 'mpiexec -n "$WORLD_SIZE" -ppn "$RANKS_PER_NODE" -hosts "$NODELIST"' in text
    assert "apptainer exec \"$SIF\"" in text and "NCCL_DEBUG" not in text


def test_cirrus_sets_tasks_on_srun_only_and_has_a_horovodrun_job():
    files = rendered("cirrus")
    srun = files["jobs/validate-srun.sbatch"][0]
    assert "#SBATCH --ntasks" not in srun and "#SBATCH --cpus-per-task" not in srun
    assert "#SBATCH --qos=gpu" in srun and "#SBATCH --exclusive" in srun and "--cpus-per-task=10" in srun
    assert '"$HOROVODRUN" -np "$WORLD_SIZE" -H "$HOSTS"' in files["jobs/validate-horovodrun.sbatch"][0]


def test_local_torchrun_job_is_standalone_on_one_node_and_c10d_on_more():
    text = rendered("local")["jobs/validate-torchrun.sbatch"][0]
    assert "RDZV=(--standalone)" in text
    assert '--rdzv-backend=c10d --rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT" --rdzv-id="$JOB_ID"' in text


def test_check_config_carries_cpu_sets_references_and_plugin():
    cfg = json.loads(rendered("lumi")["check-config.json"][0])
    assert cfg["cpu_bind"]["masks"] == LUMI_MASKS.split(",")
    assert cfg["cpu_bind"]["gpu_cpus"][0] == list(range(49, 56))
    # the AI Factory image's upstream aws-ofi-nccl (playbooks/lumi.yml)
    assert cfg["network"] == {"fabric": "slingshot-11", "net_plugin": "aws-ofi-nccl", "libfabric_provider": "cxi",
                              "nccl_net": ["AWS Libfabric", "Libfabric", "OFI"],
                              "nccl_expect": {"transport": "ofi", "provider": "cxi", "plugin": "aws-ofi-nccl"}}
    assert cfg["bandwidth"]["multi_node"]["busbw_gbs"] == 85.0 and cfg["mpi"]["library_match"] == "CRAY MPICH"
    path = GOLDEN / "lumi-check-config.json"
    if UPDATE:
        path.write_text(rendered("lumi")["check-config.json"][0])
    assert rendered("lumi")["check-config.json"][0] == path.read_text()


def test_each_site_states_what_its_nccl_logs_must_show():
    expect = {name: json.loads(rendered(name)["check-config.json"][0])["network"]["nccl_expect"]
              for name in ("lumi", "frontier", "cirrus", "dawn", "local")}
    assert expect["frontier"] == {**expect["lumi"], "plugin": "aws-ofi-rccl"}   # LUMI's image: aws-ofi-nccl
    assert expect["cirrus"] == {"transport": "ib", "provider": None, "plugin": None}  # NCCL's own IB, no plugin
    assert expect["dawn"] is None and expect["local"] is None  # oneCCL and Gloo write no NCCL logs
    assert "nccl_log.py" in rendered("local")  # shipped beside ddp_check.py, which imports it
    lumi = rendered("lumi")["README.md"][0]
    assert "every host using OFI through aws-ofi-nccl with provider cxi" in lumi
    assert "python nccl_log.py LOG... --expect-transport ofi --expect-provider cxi --expect-plugin aws-ofi-nccl" in lumi
    assert "every host using InfiniBand" in rendered("cirrus")["README.md"][0]


def test_readme_tells_users_how_to_run_it():
    text = rendered("cirrus")["README.md"][0]
    assert "sbatch [--nodes=N] /work/proj123/shared/sitestack/validation/jobs/validate-srun.sbatch" in text
    assert "validate-horovodrun.sbatch" in text and "80 GB/s on one node" in text


def test_templates_refuse_undefined_variables():
    env = jobs.environment()
    with pytest.raises(jinja2.UndefinedError):
        env.get_template("srun.sbatch.j2").render(site="x")


def test_rendering_is_stable():
    assert rendered("lumi") == rendered("lumi")


def test_bad_validation_facts_are_refused_at_load(tmp_path):
    text = (Path(pb.load("local").path) if Path(pb.load("local").path).is_absolute()
            else Path(__file__).resolve().parent.parent / pb.load("local").path).read_text()
    bad = tmp_path / "local.yml"
    bad.write_text(text.replace("launchers: [srun, mpiexec, torchrun, horovodrun]", "launchers: [srun, mpirunn]"))
    with pytest.raises(InputError, match="mpirunn"):
        pb.load(path=bad)
    bad.write_text(text.replace("lower: -0.95", "lower: 0.5"))
    with pytest.raises(InputError, match="lower"):
        pb.load(path=bad)


# -- the action, on an in-memory host ---------------------------------------------------------------

def test_check_mode_plans_every_file_and_changes_nothing():
    ctx = context("lumi")
    host = FakeHost(read_only=True)
    results = converge([step_for(ctx)], host, check=True, want_diff=True)
    assert results[0].status == "changed" and "ddp_check.py missing" in results[0].message
    assert "MPI probe" in results[0].message or "and " in results[0].message
    assert "+CPU_MASKS=" + LUMI_MASKS in results[0].diff
    assert host.mutations == []


def test_apply_writes_the_files_then_is_idempotent():
    ctx = context("local", python="/opt/venv/bin/python")
    spec = next(s for s in ctx.site.steps if s.action == "install-validation-job")
    step = InstallValidationJob.from_spec(spec, ctx)
    step.args = type(step.args)(dir=step.args.dir, python=None, build_probe=False, build_python="python3")
    host = FakeHost()
    first = converge([step], host)
    assert first[0].status == "changed", first[0].message
    base = f"{ctx.values['prefix']}/validation"
    assert f"{base}/jobs/validate-srun.sbatch" in host.files and f"{base}/README.md" in host.files
    assert "PYTHON=${SITESTACK_PYTHON:-/opt/venv/bin/python}" in host.files[f"{base}/jobs/validate-mpiexec.sbatch"]
    writes = len(host.mutations)
    again = converge([step], host)
    assert again[0].status == "ok" and len(host.mutations) == writes
    host.files[f"{base}/check-config.json"] = "{}"
    third = converge([step], host)
    assert third[0].status == "changed" and third[0].message == "check-config.json differs"


def test_a_scheduler_time_that_is_not_slurms_is_refused_at_load(tmp_path):
    from tests.conftest import playbook_copy
    path = playbook_copy(tmp_path, facts={"scheduler": {"time": "ten minutes"}})
    with pytest.raises(InputError) as err:
        pb.load(path=path)
    assert "facts.scheduler.time" in str(err.value) and "is not a Slurm time" in str(err.value)


def test_the_local_job_derives_its_time_limit_and_loads_the_stack_module():
    text = rendered("local")["jobs/validate-mpiexec.sbatch"][0]
    assert "#SBATCH --time=00:10:00" in text and "  SITESTACK_TIME_LIMIT=520\n" in text
    assert "module load pytorch/2.13.0-cpu" in text and "PYTHON=${SITESTACK_PYTHON:-python}" in text
    assert '"${GUARD[@]}" mpiexec' in text
    config = json.loads(rendered("local")["check-config.json"][0])
    assert config["stack"]["includes"] == ["horovod", "mpi4py"] and config["stack"]["needs"] == ["torch", "numpy", "mpi4py"]


def time_limit_block(text: str) -> str:
    """The batch script's lines that set SITESTACK_TIME_LIMIT (from the job's time left) and the deadline."""
    start = text.index('if [ -n "${SITESTACK_TIME_LIMIT:-}" ]; then')
    end = text.index("\n", text.index("export SITESTACK_DEADLINE="))
    return text[start:end + 1]


@pytest.mark.integration
@pytest.mark.parametrize("submit, want, source", [
    ([], 520, "this script's --time (600s)"),                               # no scheduler: the script's --time
    (["--time=4"], 160, "the job's time left (3:5|the job's time left (4:00"),  # M:SS; 240 s - 60 - 20
    (["--time=1-0"], 77740, "the job's time left (23:59:5|the job's time left (1-00:00:00"),  # 86400 - 8640 - 20
    (["--time=1"], 60, "the job's time left (0:5|the job's time left (1:00"),   # never below a minute
    (["--time=5", "--export=ALL,SITESTACK_TIME_LIMIT=33"], 33, "$SITESTACK_TIME_LIMIT"),  # the user's own
])
def test_the_time_limit_is_the_jobs_time_left(slurm_cluster, tmp_path, submit, want, source):
    """sbatch --time (or SBATCH_TIMELIMIT) overrides the script's #SBATCH --time: the checks' limit
    follows what Slurm says is left of the job (squeue %L), so the result is written before Slurm
    ends the job. Real sbatch and squeue on the test cluster."""
    script = tmp_path / "limit.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH --time=00:10:00\n" + time_limit_block(rendered("local")["jobs/validate-mpiexec.sbatch"][0])
                      + 'echo "limit=$SITESTACK_TIME_LIMIT deadline_in=$(( SITESTACK_DEADLINE - $(date +%s) )) '
                      'from=$SITESTACK_TIME_LIMIT_FROM"\n')
    if not submit:
        out = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60,
                             env={k: v for k, v in os.environ.items() if not k.startswith("SLURM_")})
        log = out.stdout
    else:
        out = slurm_cluster.sbatch_wait(f"--output={tmp_path}/job.out", f"--chdir={tmp_path}", *submit, str(script),
                                        timeout=120)
        assert out.returncode == 0, out.stderr + slurm_cluster.logs()
        log = (tmp_path / "job.out").read_text()
    found = re.search(r"limit=(\d+) deadline_in=(\d+) from=(.*)", log)
    assert found, log
    limit, left, said = int(found[1]), int(found[2]), found[3]
    assert want - 5 <= limit <= want and want - 10 <= left <= want, log  # squeue's %L counts down in seconds
    assert said.startswith(tuple(source.split("|"))), log  # %L: [D-][HH:]MM:SS, counting down from the start
