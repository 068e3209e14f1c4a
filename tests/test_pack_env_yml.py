"""Packed environments from a conda environment file: LUMI's container wrapper (Tykky) flow
(https://docs.lumi-supercomputer.eu/software/installing/container-wrapper/): `conda-containerize new
--prefix DIR env.yml`, `export PATH="DIR/bin:$PATH"`, `DIR/bin/pip show torch`, here as
`invoke pack-env --site lumi --requirements env.yml --dest DIR`. The env.yml is that page's, with
its ROCm torch replaced by the local CPU torch (tests/data/lumi-container-wrapper-env.yml says so).
This machine has no conda: its conda dependencies come from the package index, which the output says."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from sitestack.engine import playbook as pb
from sitestack.installs.conda_env import conda_create_argv, conda_of, load_env_file, pypi_requirement
from tests.conftest import REPO, playbook_copy, run_invoke
from tests.test_pack_env import unmount_all
from tests.twins import runtime as twin

ENV_YML = REPO / "tests" / "data" / "lumi-container-wrapper-env.yml"
needs_twin = pytest.mark.skipif(twin.available() is not None, reason=f"stand-in runtime: {twin.available()}")
#: This machine has no route to download.pytorch.org (the file's --extra-index-url): with pip's
#: default 5 retries every package lookup there waits ~8 s; the file stays as written, pip gives up at once.
NO_RETRIES = {"PIP_RETRIES": "0"}


def test_the_wrapper_pages_env_file() -> None:
    env = load_env_file(ENV_YML)
    assert env.name == "pytorch_rocm" and env.channels == ("conda-forge", "defaults")
    assert env.python is not None and env.python.specifier == "==3.11.7.*"
    assert [pypi_requirement(d) for d in env.conda][:2] == ["numpy==1.26.4.*", "filelock==3.16.1.*"]
    assert pypi_requirement(env.conda[-1]) == "setuptools"
    assert env.pip == ("--extra-index-url https://download.pytorch.org/whl/", "torch==2.13.0")
    assert conda_create_argv("/opt/mm", "/r", env, "3.11.7")[:10] == [
        "/opt/mm", "create", "--yes", "--prefix", "/r", "--override-channels", "--channel", "conda-forge",
        "--channel", "defaults"]


def test_conda_is_told_by_what_it_says() -> None:
    assert conda_of('/a/conda\t{"conda_version": "24.1.2"}\n') == ("/a/conda", "conda")
    assert conda_of('/x/conda\tnot json\n/b/mm\t{"micromamba version": "2.0.5"}\n') == ("/b/mm", "micromamba")
    assert conda_of("/x/conda\t{}\n/y/micromamba\t\n") is None


@pytest.mark.parametrize("body, where, message", [
    ("name: x\ndependencies: [a\n", ":3", "YAML syntax error"),
    ("name: x\ndependencies:\n  - numpy=1.26.4\n  - '=1.2'\n", ":4", "not a conda package spec"),
    ("name: x\ndependencies:\n  - pip:\n    - -e git+https://x/y\n", ":4", "option '-e' is not supported"),
    ("name: x\ndependencies:\n  - pip:\n    - --extra-index-url\n", ":4", "--extra-index-url needs one URL"),
    ("name: x\nchannel: [a]\ndependencies: [six]\n", ":2", "unknown key 'channel'"),
    ("name: x\ndependencies:\n  - numpy>=1,<<2\n", ":3", "is not one sitestack can read"),
    ("name: x\ndependencies:\n  - python=3.10.4\n  - six\n", ":3", "python=3.10.4 does not match the base "
     "interpreter, Python 3.11"),
])
def test_bad_env_files_are_refused_with_file_and_line(tmp_path: Path, body: str, where: str, message: str) -> None:
    path = tmp_path / "env.yml"
    path.write_text(body)
    out = run_invoke("pack-env", "--site", "local", "--requirements", str(path), "--prefix", str(tmp_path / "prefix"))
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    assert f"env.yml{where}: " in text and message in text, text
    assert "Traceback" not in text and not (tmp_path / "prefix").exists()


def test_conda_only_dependencies_are_refused_by_name_before_anything_is_built(tmp_path: Path) -> None:
    prefix = tmp_path / "prefix"
    for dep, says in [("cudatoolkit=11.8", "cudatoolkit=11.8: a conda package that is not a Python distribution"),
                      ("sitestack-no-such-package=1.0", "sitestack-no-such-package=1.0 (pip: No matching distribution "
                       "found for sitestack-no-such-package==1.0.*) (move them")]:
        path = tmp_path / "env.yml"
        path.write_text(f"name: tools\ndependencies:\n  - six=1.16.0\n  - {dep}\n")
        out = run_invoke("pack-env", "--site", "local", "--requirements", str(path), "--prefix", str(prefix),
                         env={"SITESTACK_LOG_DIR": str(tmp_path / "logs")}, timeout=600)
        text = out.stdout + out.stderr
        assert out.returncode == 1 and "env.yml:4: " in text and says in text, text
        assert "has no conda or micromamba" in text and "Traceback" not in text
        assert "six=1.16.0" not in text.split(says)[0].rsplit("\n", 1)[-1]   # the one on the index is not named
        assert not (prefix / "envs").exists() or not any((prefix / "envs").iterdir())


def test_the_sites_conda_is_used_where_there_is_one(tmp_path: Path) -> None:
    """Check mode only: no conda runs here. A STAND-IN micromamba answers `info --json` as micromamba
    does (https://github.com/mamba-org/mamba, `micromamba info --json`: "micromamba version"); a
    `conda` that is not conda is passed over."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "conda").write_text("#!/bin/sh\necho 'I am not conda'\n")
    (bin_dir / "micromamba").write_text("#!/bin/sh\n[ \"$1 $2\" = 'info --json' ] && "
                                        "echo '{\"micromamba version\": \"2.0.5\"}'\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    path = tmp_path / "env.yml"
    path.write_text("name: tools\nchannels: [conda-forge]\ndependencies:\n  - python=3.11\n  - cudatoolkit=11.8\n"
                    "  - pip:\n    - six==1.16.0\n")
    out = run_invoke("pack-env", "--site", "local", "--requirements", str(path), "--prefix", str(tmp_path / "p"),
                     "--check", env={"PATH": f"{bin_dir}:{os.environ['PATH']}"})
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert (f"conda dependencies by micromamba {bin_dir}/micromamba: {bin_dir}/micromamba create --yes --prefix "
            "{root} --override-channels --channel conda-forge python=3.11.7 cudatoolkit=11.8") in text, text
    assert not (tmp_path / "p").exists()


@needs_twin
def test_tykky_flow_on_a_lumi_site(tmp_path: Path) -> None:
    """lumi.yml with its container's Python stood in by this machine's (the Python minor version is
    what the machine forces), the stand-in runtime for singularity, and the page's env.yml."""
    tree = tmp_path / "image"
    python = tree / pb.load("lumi").facts.python.executable.lstrip("/")   # the image's Python, where lumi.yml says
    python.parent.mkdir(parents=True)
    python.symlink_to(os.path.realpath(subprocess.run(
        ["python3", "-c", "import sys; print(sys.executable)"], capture_output=True, text=True).stdout.strip()))
    image = twin.make_image(tree, tmp_path / "pytorch.sif")
    bin_dir = twin.install(tmp_path / "bin")
    playbook = playbook_copy(tmp_path / "pb", "lumi", facts={
        "marker": None, "python": {"version": "3.11"}, "container": {"image": str(image), "bind": []}})
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SITESTACK_LOG_DIR": str(tmp_path / "logs"), **NO_RETRIES}
    install_dir = tmp_path / "scratch" / "tykkyTest"
    install_dir.mkdir(parents=True)   # the page: `mkdir <install_dir>` first
    try:
        out = run_invoke("pack-env", "--site", "lumi", "--playbook", str(playbook), "--requirements", str(ENV_YML),
                         "--dest", str(install_dir), "--prefix", str(tmp_path / "prefix"), "--account",
                         "project_465000123", env=env, timeout=1500)
        assert out.returncode == 0, out.stdout + out.stderr
        assert "conda dependencies from the package index with pip" in out.stdout
        assert "numpy=1.26.4 as numpy==1.26.4.*" in out.stdout
        run_env = {**os.environ, **env}
        show = subprocess.run([str(install_dir / "bin" / "pip"), "show", "torch"], capture_output=True, text=True,
                              env=run_env, timeout=300)
        assert show.returncode == 0 and "Name: torch\nVersion: 2.13.0" in show.stdout, show.stdout + show.stderr
        user = subprocess.run(["bash", "-c", f'export PATH="{install_dir}/bin:$PATH"; echo "$(which python)"; '
                               'python --version; python -c "import torch, numpy; print(torch.__version__, '
                               'numpy.__version__)"'], capture_output=True, text=True, env=run_env, timeout=300)
        assert user.returncode == 0, user.stderr
        assert user.stdout.splitlines() == [f"{install_dir}/bin/python", "Python 3.11.7", "2.13.0+cpu 1.26.4"]
        # conda's order: the conda dependencies first (sympy=1.13.1), then the pip: list, whose torch
        # needs sympy>=1.13.3 and upgrades it (one resolution of both lists was refused)
        sympy = subprocess.run([str(install_dir / "bin" / "python"), "-c", "import sympy; print(sympy.__version__)"],
                               capture_output=True, text=True, env=run_env, timeout=300)
        from packaging.version import Version
        assert sympy.returncode == 0 and Version(sympy.stdout.strip()) >= Version("1.13.3"), sympy.stdout + sympy.stderr
        assert {"python", "pip", "torchrun"} <= {p.name for p in (install_dir / "bin").iterdir()}
        again = run_invoke("pack-env", "--site", "lumi", "--playbook", str(playbook), "--requirements",
                           str(ENV_YML), "--dest", str(install_dir), "--prefix", str(tmp_path / "prefix"),
                           "--account", "project_465000123", env=env, timeout=600)
        assert again.returncode == 0 and "ok       pack-env pytorch_rocm" in again.stdout, again.stdout
    finally:
        unmount_all(tmp_path)
