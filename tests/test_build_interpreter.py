"""The packages built for a conda stack (mpi4py, Horovod) are built with the stack env's interpreter,
named by its path in the env, not with ``python3`` on PATH (the conda module's, whose minor version
follows the Miniforge release: https://github.com/conda-forge/miniforge/issues/768), and their inputs
record that interpreter as it reports itself (real path, full version), so another interpreter rebuilds.

OLCF builds mpi4py inside the activated env
(https://docs.olcf.ornl.gov/software/python/pytorch_frontier.html). Nothing is compiled here: the plans
and the recorded inputs are read, with the toolchain probed for real.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sitestack.actions import ACTIONS
from sitestack.builders import symbolic
from sitestack.core.host import local_host
from sitestack.engine import playbook as pb
from sitestack.installs.inputs import digest
from sitestack.installs.target import build_plan
from sitestack.installs.venv_stack import built_for_other_python
from sitestack.model.context import RunContext
from sitestack.model.site import Site
from tests.contexts import offline_context

PLAYBOOKS = Path(__file__).resolve().parent.parent / "playbooks"


def other_minor_python() -> str | None:
    """A Python 3.10 on this machine (pyenv's, or the system's; not a pyenv shim, which may refuse), the
    stack env's interpreter below."""
    pyenv = os.environ.get("PYENV_ROOT", "/root/.pyenv")
    candidates = [*sorted(glob.glob(f"{pyenv}/versions/3.10*/bin/python3.10")), "/usr/bin/python3.10"]
    return next((c for c in candidates if os.access(c, os.X_OK)), None)


def step_of(site: Site, ctx: RunContext, name: str):
    return ACTIONS["recipe-install"].from_spec(next(s for s in site.steps if s.name == name), ctx)


def test_frontiers_builds_name_the_conda_envs_interpreter():
    site = pb.load("frontier")
    ctx = offline_context(site, account="proj123")
    env_python = "/lustre/orion/proj123/world-shared/sitestack/pytorch/2.2.2-rocm5.7/bin/python"
    mpi4py = step_of(site, ctx, "mpi4py")
    assert site.facts.python.executable == "python3" and mpi4py.target.python == env_python
    plan = build_plan(mpi4py.target, symbolic(mpi4py.target.dest))
    assert plan[0].argv[:4] == (env_python, "-m", "pip", "wheel")
    assert plan[0].env["MPICC"] == "cc -shared"   # OLCF's MPICC="cc -shared"
    assert step_of(site, ctx, "horovod").target.python == env_python   # its torch probe and build env start there


@pytest.mark.parametrize("name", ["local", "cirrus", "lumi"])
def test_venv_and_container_stacks_build_with_the_sites_python(name):
    """A venv stack is facts.python.executable's own interpreter, made in the same site environment
    (and has no pip of its own); a container's interpreter runs only inside its image."""
    site = pb.load(name)
    ctx = offline_context(site, account="proj123")
    for spec in site.steps:
        if spec.action == "recipe-install" and spec.args["recipe"] in ("mpi4py", "horovod"):
            assert ACTIONS[spec.action].from_spec(spec, ctx).target.python == site.facts.python.executable


