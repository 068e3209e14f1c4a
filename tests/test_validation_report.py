"""The report is never lost: every file of a result written atomically, the redraw
(`python ddp_report.py result.json` in a results directory) that never empties summary.md, the plot on
a machine without matplotlib (an SVG drawn with the standard library), a results directory that is
read-only or full refused by name before the job starts, and an MPI probe that hangs named as its
timeout.

The redraw runs the report as the site has it (``ddp_report.py`` and ``report_plot.py`` copied into a
job directory) with the validation test venv's Python, which has matplotlib; "no matplotlib" is that
Python with a ``matplotlib`` module on ``PYTHONPATH`` whose import fails, as on a fresh machine.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from sitestack.onsite import ddp_report
from sitestack.onsite.ddpcheck import bandwidth, mpichecks
from sitestack.onsite.report_plot import human_bytes
from sitestack.validation.results_dir import OUT_REFUSED, RESULT_SPACE_MIB, results_check
from tests.onsite_dir import install_programs
from tests.test_faults import finish, job_env, leftovers

SVG = "{http://www.w3.org/2000/svg}"
SIZES = [4096 << (2 * i) for i in range(6)]


def sample_result(probe: bool = True, reference: bool = True) -> dict:
    """A result as rank 0 writes it: 2 ranks, a sweep with a reference, the C probe's bandwidth."""
    rows = [bandwidth.bandwidth_row(s, s / 1e9 + 2e-5, 2) for s in SIZES]
    ref = {"kind": "single-node", "busbw_gbs": 2.0, "lower": -0.5, "minimum_gbs": 1.0, "message_bytes": SIZES[-1],
           "at_bytes": SIZES[-1], "measured_gbs": rows[-1]["busbw_gbs"], "source": "facts"}
    mpi = {"probe": {"library": "MPICH Version: 4.0", "size": 2, "hosts": ["vm"], "latency_us": 1.5, "allreduce_ok": True,
                     "bandwidth": [{"bytes": 1 << k, "mb_s": 50.0 * (k - 8)} for k in (10, 14, 18, 22)]}}
    return {"schema": 1, "site": "local", "verdict": "failed", "cause": "bandwidth: below the reference", "world_size": 2,
            "nodes": 1, "hosts": ["vm"], "launcher": "mpiexec", "backend": "gloo", "device": "cpu", "torch": "2.13.0",
            "elapsed_s": 9.5,
            "checks": [{"name": "environment", "status": "passed", "summary": "2 ranks", "details": {}},
                       {"name": "bandwidth", "status": "failed", "summary": "below the reference", "details": {}}],
            "ranks": [{"rank": 0, "local_rank": 0, "host": "vm", "device": "cpu", "affinity": [0]}],
            "bandwidth": {"op": "allreduce", "dtype": "float32", "ranks": 2, "iters": 5, "rows": rows,
                          "reference": ref if reference else None, "definition": "algbw = bytes / time"},
            "mpi": mpi if probe else {}, "artefacts": {"json": "result.json", "markdown": "summary.md", "plot": None}}


@pytest.fixture(scope="module")
def report_python(validation_python) -> str:
    return validation_python[0]


@pytest.fixture
def job_dir(tmp_path) -> Path:
    """The report as installed on a site: ddp_report.py, run from the on-site package beside it."""
    return install_programs(tmp_path / "validation", ("ddp_report.py",))


@pytest.fixture
def no_matplotlib(tmp_path) -> Path:
    """A PYTHONPATH entry whose ``matplotlib`` cannot be imported (a stack without it)."""
    directory = tmp_path / "no-matplotlib"
    directory.mkdir()
    (directory / "matplotlib.py").write_text("raise ImportError('No module named matplotlib')\n")
    return directory


