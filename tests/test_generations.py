"""A stack over time, for real on the local site: an upgrade makes a new generation while a process and
a job's environment keep the one they started with; the retired one stays while used and until the
longest job has had time to end, then a provision or `invoke gc` removes it; `invoke rollback` and
`invoke generations` (docs/operating.md)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import LMOD_INIT, clean_env, playbook_copy, run_invoke, shell

pytestmark = pytest.mark.integration

NAME = "pytorch/2.13.0-cpu"
#: Reads module names from stdin; prints where each import came from (a process that lives across an upgrade).
IMPORTER = ("import importlib, sys\n"
            "print('ready', flush=True)\n"
            "for line in sys.stdin:\n"
            "    print(importlib.import_module(line.strip()).__file__, flush=True)\n")


def books(tmp: Path, grace: str) -> tuple[Path, Path]:
    """The local playbook (its stack steps and module files only), and the same with one more extra."""
    keep = ("prefix-layout", "stack-venv", "venv-hook", "modulefiles")
    import yaml
    names = [s["name"] for s in yaml.safe_load((Path(__file__).parent.parent / "playbooks/local.yml").read_text())["steps"]]
    without = tuple(n for n in names if n not in keep)
    facts = {"scheduler": {"max_job_time": grace}}
    base = playbook_copy(tmp / "base", facts=facts, without=without)
    more = playbook_copy(tmp / "more", facts={**facts, "torch": {"extras": ["six"]}}, without=without)
    return base, more


def provision(book: Path, prefix: Path, env: dict[str, str], *extra: str) -> str:
    out = run_invoke("provision", "--playbook", str(book), "--prefix", str(prefix), *extra, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def generations(book: Path, prefix: Path, env: dict[str, str]) -> dict:
    out = run_invoke("generations", "--playbook", str(book), "--prefix", str(prefix), "--json", "-", env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    document = json.loads(out.stdout)
    return next(s for s in document["stacks"] if s["stack"] == NAME)


@pytest.fixture
def site(tmp_path: Path):
    prefix = tmp_path / "prefix"
    env = {"SITESTACK_LOG_DIR": str(tmp_path / "logs")}
    return prefix, env, prefix / NAME


def test_a_running_process_and_a_loaded_job_keep_their_generation_through_an_upgrade(site, tmp_path: Path):
    prefix, env, stack = site
    base, more = books(tmp_path, "00:03")  # jobs run for at most 3 s: a retired generation is kept that long
    provision(base, prefix, env)
    old = stack.resolve()
    # a process started from the stack's path, and a job's environment made by `module load`
    process = subprocess.Popen([str(stack / "bin" / "python"), "-u", "-c", IMPORTER], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None and process.stdin is not None
        assert process.stdout.readline().strip() == "ready"
        saved = tmp_path / "job-env"
        loaded = shell(["bash", "-c"], f". {LMOD_INIT}/bash; module use {shlex.quote(str(prefix / 'modules'))}; "
                       f"module load {NAME}; env -0 > {shlex.quote(str(saved))}", clean_env())
        assert loaded.returncode == 0, loaded.stdout + loaded.stderr

        changed = provision(more, prefix, env)
        assert "changed  stack-venv: extras: +six" in changed
        new = stack.resolve()
        assert new != old and old.is_dir()

        # the running process imports from the generation it started with, not through the switched link
        process.stdin.write("numpy\n")
        process.stdin.flush()
        assert process.stdout.readline().strip().startswith(f"{old}/")
        # a later step of the job, with the environment the job loaded, runs the old generation too
        job_env = dict(item.split("=", 1) for item in saved.read_text().split("\0") if "=" in item)
        step = subprocess.run(["python3", "-c", "import sys, numpy; print(sys.prefix, numpy.__file__)"],
                              env=job_env, capture_output=True, text=True)
        assert step.returncode == 0, step.stderr
        assert step.stdout.split() == [str(old), str(old / "lib/python3.11/site-packages/numpy/__init__.py")]
        # a new process gets the new generation
        fresh = subprocess.run([str(stack / "bin" / "python"), "-c", "import six; print(six.__file__)"],
                               capture_output=True, text=True)
        assert fresh.stdout.startswith(f"{new}/"), fresh.stdout + fresh.stderr

        listed = generations(base, prefix, env)
        rows = {g["generation"]: g for g in listed["generations"]}
        assert listed["current"] == new.name and rows[new.name]["state"] == "current"
        assert rows[old.name]["state"] == "retired" and "extras: +six" in rows[new.name]["change"]

        time.sleep(3.5)  # the longest job has had time to end; the process still runs
        kept = run_invoke("gc", "--playbook", str(base), "--prefix", str(prefix), env=env)
        assert kept.returncode == 0, kept.stdout + kept.stderr
        assert f"{old}: kept: in use by {process.pid} " in kept.stdout, kept.stdout
        assert old.is_dir()
    finally:
        process.kill()
        process.wait()
    dry = run_invoke("gc", "--playbook", str(base), "--prefix", str(prefix), "--dry-run", env=env)
    assert f"{old}: would be removed" in dry.stdout and old.is_dir(), dry.stdout
    # a later provision collects it (nothing else to do)
    again = provision(more, prefix, env)
    assert "changed  stack-venv: remove 1 retired generation(s)" in again
    assert not old.exists() and stack.resolve() == new
    assert "[localhost] ok       stack-venv" in provision(more, prefix, env)


def test_rollback_switches_back_and_rollback_again_returns(site, tmp_path: Path):
    prefix, env, stack = site
    base, more = books(tmp_path, "1-00:00:00")
    provision(base, prefix, env)
    first = stack.resolve()
    provision(more, prefix, env)
    second = stack.resolve()
    manifest = stack.parent / "2.13.0-cpu.manifest.json"
    assert json.loads(manifest.read_text())["plan"]["extras"] == ["six"]

    back = run_invoke("rollback", "--playbook", str(base), "--prefix", str(prefix), env=env)
    assert back.returncode == 0, back.stdout + back.stderr
    assert stack.resolve() == first and f"{NAME}: {second.name} -> {first.name}" in back.stdout
    assert json.loads(manifest.read_text())["plan"]["extras"] == []   # the manifest went back with the link
    no_six = subprocess.run([str(stack / "bin" / "python"), "-c", "import six"], capture_output=True)
    assert no_six.returncode != 0
    check = run_invoke("provision", "--playbook", str(base), "--prefix", str(prefix), "--check", "--fail-on-change",
                       "--tags", "stack-venv", env=env)
    assert check.returncode == 0, check.stdout  # the rolled-back stack is what the first playbook asks for

    listed = generations(base, prefix, env)
    assert listed["current"] == first.name
    assert {g["generation"]: g["state"] for g in listed["generations"]} == {first.name: "current", second.name: "retired"}

    forth = run_invoke("rollback", "--playbook", str(base), "--prefix", str(prefix), env=env)
    assert forth.returncode == 0 and stack.resolve() == second, forth.stdout + forth.stderr
    assert json.loads(manifest.read_text())["plan"]["extras"] == ["six"]
    # nothing to go back to is one clear message
    only = run_invoke("rollback", "--playbook", str(base), "--prefix", str(prefix / "elsewhere"), env=env)
    assert only.returncode == 1 and "Traceback" not in only.stderr
    assert os.path.isdir(first)
