"""A rank's limits, scratch directories, memory cgroup and imports (ddpcheck/resources.py, ddpcheck/imports.py),
on the real functions: real rlimits in a child process, a real full tmpfs and a read-only mount, a real OOM
kill in a memory cgroup, a real package imported from another directory."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sitestack.onsite.ddpcheck import imports, resources
from tests.test_rank_resources import MemoryLimit

CHILD_LIMITS = "import json; from sitestack.onsite.ddpcheck import resources as r; print(json.dumps(r.limits()))"


def test_a_low_open_files_limit_is_named_with_its_value():
    found = json.loads(subprocess.run(["bash", "-c", 'ulimit -n 64; exec "$0" -c "$1"', sys.executable, CHILD_LIMITS],
                                      capture_output=True, text=True, check=True).stdout)
    assert found["open_files"] == 64
    problems = resources.limit_problems(found)
    assert problems and "open files limit (ulimit -n) is 64" in problems[0]
    assert resources.limit_problems(resources.limits()) == [], "this machine's own limits are a healthy rank's"


def test_a_small_address_space_limit_is_named_in_bytes():
    found = json.loads(subprocess.run(["bash", "-c", 'ulimit -v 4000000; exec "$0" -c "$1"', sys.executable, CHILD_LIMITS],
                                      capture_output=True, text=True, check=True).stdout)
    assert any("virtual memory limit (ulimit -v) is 3.81 GiB" in p for p in resources.limit_problems(found))


@contextlib.contextmanager
def mounted(path: Path, *options: str):
    path.mkdir(exist_ok=True)
    done = subprocess.run(["mount", *options, str(path)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount here: {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_a_full_tmpdir_is_named_and_a_roomy_one_passes(tmp_path):
    assert resources.scratch_problems({"TMPDIR": str(tmp_path)}) == []
    with mounted(tmp_path / "full", "-t", "tmpfs", "-o", "size=2m", "tmpfs") as full:
        with contextlib.suppress(OSError):
            (full / "fill").write_bytes(b"\0" * (4 << 20))
        problems = resources.scratch_problems({"TMPDIR": str(full), "MIOPEN_USER_DB_PATH": str(tmp_path / "db")})
    assert len(problems) == 1 and problems[0].startswith(f"TMPDIR={full} cannot take a file: No space left"), problems


def test_a_roomy_tmpfs_below_the_minimum_is_full(tmp_path):
    with mounted(tmp_path / "small", "-t", "tmpfs", "-o", "size=8m", "tmpfs") as small:
        problem = resources.scratch_problem("TRITON_CACHE_DIR", str(small / "triton"))
    assert problem and "is full: 8 MiB free of 8 MiB, below the 64 MiB" in problem, problem


def test_a_read_only_cache_dir_is_named(tmp_path):
    (tmp_path / "ro").mkdir()
    with mounted(tmp_path / "ro", "--bind", "-o", "ro", str(tmp_path / "ro")), mounted(tmp_path / "ro", "-o", "remount,bind,ro"):
        problems = resources.scratch_problems({"TMPDIR": str(tmp_path), "MIOPEN_CUSTOM_CACHE_DIR": str(tmp_path / "ro")})
    assert problems == [f"MIOPEN_CUSTOM_CACHE_DIR={tmp_path / 'ro'} cannot take a file: Read-only file system"]


def test_an_oom_kill_in_the_memory_cgroup_is_named_with_the_limit(tmp_path):
    memory = MemoryLimit(f"sitestack-unit-{os.getpid()}", 64 << 20)
    script = ("import json, os; from sitestack.onsite.ddpcheck import resources as r; "
              "print(json.dumps([r.memory_cgroup(), os.getpid()]), flush=True); held = b'x' * (256 << 20)")
    try:
        done = subprocess.run(["bash", "-c", f'echo $$ > {memory.dir}/cgroup.procs; exec "$0" -c "$1"', sys.executable, script],
                              capture_output=True, text=True)
        record, pid = json.loads(done.stdout)
        assert done.returncode == -9 or done.returncode == 137, done
        words = resources.oom_words(record, pid)
    finally:
        memory.remove()
    assert record["limit"] == 64 << 20 and record["oom_kill"] == 0
    assert words and words.startswith("out of memory: the kernel's OOM killer ended it for exceeding its cgroup's "
                                      "memory limit of 64 MiB") and "oom_kill 0 -> 1" in words, words
    assert resources.oom_words(resources.memory_cgroup()) is None, "no kill since: not out of memory"
    if os.access("/dev/kmsg", os.R_OK):  # the kernel's own words, where its log is readable
        assert f"; the kernel: Memory cgroup out of memory: Killed process {pid} (python)" in words, words


def test_a_package_from_pythonpath_is_named_with_both_paths(tmp_path, monkeypatch):
    """A second copy of a package (PyYAML here: numpy is the validation stack's, not this one's; its own
    version string, so the same version) put first by PYTHONPATH: named with both paths."""
    import yaml
    stack = os.path.realpath(os.path.dirname(yaml.__file__))
    copy = tmp_path / "elsewhere" / "yaml"
    copy.mkdir(parents=True)
    (copy / "__init__.py").write_text(f"__version__ = {yaml.__version__!r}\n")
    done = subprocess.run([sys.executable, "-c", "import json; from sitestack.onsite.ddpcheck import imports as i; "
                           "import yaml; print(json.dumps([i.origin('yaml'), i.own_dirs(), yaml.__version__]))"],
                          env={**os.environ, "PYTHONPATH": f"{tmp_path / 'elsewhere'}{os.pathsep}{os.getcwd()}"},
                          capture_output=True, text=True, check=True)
    found, own, version = json.loads(done.stdout)
    assert found == str(copy) and version == yaml.__version__
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "elsewhere"))
    problems = imports.import_problems({"yaml": found}, {}, own, "rank 1 on vm")
    assert problems == [f"rank 1 on vm imports yaml from {copy}, not the stack's ({stack}): PYTHONPATH puts it first"]
    assert imports.import_problems({"yaml": stack, **imports.origins()}, {}, own, "rank 0") == []
    # the manifest's directory is the one expected, where the manifest names one
    assert "not the stack's (/stack/yaml)" in imports.import_problems({"yaml": stack}, {"yaml": ["/stack/yaml"]}, own, "r")[0]


def test_the_rank_whose_loss_differs_is_named():
    from types import SimpleNamespace

    from sitestack.onsite.ddpcheck.training import odd_arithmetic
    run = SimpleNamespace(ranks=[{"rank": r, "host": f"n{r}"} for r in range(3)])
    same = [0.5, 0.5, 0.5]
    assert odd_arithmetic(run, [same, same, same]) is None
    assert (odd_arithmetic(run, [same, same, [0.5, 0.5 + 1e-7, 0.5]]) or "").startswith("rank 2 on n2 is not deterministic")
    assert odd_arithmetic(run, [same, [0.5 * (1 + 1e-6)] * 3, same]) is None, "rounding of another CPU is not a fault"
    assert odd_arithmetic(run, [[0.6] * 3, same, same]) == \
        "rank 0 on n0 computes another loss on the same model and batch: 0.6, the other ranks 0.5"


def test_a_rank_that_ended_inside_mpi_init_is_named_with_its_low_limit():
    """The limits a rank recorded before MPI_Init lead the cause of a rank that never reached the
    environment check (a rank past it is named by the environment check itself)."""
    from sitestack.onsite.ddpcheck import faults
    found = json.loads(subprocess.run(["bash", "-c", 'ulimit -n 64; exec "$0" -c "$1"', sys.executable, CHILD_LIMITS],
                                      capture_output=True, text=True, check=True).stdout)
    low = resources.limit_problems(found)
    ranks = {0: {"rank": 0, "host": "n0", "world_size": 2, "phase": "MPI_Init", "limit_problems": low},
             1: {"rank": 1, "host": "n1", "world_size": 2, "phase": "MPI_Init", "state": "crashed", "signal": "SIGSEGV",
                 "signal_text": "Segmentation fault", "limit_problems": low}}
    cause = faults.describe_fault("killed", ranks, 60, 2, culprit=1)
    assert cause.startswith("rank 0 on n0: the open files limit (ulimit -n) is 64, below the 1024 a PyTorch rank needs"), cause
    assert "; rank 1 on n1: the open files limit (ulimit -n) is 64" in cause and "rank 1 on n1 crashed with SIGSEGV" in cause
    ranks[0]["phase"] = ranks[1]["phase"] = "ddp"
    assert "open files" not in faults.describe_fault("killed", ranks, 60, 2, culprit=1)