def redraw(python: str, job_dir: Path, results: Path, *args: str, blocked: Path | None = None) -> subprocess.CompletedProcess:
    """``python ddp_report.py ARGS`` run in ``results``, as the installed README says."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if blocked:
        env["PYTHONPATH"] = str(blocked)
    env["MPLCONFIGDIR"] = str(results.parent / "mplconfig")
    return subprocess.run([python, str(job_dir / "ddp_report.py"), *args], cwd=results, env=env, text=True,
                          capture_output=True, timeout=120)


def one_clear_line(proc: subprocess.CompletedProcess, *words: str) -> str:
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    message = proc.stderr.strip()
    assert "Traceback" not in message and "\n" not in message and message.startswith("ddp_report: "), message
    for word in words:
        assert word in message, message
    return message


# -- the redraw ---------------------------------------------------------------------------------------

def test_the_redraw_in_a_results_directory_leaves_summary_whole(tmp_path, job_dir, report_python):
    results = tmp_path / "sitestack-validation-42"
    results.mkdir()
    ddp_report.write_report(sample_result(), str(results))
    before = (results / "summary.md").stat().st_mtime_ns
    time.sleep(0.01)
    proc = redraw(report_python, job_dir, results, "result.json")
    assert proc.returncode == 0, proc.stderr
    assert "sitestack validation of local: FAILED" in proc.stdout
    result = json.loads((results / "result.json").read_text())
    text = (results / "summary.md").read_text()
    assert text == ddp_report.markdown(result) and text.rstrip().endswith("bandwidth vs message size")
    assert (results / "summary.md").stat().st_mtime_ns >= before
    # matplotlib is there: the PNG, named in result.json and linked from summary.md
    assert result["artefacts"]["plot"] == "bandwidth.png" and "](bandwidth.png)" in text
    assert (results / "bandwidth.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert not [p.name for p in results.iterdir() if p.name.endswith(".tmp")]


def test_a_result_that_cannot_be_rendered_leaves_every_file_as_it_was(tmp_path, job_dir, report_python, no_matplotlib):
    results = tmp_path / "sitestack-validation-43"
    results.mkdir()
    ddp_report.write_report(sample_result(), str(results))
    broken = json.loads((results / "result.json").read_text())
    del broken["bandwidth"]["rows"][2]["time_us"]  # the plot draws, the Markdown table cannot
    (results / "result.json").write_text(json.dumps(broken))
    files = {p.name: p.read_bytes() for p in results.iterdir()}
    for blocked in (None, no_matplotlib):  # PNG and SVG alike
        proc = redraw(report_python, job_dir, results, "result.json", blocked=blocked)
        one_clear_line(proc, "cannot render result.json", "KeyError: 'time_us'", "left as they were")
        assert {p.name: p.read_bytes() for p in results.iterdir()} == files


@pytest.mark.parametrize("content, words", [
    (None, ("result.json: cannot be read", "No such file or directory")),
    ("{\"verdict\": ", ("result.json: not JSON", "line 1")),
    ("[1, 2]", ("result.json: not a JSON object", "a JSON list")),
    ("{\"site\": \"x\"}", ("not a validation result", "\"verdict\" and \"checks\"")),
    ("{\"verdict\": \"passed\", \"checks\": [{\"name\": \"a\"}]}", ("a check without its name, status and summary",)),
])
def test_the_redraw_checks_its_input(tmp_path, job_dir, report_python, content, words):
    results = tmp_path / "results"
    results.mkdir()
    (results / "summary.md").write_text("the earlier summary\n")
    if content is not None:
        (results / "result.json").write_text(content)
    one_clear_line(redraw(report_python, job_dir, results, "result.json"), *words)
    assert (results / "summary.md").read_text() == "the earlier summary\n"


# -- the plot without matplotlib ----------------------------------------------------------------------

def svg_of(path: Path) -> dict:
    """The parts of the SVG plot, by class: polylines' points, texts."""
    root = ET.parse(path).getroot()
    assert root.tag == f"{SVG}svg"
    groups = {g.get("class"): g for g in root.iter(f"{SVG}g")}
    lines = {name: [tuple(map(float, p.split(","))) for p in g.find(f"{SVG}polyline").get("points").split()]
             for name, g in groups.items() if g.find(f"{SVG}polyline") is not None}
    texts: dict[str, list[str]] = {}
    for t in root.iter(f"{SVG}text"):
        texts.setdefault(t.get("class") or "", []).append(t.text or "")
    return {"root": root, "groups": groups, "lines": lines, "texts": texts}


