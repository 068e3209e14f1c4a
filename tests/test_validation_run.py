"""The validation job for real on this machine: gloo on CPU under torchrun, mpiexec and a real Slurm
cluster (sbatch + srun, 2 and 4 ranks), and the faults it must catch, each with its reason."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

from sitestack.onsite import result_schema
from tests.conftest import run_invoke
from tests.ports import free_port
from tests.test_validation_units import SOCKET_FALLBACK

pytestmark = pytest.mark.integration


def checks_of(result: dict) -> dict[str, dict]:
    return {c["name"]: c for c in result["checks"]}


def assert_report(out: Path, verdict: str = "passed") -> dict:
    result = json.loads((out / "result.json").read_text())
    assert result_schema.problem(result) is None and set(result) == set(result_schema.FIELDS), result_schema.problem(result)
    assert result["verdict"] == verdict, json.dumps([(c["name"], c["status"], c["summary"]) for c in result["checks"]], indent=1)
    summary = (out / "summary.md").read_text()
    assert summary.startswith(f"# sitestack validation: local — {verdict.upper()}")
    png = (out / "bandwidth.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    return result


def validate(job: dict, tmp_path: Path, *args: str, env: dict | None = None):
    result = run_invoke("validate", "--site", "local", "--prefix", str(job["prefix"]), "--results", str(tmp_path),
                        "--python", job["python"], "--timeout", "600", *args, env={**job["env"], **(env or {})}, timeout=700)
    outs = sorted(p for p in tmp_path.glob("sitestack-validation-*") if p.is_dir())
    return result, (outs[-1] if outs else None)


# A stand-in for horovod.torch (the job's Python here has no Horovod): init/size/rank/allreduce through the
# torch.distributed group the check program already runs, so the horovod check's own logic runs for
# real with 2 ranks. FAKE_HOROVOD_OFFSET makes its allreduce wrong.
FAKE_HOROVOD = """
import os
import torch.distributed as dist
Sum = "sum"
def init(): pass
def size(): return dist.get_world_size()
def rank(): return dist.get_rank()
def mpi_built(): return False
def gloo_built(): return True
def nccl_built(): return False
def allreduce(tensor, op=Sum, name=None):
    out = tensor.clone()
    dist.all_reduce(out)
    return out + float(os.environ.get("FAKE_HOROVOD_OFFSET", "0"))
"""


# Under torchrun the horovod check starts Horovod's rendezvous server on rank 0 (ddpcheck/horovodcheck.py);
# the stand-in's server and slot type take what the check gives them (the real ones run in
# test_every_documented_launcher_passes_a_healthy_stack).
FAKE_RUNNER = {
    "runner/http/http_server.py": "class RendezvousServer:\n    def start(self): return 1\n    def init(self, plan): self.plan = plan\n",
    "runner/common/util/hosts.py": "class SlotInfo:\n    def __init__(self, **slot): self.__dict__.update(slot)\n",
}


def horovod_python(job: dict, tmp_path: Path) -> str:
    """The job's Python with the stand-in for horovod.torch in its own site-packages: an overlay venv over
    the test stack (tests/test_faults.overlay), so that the environment check, which names a package put
    first from anywhere else (PYTHONPATH), takes it as the stack's own."""
    from tests.test_faults import overlay

    python = overlay(job, tmp_path / "with-horovod")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    package = Path(site) / "horovod"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "torch.py").write_text(FAKE_HOROVOD)
    for path, text in FAKE_RUNNER.items():
        (package / path).parent.mkdir(parents=True, exist_ok=True)
        (package / path).write_text(text)
    return python


def check_argv(job: dict, out: Path, *extra: str) -> list[str]:
    return [job["python"], "-u", str(job["dir"] / "ddp_check.py"), "--config", str(job["dir"] / "check-config.json"),
            "--out", str(out), "--steps", "8", *extra]


