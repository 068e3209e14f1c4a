"""The site's history (sitestack/onsite/history.py) on its own: records made from results, appended
once, read back past torn lines, rebuilt from runs/, written by 16 processes at once; the toolchain and
start-up a run records (ddpcheck/provenance.py); the stack digest check-config.json names."""

from __future__ import annotations

import json
import multiprocessing
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from sitestack.installs.venv_manifest import plan_digest
from sitestack.onsite import history
from sitestack.onsite.ddpcheck import provenance as toolchain
from tests.onsite_dir import install_programs


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """history.py as a job directory holds it (its launcher and ``onsite/``), nothing of sitestack on the path."""
    return install_programs(tmp_path_factory.mktemp("job"), ("history.py",)) / "history.py"


def result(job: str = "42", started: float = 1764000000.5, busbw: float = 0.7, **extra) -> dict:
    """A result.json as the check program writes it (the fields the history reads)."""
    return {"schema": 1, "site": "local", "job_id": job, "started": started, "verdict": "passed", "cause": None,
            "nodes": 1, "world_size": 2, "launcher": "torchrun", "job_launcher": "torchrun", "backend": "gloo",
            "device": "cpu", "bandwidth": {"rows": [{"bytes": 4096, "busbw_gbs": 0.1}, {"bytes": 4194304, "busbw_gbs": busbw}],
                                           "reference": None, "cpu_waited_per_s": 0.05},
            "checks": [{"name": "compute", "status": "passed", "details": {"ranks": [
                {"gflops": 100.0, "judged_gflops": 130.0}, {"gflops": 120.0, "judged_gflops": 125.0}]}}],
            "startup": {"ready_s": 3.2}, "stack": {"module": "pytorch/2.13.0-cpu", "digest": "0123456789abcdef"},
            "toolchain": {"modules": ["mpich/4.0.2", "pytorch/2.13.0-cpu"], "libfabric": "1.15.2.0", "kernel": "6.1.0",
                          "python": "3.11.2"}, **extra}


def test_a_record_holds_the_run_its_metrics_and_toolchain():
    record = history.record_from_result(result(), "validation", "/r/sitestack-validation-42")
    assert record["id"] == "20251124T160000Z-validation-42"
    assert record["metrics"] == {"busbw_gbs": 0.7, "busbw_bytes": 4194304, "cpu_waited": 0.05,
                                 "compute_gflops": 110.0, "compute_min_gflops": 100.0,
                                 "compute_judged_min_gflops": 125.0, "startup_s": 3.2}
    assert record["layout"] == {"nodes": 1, "world_size": 2, "launcher": "torchrun", "backend": "gloo", "device": "cpu"}
    assert record["stack"]["digest"] == "0123456789abcdef" and record["toolchain"]["libfabric"] == "1.15.2.0"
    # the reference's row wins over the largest one
    with_reference = result(bandwidth={"rows": [], "reference": {"measured_gbs": 0.5, "at_bytes": 1048576}})
    assert history.metrics_of(with_reference)["busbw_gbs"] == 0.5
    assert history.metrics_of(with_reference)["busbw_bytes"] == 1048576


def test_hostile_values_are_bounded_and_made_printable():
    bad = result(job="../../etc/x\x1b]0;t\x07", site="a\nb" * 500, world_size="2; rm", nodes=float("nan"))
    bad["toolchain"]["modules"] = ["\x1b[31mred/1"] * 500
    record = history.record_from_result(bad, "validation", None)
    assert history.valid_id(record["id"]) and "/" not in record["id"]
    assert record["layout"]["world_size"] is None and record["layout"]["nodes"] is None
    assert len(record["toolchain"]["modules"]) == 100 and "\x1b" not in record["toolchain"]["modules"][0]
    assert len(record["site"]) <= 64 and "\n" not in record["site"]


