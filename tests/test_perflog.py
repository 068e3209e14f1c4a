"""The ReFrame perflog export (sitestack/engine/perflog.py) against ReFrame itself: reframe-hpc from
PyPI (the test extras) runs the equivalent run-only test on this machine (local scheduler and
launcher) and writes a real perflog with its default ``filelog`` handler. The export must write the
same header and, for a run with the same values, the same line; and ReFrame, given the export as the
test's existing perflog, must recognise the header as its own (it appends to the file instead of
moving it aside to ``<file>.h0``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from sitestack.core.errors import InputError
from sitestack.engine import perflog

SITE, MODULE = "testsite", "pytorch/2.13.0-cpu"
# what ReFrame's configuration names them (perflog.py's mapping, as docs/history.md states it)
PARTITION, ENVIRON = "local-gloo-cpu", "pytorch_2_13_0-cpu"

CONFIG = """
site_configuration = {{
    'systems': [{{'name': {system!r}, 'descr': 'sitestack perflog oracle', 'hostnames': ['.*'],
                  'modules_system': 'nomod',
                  'partitions': [{{'name': {partition!r}, 'scheduler': 'local', 'launcher': 'local',
                                  'environs': [{environ!r}]}}]}}],
    'environments': [{{'name': {environ!r}}}],
}}
"""

# The equivalent test: a run-only check whose performance functions read the metrics from its stdout.
CHECK = """
import reframe as rfm
import reframe.utility.sanity as sn


@rfm.simple_test
class sitestack_validation(rfm.RunOnlyRegressionTest):
    valid_systems = ['*']
    valid_prog_environs = ['*']
    executable = 'echo'
    executable_opts = [{line!r}]
    num_tasks = 1
    num_tasks_per_node = 1
    modules = [{module!r}]
    reference = {{'*': {reference!r}}}

    @sanity_function
    def validate(self):
        return sn.assert_found(r'busbw', self.stdout)

    @performance_function('GB/s')
    def busbw(self):
        return sn.extractsingle(r'busbw (\\S+)', self.stdout, 1, float)

    @performance_function('GFLOPS')
    def compute(self):
        return sn.extractsingle(r'compute (\\S+)', self.stdout, 1, float)

    @performance_function('s')
    def startup(self):
        return sn.extractsingle(r'startup (\\S+)', self.stdout, 1, float)
"""


def reframe_program() -> str:
    found = shutil.which("reframe", path=os.path.dirname(sys.executable)) or shutil.which("reframe")
    assert found, "reframe is missing: install the test extras (pip install -e '.[test]')"
    return found


def record(metrics: dict[str, float], references: dict[str, list[Any]], verdict: str = "passed",
           **run: Any) -> dict[str, Any]:
    """A validation history record (sitestack-history/1) on SITE, one rank on one node."""
    return {"schema": "sitestack-history/1", "id": f"run-{run.get('job_id', 'x')}", "kind": "validation",
            "site": SITE, "verdict": verdict, "cause": None if verdict == "passed" else "bandwidth: below the reference",
            "layout": {"nodes": 1, "world_size": 1, "launcher": "local", "backend": "gloo", "device": "cpu"},
            "stack": {"module": MODULE, "digest": "abcd1234"}, "metrics": {"busbw_bytes": 4194304, **metrics},
            "references": references, "toolchain": {}, "results": "/nonexistent", "regression": None, "tuning": None,
            **run}


def run_reframe(workdir: Path, metrics: dict[str, float], references: dict[str, list[Any]]) -> Path:
    """Run the equivalent test once under ReFrame (prefix ``workdir/rfm``); its perflog's path."""
    line = " ".join(f"{name} {metrics[metric]!r}" for name, metric, _ in perflog.PERF_VARIABLES)
    ref = {name: (*references[metric], unit) for name, metric, unit in perflog.PERF_VARIABLES if metric in references}
    (workdir / "config.py").write_text(CONFIG.format(system=SITE, partition=PARTITION, environ=ENVIRON))
    (workdir / "check.py").write_text(CHECK.format(line=line, module=MODULE, reference=ref))
    env = {**os.environ, "HOME": str(workdir / "home")}
    done = subprocess.run([reframe_program(), "-C", str(workdir / "config.py"), "-c", str(workdir / "check.py"),
                           "--prefix", str(workdir / "rfm"), "-r"], cwd=workdir, env=env, text=True,
                          capture_output=True, timeout=300)
    assert "Ran 1/1 test case" in done.stdout, done.stdout + done.stderr
    return workdir / "rfm" / "perflogs" / SITE / PARTITION / f"{perflog.CHECK_NAME}.log"


