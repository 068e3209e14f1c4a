"""The history against hostile or broken files: records of foreign types, FIFOs and links where the
history's files should be, terminal escapes in a record, times out of range, a planted link at
rebuild's temporary name, a lasting drop that must not become the baseline, a malformed
check-config.json. Each is one warning or one error line, never a traceback or a hang."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from sitestack.core.errors import InputError, SitestackError
from sitestack.core.host import local_host
from sitestack.engine import batchjob, perflog, regression, site_history
from sitestack.model.validation_facts import Regression
from sitestack.onsite import fileio, history
from tests.onsite_dir import install_programs


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """history.py as a job directory holds it (its launcher and ``onsite/``), nothing of sitestack on the path."""
    return install_programs(tmp_path_factory.mktemp("job"), ("history.py",)) / "history.py"


def record(n: int, busbw: float = 1.0, **extra: Any) -> dict[str, Any]:
    """A validation record as the job writes it (one run of a fixed stack and layout)."""
    result = {"site": "local", "job_id": str(n), "started": 1764000000.0 + 60 * n, "verdict": "passed",
              "nodes": 1, "world_size": 2, "job_launcher": "srun", "backend": "gloo", "device": "cpu",
              "bandwidth": {"rows": [{"bytes": 4194304, "busbw_gbs": busbw}], "reference": None},
              "checks": [{"name": "compute", "details": {"ranks": [{"gflops": 100.0}, {"gflops": 101.0}]}}],
              "startup": {"ready_s": 3.0}, "stack": {"module": "pytorch/2.13.0-cpu", "digest": "0123456789abcdef"},
              "toolchain": {"modules": ["mpich/4.0.2"], "libfabric": "1.15.2.0"}}
    return {**history.record_from_result(result, "validation", f"/r/{n}"), **extra}


def index_line(data: Any) -> str:
    return json.dumps(data) + "\n"


HOSTILE = [
    record(1, started="abc"),                       # no start time: skipped
    record(2, metrics=[1]),                         # a list for an object: made {}
    record(3, verdict="\x1b]0;pwned\x07", cause="\x1b[2J", stack={"digest": "\x1b]0;x\x07"}),
    record(4, started=1e300),                       # out of range: skipped
    record(5, regression={"status": ["fail"], "lines": "x"}, layout="srun", toolchain={"modules": 7}),
    record(6, metrics={"busbw_gbs": "fast", "startup_s": -4, "compute_min_gflops": True}),
    record(7, kind="tuning"),                       # a kind other than its id's: skipped
    record(8, metrics={"busbw_gbs": float("inf")}),  # Infinity, which JSON has not: no record, skipped
    [1, 2], "text", None,
]


def hostile_history(tmp_path: Path) -> Path:
    directory = tmp_path / "history"
    (directory / "runs").mkdir(parents=True)
    (directory / "index.jsonl").write_text("".join(index_line(r) for r in HOSTILE) + '{"torn": \n')
    return directory


def test_a_lasting_drop_keeps_failing_and_never_becomes_the_baseline(tmp_path: Path) -> None:
    directory = str(tmp_path / "history")
    policy = Regression()
    for n in range(10):
        history.append(directory, record(n, 1.0))
    statuses = []
    for n in range(10, 10 + policy.window + 2):   # past half the window, then past all of it
        new = record(n, 0.5)
        report = regression.judge(new, history.read(directory), policy)
        statuses.append(report["status"])
        history.append(directory, {**new, "regression": {"status": report["status"], "lines": report["lines"]}})
    assert statuses == ["fail"] * len(statuses)
    # a run that was itself only a warning is no baseline either
    warned = {**record(40, 1.0), "regression": {"status": "warn", "lines": []}}
    assert regression.healthy_runs(record(41), [record(1), warned], 10) == [history.normalise(record(1))]


def test_every_record_read_is_normalised_and_bad_ones_are_counted(tmp_path: Path) -> None:
    records, skipped = history.scan(str(hostile_history(tmp_path)))
    assert [r["job_id"] for r in records] == ["2", "3", "5", "6"]
    assert skipped == 8   # started "abc", 1e300, the wrong kind, Infinity, a list, a string, null, a torn line
    by_job = {r["job_id"]: r for r in records}
    assert by_job["2"]["metrics"] == {}
    assert by_job["3"]["verdict"] is None and by_job["3"]["cause"] == "?[2J" and by_job["3"]["stack"]["digest"] == "?]0;x?"
    assert by_job["5"]["regression"] == {"status": "unknown", "lines": []} and by_job["5"]["layout"]["launcher"] is None
    assert by_job["5"]["toolchain"]["modules"] == []
    assert by_job["6"]["metrics"] == {"busbw_gbs": None, "compute_min_gflops": None, "startup_s": None}
    # a record the writer made is its own normal form
    assert history.normalise(record(9)) == record(9)


def test_append_records_the_normalised_record(tmp_path: Path) -> None:
    directory = tmp_path / "history"
    run = history.append(str(directory), record(1, cause="a\x1b]0;pwned\x07b", metrics={"busbw_gbs": "fast"},
                                                extra_field="dropped"))
    stored = json.loads((directory / "runs" / f"{run}.json").read_text())
    assert stored["cause"] == "a?]0;pwned?b" and stored["metrics"] == {"busbw_gbs": None}
    assert "extra_field" not in stored
    with pytest.raises(history.HistoryError, match="not a history record"):
        history.append(str(directory), record(2, started=-5.0))


def test_list_prints_no_escape_and_no_traceback(tmp_path: Path, program: Path) -> None:
    directory = hostile_history(tmp_path)
    for extra in ([], ["--json"]):
        out = subprocess.run([sys.executable, str(program), "list", "--dir", str(directory), *extra],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert "\x1b" not in out.stdout and "\x07" not in out.stdout and "\\u001b" not in out.stdout
        assert "Traceback" not in out.stderr
        assert out.stderr == ("sitestack history: 8 index lines or run files skipped (torn, not history records, "
                              "or not regular files)\n")


def test_row_of_takes_every_record_read_on_a_host(tmp_path: Path, program: Path) -> None:
    directory = hostile_history(tmp_path)
    records, warnings = site_history.read_on(local_host(), str(program), str(directory))
    rows = [site_history.row_of(r) for r in site_history.with_changes(records)]
    assert len(rows) == 4 and all(row.isprintable() for row in rows)
    assert warnings == [f"history: 8 index lines or run files in {directory} skipped (torn, not history records, "
                        "or not regular files)"]


def _in_thread(call: Any) -> Any:
    """``call()``'s value, or a failure when it does not return within 20 s (a FIFO's open would wait)."""
    box: list[Any] = []

    def target() -> None:
        try:
            box.append((call(), None))
        except Exception as exc:  # raised here, in the test's thread
            box.append((None, exc))

    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    worker.join(20)
    assert box, "the read waited on a FIFO"
    value, error = box[0]
    if error is not None:
        raise error
    return value


def test_a_fifo_or_link_in_the_history_is_a_warning_never_a_wait(tmp_path: Path, program: Path) -> None:
    directory = tmp_path / "history"
    (directory / "runs").mkdir(parents=True)
    good = record(1)
    (directory / "runs" / f"{good['id']}.json").write_text(json.dumps(good))
    os.mkfifo(directory / "index.jsonl")
    os.mkfifo(directory / "runs" / f"{record(2)['id']}.json")
    secret = tmp_path / "elsewhere.json"
    secret.write_text(json.dumps(record(3)))
    (directory / "runs" / f"{record(3)['id']}.json").symlink_to(secret)
    records, warnings = _in_thread(lambda: site_history.read_on(local_host(), str(program), str(directory)))
    assert [r["id"] for r in records] == [good["id"]]
    assert any("index.jsonl is not a regular file" in w for w in warnings), warnings
    assert any("is a symbolic link" in w for w in warnings), warnings
    assert warnings[-1].startswith("history: 2 index lines or run files")
    # the shipped reader: the same, and no wait either
    out = subprocess.run([sys.executable, str(program), "list", "--dir", str(directory)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith(good["id"]) and "2 index lines" in out.stderr


def test_perflog_refuses_times_out_of_range_naming_the_record() -> None:
    for field, value in (("started", 1e300), ("ended", -1e12), ("started", 0.0)):
        bad = {**record(1), field: value}
        with pytest.raises(InputError, match=rf"history record {bad['id']}: {field}: not a time after 1970"):
            perflog.perflog_text([bad])


def test_a_result_with_a_time_out_of_range_is_one_error() -> None:
    result = {"job_id": "1", "started": 1e300, "verdict": "passed"}
    with pytest.raises(history.HistoryError, match="when the run started"):
        history.record_from_result(result, "validation", None)
    # a rank's own start time still dates it
    dated = history.record_from_result({**result, "ranks": [{"started": 1764000000.0}]}, "validation", None)
    assert dated["id"].startswith("20251124T160000Z-validation-1")


def test_rebuild_never_follows_a_link_planted_at_its_temporary_name(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    directory = tmp_path / "history"
    history.append(str(directory), record(1))
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    monkeypatch.setattr(fileio, "_token", lambda: "7")  # the temporary name the rewrite will pick
    (directory / f".index.jsonl.{os.getpid()}.7.tmp").symlink_to(victim)
    with pytest.raises(FileExistsError):
        history.rebuild(str(directory))
    assert victim.read_text() == "precious\n"
    assert not (directory / "index.jsonl").is_symlink()


@pytest.mark.parametrize("text", ["{bad", "[1]", '{"stack": 5}', '{"history_dir": 5}'])
def test_a_malformed_check_config_is_one_error_naming_it(tmp_path: Path, text: str) -> None:
    (tmp_path / "check-config.json").write_text(text)
    for check in (batchjob.check_imports, batchjob.check_launch_env, batchjob.job_config, site_history.history_dir_of):
        with pytest.raises(InputError) as caught:
            check(local_host(), str(tmp_path), "local")
        assert str(caught.value).startswith(f"{tmp_path}/check-config.json: ")
    os.unlink(tmp_path / "check-config.json")
    os.mkfifo(tmp_path / "check-config.json")
    with pytest.raises(SitestackError, match="not a regular file"):
        _in_thread(lambda: batchjob.check_launch_env(local_host(), str(tmp_path), "local"))