def test_a_tuning_record_keeps_the_choice_and_its_date():
    doc = {"schema": "sitestack-tuning/1", "site": "local", "job_id": "7", "date": "2026-11-25T10:00:00Z",
           "launcher": "srun", "nodes": 1, "world_size": 2, "stack": {"module": "m", "digest": "d"},
           "chosen": {"OMP_NUM_THREADS": "1"}, "evidence": {"OMP_NUM_THREADS": "DDP step 20 ms vs 39 ms"}}
    record = history.record_from_result(doc, "tuning", None)
    assert record["id"] == "20261125T100000Z-tuning-7" and record["tuning"]["chosen"] == {"OMP_NUM_THREADS": "1"}


def test_append_is_once_per_run_and_read_skips_torn_lines(tmp_path):
    directory = str(tmp_path / "history")
    first = history.record_from_result(result("1", 1764000000.0), "validation", None)
    second = history.record_from_result(result("2", 1764000100.0), "validation", None)
    assert history.append(directory, first) == first["id"]
    assert history.append(directory, {**first, "verdict": "failed"}) == first["id"]   # no-op: the first record wins
    history.append(directory, second)
    index = tmp_path / "history" / "index.jsonl"
    assert len(index.read_text().splitlines()) == 2
    with open(index, "a") as handle:   # a writer killed mid-line, and a line of something else
        handle.write('{"schema": "sitestack-history/1", "id": "2026')
    runs = history.read(directory)
    assert [r["id"] for r in runs] == [first["id"], second["id"]] and runs[0]["verdict"] == "passed"
    # a run whose index line never came (killed between the two writes) is read from runs/
    index.write_text(index.read_text().splitlines()[0] + "\n")
    assert [r["id"] for r in history.read(directory)] == [first["id"], second["id"]]
    assert history.rebuild(directory) == 2
    assert [json.loads(line)["id"] for line in index.read_text().splitlines()] == [first["id"], second["id"]]


def test_modes_follow_the_prefix(tmp_path):
    shared, own = tmp_path / "shared", tmp_path / "own"
    shared.mkdir(mode=0o775)
    os.chmod(shared, 0o2775)
    own.mkdir(mode=0o755)
    os.chmod(own, 0o755)
    record = history.record_from_result(result(), "validation", None)
    # group-shared: setgid keeps the group, sticky keeps a member from unlinking or replacing another's run
    for prefix, dir_mode, index_mode in ((shared, 0o3775, 0o664), (own, 0o755, 0o644)):
        history.append(str(prefix / "history"), record)
        assert stat.S_IMODE(os.stat(prefix / "history").st_mode) == dir_mode
        assert stat.S_IMODE(os.stat(prefix / "history" / "runs").st_mode) == dir_mode
        assert stat.S_IMODE(os.stat(prefix / "history" / "index.jsonl").st_mode) == index_mode
        assert stat.S_IMODE(os.stat(prefix / "history" / "runs" / f"{record['id']}.json").st_mode) == 0o644
    # a history made group-shared before, without the sticky bit, gains it at the next append
    os.chmod(shared / "history" / "runs", 0o2775)
    history.append(str(shared / "history"), history.record_from_result(result("43"), "validation", None))
    assert stat.S_IMODE(os.stat(shared / "history" / "runs").st_mode) == 0o3775


def _append_one(directory: str, job: int, barrier) -> None:
    record = history.record_from_result(result(str(job), 1764000000.0 + job), "validation", None)
    barrier.wait()
    history.append(directory, record)