def test_without_matplotlib_the_redraw_writes_the_same_figure_as_svg(tmp_path, job_dir, report_python, no_matplotlib):
    results = tmp_path / "results"
    results.mkdir()
    result = sample_result()
    (results / "result.json").write_text(json.dumps(result))
    proc = redraw(report_python, job_dir, results, "result.json", blocked=no_matplotlib)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((results / "result.json").read_text())["artefacts"]["plot"] == "bandwidth.svg"
    assert "![allreduce bandwidth vs message size](bandwidth.svg)" in (results / "summary.md").read_text()
    assert not (results / "bandwidth.png").exists()
    svg = svg_of(results / "bandwidth.svg")
    busbw, algbw, mpi = svg["lines"]["busbw"], svg["lines"]["algbw"], svg["lines"]["mpi"]
    assert len(busbw) == len(algbw) == len(SIZES) and len(mpi) == 4
    xs = [x for x, _ in busbw]
    assert xs == sorted(xs) and len(set(xs)) == len(xs)
    # log-log: equal steps in size (x4) are equal steps across; busbw rises with size (y grows downwards)
    steps = [b - a for a, b in zip(xs, xs[1:])]
    assert max(steps) - min(steps) < 0.5
    assert [y for _, y in busbw] == sorted((y for _, y in busbw), reverse=True)
    assert busbw == algbw  # 2 ranks: busbw = algbw
    assert len(svg["groups"]["busbw"].findall(f"{SVG}circle")) == len(SIZES)
    assert svg["root"].find(f".//{SVG}line[@class='reference']") is not None
    assert svg["groups"]["deciding"].find(f"{SVG}polygon") is not None
    title = svg["texts"]["title"][0]
    assert all(w in title for w in ("local", "2 ranks on 1 node(s)", "gloo on cpu", "(mpiexec)", "FAILED")), title
    assert [human_bytes(s) for s in SIZES] == [t for t in svg["texts"]["xtick"] if t in {human_bytes(s) for s in SIZES}]
    assert {"1 KiB", "4 KiB", "4 MiB"} <= set(svg["texts"]["xtick"])  # the probe's sizes too
    assert svg["texts"]["xlabel"] == ["message size"]
    assert svg["texts"]["ylabel"] == ["bandwidth (GB/s, 10⁹ bytes/s)", "MPI bandwidth (MB/s)"]
    assert any("the deciding point" in t for t in svg["texts"]["legend"])
    assert any("MPI point-to-point" in t for t in svg["texts"]["legend"])
    assert svg["texts"]["ytick"] and all(re.fullmatch(r"[0-9.e+-]+", t) for t in svg["texts"]["ytick"])


