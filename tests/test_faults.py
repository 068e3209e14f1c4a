"""The fault catalogue: each fault injected for real into the local stack or the job's environment
(never by editing the check program), the installed job run as users run it (its batch script
under bash, or ranks started by hand under the job's guard), and each must give a FAIL whose
one-line cause names it, end within the job's time limit with result.json written, and leave no
process behind (every process whose environment names the run's results directory is gone).

Injection mechanisms, all real:
- a stack with a fault: an overlay venv of the test stack (``python -m venv`` + a ``.pth`` line that
  puts the stack's site-packages on the path) with a ``.pth`` hook that hangs one rank at start-up
  or in DDP, or without mpi4py;
- the MPI library: an LD_PRELOAD library (built here with gcc) whose MPI_Init/MPI_Init_thread hangs
  or crashes with SIGBUS in one rank; a directory on LD_LIBRARY_PATH whose libmpi.so.12 is not an
  ELF file; the job's environment without the path to libmpi.so.12;
- the test acts on a rank's process: SIGSTOP (frozen), SIGKILL (killed), a SIGSTOP/SIGCONT duty
  cycle holding it to 10% of a CPU (slow), or holds MASTER_PORT (taken);
- the job's environment: a launcher that starts fewer ranks than the world size, a CPU binding
  other than the one the job states, a socket interface that does not exist, site facts that
  name another torch version (the job's check-config.json, as install-validation-job writes it).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from sitestack.onsite import result_schema
from tests.ports import free_port

pytestmark = pytest.mark.integration

#: The checks' time limit in these jobs (SITESTACK_TIME_LIMIT): short, to keep the catalogue quick.
LIMIT = 24
#: ddp_check.GUARD_GRACE: the guard around the launcher acts this long after the ranks' deadline.
GRACE = 20
#: The longest a faulty job may take: the limit, the guard's grace and the report.
BOUND = LIMIT + GRACE + 10
#: The time limit of a job expected to pass: one it never reaches. A healthy job takes about 8 s here,
#: but on a machine other work keeps busy its ranks were seen to finish every check and still be
#: exiting when the catalogue's 24 s ran out (a FAIL of a healthy run).
HEALTHY_LIMIT = 300

SHIM_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
/* MPI_Init/MPI_Init_thread of one rank (FAULT_RANK, compared with PMI_RANK) hang, or crash with
   SIGBUS when FAULT_MODE=crash; every other rank calls the real MPI library. */
static int chosen(void) {
  const char *want = getenv("FAULT_RANK"), *rank = getenv("PMI_RANK");
  return want && rank && strcmp(want, rank) == 0;
}
static void fault(void) {
  const char *mode = getenv("FAULT_MODE");
  if (mode && strcmp(mode, "crash") == 0) raise(SIGBUS);
  for (;;) pause();
}
/* mpi4py dlopens the MPI library with local symbols: RTLD_NEXT may not see it, so look it up by name */
static void *real(const char *name) {
  void *f = dlsym(RTLD_NEXT, name);
  const char *libs[] = {"libmpi.so.12", "libmpich.so.12", "libmpi.so.40", "libmpi.so"};
  for (unsigned i = 0; !f && i < sizeof libs / sizeof *libs; i++) {
    void *h = dlopen(libs[i], RTLD_NOLOAD | RTLD_LAZY);
    if (h) f = dlsym(h, name);
  }
  return f;
}
int MPI_Init_thread(int *argc, char ***argv, int required, int *provided) {
  if (chosen()) fault();
  int (*init)(int *, char ***, int, int *) = (int (*)(int *, char ***, int, int *))real("MPI_Init_thread");
  return init(argc, argv, required, provided);
}
int MPI_Init(int *argc, char ***argv) {
  if (chosen()) fault();
  int (*init)(int *, char ***) = (int (*)(int *, char ***))real("MPI_Init");
  return init(argc, argv);
}
"""

