"""import_probe.py, the start-up probe every rank of the validation job runs: real processes, each
writing its rank file; the aggregate's time until every rank imported; bad input refused in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sitestack.onsite import import_probe
from tests.onsite_dir import install_programs


@pytest.fixture(scope="module")
def probe_program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """import_probe.py as a job directory holds it (its launcher and ``onsite/``)."""
    return install_programs(tmp_path_factory.mktemp("job"), ("import_probe.py",)) / "import_probe.py"


@pytest.fixture()
def run(probe_program: Path):
    def run(python: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([python, str(probe_program), *args], capture_output=True, text=True, timeout=300,
                              env={**os.environ, **(env or {})})
    return run


def test_ranks_and_aggregate(tmp_path: Path, run) -> None:
    t0 = time.time()
    for rank in range(3):   # the rank from the launcher's variables, as under srun
        out = run(sys.executable, "--out", str(tmp_path), "--module", "json",
                  env={"SLURM_PROCID": str(rank), "SLURM_NTASKS": "3", "RANK": ""})
        assert out.returncode == 0, out.stderr
    record = json.loads((tmp_path / "rank-00001.json").read_text())
    assert record["rank"] == 1 and record["world_size"] == 3 and record["pid"] > 0
    assert record["started_at"] <= record["imported_at"] and record["imported_s"] >= 0
    assert record["io"]["rchar"] > 0
    summary = import_probe.aggregate(str(tmp_path), t0, 3)
    assert summary["ranks"] == 3 and summary["imported"] == 3 and summary["missing"] == []
    assert 0 < summary["all_imported_s"] <= time.time() - t0
    assert summary["imported_s"]["max"] >= summary["imported_s"]["median"]
    assert summary["rchar"]["max"] >= summary["rchar"]["median"] > 0   # /proc/self/io, through the path into "io"
    # a missing rank and a failed import leave no time until all imported
    assert import_probe.aggregate(str(tmp_path), t0, 4)["all_imported_s"] is None
    failed = run(sys.executable, "--out", str(tmp_path), "--module", "no_such_module_here", "--rank", "3",
                 "--world-size", "4")
    assert failed.returncode == 1
    summary = import_probe.aggregate(str(tmp_path), t0, 4)
    assert summary["failed"] == [3] and summary["all_imported_s"] is None
    assert "ModuleNotFoundError" in summary["errors"][0]
    cli = run(sys.executable, "--aggregate", str(tmp_path), "--t0", f"{t0:.3f}", "--json", str(tmp_path / "s.json"))
    assert cli.returncode == 0, cli.stderr
    assert json.loads((tmp_path / "s.json").read_text())["ranks"] == 4


def test_ddp_start_on_gloo(tmp_path: Path, validation_python: tuple[str, dict[str, str]], probe_program: Path) -> None:
    python, env = validation_python
    t0 = time.time()
    env = {**env, "GLOO_SOCKET_IFNAME": "lo", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29733", "WORLD_SIZE": "2"}
    procs = [subprocess.Popen([python, str(probe_program), "--out", str(tmp_path), "--ddp"], env={**os.environ, **env, "RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    summary = import_probe.aggregate(str(tmp_path), t0, 2)
    assert summary["failed"] == [] and summary["all_ddp_ready_s"] >= summary["all_imported_s"] > 0


def test_bad_input_is_one_line(tmp_path: Path, run) -> None:
    cases = [({"RANK": "1; rm -rf /", "WORLD_SIZE": "2"}, ["--out", str(tmp_path)], "RANK="),
             ({"RANK": "0", "WORLD_SIZE": "1", "MASTER_PORT": "99999"}, ["--out", str(tmp_path)], "MASTER_PORT="),
             ({}, ["--out", str(tmp_path), "--rank", "2", "--world-size", "2"], "not below"),
             ({}, ["--out", str(tmp_path / "absent"), "--module", "json"], "not a directory"),
             ({}, ["--out", str(tmp_path), "--module", "os; import x"], "--module"),
             ({}, ["--aggregate", str(tmp_path), "--t0", "yesterday"], "--t0"),
             ({}, ["--aggregate", str(tmp_path)], "needs --t0"),
             ({}, ["--aggregate", str(tmp_path), "--combine", str(tmp_path / "s.json")], "give one of"),
             ({}, ["--combine", str(tmp_path / "s.json"), "--shared-python", sys.executable], "needs --shared-python")]
    for env, args, words in cases:
        out = run(sys.executable, *args, env={"RANK": "", "WORLD_SIZE": "", **env})
        assert out.returncode == 1, (args, out.stdout)
        assert out.stderr.startswith("error: import_probe: ") and words in out.stderr, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1
    assert not list(tmp_path.glob("rank-*.json"))


def test_combine_writes_the_jobs_startup_json(tmp_path: Path, run) -> None:
    """``--combine``, as the validation job runs it after its two start-up rounds: startup.json names
    both Pythons, the time until every rank imported from each, the staging time and both summaries;
    a round that did not run (no staging, a summary never written) is null, never an error."""
    t0 = time.time()
    shared_dir = tmp_path / "startup-shared"
    shared_dir.mkdir()
    for rank in range(2):
        assert run(sys.executable, "--out", str(shared_dir), "--module", "json", "--rank", str(rank),
                   "--world-size", "2").returncode == 0
    made = run(sys.executable, "--aggregate", str(shared_dir), "--t0", f"{t0:.3f}", "--expect", "2",
               "--json", str(tmp_path / "startup-shared.json"))
    assert made.returncode == 0, made.stderr
    shared = json.loads((tmp_path / "startup-shared.json").read_text())
    staged = {**shared, "all_imported_s": 0.25}
    (tmp_path / "startup-staged.json").write_text(json.dumps(staged))
    out = tmp_path / "startup.json"
    done = run(sys.executable, "--combine", str(out), "--shared-python", "/prefix/bin/python",
               "--shared-summary", str(tmp_path / "startup-shared.json"), "--staged-env", "/tmp/stack",
               "--staged-summary", str(tmp_path / "startup-staged.json"), "--stage-s", "1.500")
    assert done.returncode == 0, done.stderr
    doc = json.loads(out.read_text())
    assert doc == {"shared_path": "/prefix/bin/python", "shared_s": shared["all_imported_s"], "staged_path": "/tmp/stack",
                   "staged_s": 0.25, "stage_s": 1.5, "ranks": 2, "shared": shared, "staged": staged}
    assert 0 < doc["shared_s"] <= time.time() - t0
    assert done.stdout == (f"sitestack validation: every rank imported torch after {doc['shared_s']} s from the shared "
                           "prefix, 0.25 s staged (staging 1.5 s)\n")
    # not staged (the batch script passes empty texts), and a shared summary that is not an object
    (tmp_path / "startup-shared.json").write_text("[1]")
    done = run(sys.executable, "--combine", str(out), "--shared-python", "/prefix/bin/python",
               "--shared-summary", str(tmp_path / "startup-shared.json"), "--staged-env", "", "--staged-summary", "",
               "--stage-s", "")
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text()) == {"shared_path": "/prefix/bin/python", "shared_s": None, "staged_path": None,
                                           "staged_s": None, "stage_s": None, "ranks": None, "shared": None,
                                           "staged": None}
    assert "after None s from the shared prefix, None s staged (staging None s)" in done.stdout
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []   # no temporary left
    # a file it cannot write: one line, exit 1 (the batch script then prints its own line)
    failed = run(sys.executable, "--combine", str(tmp_path / "absent" / "startup.json"), "--shared-python", "p",
                 "--shared-summary", str(tmp_path / "startup-shared.json"))
    assert failed.returncode == 1 and failed.stderr.startswith("error: import_probe: ")
    assert len(failed.stderr.strip().splitlines()) == 1