def test_the_svg_without_a_reference_or_a_probe_has_only_the_sweep(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    result = sample_result(probe=False, reference=False)
    ddp_report.write_report(result, str(tmp_path))
    svg = svg_of(tmp_path / "bandwidth.svg")
    assert set(svg["lines"]) == {"busbw", "algbw"} and "deciding" not in svg["groups"]
    assert svg["root"].find(f".//{SVG}line[@class='reference']") is None
    assert svg["texts"]["ylabel"] == ["bandwidth (GB/s, 10⁹ bytes/s)"]


# -- the MPI probe's end ------------------------------------------------------------------------------

@pytest.mark.parametrize("status, log, want", [
    ({"exit_code": 124, "limit_s": 20}, "", "the MPI probe did not finish within 20 s (killed by timeout; see "),
    ({"exit_code": 137, "limit_s": 30}, "", "did not finish within 30 s (killed by timeout"),
    ({"exit_code": 127}, "sitestack-mpi-probe: error while loading shared libraries: libmpi.so.12\n===\n",
     "the MPI probe exited with code 127: sitestack-mpi-probe: error while loading shared libraries: libmpi.so.12 (see "),
    ({"exit_code": 0}, "", None),
    ("not json", "", None),
])
def test_how_the_probe_ended_is_its_cause(tmp_path, status, log, want):
    (tmp_path / "mpi-probe.status").write_text(status if isinstance(status, str) else json.dumps(status))
    (tmp_path / "mpi-probe.log").write_text(log)
    cause = mpichecks.probe_failure(str(tmp_path / "mpi-probe.json"))
    assert cause == want if want is None else want in cause, cause
    assert mpichecks.probe_failure(str(tmp_path / "missing" / "mpi-probe.json")) is None


# -- the installed job ------------------------------------------------------------------------------

def in_namespace(setup: str, argv: list[str]) -> subprocess.CompletedProcess:
    """``argv`` after the shell lines ``setup`` in a private mount namespace."""
    return subprocess.run(["unshare", "-m", "--propagation", "private", "bash", "-c", f'set -e\n{setup}\nexec "$@"', "setup",
                           *argv], text=True, capture_output=True, timeout=60)


def test_the_check_invoke_validate_runs_before_it_submits(tmp_path, can_mount):
    """The batch script's check, on its own: a good directory passes (and is made), a read-only one
    and a full one are refused with the job's line and code."""
    good = subprocess.run(results_check(str(tmp_path / "new" / "results")), text=True, capture_output=True)
    assert good.returncode == 0 and not good.stderr and (tmp_path / "new" / "results").is_dir()
    assert list((tmp_path / "new" / "results").iterdir()) == []
    shelf = tmp_path / "shelf"
    shelf.mkdir()
    ro = in_namespace(f"mount --bind {shelf} {shelf}\nmount -o remount,bind,ro {shelf}", results_check(str(shelf)))
    assert (ro.returncode, ro.stderr) == (OUT_REFUSED, f"sitestack: results directory {shelf} is not writable: "
                                                       "Read-only file system\n")
    full = in_namespace(f"mount -t tmpfs -o size=2M,mode=0700 none {shelf}", results_check(str(shelf)))
    assert full.returncode == OUT_REFUSED and re.fullmatch(
        rf"sitestack: results directory {re.escape(str(shelf))} has only \d+ KiB free \(a result needs 64 MiB\)\n",
        full.stderr), full.stderr


def run_script(job: dict, tmp_path: Path, out: Path, setup: str = "", directory: Path | None = None,
               **env: str):
    """The installed mpiexec job under bash, as `invoke validate --scheduler none` runs it; ``setup``:
    shell lines run first in a private mount namespace (``unshare -m``), to mount over the results."""
    script = (directory or job["dir"]) / "jobs" / "validate-mpiexec.sbatch"
    command = ["bash", str(script)]
    if setup:
        command = ["unshare", "-m", "--propagation", "private", "bash", "-c", f"set -e\n{setup}\nexec bash \"$0\"",
                   str(script)]
    start = time.monotonic()
    proc = subprocess.Popen(command, env=job_env(job, out, **env), cwd=tmp_path, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    return finish(proc, out, start)


def refused(run, line: str) -> None:
    """Ended at once with the results directory's exit code and one line naming it and the cause,
    before any module, probe or launcher ran."""
    assert run.rc == OUT_REFUSED, run.log
    assert line in run.log.splitlines(), run.log
    assert run.log.strip() == line, run.log  # nothing else ran: no module, no probe, no launcher
    assert run.seconds < 10 and not run.left


@pytest.fixture
def can_mount(tmp_path):
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "mount", "-t", "tmpfs", "-o", "size=1M", "none",
                            str(tmp_path)], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"no mount namespace here (unshare -m: {probe.stderr.strip()})")


@pytest.mark.integration
@pytest.mark.parametrize("existing", [True, False])
def test_a_read_only_results_directory_is_refused_by_name(installed_local_job, tmp_path, can_mount, existing):
    shelf = tmp_path / "shelf"
    out = shelf / "sitestack-validation-ro"
    (out if existing else shelf).mkdir(parents=True)
    run = run_script(installed_local_job, tmp_path, out,
                     f"mount --bind {shelf} {shelf}\nmount -o remount,bind,ro {shelf}")
    if existing:
        refused(run, f"sitestack: results directory {out} is not writable: Read-only file system")
    else:
        refused(run, f"sitestack: results directory {out} cannot be made: Read-only file system")
    assert list(shelf.iterdir()) == ([out] if existing else [])


@pytest.mark.integration
def test_a_full_results_directory_is_refused_by_name(installed_local_job, tmp_path, can_mount):
    shelf = tmp_path / "shelf"
    shelf.mkdir()
    out = shelf / "sitestack-validation-full"
    run = run_script(installed_local_job, tmp_path, out, f"mount -t tmpfs -o size=1M none {shelf}")
    free = re.search(rf"results directory {re.escape(str(out))} has only (\d+) KiB free \(a result needs "
                     rf"{RESULT_SPACE_MIB} MiB\)", run.log)
    assert free and int(free.group(1)) <= 1024, run.log
    refused(run, f"sitestack: {free.group(0)}")
    # and one with no room at all: the write itself fails, and says so
    fill = (f"mount -t tmpfs -o size=64k none {shelf}\nmkdir {out}\n"
            f"dd if=/dev/zero of={shelf}/filler bs=4k 2>/dev/null || true")
    run = run_script(installed_local_job, tmp_path, out, fill)
    refused(run, f"sitestack: results directory {out} is not writable: No space left on device")


