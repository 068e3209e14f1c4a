"""The users' launch helpers (sitestack-launch-env, sitestack-launch) and `invoke job-template`:
rendered for every site, sourced by bash, dash and zsh, and run for real under srun on the test
Slurm cluster (tests/slurm.py), two ranks and two concurrent jobs."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from sitestack.actions import ACTIONS
from sitestack.actions.launch_env import launch_inputs
from sitestack.core.paths import PLAYBOOK_DIR
from sitestack.core.shipped import single_file
from sitestack.engine import playbook as pb
from sitestack.model.context import RunContext, RunOptions
from sitestack.model.site import list_sites
from sitestack.validation import jobs
from sitestack.validation.launch_helpers import (
    BIND_RANK,
    HOSTLIST,
    LaunchInputs,
    StackPack,
    helper_files,
    render_helper,
)
from tests.conftest import run_invoke

SHELLS = [s for s in ("bash", "dash", "zsh") if shutil.which(s)]
#: The variables a test prints after sourcing the helper.
SHOWN = ("NODELIST", "NNODES", "TASKS_PER_NODE", "CPUS_PER_TASK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
         "RANK", "LOCAL_RANK", "CPU_MASKS", "MIOPEN_USER_DB_PATH", "MIOPEN_CUSTOM_CACHE_DIR", "OMP_NUM_THREADS",
         "ZE_FLAT_DEVICE_HIERARCHY", "APPTAINERENV_ZE_FLAT_DEVICE_HIERARCHY", "NCCL_SOCKET_IFNAME")
#: Prints the SHOWN variables as JSON lines (unset ones as null), in any POSIX shell.
PRINT = " ".join(f'printf "%s=%s\\n" {name} "${{{name}-<unset>}}";' for name in SHOWN)


def render(site: str, prefix: Path, playbook: Path | None = None) -> Path:
    """The site's helpers, rendered as its install-launch-env step does, written to ``prefix/bin``."""
    loaded = pb.load(None, playbook) if playbook else pb.load(site)
    ctx = RunContext.resolve(loaded, home="/home/u", user="u", account="proj", prefix=str(prefix),
                             options=RunOptions(), actions=ACTIONS)
    bindir = prefix / "bin"
    bindir.mkdir(parents=True, exist_ok=True)
    for name, (text, mode) in helper_files(launch_inputs(ctx, str(bindir))).items():
        (bindir / name).write_text(text)
        (bindir / name).chmod(mode)
    return bindir / "sitestack-launch-env"


def source(shell: str, helper: Path, env: dict[str, str], tail: str = PRINT) -> dict[str, str]:
    """Source ``helper`` in ``shell`` with exactly ``env`` (plus PATH), return the SHOWN variables."""
    out = subprocess.run([shell, "-c", f'. "$1" && {tail}', shell, str(helper)], capture_output=True, text=True,
                         env={"PATH": os.environ["PATH"], **env}, timeout=60)
    assert out.returncode == 0, out.stderr
    values = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
    return {k: v for k, v in values.items() if v != "<unset>"}


@pytest.fixture
def user(tmp_path: Path):
    """A user name of our own, so the MIOpen directories the helper makes in /tmp are ours to remove."""
    name = f"sitestack-test-{os.getpid()}"
    yield name
    for path in Path("/tmp").glob(f"{name}-miopen*"):
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("site", list_sites())
def test_every_site_helper_parses_in_every_shell(site: str, tmp_path: Path):
    helper = render(site, tmp_path)
    for path in helper.parent.iterdir():
        if path.name in (HOSTLIST, BIND_RANK):  # Python programs (tests/test_hostlist.py, test_torchrun_placement.py)
            continue
        for shell in SHELLS:
            out = subprocess.run([shell, "-n", str(path)], capture_output=True, text=True)
            assert out.returncode == 0, f"{shell} -n {path.name}: {out.stderr}"