@pytest.mark.parametrize("attempt", range(3))
def test_sixteen_processes_appending_at_once_leave_sixteen_runs(tmp_path, attempt):
    directory = str(tmp_path / "history")
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(16)
    procs = [context.Process(target=_append_one, args=(directory, job, barrier)) for job in range(16)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(60)
    assert [proc.exitcode for proc in procs] == [0] * 16
    lines = (tmp_path / "history" / "index.jsonl").read_text().splitlines()
    assert len(lines) == 16 and all(history.load_record(line) for line in lines)
    assert sorted(json.loads(line)["job_id"] for line in lines) == sorted(str(j) for j in range(16))
    runs = [history.load_record(p.read_text()) for p in (tmp_path / "history" / "runs").iterdir()]
    assert len(runs) == 16 and all(runs)
    assert len(history.read(directory)) == 16


def test_the_command_line_records_lists_and_fails_softly(tmp_path, program: Path):
    path = tmp_path / "result.json"
    path.write_text(json.dumps(result()))
    config = tmp_path / "check-config.json"
    config.write_text(json.dumps({"history_dir": str(tmp_path / "h")}))
    run = subprocess.run([sys.executable, "-E", "-s", "-S", str(program), "record", "--config", str(config), str(path)],
                         capture_output=True, text=True)
    assert run.returncode == 0 and "recorded in" in run.stdout, run.stderr
    again = subprocess.run([sys.executable, str(program), "record", "--dir", str(tmp_path / "h"), str(path)],
                           capture_output=True, text=True)
    assert "was recorded already" in again.stdout
    listed = subprocess.run([sys.executable, str(program), "list", "--dir", str(tmp_path / "h"), "--json"],
                            capture_output=True, text=True)
    assert [r["job_id"] for r in json.loads(listed.stdout)["runs"]] == ["42"]
    blocked = tmp_path / "file"
    blocked.write_text("")
    soft = subprocess.run([sys.executable, str(program), "record", "--dir", str(blocked / "h"), str(path)],
                          capture_output=True, text=True)
    assert soft.returncode == 1 and soft.stdout == ""
    assert soft.stderr.startswith("sitestack history: not recorded: ") and len(soft.stderr.splitlines()) == 1


def test_toolchain_changes_name_each_change():
    old = {"modules": ["mpich/4.0.2", "cray-libfabric/1.15.2.0", "gone"], "libfabric": "1.15.2.0", "driver": None,
           "kernel": "6.1"}
    new = {"modules": ["mpich/4.1", "cray-libfabric/1.15.2.0", "extra/2"], "libfabric": "1.20.1", "driver": "amdgpu 6.3",
           "kernel": "6.1"}
    assert history.toolchain_changes(old, new) == [
        "module extra/2 added", "module gone removed", "module mpich 4.0.2 -> 4.1",
        "libfabric 1.15.2.0 -> 1.20.1", "driver (none) -> amdgpu 6.3"]
    assert history.toolchain_changes(old, dict(old)) == []


def test_values_read_at_run_time_are_bounded():
    assert toolchain.clean("1.15\x1b[31m;rm -rf\n" + "x" * 500) == ("1.15??31m?rm -rf " + "x" * 500)[:120]
    assert toolchain.clean("  ") is None
    env = {toolchain.LAUNCH_START: "1000.0"}
    assert toolchain.ready_seconds(env, 1002.5, now=1003.0) == 2.5
    for start, ready in (("nan", 1002.0), ("1e400", 1002.0), ("1000", 999.0), ("x", 1.0), ("1000", None)):
        assert toolchain.ready_seconds({toolchain.LAUNCH_START: start}, ready, now=1003.0) is None
    assert toolchain.ready_seconds({}, 1002.0, now=1003.0) is None
    record = toolchain.toolchain({"LOADEDMODULES": "a/1:\x1bb/2:"}, {"torch": "2.13.0", "nccl": None, "python": "3.11.2"},
                                 {"library": "MPICH Version: 4.0.2\nMPICH Release date: ..."})
    assert record["modules"] == ["a/1", "?b/2"] and record["mpi"] == "MPICH Version: 4.0.2" and record["nccl"] is None


def test_the_manifest_digest_is_the_stack_generations_plan_digest(tmp_path):
    plan = {"base": {"python": "3.11", "source": "system"}, "requirements": ["torch==2.13.0"], "built": {}}
    manifest = tmp_path / "stack.manifest.json"
    manifest.write_text(json.dumps({"format": 1, "plan": plan}))
    assert toolchain.manifest_digest(str(manifest)) == plan_digest(plan)
    config = {"stack": {"module": "pytorch/x", "manifest": str(manifest)}}
    assert toolchain.stack_record(config) == {"module": "pytorch/x", "digest": plan_digest(plan)}
    config["stack"]["manifest"] = str(tmp_path / "missing.json")
    assert toolchain.stack_record(config)["digest"] is None
    manifest.write_text("[1, 2]")
    assert toolchain.manifest_digest(str(manifest)) is None


def test_the_jobs_files_do_not_depend_on_whether_the_stack_was_made_first(tmp_path):
    """A playbook may install the validation job before its stack (Frontier's, Cirrus's): the job's files
    must be the same before and after the stack exists, or a second provision would change them. The
    stack's digest is read from its manifest when the job runs (provenance.stack_record, above)."""
    from sitestack.engine import playbook as pb
    from sitestack.installs.site_stack import job_inputs, site_stack
    from sitestack.validation import jobs
    from tests.contexts import offline_context

    ctx = offline_context(pb.load("local"), prefix=str(tmp_path / "prefix"))
    directory = f"{ctx.values['prefix']}/validation"
    before = jobs.job_files(job_inputs(ctx, directory, None))
    stack = site_stack(ctx)
    assert stack is not None
    Path(stack.manifest).parent.mkdir(parents=True, exist_ok=True)
    Path(stack.manifest).write_text(json.dumps({"format": 1, "plan": {"requirements": ["torch==2.13.0"]}, "packages": []}))
    assert jobs.job_files(job_inputs(ctx, directory, None)) == before
    config = json.loads(before["check-config.json"][0])
    assert config["stack"]["manifest"] == stack.manifest and "digest" not in config["stack"]
    assert config["history_dir"] == f"{ctx.values['prefix']}/history" and "history.py" in before

def test_a_tuning_is_recorded_with_its_start_and_whether_it_was_published(tmp_path: Path) -> None:
    from sitestack.engine.site_history import row_of
    from sitestack.onsite import history
    doc = {"schema": "sitestack-tuning/1", "site": "local", "job_id": "77", "date": "2026-11-25T10:00:00Z",
           "started": 1764064800.0, "chosen": {"OMP_NUM_THREADS": "1"}, "evidence": {"OMP_NUM_THREADS": "DDP step ..."},
           "published": False, "unpublished": "1 point(s) not run for want of time (default (again))"}
    record = history.record_from_result(doc, "tuning", None)
    assert record["id"] == "20251125T100000Z-tuning-77"   # the sweep's start, not the decision's date
    assert record["tuning"]["published"] is False and "want of time" in record["tuning"]["unpublished"]
    history.append(str(tmp_path / "history"), record)
    (read,) = history.read(str(tmp_path / "history"))
    assert read["tuning"] == record["tuning"]
    assert "chose OMP_NUM_THREADS=1, not published (1 point(s) not run" in row_of(read)
    assert row_of({**read, "tuning": {**read["tuning"], "published": True}}).count("chose OMP_NUM_THREADS=1, published") == 1


def test_a_bounded_read_keeps_the_newest_lines_whole(tmp_path: Path) -> None:
    from sitestack.onsite.history_store import newest_lines
    index = tmp_path / "index.jsonl"
    index.write_text("".join(f'{{"n": {i}}}\n' for i in range(1000)))
    text = newest_lines(str(index), 100)
    assert text is not None and text.endswith('{"n": 999}\n')
    assert all(json.loads(line)["n"] > 990 for line in text.splitlines())   # no cut first line
    assert newest_lines(str(index), index.stat().st_size) == index.read_text()   # a file within the cap: whole
    assert newest_lines(str(index), index.stat().st_size - 1) == index.read_text().split("\n", 1)[1]
    os.mkfifo(tmp_path / "fifo")
    assert newest_lines(str(tmp_path / "fifo"), 100) is None
    (tmp_path / "link").symlink_to(index)
    assert newest_lines(str(tmp_path / "link"), 100) is None