def conda_playbook(tmp_path: Path, python3: Path) -> Path:
    """local.yml as a conda site: facts.python.source conda, Python 3.10 (the stack env's), whose conda
    module puts ``python3`` (its base interpreter) first on PATH."""
    modules = tmp_path / "modules" / "miniforge3"
    modules.mkdir(parents=True)
    (modules / "test.lua").write_text(f'prepend_path("PATH", "{python3.parent}")\n')
    data = yaml.safe_load((PLAYBOOKS / "local.yml").read_text())
    data["facts"]["python"].update(source="conda", version="3.10", module="miniforge3/test")
    data["facts"]["modules"]["use"] = [str(tmp_path / "modules")]
    path = tmp_path / "local.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.skipif(not Path("/usr/share/lmod/lmod/init/bash").exists(), reason="needs Lmod (the local site's)")
def test_the_recorded_inputs_name_the_stack_envs_interpreter_not_python3_on_path(tmp_path):
    py310 = other_minor_python()
    if py310 is None or sys.version_info[:2] == (3, 10):
        pytest.skip("needs a Python 3.10 beside another python3")
    # python3 first on PATH (the conda module's) is another interpreter, as a newer Miniforge's base
    # would be: it must play no part.
    fake = tmp_path / "bin" / "python3"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\necho "Python 3.99.0"\nexit 0\n')
    fake.chmod(0o755)
    site = pb.load(None, conda_playbook(tmp_path, fake))
    prefix = tmp_path / "prefix"
    ctx = RunContext.resolve(site, home=str(tmp_path), user="alice", account=None, prefix=str(prefix), actions=ACTIONS)
    env_python = f"{prefix}/pytorch/2.13.0-cpu/bin/python"
    host = local_host()
    mpi4py = step_of(site, ctx, "mpi4py")

    # before the stack-venv step made the env, the build waits for it, naming its interpreter
    assert mpi4py.pending(host) == (f"the stack environment's interpreter {env_python}, which builds it, "
                                    "is not there yet (made by the stack-venv step)")

    # the env, as `conda create --prefix ... python=3.10` would leave it: an interpreter of its own
    subprocess.run([py310, "-m", "venv", "--without-pip", str(prefix / "pytorch/2.13.0-cpu")], check=True)
    inputs = mpi4py.inputs(host)
    assert inputs["build"]["plan"][0]["argv"][0] == env_python
    assert inputs["install"]["install"][0]["argv"][0] == env_python
    interpreter = inputs["build"]["toolchain"]["interpreter"]
    assert interpreter["realpath"] == os.path.realpath(py310)
    assert interpreter["version"].startswith("3.10.") and interpreter["abi"].startswith("cpython-310 ")
    assert inputs["build"]["toolchain"]["tools"][env_python].startswith(os.path.realpath(py310) + " | Python 3.10.")
    assert "3.99" not in json.dumps(inputs)

    # another interpreter at the same path (the env made again with another Python): other build inputs,
    # so the package is built again rather than taken from the build cache
    shutil.rmtree(prefix / "pytorch/2.13.0-cpu")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(prefix / "pytorch/2.13.0-cpu")], check=True)
    again = step_of(site, ctx, "mpi4py").inputs(host)
    assert again["build"]["toolchain"]["interpreter"]["realpath"] == os.path.realpath(sys.executable)
    assert digest(again["build"]) != digest(inputs["build"])


def test_a_wheel_built_for_another_python_is_left_out_of_a_stack():
    assert built_for_other_python("/p/mpi4py-4.1.2-cp311-cp311-linux_x86_64.whl", "3.10") == "3.11"
    assert built_for_other_python("/p/mpi4py-4.1.2-cp310-cp310-linux_x86_64.whl", "3.10") is None
    assert built_for_other_python("/p/pkg-1.0-py3-none-any.whl", "3.10") is None
    assert built_for_other_python("/p/pkg-1.0-cp38-abi3-linux_x86_64.whl", "3.10") is None


@pytest.mark.skipif(not Path("/usr/share/lmod/lmod/init/bash").exists(), reason="needs Lmod (the local site's)")
def test_the_build_task_builds_for_the_playbooks_stack_too(cli, tmp_path):
    """`invoke build-mpi4py` runs one step of its own, for the stack the site's playbook makes."""
    fake = tmp_path / "bin" / "python3"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\necho "Python 3.99.0"\nexit 0\n')
    fake.chmod(0o755)
    prefix = tmp_path / "prefix"
    out = cli("build-mpi4py", "--playbook", str(conda_playbook(tmp_path, fake)), "--prefix", str(prefix), "--check",
              env={"SITESTACK_LOG_DIR": str(tmp_path / "logs")})
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"the stack environment's interpreter {prefix}/pytorch/2.13.0-cpu/bin/python, which builds it" in out.stdout