@pytest.mark.parametrize("shell", SHELLS)
def test_frontier_geometry_masks_miopen_and_site_settings(shell: str, tmp_path: Path, user: str):
    helper = render("frontier", tmp_path)
    slurm = {"USER": user, "SLURM_JOB_ID": "1234567", "SLURM_JOB_NODELIST": "frontier[00012,00020]",
             "SLURM_JOB_NUM_NODES": "2", "SLURM_TASKS_PER_NODE": "8(x2)", "SLURM_NTASKS": "16",
             "NCCL_SOCKET_IFNAME": "hsn1"}
    # In the batch script Slurm sets SLURM_PROCID=0 too; ranks exist only in tasks (SLURM_STEP_ID).
    batch = source(shell, helper, {**slurm, "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "RANK": "5"})
    assert batch["NODELIST"] == "frontier00012,frontier00020" and batch["MASTER_ADDR"] == "frontier00012"
    assert (batch["NNODES"], batch["TASKS_PER_NODE"], batch["WORLD_SIZE"], batch["CPUS_PER_TASK"]) == ("2", "8", "16", "7")
    assert batch["MASTER_PORT"] == str(jobs.master_port(1234567)) == "24567"
    assert "RANK" not in batch and "LOCAL_RANK" not in batch
    assert batch["CPU_MASKS"].split(",")[4] == "0x00000000000000fe"  # GCD 4 -> CCD 0, core 0 reserved
    # (LUMI's masks, https://lumi-supercomputer.github.io/LUMI-EasyBuild-docs/p/PyTorch/)
    # MIOpen's cache: the job's own directory (model/miopen.py), made before use
    assert batch["MIOPEN_USER_DB_PATH"] == batch["MIOPEN_CUSTOM_CACHE_DIR"] == f"/tmp/{user}-miopen-1234567"
    assert Path(batch["MIOPEN_USER_DB_PATH"]).is_dir()
    Path(batch["MIOPEN_USER_DB_PATH"], "db").write_text("job 1234567's")
    other = source(shell, helper, {**slurm, "SLURM_JOB_ID": "1234568", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0",
                                   "SLURM_LOCALID": "0"})
    assert other["MIOPEN_USER_DB_PATH"] == f"/tmp/{user}-miopen-1234568" and Path(other["MIOPEN_USER_DB_PATH"]).is_dir()
    assert Path(batch["MIOPEN_USER_DB_PATH"], "db").read_text() == "job 1234567's"  # another job's is left alone
    assert batch["NCCL_SOCKET_IFNAME"] == "hsn1"  # the user's setting is kept over facts.env's hsn0
    task = source(shell, helper, {**slurm, "SLURM_STEP_ID": "0", "SLURM_PROCID": "9", "SLURM_LOCALID": "1"})
    assert (task["RANK"], task["LOCAL_RANK"], task["WORLD_SIZE"]) == ("9", "1", "16")
    # Hydra's proxies run under srun: its PMI_RANK is the rank, not the proxy's SLURM_PROCID.
    hydra = source(shell, helper, {**slurm, "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "PMI_RANK": "11",
                                   "PMI_SIZE": "16", "MPI_LOCALRANKID": "3"})
    assert (hydra["RANK"], hydra["LOCAL_RANK"]) == ("11", "3")


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("hierarchy, tasks, cpus", [("COMPOSITE", "4", "24"), ("FLAT", "8", "12"), (None, "8", "12"),
                                                    ("", "8", "12")])
def test_dawn_ranks_follow_the_ze_hierarchy(shell: str, hierarchy: str | None, tasks: str, cpus: str, tmp_path: Path):
    """Dawn's setup_mpi.sh (https://github.com/kh296/dawn-containers): 4 cards give 4 ranks x 24 cores
    with COMPOSITE, 8 x 12 with FLAT (the default, also for an empty value); the hierarchy goes into
    the image as APPTAINERENV_ZE_FLAT_DEVICE_HIERARCHY, which wins over its %environment."""
    helper = render("dawn", tmp_path)
    env = {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "pvc-s-[1,3]", "SLURM_JOB_NUM_NODES": "2",
           "SLURM_GPUS_ON_NODE": "4", "SLURM_CPUS_ON_NODE": "96"}
    if hierarchy is not None:
        env["ZE_FLAT_DEVICE_HIERARCHY"] = hierarchy
    got = source(shell, helper, env)
    assert (got["TASKS_PER_NODE"], got["CPUS_PER_TASK"]) == (tasks, cpus)
    assert got["WORLD_SIZE"] == str(2 * int(tasks)) and got["NODELIST"] == "pvc-s-1,pvc-s-3"
    assert got["ZE_FLAT_DEVICE_HIERARCHY"] == (hierarchy or "FLAT") and got["OMP_NUM_THREADS"] == cpus
    assert got["APPTAINERENV_ZE_FLAT_DEVICE_HIERARCHY"] == (hierarchy or "FLAT")


def test_hostile_values_stay_inert(tmp_path: Path):
    site = pb.load("local")
    ctx = RunContext.resolve(site, home="/h", user="u", account=None, prefix=str(tmp_path), options=RunOptions(),
                             actions=ACTIONS)
    marker = tmp_path / "ran"
    inputs = LaunchInputs(site="local", facts=ctx.facts, bin=str(tmp_path),
                          env={"EVIL": f'a"$(touch {marker})`touch {marker}`\\${{HOME}}\'$HOME'})
    helper = tmp_path / "helper"
    helper.write_text(render_helper(inputs))
    for shell in SHELLS:
        got = subprocess.run([shell, "-c", '. "$1" && printf %s "$EVIL"', shell, str(helper)], capture_output=True,
                             text=True, env={"PATH": os.environ["PATH"], "HOME": "/h"})
        assert got.returncode == 0, got.stderr
        # $(...) and backticks stay text; $NAME and ${NAME} expand when the job runs (sh_expanding)
        assert got.stdout == f'a"$(touch {marker})`touch {marker}`\\/h\'/h' and not marker.exists()


# -- for real on the test Slurm cluster -----------------------------------------------------------------

@pytest.fixture(scope="module")
def local_helpers(tmp_path_factory) -> Path:
    """The local site's helpers installed by `invoke provision --tags launch` into a scratch prefix."""
    prefix = tmp_path_factory.mktemp("launch") / "prefix"
    result = run_invoke("provision", "--site", "local", "--prefix", str(prefix), "--tags", "launch")
    assert result.returncode == 0, result.stdout + result.stderr
    again = run_invoke("provision", "--site", "local", "--prefix", str(prefix), "--tags", "launch")
    assert "changed" not in again.stdout.split("RECAP")[0], again.stdout
    return prefix


def srun(cluster, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    out = cluster.run("srun", *argv, timeout=timeout)
    assert out.returncode == 0, out.stderr + cluster.logs()
    return out


@pytest.mark.integration
@pytest.mark.parametrize("shell", SHELLS)
def test_two_ranks_under_srun(shell: str, local_helpers: Path, slurm_cluster):
    helper = local_helpers / "bin" / "sitestack-launch-env"
    script = '. "$1" && printf "%s %s %s %s %s %s %s %s\\n" "$SLURM_JOB_ID" "$RANK" "$LOCAL_RANK" "$WORLD_SIZE" ' \
             '"$TASKS_PER_NODE" "$NODELIST" "$MASTER_ADDR" "$MASTER_PORT"'
    out = srun(slurm_cluster, "--ntasks=2", "--nodes=1", shell, "-c", script, shell, str(helper))
    rows = sorted(line.split() for line in out.stdout.splitlines())
    assert [r[1:3] for r in rows] == [["0", "0"], ["1", "1"]], out.stdout
    job = int(rows[0][0])
    node = slurm_cluster.node
    for row in rows:
        assert row[3:] == ["2", "2", node, node, str(jobs.master_port(job))], out.stdout
    # sitestack-launch: the same, for a command that is not a shell
    launched = srun(slurm_cluster, "--ntasks=2", "--nodes=1", str(local_helpers / "bin" / "sitestack-launch"),
                    "sh", "-c", 'echo "$RANK/$WORLD_SIZE"')
    assert sorted(launched.stdout.split()) == ["0/2", "1/2"]


@pytest.mark.integration
@pytest.mark.parametrize("asked, tasks", [((), "2"), (("--ntasks=3",), "3"), (("--ntasks-per-node=1",), "1")])
def test_tasks_per_node_in_a_batch_script(local_helpers: Path, slurm_cluster, tmp_path: Path, asked, tasks):
    """sbatch sets SLURM_TASKS_PER_NODE (1) for a job that asked for no task count too: the helper then
    gives the site's ranks per node (the validation job's, tests/test_job_launch_env.py), as the job asked otherwise."""
    script = tmp_path / "job.sh"
    script.write_text(f'#!/bin/sh\n. {local_helpers / "bin" / "sitestack-launch-env"}\n'
                      f'echo "$TASKS_PER_NODE ${{SLURM_TASKS_PER_NODE:-unset}}" > {tmp_path}/tasks\n')
    out = slurm_cluster.sbatch_wait("--nodes=1", *asked, f"--output={tmp_path}/out-%j", str(script), timeout=120)
    assert out.returncode == 0, out.stderr + slurm_cluster.logs()
    got, slurm_value = (tmp_path / "tasks").read_text().split()
    assert got == tasks and slurm_value != "unset", (got, slurm_value)


@pytest.mark.integration
def test_two_concurrent_jobs_get_different_master_ports(local_helpers: Path, slurm_cluster, tmp_path: Path):
    helper = local_helpers / "bin" / "sitestack-launch-env"
    script = tmp_path / "job.sh"
    # Each job waits (at most 60 s) until both have started, so they certainly share the node at once.
    script.write_text(f"""#!/bin/sh
. {helper}
echo "$SLURM_JOB_ID $MASTER_PORT" > {tmp_path}/port-$SLURM_JOB_ID
touch {tmp_path}/started-$SLURM_JOB_ID
i=0
while [ "$(ls {tmp_path} | grep -c '^started-')" -lt 2 ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
[ $i -lt 600 ]
""")
    ids = []
    for _ in range(2):
        out = slurm_cluster.run("sbatch", "--parsable", "--ntasks=1", f"--output={tmp_path}/out-%j", str(script))
        assert out.returncode == 0, out.stderr
        ids.append(int(out.stdout.strip().split(";")[0]))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(list(tmp_path.glob("port-*"))) < 2:
        time.sleep(0.5)
    while time.monotonic() < deadline and slurm_cluster.run("squeue", "-h", "-j", ",".join(map(str, ids))).stdout.strip():
        time.sleep(0.5)
    ports = dict(tuple(map(int, p.read_text().split())) for p in tmp_path.glob("port-*"))
    assert ports == {job: jobs.master_port(job) for job in ids}
    assert len(set(ports.values())) == 2
    states = slurm_cluster.run("scontrol", "show", "job", ",".join(map(str, ids))).stdout
    assert "JobState=FAILED" not in states, states


@pytest.mark.parametrize("site", list_sites())
def test_job_template_is_bash(site: str, tmp_path: Path):
    out = tmp_path / "job.sh"
    result = run_invoke("job-template", "--site", site, "--prefix", str(tmp_path / "p"), "--output", str(out))
    assert result.returncode == 0, result.stderr
    text = out.read_text()
    assert subprocess.run(["bash", "-n", str(out)], capture_output=True).returncode == 0
    assert f"{tmp_path}/p/bin/sitestack-launch-env" in text and "module load" in text
    printed = run_invoke("job-template", "--site", site, "--prefix", str(tmp_path / "p"))
    assert printed.stdout == text


def test_job_template_bad_output_writes_nothing(tmp_path: Path):
    result = run_invoke("job-template", "--site", "local", "--output", str(tmp_path / "missing" / "job.sh"))
    assert result.returncode == 1 and "--output" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "missing").exists()


#: A stand-in for the stack's module file: the real one needs the stack venv built by provision (torch
#: from PyPI, minutes), which tests/test_modulefile_lmod.py and test_provision_local.py cover. This one
#: puts the session's torch venv first on PATH, which is what the job needs from it.
STAND_IN_MODULE = 'prepend_path("PATH", "{bin}")\n'

TRAIN = """
import os, sys, torch, torch.distributed as dist
dist.init_process_group("gloo")  # env://: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE from the helper
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
# one write per line: under python -u, print writes each argument and the newline on its own, and two
# ranks' lines sharing the job's output would interleave
sys.stdout.write(" ".join(str(x) for x in ("rank", os.environ["RANK"], "local", os.environ["LOCAL_RANK"], "of",
                                           dist.get_world_size(), "sum", int(t.item()), "port", os.environ["MASTER_PORT"],))
                 + "\\n")
sys.stdout.flush()
dist.destroy_process_group()
"""


@pytest.mark.integration
def test_job_template_runs_on_the_cluster(local_helpers: Path, slurm_cluster, validation_python, tmp_path: Path):
    python, env = validation_python
    job = tmp_path / "job.sh"
    result = run_invoke("job-template", "--site", "local", "--prefix", str(local_helpers), "--output", str(job))
    assert result.returncode == 0, result.stderr
    module = local_helpers / "modules" / "pytorch" / "2.13.0-cpu.lua"
    module.parent.mkdir(parents=True, exist_ok=True)
    module.write_text(STAND_IN_MODULE.format(bin=Path(python).parent))
    (tmp_path / "train.py").write_text(TRAIN)
    out = slurm_cluster.sbatch_wait("--nodes=1", f"--chdir={tmp_path}", f"--output={tmp_path}/job.out", str(job),
                                    timeout=300, env=env)
    log = (tmp_path / "job.out").read_text() if (tmp_path / "job.out").exists() else ""
    assert out.returncode == 0, out.stderr + log + slurm_cluster.logs()
    lines = sorted(line for line in log.splitlines() if line.startswith("rank "))
    job_id = int(out.stdout.split()[-1])
    assert lines == [f"rank {r} local {r} of 2 sum 3 port {jobs.master_port(job_id)}" for r in (0, 1)], log


def test_facts_stage_env_needs_local_scratch(tmp_path: Path):
    bad = tmp_path / "local.yml"
    bad.write_text((PLAYBOOK_DIR / "local.yml").read_text().replace("    local_scratch: /tmp\n", "    stage_env: true\n"))
    result = run_invoke("job-template", "--playbook", str(bad))
    assert result.returncode == 1 and "stage_env needs local_scratch" in result.stderr, result.stderr
    assert "local.yml:" in result.stderr and "Traceback" not in result.stderr


GOLDEN = Path(__file__).parent / "golden" / "launch"


@pytest.mark.parametrize("site", list_sites())
def test_helpers_match_golden(site: str, tmp_path: Path):
    """The rendered helpers of every site, reviewed once (SITESTACK_UPDATE_GOLDEN=1 rewrites them)."""
    prefix = Path("/opt/sitestack-golden")
    loaded = pb.load(site)
    ctx = RunContext.resolve(loaded, home="/home/u", user="u", account="proj", prefix=str(prefix),
                             options=RunOptions(), actions=ACTIONS)
    for name, (text, _mode) in helper_files(launch_inputs(ctx, f"{prefix}/bin")).items():
        if name in (HOSTLIST, BIND_RANK):  # copies of sitestack/onsite/hostlist.py and bind_rank.py
            assert text == single_file(name.removeprefix("sitestack-").replace("-", "_"))
            continue
        path = GOLDEN / f"{site}-{name}"
        if os.environ.get("SITESTACK_UPDATE_GOLDEN"):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        assert path.exists(), f"{path} missing: run with SITESTACK_UPDATE_GOLDEN=1 once and review it"
        assert text == path.read_text(), f"{path} differs from the rendering (SITESTACK_UPDATE_GOLDEN=1 to accept)"


def test_frontier_stages_a_conda_pack(tmp_path: Path):
    """Frontier's env is a conda env: conda-pack makes the pack, conda-unpack fixes the copy up (OLCF's guide).
    The script follows what the copy holds (tests/test_stage_archive.py: the pack follows what the env is)."""
    render("frontier", tmp_path)
    stage = (tmp_path / "bin" / "sitestack-stage-env").read_text()
    assert f"SITESTACK_PACK={tmp_path}/packs/pytorch-2.2.2-rocm5.7.tar.gz" in stage
    assert '_sitestack_dir="/mnt/bb/${USER}"' in stage  # {user} is the job's user, bound when it runs
    assert "sbcast --force --preserve" in stage and "bin/conda-unpack" in stage and "CONDA_PREFIX=" in stage
    assert ".sitestack-unpack.py" in stage and "VIRTUAL_ENV=" in stage
    from sitestack.installs.staging import StageArchive
    from sitestack.installs.venv_stack import stack_for
    ctx = RunContext.resolve(pb.load("frontier"), home="/home/u", user="u", account="proj", prefix=str(tmp_path),
                             options=RunOptions(), actions=ACTIONS)
    pack = StageArchive(stack_for(ctx), str(tmp_path))
    assert pack.expected_kind == "conda" and pack.conda_pack_argv("/env", "/out.tar.gz") == [
        f"{tmp_path}/tools/conda-pack/bin/conda-pack", "--prefix", "/env", "--output", "/out.tar.gz",
        "--format", "tar.gz", "--n-threads", "-1", "--force", "--quiet"]
    # The other sites do not stage: no sitestack-stage-env, and the pack step has nothing to do.
    for site in ("lumi", "dawn", "cirrus", "local"):
        render(site, tmp_path / site)
        assert not (tmp_path / site / "bin" / "sitestack-stage-env").exists()


def test_hostile_scratch_and_prefix_stay_inert_in_the_stage_script(tmp_path: Path):
    ctx = RunContext.resolve(pb.load("frontier"), home="/h", user="u", account=None, prefix=str(tmp_path),
                             options=RunOptions(), actions=ACTIONS)
    marker = tmp_path / "ran"
    evil_prefix = f"{tmp_path}/it's $(touch {marker})"
    inputs = LaunchInputs(site="frontier", facts=ctx.facts, bin=f"{evil_prefix}/bin", env={},
                          scratch=f"{tmp_path}/nvme/$(touch {marker})`touch {marker}`",
                          packs=(StackPack(module="pytorch/x", pack=f"{evil_prefix}/packs/p.tar.gz", own=True),))
    from sitestack.validation.launch_helpers import render_stage
    stage = tmp_path / "stage"
    stage.write_text(render_stage(inputs))
    for shell in SHELLS:
        # Outside a job it stops at once (no sbcast without a job), after reading every assignment.
        out = subprocess.run([shell, "-c", '. "$1"; printf "%s|%s" "$?" "$SITESTACK_PACK"', shell, str(stage)],
                             capture_output=True, text=True, env={"PATH": os.environ["PATH"]})
        assert out.stdout == f"1|{evil_prefix}/packs/p.tar.gz" and "not in a Slurm job" in out.stderr, out
    assert not marker.exists()
    assert f'_sitestack_dir="{tmp_path}/nvme/\\$(touch {marker})\\`touch {marker}\\`"' in stage.read_text()


@pytest.mark.parametrize("old, new, message", [
    ("    local_scratch: /tmp\n", "    local_scratch: scratch\n", "local_scratch: 'scratch' must be an absolute path"),
    ("  marker: /lustre/orion ", "  marker: lustre/orion ", "marker: 'lustre/orion' must be an absolute path"),
])
def test_facts_paths_that_jobs_and_probes_use_are_absolute(tmp_path: Path, old: str, new: str, message: str):
    site = "local" if "scratch" in old else "frontier"
    text = (PLAYBOOK_DIR / f"{site}.yml").read_text()
    assert old in text
    bad = tmp_path / f"{site}.yml"
    bad.write_text(text.replace(old, new))
    result = run_invoke("job-template", "--playbook", str(bad))
    assert result.returncode == 1 and message in result.stderr, result.stderr
    assert f"{site}.yml:" in result.stderr and "Traceback" not in result.stderr
