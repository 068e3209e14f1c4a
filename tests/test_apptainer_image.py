"""The Dawn image (https://github.com/kh296/dawn-containers): the definition rendered from facts (golden), the exact build command
lines (golden), an unknown base refused at load time, check mode reporting a missing or stale image
(and the stack venv that runs in it), and real builds through the runtime stand-in
(tests/twins/runtime.py: Apptainer is not available here; Intel's image is a local stand-in, since
nothing can be pulled), on the host and as a job on the test Slurm cluster; idempotent by digest."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from sitestack.actions import ACTIONS
from sitestack.engine import playbook as pb
from sitestack.installs.image_def import build_job
from sitestack.model.container_facts import runtime_named
from tests.conftest import playbook_copy, run_invoke
from tests.contexts import offline_context
from tests.test_pack_env import golden
from tests.twins import runtime as twin

needs_twin = pytest.mark.skipif(twin.available() is not None, reason=f"stand-in runtime: {twin.available()}")


def step_for(site_path: Path | None = None):
    site = pb.load("dawn", site_path)
    ctx = offline_context(site, home="/home/alice", user="alice", account="XYZ-DAWN-GPU")
    return ACTIONS["apptainer-image"].from_spec(next(s for s in site.steps if s.action == "apptainer-image"), ctx)


def test_definition_and_command_lines_golden() -> None:
    step = step_for()
    golden("dawn-pytorch2.8.def", step.text)
    assert step.definition_file == "/home/alice/sitestack/dawn/apptainer/pytorch2.8.def"
    apptainer = runtime_named("apptainer")
    lines = [" ".join(apptainer.build_argv("/p/.pytorch2.8.sif.tmp-x", step.definition_file)),
             " ".join(apptainer.inspect_labels_argv("/p/pytorch2.8.sif")),
             " ".join(apptainer.exec_argv("/p/pytorch2.8.sif", ["python", "-m", "venv", "/p/v"], ["/p", "/etc/x"])),
             " ".join(runtime_named("singularity").exec_argv("/p/i.sif", ["true"]))]
    golden("runtime-command-lines.txt", "\n".join(lines) + "\n")
    golden("dawn-build-job.sbatch", build_job(apptainer, out="/p/.pytorch2.8.sif.tmp-x", definition_file=step.definition_file,
                                              scratch="/ramdisks", sbatch=["--job-name=sitestack-image", "--partition=pvc9"]))


def test_unknown_base_is_one_clear_error(tmp_path: Path) -> None:
    bad = playbook_copy(tmp_path, "dawn", facts={"container": {"build": {"base": "nvidia-pytorch"}}})
    out = run_invoke("provision", "--site", "dawn", "--playbook", str(bad), "--check", "--account", "X")
    assert out.returncode == 1
    text = out.stdout + out.stderr
    assert "unknown base image 'nvidia-pytorch' (known: intel-extension-for-pytorch)" in text and "Traceback" not in text
    assert f"{bad}:" in text


@pytest.fixture
def dawn(tmp_path: Path) -> dict:
    """Dawn's playbook on this machine: a stand-in for Intel's image whose `python` records %post's pip calls."""
    tree = tmp_path / "intel"
    (tree / "usr" / "local" / "bin").mkdir(parents=True)
    (tree / "opt" / "record").mkdir(parents=True)
    fake = tree / "usr" / "local" / "bin" / "python"
    fake.write_text('#!/bin/sh\necho "$@" >> /opt/record/pip-calls\n')
    fake.chmod(0o755)
    docker = tmp_path / "docker"
    docker.mkdir()
    twin.make_image(tree, docker / "intel_intel-extension-for-pytorch_2.8.10-xpu.sif")
    bin_dir = twin.install(tmp_path / "bin", docker_dir=docker)
    (tmp_path / "scratch").mkdir()
    prefix = tmp_path / "prefix"

    def copy(**build: object) -> Path:
        facts = {"marker": None, "prefix": str(prefix), "node": {"local_scratch": str(tmp_path / "scratch")},
                 "scheduler": {"partition": "debug", "gres": None},
                 "container": {"bind": [], "build": {"packages": ["six"], "slurm_options": [], **build}}}
        return playbook_copy(tmp_path / f"pb-{len(list(tmp_path.glob('pb-*')))}", "dawn", facts=facts)

    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SITESTACK_LOG_DIR": str(tmp_path / "logs")}
    return {"copy": copy, "prefix": prefix, "env": env, "image": prefix / "apptainer" / "pytorch2.8.sif"}


