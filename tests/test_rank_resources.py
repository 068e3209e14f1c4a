"""Faults whose cause is not a hang, injected for real into one rank of the local job (a resource limit,
a full scratch directory, another copy of a package, an out-of-memory kill, a read-only checkpoint
directory, a rank whose arithmetic differs): each named with the rank, its host and the cause."""

from __future__ import annotations

import contextlib
import glob
import os
import shlex
import socket
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.ports import free_port
from tests.test_fault_causes import patch_hook
from tests.test_faults import BOUND, GRACE, assert_fault, finish, job_env, overlay

pytestmark = pytest.mark.integration
HOST = socket.gethostname().split(".")[0]


#: The time limit of these jobs: none of their faults is a hang, so one a loaded machine never reaches
#: (the catalogue's 24 s ran out in the environment check with other tests running beside).
CAUSE_LIMIT = 90


def by_hand(job: dict, tmp_path: Path, prefixes: dict[int, str], python: str | None = None, **env: str) -> SimpleNamespace:
    """Two ranks started by hand (env://) under the job's guard; rank R's command led by ``prefixes[R]``
    (a shell fragment: ``ulimit -n 64;``, ``TMPDIR=/full``), the job's own python or ``python``."""
    out = tmp_path / "sitestack-validation-fault"
    program = job["dir"] / "ddp_check.py"
    py = python or job["python"]
    starts = " ".join(
        f"( {prefixes.get(r, '')} RANK={r} LOCAL_RANK={r} WORLD_SIZE=2 exec {shlex.quote(py)} -u {program} "
        f"--config {job['dir'] / 'check-config.json'} --out {out} --steps 8 ) &" for r in range(2))
    argv = [job["python"], "-E", "-s", "-S", str(program), "--guard", "--out", str(out), "--expect-world-size", "2",
            "--", "bash", "-c", f"{starts} wait"]
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "SITESTACK_TIME_LIMIT": str(CAUSE_LIMIT),
           "SITESTACK_DEADLINE": str(time.time() + CAUSE_LIMIT), **env}
    start = time.monotonic()
    proc = subprocess.Popen(argv, env=job_env(job, out, **env), cwd=tmp_path, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    return finish(proc, out, start, CAUSE_LIMIT + GRACE + 40)


def assert_named(run: SimpleNamespace, *words: str) -> str:
    """:func:`tests.test_faults.assert_fault` under this file's limit: a fault the run names by itself may
    take a loaded machine longer than the catalogue's bound, which is for faults the watchdogs end."""
    slow, run.seconds = run.seconds, min(run.seconds, BOUND - 1)
    assert slow < CAUSE_LIMIT + GRACE, f"took {slow:.0f}s"
    return assert_fault(run, *words)


class MemoryLimit:
    """A memory cgroup of ``limit`` bytes (cgroup v2 ``memory.max``, or v1 ``memory.limit_in_bytes`` with
    swap held to the same): a process in it that uses more is ended by the kernel's OOM killer."""

    def __init__(self, name: str, limit: int) -> None:
        v2 = Path("/sys/fs/cgroup")
        controllers = v2 / "cgroup.controllers"
        if controllers.exists() and "memory" in controllers.read_text().split():
            self.dir, files = v2 / name, {"memory.max": str(limit), "memory.swap.max": "0"}
            with contextlib.suppress(OSError):
                (v2 / "cgroup.subtree_control").write_text("+memory")
        else:  # v1: the memory controller's own hierarchy, under this process's group
            line = next((x for x in Path("/proc/self/cgroup").read_text().splitlines() if ":memory:" in x), None)
            if line is None:
                pytest.skip("no memory cgroup controller here")
            self.dir = Path("/sys/fs/cgroup/memory") / line.split(":", 2)[2].strip("/") / name
            files = {"memory.limit_in_bytes": str(limit), "memory.memsw.limit_in_bytes": str(limit)}
        try:
            self.dir.mkdir()
            for file, value in files.items():
                with contextlib.suppress(FileNotFoundError):  # no swap accounting: nothing to hold
                    (self.dir / file).write_text(value)
        except OSError as exc:
            pytest.skip(f"cannot make a memory cgroup in {self.dir.parent}: {exc}")

    def remove(self) -> None:
        with contextlib.suppress(OSError):
            self.dir.rmdir()


def test_out_of_memory_kill_of_one_rank_is_named_with_its_limit(installed_local_job, tmp_path):
    """Rank 1 runs in a cgroup of 1 GiB and grows by 256 MiB a training step (a leak): the kernel's OOM
    killer ends it, and the cause says out of memory with the limit, not only SIGKILL."""
    memory = MemoryLimit(f"sitestack-test-{os.getpid()}-{tmp_path.name}", 1 << 30)
    hog = "globals().setdefault('held', []).append(b'x' * (256 << 20))"
    python = overlay(installed_local_job, tmp_path / "leaky", patch_hook("torch.nn.functional", "mse_loss", hog))
    try:
        run = by_hand(installed_local_job, tmp_path, {1: f"echo $BASHPID > {memory.dir}/cgroup.procs;"}, python=python)
    finally:
        memory.remove()
    assert_named(run, f"rank 1 on {HOST} was killed by SIGKILL", "out of memory", "memory limit of 1 GiB", str(memory.dir))


def test_read_only_checkpoint_directory_is_named_with_rank_and_path_at_once(installed_local_job, tmp_path):
    """The writer rank's checkpoint directory on a read-only mount: the writer's rank, host and path are
    named, and the other rank is told at once (the run ends without waiting for the time limit)."""
    directory = tmp_path / "sitestack-validation-fault" / "checkpoint"
    directory.mkdir(parents=True)
    mounted = subprocess.run(["mount", "--bind", "-o", "ro", str(directory), str(directory)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount here: {mounted.stderr.strip()}")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(directory)], check=True)
        run = by_hand(installed_local_job, tmp_path, {})
    finally:
        subprocess.run(["umount", "-l", str(directory)], check=False)
    cause = assert_named(run, f"checkpoint: rank 0 on {HOST} could not write the checkpoint {directory}/ddp.pt",
                         "Read-only file system")
    checkpoint = next(c for c in run.result["checks"] if c["name"] == "checkpoint")
    assert run.result["fault"] is None and checkpoint["seconds"] < 5, f"the other rank waited for the time limit: {cause}"


def test_a_rank_with_non_deterministic_arithmetic_is_named(installed_local_job, tmp_path):
    """Rank 1's loss is scaled by a random factor near 1 at every call (arithmetic that is not
    deterministic): the checkpoint check names rank 1, not the divergence every rank then sees."""
    noisy = "return real(*args, **kwargs) * (1 + 1e-3 * __import__('random').random())"
    python = overlay(installed_local_job, tmp_path / "noisy", patch_hook("torch.nn.functional", "mse_loss", noisy))
    run = by_hand(installed_local_job, tmp_path, {}, python=python)
    assert_named(run, f"checkpoint: rank 1 on {HOST} is not deterministic: the same model and batch give loss")


def test_low_limit_full_tmpdir_and_another_numpy_on_one_rank_are_named(installed_local_job, tmp_path):
    """Rank 1 alone: ``ulimit -n 64``, its TMPDIR a full tmpfs, and PYTHONPATH putting a copy of the
    stack's own numpy (the same version) first. The environment check names each, with rank 1, its host,
    the limit's value and the paths; rank 0 is not blamed."""
    numpy_dir = subprocess.run([installed_local_job["python"], "-c", "import numpy, os; print(os.path.dirname(numpy.__file__))"],
                               capture_output=True, text=True, check=True).stdout.strip()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # the package and the libraries its wheel bundles beside it (numpy.libs: the extensions' RPATH is $ORIGIN/../numpy.libs)
    subprocess.run(["cp", "-a", numpy_dir, *glob.glob(f"{numpy_dir}.libs"), str(elsewhere)], check=True)
    full = tmp_path / "full"
    full.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(full)], capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        with contextlib.suppress(OSError):
            (full / "fill").write_bytes(b"\0" * (2 << 20))
        run = by_hand(installed_local_job, tmp_path, {1: f"ulimit -n 64; TMPDIR={full} PYTHONPATH={elsewhere}"})
    finally:
        subprocess.run(["umount", "-l", str(full)], check=False)
    cause = assert_named(run, f"environment: rank 1 on {HOST}: the open files limit (ulimit -n) is 64, below the 1024")
    assert run.result["fault"] is None, f"ended by a watchdog, not by the environment check: {cause}"
    problems = next(c for c in run.result["checks"] if c["name"] == "environment")["details"]["problems"]
    assert f"rank 1 on {HOST}: TMPDIR={full} cannot take a file: No space left on device" in problems, problems
    assert f"rank 1 on {HOST} imports numpy from {elsewhere / 'numpy'}, not the stack's ({os.path.realpath(numpy_dir)}): " \
           "PYTHONPATH puts it first" in problems, cause
    assert not any(p.startswith("rank 0") for p in problems), problems


def test_a_rank_that_cannot_read_the_checkpoint_is_named_at_once(installed_local_job, tmp_path):
    """Rank 1 finds no checkpoint file (as on a node the results directory is not shared with): rank 1,
    its host and the path are named, and rank 0 is told at once instead of waiting in the next check."""
    missing = "raise FileNotFoundError(2, 'No such file or directory', str(args[0]))"
    python = overlay(installed_local_job, tmp_path / "unshared", patch_hook("torch", "load", missing))
    run = by_hand(installed_local_job, tmp_path, {}, python=python)
    cause = assert_named(run, f"checkpoint: rank 1 on {HOST} could not read the checkpoint", "No such file or directory")
    assert run.result["fault"] is None, f"ended by a watchdog, not by the check: {cause}"
    assert not (run.out / "checkpoint").exists(), "rank 0 leaves no checkpoint behind"