#: A .pth hook (run by site.py at every start of the overlay's Python): rank 1 hangs at start-up.
HANG_AT_STARTUP = ("import os, time\n"
                   "while os.environ.get('RANK', os.environ.get('PMI_RANK')) == '1': time.sleep(1)\n")

#: A .pth hook: once torch's DDP module is imported, rank 1's DDP forward pass never returns.
HANG_IN_DDP = '''
import importlib.abc, importlib.util, os, sys, time

class _Hang(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "torch.nn.parallel.distributed":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            forward = module.DistributedDataParallel.forward

            def hang(self, *args, **kwargs):
                while os.environ.get("RANK", os.environ.get("PMI_RANK")) == "1":
                    time.sleep(1)
                return forward(self, *args, **kwargs)

            module.DistributedDataParallel.forward = hang
        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, _Hang())
'''


@pytest.fixture(scope="module")
def shim(tmp_path_factory) -> Path:
    if not shutil.which("gcc"):
        pytest.skip("no gcc to build the MPI_Init fault library")
    root = tmp_path_factory.mktemp("shim")
    (root / "shim.c").write_text(SHIM_C)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(root / "shim.so"), str(root / "shim.c"), "-ldl"], check=True)
    return root / "shim.so"


def overlay(job: dict, root: Path, hook: str | None = None, without: tuple[str, ...] = ()) -> str:
    """A venv over the test stack (its site-packages on the path through a .pth line), with a .pth
    ``hook`` and without the distributions named in ``without``; returns its python."""
    base = subprocess.run([job["python"], "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    subprocess.run([job["python"], "-m", "venv", "--without-pip", str(root)], check=True)
    site = Path(subprocess.run([str(root / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    if without:
        links = root / "stack-packages"
        links.mkdir()
        for entry in Path(base).iterdir():
            if not entry.name.startswith(without):
                (links / entry.name).symlink_to(entry)
        base = str(links)
    (site / "stack.pth").write_text(base + "\n")
    if hook:
        (site / "fault_hook.py").write_text(hook)
        (site / "zz_fault.pth").write_text("import fault_hook\n")
    return str(root / "bin" / "python")


def leftovers(out: Path) -> list[str]:
    """Processes (pid and command) whose environment names this run's results directory."""
    needle = f"SITESTACK_VALIDATION_OUT={out}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
            if needle in environ.split(b"\0"):
                command = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
                found.append(f"{entry}: {command}")
        except OSError:
            continue
    return found


def rank_progress(out: Path, rank: int) -> dict:
    try:
        return json.loads((out / "ranks" / f"rank-{rank}.json").read_text())
    except (OSError, ValueError):
        return {}


PHASES = ("startup", "MPI_Init", "import torch", "environment", "process-group", "affinity", "compute", "collectives", "ddp",
          "checkpoint", "bandwidth", "net-plugin", "mpi-probe", "mpi4py", "horovod", "report", "finished")


def when_rank_reaches(out: Path, rank: int, phase: str, timeout: float = 60) -> dict:
    """Wait until ``rank``'s worker process is at ``phase`` or later; its progress record."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        data = rank_progress(out, rank)
        if data.get("watchdog") and data.get("phase") in PHASES and PHASES.index(data["phase"]) >= PHASES.index(phase):
            return data
        time.sleep(0.01)
    raise AssertionError(f"rank {rank} did not reach {phase} in {timeout}s: {rank_progress(out, rank)}")


def job_env(job: dict, out: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PMI_", "OMPI_"))}
    env.update(job["env"])
    env.update({"SITESTACK_VALIDATION_OUT": str(out), "SITESTACK_PYTHON": job["python"],
                "SITESTACK_TIME_LIMIT": str(LIMIT), "OMP_NUM_THREADS": "1"})
    env.update(extra)
    return env


def finish(proc: subprocess.Popen, out: Path, start: float, wait: float = BOUND + 30) -> SimpleNamespace:
    try:
        log, _ = proc.communicate(timeout=wait)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        log, _ = proc.communicate()
        raise AssertionError(f"the job did not end in {wait:.0f}s:\n{log[-4000:]}") from None
    seconds = time.monotonic() - start
    left = leftovers(out)
    for line in left:  # clean up for the next test; the assertion reports them
        with_pid = int(line.split(":", 1)[0])
        try:
            os.kill(with_pid, signal.SIGKILL)
        except OSError:
            pass
    result = json.loads((out / "result.json").read_text()) if (out / "result.json").exists() else None
    # a finished run's result and a fault's alike: every field of the one type (onsite/result_schema.py)
    assert result is None or (result_schema.problem(result) is None and set(result) == set(result_schema.FIELDS)), \
        result_schema.problem(result)
    return SimpleNamespace(rc=proc.returncode, log=log, out=out, seconds=seconds, result=result, left=left)


def run_job(job: dict, tmp_path: Path, launcher: str = "mpiexec", during=None, directory: Path | None = None,
            **env: str) -> SimpleNamespace:
    """The installed batch script for ``launcher`` under bash (no scheduler), as `invoke validate
    --scheduler none` runs it; ``during(out)`` injects a fault while it runs."""
    out = tmp_path / "sitestack-validation-fault"
    script = (directory or job["dir"]) / "jobs" / f"validate-{launcher}.sbatch"
    start = time.monotonic()
    proc = subprocess.Popen(["bash", str(script)], env=job_env(job, out, **env), cwd=tmp_path, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    if during is not None:
        worker = threading.Thread(target=during, args=(out,), daemon=True)
        worker.start()
    return finish(proc, out, start, float(env.get("SITESTACK_TIME_LIMIT", LIMIT)) + GRACE + 40)


def run_by_hand(job: dict, tmp_path: Path, world: int, nprocs: int, port: int, *extra: str, **env: str) -> SimpleNamespace:
    """``nprocs`` ranks started by hand with RANK/WORLD_SIZE (the env:// launcher), under the job's guard."""
    out = tmp_path / "sitestack-validation-fault"
    program = job["dir"] / "ddp_check.py"
    starts = " ".join(
        f"RANK={r} LOCAL_RANK={r} WORLD_SIZE={world} \"$0\" -u {program} --config {job['dir'] / 'check-config.json'} "
        f"--out {out} --steps 8 {' '.join(extra)} &" for r in range(nprocs))
    argv = [job["python"], "-E", "-s", "-S", str(program), "--guard", "--out", str(out), "--expect-world-size", str(world),
            "--", "bash", "-c", f"{starts} wait", job["python"]]
    start = time.monotonic()
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "SITESTACK_DEADLINE": str(time.time() + LIMIT), **env}
    proc = subprocess.Popen(argv, env=job_env(job, out, **env),
                            cwd=tmp_path, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    return finish(proc, out, start)


def assert_fault(run: SimpleNamespace, *words: str) -> str:
    """FAIL with a one-line cause naming the fault, within the time limit, result written, nothing left."""
    assert run.result is not None, f"no result.json:\n{run.log[-4000:]}"
    cause = run.result.get("cause") or ""
    assert run.result["verdict"] == "failed", (cause, run.log[-3000:])
    assert run.rc != 0, run.log[-3000:]
    assert cause and "\n" not in cause, cause
    for word in words:
        assert word in cause, f"{word!r} not in the cause: {cause}\n{run.log[-3000:]}"
    assert run.seconds < BOUND, f"took {run.seconds:.0f}s (bound {BOUND}s)"
    assert not run.left, f"processes left behind: {run.left}"
    summary = run.out / "summary.md"
    assert summary.exists() and "\t" not in summary.read_text()
    last = run.log.rstrip().splitlines()[-1]
    assert "summary.md" not in last or summary.exists(), last
    print(f"CAUSE: {cause} ({run.seconds:.0f}s)")
    return cause


# -- the catalogue ----------------------------------------------------------------------------------------

def test_healthy_mpiexec_job_passes_and_leaves_nothing(installed_local_job, tmp_path):
    run = run_job(installed_local_job, tmp_path, SITESTACK_TIME_LIMIT=str(HEALTHY_LIMIT))
    assert run.rc == 0 and run.result["verdict"] == "passed", run.log[-4000:]
    assert run.result["cause"] is None and not run.left
    assert run.log.rstrip().splitlines()[-1].endswith(f"summary: {run.out}/summary.md")
    assert all(r["state"] == "finished" for r in (rank_progress(run.out, 0), rank_progress(run.out, 1)))
    checks = {c["name"]: c for c in run.result["checks"]}
    assert checks["compute"]["status"] == "passed", checks["compute"]["summary"]
    for rank in run.result["ranks"]:  # numpy and the thread settings of every rank are on record
        assert rank["numpy"] and rank["numpy"][0].isdigit(), rank["numpy"]
        assert rank["threads"]["torch_threads"] == 1 and rank["threads"]["env"]["OMP_NUM_THREADS"] == "1"
        assert rank["threads"]["ranks_sharing"] == 2 and rank["threads"]["cpus"] == len(os.sched_getaffinity(0))


def test_wrong_world_size(installed_local_job, tmp_path):
    run = run_by_hand(installed_local_job, tmp_path, 3, 2, free_port(), "--init-timeout", "8")
    assert_fault(run, "waiting for 3 ranks", "2 of 3 ranks joined")


def test_hang_at_startup_under_torchrun(installed_local_job, tmp_path):
    python = overlay(installed_local_job, tmp_path / "venv", HANG_AT_STARTUP)
    run = run_job(installed_local_job, tmp_path, "torchrun", SITESTACK_PYTHON=python)
    assert_fault(run, "time limit", "rank 1", "never reached the check program")


def test_hang_at_startup_under_mpiexec_inside_mpi_init(installed_local_job, shim, tmp_path):
    run = run_job(installed_local_job, tmp_path, LD_PRELOAD=str(shim), FAULT_RANK="1", FAULT_MODE="hang")
    cause = assert_fault(run, "time limit", "inside MPI_Init")
    assert run.result["fault"]["kind"] == "timeout" and "rank" in cause


def test_crash_inside_mpi_init_is_named(installed_local_job, shim, tmp_path):
    run = run_job(installed_local_job, tmp_path, LD_PRELOAD=str(shim), FAULT_RANK="1", FAULT_MODE="crash")
    assert_fault(run, "rank 1", "crashed with SIGBUS", "inside MPI_Init")


def test_hang_in_ddp(installed_local_job, tmp_path):
    python = overlay(installed_local_job, tmp_path / "venv", HANG_IN_DDP)
    run = run_job(installed_local_job, tmp_path, SITESTACK_PYTHON=python)
    assert_fault(run, "time limit", "rank 1 on", "hung during ddp (step 1 forward)")
    checks = {c["name"]: c for c in run.result["checks"]}
    assert checks["collectives"]["status"] == "passed" and checks["ddp"]["status"] == "failed"


@pytest.mark.parametrize("phase", ["ddp", "net-plugin"])
def test_frozen_rank(installed_local_job, tmp_path, phase):
    """Frozen in DDP (the other rank waits in gloo), or just before the MPI checks (the other rank
    spins in MPI_Barrier/allreduce, holding the GIL: no thread could time it out)."""
    def freeze(out: Path) -> None:
        data = when_rank_reaches(out, 1, phase)
        os.kill(data["pid"], signal.SIGSTOP)

    run = run_job(installed_local_job, tmp_path, during=freeze)
    assert_fault(run, "time limit", "rank 1 on", "frozen (stopped by SIGSTOP)")


def test_killed_rank(installed_local_job, tmp_path):
    seen = {}

    def kill(out: Path) -> None:
        data = when_rank_reaches(out, 1, "ddp")
        os.kill(data["pid"], signal.SIGKILL)
        seen.update(data)

    run = run_job(installed_local_job, tmp_path, during=kill)
    cause = assert_fault(run, f"rank 1 on {socket.gethostname().split('.')[0]}", "was killed by SIGKILL")
    assert run.result["fault"]["phase"] in PHASES[PHASES.index("ddp"):], cause
    assert f"during {run.result['fault']['phase']}" in cause


def test_port_taken(installed_local_job, tmp_path):
    job_id = 4242
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("0.0.0.0", 20000 + job_id))
        holder.listen(1)
        run = run_job(installed_local_job, tmp_path, SLURM_JOB_ID=str(job_id))
    assert_fault(run, f"MASTER_PORT {20000 + job_id} is already in use")


def test_wrong_binding(installed_local_job, tmp_path):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: no binding can be wrong")
    run = run_job(installed_local_job, tmp_path, HYDRA_BINDING="core", SITESTACK_CPU_MASKS="0x2,0x1")
    assert_fault(run, "affinity", "runs on CPUs 0, expected 1")


def test_mpi4py_missing(installed_local_job, tmp_path):
    python = overlay(installed_local_job, tmp_path / "venv", without=("mpi4py",))
    run = run_job(installed_local_job, tmp_path, SITESTACK_PYTHON=python)
    assert_fault(run, "mpi4py is missing", "No module named 'mpi4py'")


@pytest.mark.parametrize("how", ["no libmpi", "invalid ELF"])
def test_mpi4py_broken(installed_local_job, tmp_path, how):
    env = {"LD_LIBRARY_PATH": ""}
    if how == "invalid ELF":
        bad = tmp_path / "badlib"
        bad.mkdir()
        (bad / "libmpi.so.12").write_text("not a shared library\n" * 16)  # the name mpi4py loads; the probe links libmpich
        env["LD_LIBRARY_PATH"] = str(bad)
    run = run_job(installed_local_job, tmp_path, **env)
    if how == "no libmpi" and run.result and run.result["verdict"] == "passed":
        pytest.skip("libmpi.so.12 is found without the test's path here: nothing is missing")
    assert_fault(run, "mpi4py is broken", "invalid ELF header" if how == "invalid ELF" else "libmpi")


def test_torch_version_mismatch(installed_local_job, tmp_path):
    copy = tmp_path / "validation"
    shutil.copytree(installed_local_job["dir"], copy, symlinks=True)
    config = json.loads((copy / "check-config.json").read_text())
    config["torch_version"] = "2.12.0"  # the site facts name another torch than the stack has
    (copy / "check-config.json").write_text(json.dumps(config))
    for script in (copy / "jobs").iterdir():
        script.write_text(script.read_text().replace(str(installed_local_job["dir"]), str(copy)))
    run = run_job(installed_local_job, tmp_path, directory=copy)
    assert_fault(run, "environment", "torch 2.13.0", "the site facts say 2.12.0")


def duty_cycle(percent: int, stop: threading.Event):
    """A ``during`` that holds rank 1 to ``percent`` of a CPU as cpulimit does: SIGCONT, run for
    ``percent`` ms, SIGSTOP for the rest of each 100 ms."""
    def throttle(out: Path) -> None:
        pid = when_rank_reaches(out, 1, "process-group")["pid"]
        try:
            while not stop.is_set():
                os.kill(pid, signal.SIGCONT)
                time.sleep(percent / 1000)
                os.kill(pid, signal.SIGSTOP)
                time.sleep((100 - percent) / 1000)
        except OSError:
            pass
        finally:
            try:
                os.kill(pid, signal.SIGCONT)
            except OSError:
                pass
    return throttle


def test_slow_rank_at_ten_percent_cpu(installed_local_job, tmp_path):
    stop = threading.Event()
    try:
        run = run_job(installed_local_job, tmp_path, during=duty_cycle(10, stop))
    finally:
        stop.set()
    assert_fault(run, "compute: slow rank: rank 1 on", "slower than the other ranks", "stopped part of the time")


def test_slow_rank_at_thirty_percent_cpu(installed_local_job, tmp_path):
    """30% of a CPU, 2.5-3.5x slower: more than the 1.5x the check allows between ranks."""
    stop = threading.Event()
    try:
        run = run_job(installed_local_job, tmp_path, during=duty_cycle(30, stop))
    finally:
        stop.set()
    assert_fault(run, "compute: slow rank: rank 1 on", "slower than the other ranks", "stopped part of the time")


class CpuQuota:
    """A cgroup that holds its processes to ``percent`` of one CPU with CFS bandwidth control
    (https://docs.kernel.org/scheduler/sched-bwc.html): cgroup v2's cpu.max, or v1's cpu controller."""

    def __init__(self, name: str, percent: int) -> None:
        v2, v1 = Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/cpu")
        controllers = v2 / "cgroup.controllers"
        if controllers.exists() and "cpu" in controllers.read_text().split():
            self.dir = v2 / name
            self.files = {"cpu.max": f"{percent * 1000} 100000"}
            with contextlib.suppress(OSError):  # children get cpu.max once the root delegates the controller
                (v2 / "cgroup.subtree_control").write_text("+cpu")
        elif (v1 / "cpu.cfs_quota_us").exists():
            self.dir = v1 / name
            self.files = {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": str(percent * 1000)}
        else:
            pytest.skip("no cgroup CPU controller here (neither cgroup v2's cpu.max nor v1's cpu)")
        try:
            self.dir.mkdir()
            for name_, value in self.files.items():
                (self.dir / name_).write_text(value)
        except OSError as exc:
            pytest.skip(f"cannot make a CPU quota cgroup in {self.dir.parent}: {exc}")

    def add(self, pid: int) -> None:
        (self.dir / "cgroup.procs").write_text(str(pid))

    def remove(self) -> None:
        """Back to the parent group (what is left of the job), then gone."""
        for pid in (self.dir / "cgroup.procs").read_text().split():
            try:
                (self.dir.parent / "cgroup.procs").write_text(pid)
            except OSError:
                pass
        self.dir.rmdir()


def test_rank_held_to_thirty_percent_by_a_cgroup_cpu_quota(installed_local_job, tmp_path):
    """One rank in a cgroup with cpu.max 30000 100000 (v1: cfs_quota_us 30000 per 100000): it runs
    30 ms of each 100 ms period, 2.2-3.3x slower; the compute check names the rank and its quota."""
    quota = CpuQuota(f"sitestack-test-{os.getpid()}-{tmp_path.name}", 30)

    def confine(out: Path) -> None:
        quota.add(when_rank_reaches(out, 1, "environment")["pid"])

    try:
        run = run_job(installed_local_job, tmp_path, during=confine)
    finally:
        quota.remove()
    assert_fault(run, "compute: slow rank: rank 1 on", "CPU quota: its cgroup allows 0.3 CPUs")


def test_thread_oversubscription_is_named_before_the_timing(installed_local_job, tmp_path):
    """OMP_NUM_THREADS=32 for 2 ranks on this machine's CPUs: the environment check names it."""
    cpus = len(os.sched_getaffinity(0))
    if cpus >= 64:
        pytest.skip(f"{cpus} CPUs: 2 ranks x 32 threads fit")
    run = run_job(installed_local_job, tmp_path, OMP_NUM_THREADS="32")
    assert_fault(run, "environment: OMP_NUM_THREADS=32 on rank 0", "2 ranks x", f"threads on {cpus} CPUs",
                 "thread oversubscription")


def test_ranks_that_die_at_start_up_still_give_a_result(installed_local_job, tmp_path):
    """A Python that cannot start: the guard (run by the node's python3) writes the result."""
    run = run_job(installed_local_job, tmp_path, SITESTACK_PYTHON=shutil.which("false") or "/bin/false")
    assert_fault(run, "mpiexec exited with code", "before a result was written", "no rank reached the check program")


def test_bad_socket_interface(installed_local_job, tmp_path):
    run = run_by_hand(installed_local_job, tmp_path, 2, 2, free_port(), GLOO_SOCKET_IFNAME="nosuch0")
    assert_fault(run, "nosuch0")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