def columns(line: str, head: str) -> dict[str, str]:
    names, values = head.split(perflog.SEPARATOR), line.split(perflog.SEPARATOR)
    assert len(values) == len(names), f"{len(values)} fields under a header of {len(names)}: {line}"
    return dict(zip(names, values))


def same_run(reframe_line: str, head: str, metrics: dict[str, float], references: dict[str, list[Any]],
             verdict: str) -> dict[str, Any]:
    """The history record of the run ReFrame logged in ``reframe_line``: what only ReFrame knows at run
    time (job id, times, host, exit code) taken from its line, the rest as the test set it."""
    logged = columns(reframe_line, head)
    return record(metrics, references, verdict, job_id=logged["jobid"], started=float(logged["job_submit_time"]),
                  ended=float(logged["job_completion_time_unix"]), hosts=logged["job_nodelist"].split(","),
                  exit_code=int(logged["job_exitcode"]))


@pytest.fixture
def zone(monkeypatch: pytest.MonkeyPatch):
    """A local time zone off UTC by a fraction of an hour, for this process and ReFrame alike."""
    monkeypatch.setenv("TZ", "XST-05:30")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_export_matches_reframe_and_reframe_appends_to_it(tmp_path: Path, zone: None) -> None:
    good = {"busbw_gbs": 0.71, "compute_gflops": 141.0, "startup_s": 6.2}
    good_refs = {"busbw_gbs": [0.5, -0.05, None]}   # compute and startup: no reference
    (tmp_path / "a").mkdir()
    first = run_reframe(tmp_path / "a", good, good_refs)
    head, reframe_line = first.read_text().splitlines()
    assert head == perflog.header()
    ours = perflog.perflog_text([same_run(reframe_line, head, good, good_refs, "passed")])
    assert ours == f"{head}\n{reframe_line}\n"
    logged = columns(reframe_line, head)
    assert (logged["result"], logged["busbw_ref"], logged["compute_ref"], logged["compute_lower_thres"]) == \
        ("pass", "0.5", "0", "None")   # the oracle ran as intended: a reference, and ReFrame's "none"
    assert datetime.strptime(logged["job_completion_time"], perflog.TIME_FORMAT).strftime("%H:%M:%S") == \
        time.strftime("%H:%M:%S", time.localtime(float(logged["job_completion_time_unix"])))

    # A run below its reference fails in ReFrame's performance stage and is logged as "fail". The
    # export of both runs (and a tuning run, left out), put where ReFrame keeps this test's perflog:
    slow = {"busbw_gbs": 0.2, "compute_gflops": 98.5, "startup_s": 12.25}
    slow_refs = {"busbw_gbs": [0.5, -0.05, 0.1], "startup_s": [6.0, None, 0.5]}
    tuning = {**record(good, {}), "kind": "tuning", "job_id": "9", "started": 1.0}
    second_dir = tmp_path / "b"
    second_dir.mkdir()
    target = second_dir / "rfm" / "perflogs" / SITE / PARTITION / f"{perflog.CHECK_NAME}.log"
    target.parent.mkdir(parents=True)
    exported = perflog.perflog_text([same_run(reframe_line, head, good, good_refs, "passed"), tuning])
    target.write_text(exported)
    assert run_reframe(second_dir, slow, slow_refs) == target
    # ReFrame took the header for its own: it appended, and did not move the file aside
    assert not list(target.parent.glob("*.h*")), sorted(p.name for p in target.parent.iterdir())
    lines = target.read_text().splitlines()
    assert len(lines) == 3 and f"{lines[0]}\n{lines[1]}\n" == exported
    appended = lines[2]
    assert columns(appended, head)["result"] == "fail"
    assert perflog.perflog_text([same_run(appended, head, slow, slow_refs, "failed")]).splitlines()[1] == appended


