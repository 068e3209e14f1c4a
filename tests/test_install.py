"""The installed ``sitestack`` command: a non-editable ``pip install`` of the checkout into a fresh
venv runs from any directory, with the playbooks, recipes, patches and module-file templates the
wheel carries (sitestack/core/paths.py, setup.py).

Offline and quick: the wheel is built without build isolation, and the new venv sees this venv's
packages (invoke, fabric, setuptools...) through a .pth line, so nothing is downloaded."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.conftest import REPO


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ``bin/`` of a venv with sitestack installed from a copy of the checkout's tracked files."""
    root = tmp_path_factory.mktemp("install")
    src = root / "src"
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    for name in filter(None, files.decode().split("\0")):
        if (REPO / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, src / name)
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    # this venv's packages, after the new venv's own (a path line: its .pth files, the editable
    # install of sitestack among them, are not read)
    Path(site, "test-deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    out = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                          "--no-deps", "--no-build-isolation", "--no-index", str(src)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    return venv / "bin"


def sitestack(bin_dir: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(bin_dir / "sitestack"), *args], cwd="/", capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def test_installed_command_runs_from_anywhere_with_the_wheels_data(installed, tmp_path):
    where = subprocess.run([str(installed / "python"), "-c", "import sitestack.core.paths as p; print(p.DATA_DIR)"],
                           cwd="/", capture_output=True, text=True, check=True).stdout.strip()
    assert where.endswith("sitestack/_data") and not where.startswith(str(REPO)), where
    data = Path(where)
    assert (data / "sources" / "mpi_probe" / "CMakeLists.txt").is_file() and any((data / "patches").rglob("*.patch"))
    assert (data / "modulefiles" / "base.lua.j2").is_file()

    help_ = sitestack(installed, "--help")
    assert help_.returncode == 0 and help_.stdout.startswith("Usage: sitestack "), help_.stdout + help_.stderr
    listing = sitestack(installed, "--list")
    assert listing.returncode == 0 and "provision" in listing.stdout and "nccl-log" in listing.stdout
    doc = json.loads(sitestack(installed, "sites", "--json", "-").stdout)
    assert sorted(s["name"] for s in doc["sites"]) == sorted(p.stem for p in (REPO / "playbooks").glob("*.yml"))
    site = sitestack(installed, "show-site", "--site", "local")
    assert site.returncode == 0 and "site: local" in site.stdout, site.stderr
    recipes = json.loads(sitestack(installed, "recipes", "--json", "-").stdout)["recipes"]
    assert {"mpi4py", "horovod"} <= {r["name"] for r in recipes}  # recipes with their patches/ load
    plan = sitestack(installed, "install-modulefiles", "--site", "local", "--check", "--prefix", str(tmp_path / "p"))
    assert plan.returncode == 0 and "modulefiles: would change" in plan.stdout, plan.stdout + plan.stderr  # templates found

    own = tmp_path / "data"  # SITESTACK_DATA_DIR: a site's own copy of the data folders
    shutil.copytree(data, own)
    text = (own / "playbooks" / "local.yml").read_text()
    (own / "playbooks" / "mysite.yml").write_text(text.replace("site: local\n", "site: mysite\n", 1))
    names = json.loads(sitestack(installed, "sites", "--json", "-", env={"SITESTACK_DATA_DIR": str(own)}).stdout)
    assert "mysite" in {s["name"] for s in names["sites"]}