def run_ranks(job: dict, out: Path, world: int, nprocs: int, port: int, extra: tuple[str, ...] = (), timeout: float = 120):
    """``nprocs`` ranks started by hand with RANK/WORLD_SIZE (the plain env:// launcher)."""
    procs = []
    for rank in range(nprocs):
        env = {**os.environ, **job["env"], "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen(check_argv(job, out, "--init-timeout", "8", *extra), env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    outputs = [p.communicate(timeout=timeout)[0] for p in procs]
    return [(p.returncode, text) for p, text in zip(procs, outputs)]


# -- the job, for real ----------------------------------------------------------------------------------

def test_install_built_the_probe_and_is_idempotent(installed_local_job, tmp_path):
    job = installed_local_job
    assert "changed  validation-job" in job["install_output"]
    probe = job["dir"] / "mpi-probe" / "bin" / "sitestack-mpi-probe"
    assert os.access(probe, os.X_OK)
    again = run_invoke("install-validation-job", "--site", "local", "--prefix", str(job["prefix"]), "--python",
                       job["python"], "--check", env={"SITESTACK_LOG_DIR": str(tmp_path)})
    assert again.returncode == 0 and "ok       validation-job" in again.stdout, again.stdout
    out = subprocess.run(["mpiexec", "-n", "2", str(probe)], capture_output=True, text=True, timeout=120)
    data = json.loads(out.stdout)
    assert out.returncode == 0 and data["size"] == 2 and data["allreduce_ok"] and "MPICH" in data["library"]
    assert data["latency_us"] > 0 and [b["bytes"] for b in data["bandwidth"]][:2] == [1024, 4096]


def test_torchrun_without_a_scheduler(installed_local_job, tmp_path):
    job = {**installed_local_job, "python": horovod_python(installed_local_job, tmp_path)}
    result, out = validate(job, tmp_path, "--scheduler", "none", "--launcher", "torchrun")
    assert result.returncode == 0, result.stdout + result.stderr
    data = assert_report(out)
    checks = checks_of(data)
    assert data["launcher"] == "torchrun" and data["world_size"] == 2 and data["backend"] == "gloo"
    assert checks["mpi4py"]["status"] == "skipped" and "torchrun" in checks["mpi4py"]["summary"]
    assert checks["horovod"]["status"] == "passed" and "2-rank allreduce exact" in checks["horovod"]["summary"]
    assert "sitestack validation of local: PASSED" in result.stdout and "summary.md" in result.stdout


def test_mpiexec_without_a_scheduler(installed_local_job, tmp_path):
    # what a user exported, misspelled (LUMI-AI-Guide PR #108): a warning naming it, not a failure
    typo = {"NCCL_SOCKET_IFNAM": "lo", "NCCL_DEBUG_SUBSYTEM": "INIT"}
    result, out = validate(installed_local_job, tmp_path, "--scheduler", "none", "--launcher", "mpiexec", env=typo)
    assert result.returncode == 0, result.stdout + result.stderr
    data = assert_report(out)
    checks = checks_of(data)
    environment = checks["environment"]
    assert environment["status"] == "passed" and environment["summary"].startswith(
        "warning: NCCL_DEBUG_SUBSYTEM: not a variable NCCL or RCCL reads; did you mean NCCL_DEBUG_SUBSYS?; "
        "NCCL_SOCKET_IFNAM: not a variable NCCL or RCCL reads; did you mean NCCL_SOCKET_IFNAME?"), environment
    assert data["launcher"] == "mpiexec (Hydra)"
    assert checks["mpi-probe"]["status"] == "passed" and "MPICH" in checks["mpi-probe"]["summary"]
    assert checks["mpi4py"]["status"] == "passed" and "2 ranks" in checks["mpi4py"]["summary"]
    assert checks["ddp"]["status"] == "passed" and checks["checkpoint"]["status"] == "passed"
    assert checks["horovod"]["summary"] == "skipped: Horovod not in this stack"


@pytest.mark.parametrize("ranks", [2, 4])
def test_sbatch_and_srun_on_the_slurm_cluster(installed_local_job, slurm_cluster, tmp_path, ranks):
    result, out = validate(installed_local_job, tmp_path, "--ranks-per-node", str(ranks), env=slurm_cluster.env)
    assert result.returncode == 0, result.stdout + result.stderr + slurm_cluster.logs()
    assert "submitted validate-srun.sbatch to Slurm as job" in result.stdout
    data = assert_report(out)
    checks = checks_of(data)
    assert data["launcher"] == "srun" and data["world_size"] == ranks and data["job_id"] == out.name.split("-")[-1]
    assert all(r["source"].startswith("SLURM_PROCID") for r in data["ranks"])
    limit = data["time_limit"]  # from what Slurm says is left of the job, unless the caller set it
    assert limit["from"].startswith(("the job's time left (", "$SITESTACK_TIME_LIMIT")) and limit["seconds"] >= 60, limit
    assert checks["mpi4py"]["status"] == "passed" and f"{ranks} ranks" in checks["mpi4py"]["summary"]
    assert checks["mpi-probe"]["status"] == "passed"
    rows = data["bandwidth"]["rows"]
    assert [r["bytes"] for r in rows][-1] == 4 << 20
    assert rows[-1]["busbw_gbs"] == pytest.approx(rows[-1]["algbw_gbs"] * 2 * (ranks - 1) / ranks)
    job_id = int(data["job_id"])
    assert any(r["master"].endswith(f":{20000 + job_id % 10000}") for r in data["ranks"])


# -- faults ------------------------------------------------------------------------------------------------

def test_a_rank_initialised_differently_and_a_socket_fallback_log_fail(installed_local_job, tmp_path):
    job = installed_local_job
    log = tmp_path / "nccl.log"
    log.write_text(SOCKET_FALLBACK)
    out = tmp_path / "out"
    env = {**os.environ, **job["env"], "SITESTACK_CHECK_FAULT": "seed@1", "FAKE_HOROVOD_OFFSET": "1"}
    proc = subprocess.run([horovod_python(job, tmp_path), "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           *check_argv(job, out, "--nccl-log", str(log))[2:]], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    checks = checks_of(assert_report(out, "failed"))
    assert checks["ddp"]["status"] == "failed"
    assert "rank 1 built different initial parameters than rank 0" in checks["ddp"]["summary"]
    assert checks["net-plugin"]["status"] == "failed"
    assert "fell back to TCP sockets between nodes on nid005011" in checks["net-plugin"]["summary"]
    assert checks["collectives"]["status"] == "passed" and checks["environment"]["status"] == "passed"
    assert checks["horovod"]["status"] == "failed" and "Horovod allreduce gave 4, expected 3" in checks["horovod"]["summary"]


def test_a_wrong_world_size_is_named(installed_local_job, tmp_path):
    job = installed_local_job
    out = tmp_path / "out"
    results = run_ranks(job, out, world=3, nprocs=2, port=free_port())
    assert [rc for rc, _ in results] == [1, 1], results
    checks = checks_of(json.loads((out / "result.json").read_text()))
    summary = checks["process-group"]["summary"]
    assert checks["process-group"]["status"] == "failed"
    assert "timed out after 8s waiting for 3 ranks" in summary and "2 of 3 ranks joined" in summary
    assert checks["ddp"]["status"] == "skipped"


def test_a_launcher_disagreeing_with_the_job_fails_before_init(installed_local_job, tmp_path):
    job = installed_local_job
    out = tmp_path / "out"
    results = run_ranks(job, out, world=2, nprocs=2, port=free_port(), extra=("--expect-world-size", "4"))
    assert [rc for rc, _ in results] == [1, 1]
    checks = checks_of(json.loads((out / "result.json").read_text()))
    assert checks["environment"]["status"] == "failed"
    assert "the job expects 4 ranks but the launcher (env, RANK/WORLD_SIZE) says world size 2" in checks["environment"]["summary"]


def test_a_taken_port_is_named(installed_local_job, tmp_path):
    job = installed_local_job
    out = tmp_path / "out"
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        results = run_ranks(job, out, world=2, nprocs=2, port=port)
    assert [rc for rc, _ in results] == [1, 1]
    checks = checks_of(json.loads((out / "result.json").read_text()))
    assert checks["process-group"]["status"] == "failed"
    assert f"MASTER_PORT {port} is already in use" in checks["process-group"]["summary"]


@pytest.mark.parametrize("masks, status", [("0x1,0x2", "passed"), ("0x2,0x1", "failed")])
def test_affinity_is_compared_with_the_masks(installed_local_job, tmp_path, masks, status):
    job = installed_local_job
    out = tmp_path / "out"
    env = {**os.environ, **job["env"], "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    proc = subprocess.run(["mpiexec", "-n", "2", "-bind-to", "core", *check_argv(job, out, "--cpu-masks", masks)],
                          env=env, capture_output=True, text=True, timeout=300)
    checks = checks_of(json.loads((out / "result.json").read_text()))
    assert checks["affinity"]["status"] == status, checks  # every check: an earlier one may have ended the run
    assert proc.returncode == (0 if status == "passed" else 1), proc.stdout[-3000:]
    if status == "failed":
        assert "rank 0 on" in checks["affinity"]["summary"] and "runs on CPUs 0, expected 1" in checks["affinity"]["summary"]


def test_a_single_rank_without_a_launcher_still_runs_the_collectives(installed_local_job, tmp_path):
    """One process on one device (e.g. `python ddp_check.py` on a one-GPU node): a process group of
    one is made, so the backend initialises and every collective runs."""
    job = installed_local_job
    env = {k: v for k, v in {**os.environ, **job["env"]}.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    out = subprocess.run(check_argv(job, tmp_path / "one", "--no-mpi"), env=env, text=True, capture_output=True,
                         timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    checks = checks_of(json.loads((tmp_path / "one" / "result.json").read_text()))
    assert checks["process-group"]["status"] == "passed" and "process group of 1 ranks" in checks["process-group"]["summary"]
    assert checks["collectives"]["status"] == "passed" and checks["ddp"]["status"] == "passed"


def install_job_with_helper(stack, env: dict) -> None:
    """The job installed without --python, after the users' launch helper (the install-launch-env step,
    tag launch) that it sources; without the helper `invoke validate` refuses before submitting."""
    install = run_invoke("install-validation-job", "--site", "local", "--prefix", str(stack.prefix), env=env,
                         timeout=900)
    assert install.returncode == 0, install.stdout + install.stderr
    helper = stack.prefix / "bin" / "sitestack-launch-env"
    if not helper.exists():
        refused = run_invoke("validate", "--site", "local", "--prefix", str(stack.prefix), "--scheduler", "none",
                             "--launcher", "mpiexec", env=env, timeout=120)
        assert refused.returncode == 1 and f"sources the launch helper {helper}, missing" in refused.stderr, refused.stderr
        launch = run_invoke("provision", "--site", "local", "--prefix", str(stack.prefix), "--tags", "launch", env=env,
                            timeout=600)
        assert launch.returncode == 0 and helper.exists(), launch.stdout + launch.stderr


def test_the_job_sources_the_users_launch_helper_under_sbatch_and_srun(local_stack, slurm_cluster, tmp_path):
    """The job as users get it on the Slurm cluster: the stack module, then the launch helper's geometry,
    hosts and MASTER_PORT (the same constants as the job's own), through `invoke validate`."""
    env = {**local_stack.env, **slurm_cluster.env, "SITESTACK_LOG_DIR": str(tmp_path / "logs")}
    install_job_with_helper(local_stack, env)
    script = (local_stack.prefix / "validation" / "jobs" / "validate-srun.sbatch").read_text()
    assert ". \"$LAUNCH_ENV\"" in script and "MASTER_PORT=" not in script
    result = run_invoke("validate", "--site", "local", "--prefix", str(local_stack.prefix), "--results", str(tmp_path),
                        "--timeout", "600", env=env, timeout=700)
    assert result.returncode == 0, result.stdout + result.stderr + slurm_cluster.logs()
    assert "submitted validate-srun.sbatch to Slurm as job" in result.stdout
    out = sorted(p for p in tmp_path.glob("sitestack-validation-*") if p.is_dir())[-1]
    data = json.loads((out / "result.json").read_text())
    assert data["verdict"] == "passed" and data["launcher"] == "srun" and data["world_size"] == 2
    job_id = int(data["job_id"])
    assert all(r["master"].endswith(f":{20000 + job_id % 10000}") for r in data["ranks"])
    assert local_stack.name in data["job_environment"]["modules"]


def test_the_job_validates_the_stack_as_users_load_it(local_stack, tmp_path):
    """Installed without --python, the job loads the stack's module (`module load pytorch/2.13.0-cpu`)
    and runs the Python it puts first on PATH; `invoke validate` first checks the job's imports
    against the stack's manifest. The report records the modules the ranks ran with."""
    env = {**local_stack.env, "SITESTACK_LOG_DIR": str(tmp_path / "logs")}
    install_job_with_helper(local_stack, env)
    script = (local_stack.prefix / "validation" / "jobs" / "validate-mpiexec.sbatch").read_text()
    assert f"module load {local_stack.name}" in script and "PYTHON=${SITESTACK_PYTHON:-python}" in script
    result = run_invoke("validate", "--site", "local", "--prefix", str(local_stack.prefix), "--results", str(tmp_path),
                        "--scheduler", "none", "--launcher", "mpiexec", "--timeout", "600", env=env, timeout=700)
    assert result.returncode == 0, result.stdout + result.stderr
    out = sorted(p for p in tmp_path.glob("sitestack-validation-*") if p.is_dir())[-1]
    data = json.loads((out / "result.json").read_text())
    assert data["verdict"] == "passed" and data["job_id"] == out.name.removeprefix("sitestack-validation-")
    assert local_stack.name in data["job_environment"]["modules"]
    assert data["job_environment"]["variables"]["GLOO_SOCKET_IFNAME"] == "lo"
    checks = checks_of(data)
    assert checks["mpi4py"]["status"] == "passed" and checks["environment"]["seconds"] > 0


@pytest.mark.parametrize("launcher", ["torchrun", "horovodrun"])
def test_every_documented_launcher_passes_a_healthy_stack(local_stack, tmp_path, launcher):
    """The stack with Horovod under torchrun (which starts no MPI ranks and no Horovod rendezvous: the
    horovod check makes Horovod's own Gloo rendezvous) and horovodrun (--gloo with MPICH); mpiexec and
    srun are the tests above. Every check that applies passes, Horovod sees both ranks."""
    if local_stack.horovod:
        pytest.skip(local_stack.horovod)
    env = {**local_stack.env, "SITESTACK_LOG_DIR": str(tmp_path / "logs")}
    install_job_with_helper(local_stack, env)
    result = run_invoke("validate", "--site", "local", "--prefix", str(local_stack.prefix), "--results", str(tmp_path),
                        "--scheduler", "none", "--launcher", launcher, "--timeout", "600", env=env, timeout=700)
    assert result.returncode == 0, result.stdout + result.stderr
    out = sorted(p for p in tmp_path.glob("sitestack-validation-*") if p.is_dir())[-1]
    checks = checks_of(json.loads((out / "result.json").read_text()))
    assert checks["horovod"]["status"] == "passed" and checks["horovod"]["summary"].startswith("2-rank allreduce exact")
    assert checks["mpi4py"]["status"] == "skipped" and "starts no MPI ranks" in checks["mpi4py"]["summary"]