def provision(dawn: dict, playbook: Path, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    return run_invoke("provision", "--site", "dawn", "--playbook", str(playbook), "--prefix", str(dawn["prefix"]),
                      "--account", "XYZ", *extra, env={**dawn["env"], **(env or {})}, timeout=900)


@needs_twin
def test_build_on_the_host_is_idempotent_and_rebuilds_on_change(dawn: dict) -> None:
    playbook = dawn["copy"](where="login")
    check = provision(dawn, playbook, "--check", "--tags", "stack")
    assert "would build: " in check.stdout and "pytorch2.8.sif missing" in check.stdout, check.stdout
    assert "the image it runs in" in check.stdout and "is missing" in check.stdout  # the stack venv sees it
    assert not dawn["prefix"].exists()
    first = provision(dawn, playbook, "--tags", "container")
    assert first.returncode == 0 and "changed  container-image" in first.stdout, first.stdout
    image = dawn["image"]
    run_env = {**os.environ, **dawn["env"]}
    out = subprocess.run(["apptainer", "exec", str(image), "sh", "-c", 'cat /opt/record/pip-calls; echo "$ZE_FLAT_DEVICE_HIERARCHY"'],
                         capture_output=True, text=True, env=run_env)
    assert out.stdout.split("\n")[:2] == ["-m pip install six", "FLAT"], out.stdout + out.stderr
    assert sorted(p.name for p in image.parent.iterdir()) == ["pytorch2.8.def", "pytorch2.8.sif"]
    mtime = image.stat().st_mtime_ns
    again = provision(dawn, playbook, "--tags", "container")
    assert again.returncode == 0 and "ok       container-image" in again.stdout and image.stat().st_mtime_ns == mtime
    changed = dawn["copy"](where="login", packages=["six", "wheel"])
    stale = provision(dawn, changed, "--check", "--tags", "container")
    assert stale.returncode == 0 and "was built from another definition" in stale.stdout, stale.stdout
    rebuilt = provision(dawn, changed, "--tags", "container")
    assert rebuilt.returncode == 0 and image.stat().st_mtime_ns != mtime
    labels = subprocess.run(["apptainer", "inspect", "--labels", str(image)], capture_output=True, text=True, env=run_env)
    assert step_for(changed).digest in labels.stdout


@needs_twin
def test_failed_build_leaves_the_old_image(dawn: dict, tmp_path: Path) -> None:
    playbook = dawn["copy"](where="login")
    assert provision(dawn, playbook, "--tags", "container").returncode == 0
    before = dawn["image"].read_bytes()
    empty = tmp_path / "empty-docker"
    empty.mkdir()
    failed = provision(dawn, dawn["copy"](where="login", packages=["other"]), "--tags", "container",
                       env={"PATH": f"{tmp_path / 'bin2'}:{os.environ['PATH']}"} if twin.install(tmp_path / "bin2", empty)
                       else None)
    assert failed.returncode == 1 and "cannot pull" in failed.stdout, failed.stdout
    assert dawn["image"].read_bytes() == before
    assert sorted(p.name for p in dawn["image"].parent.iterdir()) == ["pytorch2.8.def", "pytorch2.8.sif"]


@needs_twin
def test_build_as_a_slurm_job(dawn: dict, slurm_cluster) -> None:
    playbook = dawn["copy"](where="slurm")
    out = provision(dawn, playbook, "--tags", "container", env=slurm_cluster.env)
    assert out.returncode == 0, out.stdout + slurm_cluster.logs()
    assert dawn["image"].is_file()
    log = (dawn["image"].parent / ".pytorch2.8.sif.build.log").read_text()
    assert "FATAL" not in log
    assert not list((dawn["prefix"].parent / "scratch").iterdir())  # the job's APPTAINER_TMPDIR is gone
