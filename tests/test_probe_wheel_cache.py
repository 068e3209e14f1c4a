"""The validation job's MPI probe is built once per toolchain: its wheel is kept in the build cache
(sitestack/installs/wheel_cache.py), so installing the job into another prefix builds nothing, and
--no-cache builds it again. Real builds against the local site's MPICH, a private build cache."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import run_invoke

pytestmark = pytest.mark.integration


def install_job(root: Path, prefix: str, task: str = "install-validation-job", *extra: str) -> str:
    """Install the local site's validation job into ``root/prefix`` (with ``task``); the text of its logs."""
    logs = root / f"logs-{prefix}"
    out = run_invoke(task, "--site", "local", "--prefix", str(root / prefix), *extra,
                     env={"SITESTACK_BUILD_CACHE": str(root / "cache"), "SITESTACK_LOG_DIR": str(logs)}, timeout=900)
    assert out.returncode == 0, out.stdout + out.stderr
    return "\n".join(f.read_text() for f in sorted(logs.rglob("*.log")))


def run_probe(job: Path) -> dict:
    out = subprocess.run(["mpiexec", "-n", "2", str(job / "validation/mpi-probe/bin/sitestack-mpi-probe")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    data: dict = json.loads(out.stdout)
    return data


def test_probe_wheel_is_built_once_and_installed_into_a_new_prefix(tmp_path):
    first = install_job(tmp_path, "a")
    assert "pip wheel" in first and "from the build cache" not in first
    entries = list((tmp_path / "cache" / "mpi-probe").glob("*/artefact.json"))
    assert len(entries) == 1
    manifest = json.loads(entries[0].read_text())
    assert manifest["file"].endswith(".whl") and manifest["toolchain"]["tools"]["mpicc"].startswith("/")
    wheel_mtime = (entries[0].parent / manifest["file"]).stat().st_mtime_ns

    second = install_job(tmp_path, "b")
    assert "pip wheel" not in second and "MPI probe: from the build cache" in second
    data = run_probe(tmp_path / "b")
    assert data["size"] == 2 and data["allreduce_ok"] and "MPICH" in data["library"]
    assert (tmp_path / "b/validation/src/mpi_probe/probe.c").is_file()
    assert (tmp_path / "b/validation/mpi-probe/.sitestack-stamp").read_text() == \
        (tmp_path / "a/validation/mpi-probe/.sitestack-stamp").read_text()

    third = install_job(tmp_path, "c", "provision", "--tags", "validation", "--no-cache")
    assert "pip wheel" in third and "from the build cache" not in third
    assert len(list((tmp_path / "cache" / "mpi-probe").glob("*/artefact.json"))) == 1
    assert (entries[0].parent / json.loads(entries[0].read_text())["file"]).stat().st_mtime_ns != wheel_mtime
    assert run_probe(tmp_path / "c")["allreduce_ok"]