def test_lines_keep_the_columns_and_the_order(tmp_path: Path) -> None:
    late = record({"busbw_gbs": 1.5, "compute_gflops": 200.0, "startup_s": 3.0}, {}, job_id="20", started=2000.0)
    early = record({"busbw_gbs": 1.0}, {}, verdict="failed", job_id="10", started=1000.0)   # compute, startup unmeasured
    early["layout"] = {"nodes": 2, "world_size": 8, "launcher": "srun", "backend": "gloo", "device": "cpu"}
    head, *lines = perflog.perflog_text([late, early]).splitlines()
    first, second = (columns(line, head) for line in lines)
    assert (first["jobid"], second["jobid"]) == ("10", "20")   # by time, oldest first
    assert (first["result"], first["job_exitcode"], first["compute_value"], first["startup_ref"]) == ("fail", "null", "None", "0")
    assert (first["partition"], first["num_tasks"], first["num_tasks_per_node"]) == ("srun-gloo-cpu", "8", "4")
    assert (second["result"], second["job_exitcode"], second["job_nodelist"], second["modules"]) == ("pass", "0", "null", MODULE)
    assert perflog.perflog_text([]) == f"{perflog.header()}\n"


@pytest.mark.parametrize("field, value", [("job_id", "12|3"), ("job_id", "12\n3"), ("stack", {"module": "a|b"}),
                                          ("hosts", ["n1", "n2\r"]), ("site", "a\u2028b")])
def test_a_value_that_would_break_the_line_is_refused(field: str, value: Any) -> None:
    bad = record({"busbw_gbs": 1.0}, {}, job_id="1", started=1.0)
    bad[field] = value
    with pytest.raises(InputError, match=r"history record run-.*contains '\|' or a line break"):
        perflog.perflog_text([bad])


@pytest.mark.parametrize("field, value, problem", [
    ("started", None, "started: missing"), ("started", "yesterday", "not a finite number"),
    ("metrics", {"busbw_gbs": float("nan")}, "metrics.busbw_gbs: not a finite number"),
    ("references", {"busbw_gbs": [1.0, -0.05]}, "not \\[reference, lower, upper\\]"),
    ("layout", {"world_size": 0}, "layout.world_size: not a positive whole number")])
def test_a_malformed_record_is_refused(field: str, value: Any, problem: str) -> None:
    bad = record({"busbw_gbs": 1.0}, {}, job_id="1", started=1.0)
    bad[field] = value
    with pytest.raises(InputError, match=problem):
        perflog.perflog_text([bad])


def test_write_perflog_follows_the_user_file_rule(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = [record({"busbw_gbs": 1.0}, {}, job_id="1", started=1.0)]
    out = tmp_path / "site.perflog"
    perflog.write_perflog(runs, str(out))
    assert out.read_text() == perflog.perflog_text(runs)
    perflog.write_perflog(runs, "-")
    assert capsys.readouterr().out == perflog.perflog_text(runs)
    with pytest.raises(InputError, match="--perflog: .* is a directory"):
        perflog.write_perflog(runs, str(tmp_path))
    (tmp_path / "link").symlink_to(out)
    with pytest.raises(InputError, match="is a symbolic link"):
        perflog.write_perflog(runs, str(tmp_path / "link"))
