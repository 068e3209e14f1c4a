"""`invoke validate --site local --if-changed` for real: the first run validates (no passing run to compare
with), the second submits nothing (the host is as it was), and after the host changes (a stand-in
`fi_info` earlier on PATH reporting another libfabric) the third re-runs and names the change, in its
output and in the history."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_fingerprint import fi_info
from tests.test_history_e2e import history, job, validate  # noqa: F401  (job: the fixture)

pytestmark = pytest.mark.integration


def test_if_changed_runs_once_skips_an_unchanged_host_and_names_a_change(job, tmp_path: Path):  # noqa: F811
    bindir = tmp_path / "standins"
    fi_info(bindir, "1.15.2.0")
    env = {"PATH": f"{bindir}:{job['env'].get('PATH') or __import__('os').environ['PATH']}"}
    args = ("--if-changed", "--scheduler", "none", "--launcher", "torchrun")
    first = validate(job, *args, env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "validating: no passing run of this stack (no manifest digest) with a host fingerprint" in first.stdout
    [run] = history(job)["runs"]
    assert run["fingerprint"]["libfabric"] == "1.15.2.0" and run["toolchain"]["libfabric"] == "1.15.2.0"

    same = validate(job, *args, env=env)
    assert same.returncode == 0, same.stdout + same.stderr
    assert same.stdout.strip().splitlines() == [
        f"unchanged: the host's fingerprint is that of the last passing run {run['id']} of this stack (no manifest "
        "digest); nothing submitted"]
    assert len(history(job)["runs"]) == 1

    fi_info(bindir, "1.20.1")
    changed = validate(job, *args, env=env)
    assert changed.returncode == 0, changed.stdout + changed.stderr
    assert (f"re-validating: the host changed since the last passing run {run['id']}: libfabric 1.15.2.0 -> 1.20.1"
            in changed.stdout)
    said = f"changed since the last passing run {run['id']}: libfabric 1.15.2.0 -> 1.20.1; busbw "
    assert said in changed.stdout and " vs the last passing run" in changed.stdout
    last = history(job)["runs"][-1]
    assert last["fingerprint"]["libfabric"] == "1.20.1"
    assert any(line.startswith(said) for line in last["regression"]["lines"])
