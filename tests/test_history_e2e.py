"""The history and its regression alarm for real on the local site: validations recorded by `invoke validate`
and by the batch script itself, an oversubscribed node caught against the healthy runs, `invoke history`
listing them; and a run through the test Slurm cluster (sbatch + srun), recorded with its Slurm."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import clean_env, run_invoke

pytestmark = pytest.mark.integration

#: CPU-bound processes started while the injected run runs: four times the machine's two cores.
HOGS = 8
#: Each hog in a session of its own, as another user's process is: with the kernel's autogroup
#: scheduling (sched(7), "The autogroup feature"; /proc/sys/kernel/sched_autogroup_enabled) the CPU is
#: shared between sessions first, and the job's ranks run in the session the guard makes for its
#: launcher, so eight hogs in this test's session would take no more from them than one.
HOG_SESSION = {"start_new_session": True}


@pytest.fixture
def job(tmp_path, validation_python) -> dict:
    """The local site's job installed into a prefix of this test's own (its history starts empty)."""
    python, env = validation_python
    prefix = tmp_path / "prefix"
    result = run_invoke("install-validation-job", "--site", "local", "--prefix", str(prefix), "--python", python,
                        env={"SITESTACK_LOG_DIR": str(tmp_path / "logs")}, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    config = json.loads((prefix / "validation" / "check-config.json").read_text())
    assert config["history_dir"] == str(prefix / "history") and config["stack"]["manifest"] is None   # --python: no stack
    return {"prefix": prefix, "dir": prefix / "validation", "python": python, "env": env, "results": tmp_path / "results"}


def validate(job: dict, *args: str, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    job["results"].mkdir(exist_ok=True)
    return run_invoke("validate", "--site", "local", "--prefix", str(job["prefix"]), "--results", str(job["results"]),
                      "--python", job["python"], "--timeout", "600", *args, env={**job["env"], **(env or {})}, timeout=700)


def history(job: dict, *args: str) -> dict:
    listed = run_invoke("history", "--site", "local", "--prefix", str(job["prefix"]), "--json", "-", *args)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    return json.loads(listed.stdout)


def test_an_oversubscribed_node_is_caught_against_the_healthy_runs(job):
    for n in range(3):
        healthy = validate(job, "--scheduler", "none", "--launcher", "torchrun")
        assert healthy.returncode == 0, healthy.stdout + healthy.stderr
        assert f"regression: unknown: {n} healthy run" in healthy.stdout
    # a user's run of the batch script, without invoke: the job records itself
    out = job["results"] / "by-hand"
    by_hand = subprocess.run(["bash", str(job["dir"] / "jobs" / "validate-mpiexec.sbatch")], capture_output=True, text=True,
                             timeout=600, cwd=job["results"], env=clean_env(**job["env"], SITESTACK_PYTHON=job["python"],
                                                                            SITESTACK_VALIDATION_OUT=str(out)))
    assert by_hand.returncode == 0, by_hand.stdout + by_hand.stderr
    assert f"recorded in {job['prefix'] / 'history'}" in by_hand.stdout
    # recorded before the guard's last words, which still name the summary
    assert by_hand.stdout.splitlines()[-1].startswith("sitestack validation: PASSED, exit code 0; summary: ")
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], **HOG_SESSION) for _ in range(HOGS)]
    try:
        slow = validate(job, "--scheduler", "none", "--launcher", "torchrun")
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    alarms = [line for line in slow.stdout.splitlines() if line.startswith(("!!! regression WARN", "!!! regression FAIL"))]
    assert alarms, slow.stdout + slow.stderr
    assert "!!! regression: since the last healthy run " in slow.stdout
    assert slow.stdout.count("nothing in the recorded toolchain changed") == 1
    listed = history(job)
    runs = listed["runs"]
    assert len(runs) == 5 and listed["history_dir"] == str(job["prefix"] / "history")
    assert [r["layout"]["launcher"] for r in runs] == ["torchrun"] * 3 + ["mpiexec", "torchrun"]
    assert runs[-1]["regression"]["status"] in ("warn", "fail") and runs[3]["regression"] is None   # by hand: none
    # FAIL exits 1, WARN 0 (unless the checks themselves failed)
    failed = runs[-1]["regression"]["status"] == "fail" or runs[-1]["verdict"] == "failed"
    assert slow.returncode == (1 if failed else 0), slow.stdout + slow.stderr
    assert all(isinstance(r["metrics"]["busbw_gbs"], float) and r["metrics"]["startup_s"] > 0 for r in runs)
    assert runs[0]["toolchain"]["torch"].startswith("2.") and runs[0]["toolchain"]["kernel"] == os.uname().release
    assert [r["id"] for r in history(job, "--last", "2")["runs"]] == [r["id"] for r in runs[-2:]]
    human = run_invoke("history", "--site", "local", "--prefix", str(job["prefix"]))
    assert human.returncode == 0 and len(human.stdout.splitlines()) == 6, human.stdout + human.stderr
    # a throttled rank: rank 1 stopped and continued in turns (as cpulimit does), the node otherwise idle
    with Throttle(rank=1):
        throttled = validate(job, "--scheduler", "none", "--launcher", "torchrun")
    assert throttled.returncode == 1, throttled.stdout + throttled.stderr   # the compute check fails the run
    record = history(job)["runs"][-1]
    assert record["verdict"] == "failed" and record["regression"]["status"] in ("warn", "fail"), record
    compute = [line for line in record["regression"]["lines"] if "compute (slowest rank)" in line]
    assert compute and compute[0].startswith(("regression WARN", "regression FAIL")), record["regression"]
    # compared with the three healthy torchrun runs only: the oversubscribed run's alarm keeps it out
    assert "of 3 healthy runs" in compute[0], compute


class Throttle:
    """Stops and continues, in turns of 0.1 s, every process of the check program whose RANK is ``rank``
    (the rank and its watchdog), from a thread, while the ``with`` block runs."""

    def __init__(self, rank: int) -> None:
        self.rank, self.stop = rank, threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def __enter__(self) -> Throttle:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()

    @staticmethod
    def signal(pids: list[int], sig: int) -> list[int]:
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
        return pids

    def pids(self) -> list[int]:
        found = []
        for entry in os.listdir("/proc"):
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
                environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            except (OSError, ValueError):
                continue
            if b"ddp_check.py" in cmdline and b"--guard" not in cmdline and f"RANK={self.rank}".encode() in environ:
                found.append(int(entry))
        return found

    def loop(self) -> None:
        # /proc is scanned while the rank is stopped, so the scan's time (long on a busy machine) adds
        # to its stop, never to its run: it stays stopped at least half the time, however busy
        pids: list[int] = []
        while not self.stop.is_set():
            end = time.monotonic() + 0.1
            self.signal(pids, signal.SIGSTOP)                   # the ranks found before stop at once,
            pids = self.signal(self.pids(), signal.SIGSTOP)     # then the scan, which finds one started since
            time.sleep(max(0.0, end - time.monotonic()))
            self.signal(pids, signal.SIGCONT)
            time.sleep(0.1)
        for pid in self.pids():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGCONT)


def test_a_run_through_slurm_records_its_slurm(job, slurm_cluster):
    result = validate(job, "--ranks-per-node", "2", env=slurm_cluster.env)
    assert result.returncode == 0, result.stdout + result.stderr + slurm_cluster.logs()
    runs = history(job)["runs"]
    assert len(runs) == 1 and runs[0]["layout"]["launcher"] == "srun" and runs[0]["toolchain"]["slurm"]
    assert runs[0]["regression"]["status"] == "unknown"
    # recorded by invoke validate, not by the job (SITESTACK_HISTORY=off): the job's log says nothing of it
    log = next(job["results"].glob("sitestack-validation-*.log")).read_text()
    assert "sitestack history:" not in log