@pytest.mark.integration
def test_a_hanging_mpi_probe_is_named_and_the_report_has_its_plot_without_matplotlib(
        installed_local_job, tmp_path, report_python, no_matplotlib):
    """The probe sleeps (it would hang in MPI_Init): the job names its timeout. The stack has no
    matplotlib: the report's plot is the SVG. Then the README's redraw, in the results directory."""
    job = installed_local_job
    copy = tmp_path / "validation"
    shutil.copytree(job["dir"], copy, symlinks=True)
    for script in (copy / "jobs").iterdir():
        script.write_text(script.read_text().replace(str(job["dir"]), str(copy)))
    probe = copy / "mpi-probe" / "bin" / "sitestack-mpi-probe"
    probe.unlink()
    probe.write_text("#!/bin/sh\nexec sleep 300\n")
    probe.chmod(0o755)
    out = tmp_path / "sitestack-validation-probe"
    # 80 s: the probe gets a quarter (20 s), the ranks the rest
    run = run_script(job, tmp_path, out, directory=copy, SITESTACK_TIME_LIMIT="80", PYTHONPATH=str(no_matplotlib))
    assert run.result is not None, run.log[-4000:]
    check = next(c for c in run.result["checks"] if c["name"] == "mpi-probe")
    want = f"the MPI probe did not finish within 20 s (killed by timeout; see {out}/mpi-probe.log)"
    assert check["status"] == "failed" and check["summary"] == want, (check, run.log[-3000:])
    assert run.result["verdict"] == "failed" and run.rc != 0
    assert "sitestack: the MPI probe did not finish within 20 s (killed by timeout)" in run.log
    assert "FileNotFoundError" not in json.dumps(run.result)
    assert not run.left and not leftovers(out), run.left
    assert run.seconds < 80 + 20 + 10, run.seconds
    # no matplotlib in the stack: the plot is the SVG, named in result.json and linked from summary.md
    assert run.result["artefacts"]["plot"] == "bandwidth.svg", run.result["artefacts"]
    svg = svg_of(out / "bandwidth.svg")
    assert len(svg["lines"]["busbw"]) == len(run.result["bandwidth"]["rows"]) >= 4
    assert "FAILED" in svg["texts"]["title"][0] and "2 ranks" in svg["texts"]["title"][0]
    summary = (out / "summary.md").read_text()
    assert "](bandwidth.svg)" in summary and want.replace("|", "\\|") in summary
    # the README's redraw, in the results directory, with matplotlib now there: whole, and newer
    before = (out / "summary.md").stat().st_mtime_ns
    proc = redraw(report_python, copy, out, "result.json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads((out / "result.json").read_text())
    assert (out / "summary.md").read_text() == ddp_report.markdown(result) and result["artefacts"]["plot"] == "bandwidth.png"
    assert (out / "summary.md").stat().st_mtime_ns >= before and (out / "bandwidth.png").stat().st_size > 1000


@pytest.mark.integration
def test_invoke_validate_refuses_a_results_root_it_cannot_write(installed_local_job, tmp_path, can_mount):
    """`invoke validate --results` on a read-only file system: one message naming the directory and the
    cause, exit 1, before any job runs (the job's log would go there too)."""
    from tests.conftest import REPO

    shelf = tmp_path / "shelf"
    shelf.mkdir()
    job = installed_local_job
    argv = [sys.executable, "-m", "invoke", "validate", "--site", "local", "--prefix", str(job["prefix"]),
            "--results", str(shelf), "--python", job["python"], "--scheduler", "none"]
    run = subprocess.run(["unshare", "-m", "--propagation", "private", "bash", "-c",
                          f'set -e\nmount --bind {shelf} {shelf}\nmount -o remount,bind,ro {shelf}\ncd {REPO}\nexec "$@"',
                          "setup", *argv], text=True, capture_output=True, timeout=120, env={**os.environ, **job["env"]})
    assert run.returncode == 1, run.stdout + run.stderr
    assert f"results directory {shelf} is not writable: Read-only file system" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr and "running validate-" not in run.stdout
    assert list(shelf.iterdir()) == []
