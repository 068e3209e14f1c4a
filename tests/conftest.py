"""Shared fixtures: the repository, running the CLI as a user would, scratch prefixes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


def run_invoke(*args: str, cwd: Path = REPO, env: dict[str, str] | None = None,
               timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    """Run ``invoke ARGS`` in the checkout the way a user does; capture everything."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=cwd, env=full_env, text=True,
                          capture_output=True, timeout=timeout)


@pytest.fixture
def cli():
    """``cli("provision", "--site", "local")`` -> CompletedProcess (stdout, stderr, returncode)."""
    return run_invoke


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    """An empty directory for a prefix; logs of runs go beside it, not to ~/.cache."""
    os.environ["SITESTACK_LOG_DIR"] = str(tmp_path / "logs")
    path = tmp_path / "prefix"
    return path


def tree(path: Path) -> list[str]:
    """Every path below ``path``, relative and sorted (to compare before/after a run)."""
    if not path.exists():
        return []
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


@pytest.fixture(scope="session")
def mpi4py_build(tmp_path_factory):
    """mpi4py built ONCE per session, for real, from its PyPI sdist against the local site's MPICH
    (`invoke build-mpi4py --site local`), with a check-mode run before it. Its build cache
    (``env["SITESTACK_BUILD_CACHE"]``) holds the wheel: later installs with that env reuse it."""
    import time
    from types import SimpleNamespace

    root = tmp_path_factory.mktemp("mpi4py")
    env = {"SITESTACK_BUILD_CACHE": str(root / "build-cache"), "SITESTACK_SOURCE_CACHE": str(root / "source-cache"),
           "SITESTACK_LOG_DIR": str(root / "logs")}
    prefix = root / "prefix"
    check = run_invoke("build-mpi4py", "--site", "local", "--prefix", str(prefix), "--check", "--fail-on-change", env=env)
    start = time.monotonic()
    build = run_invoke("build-mpi4py", "--site", "local", "--prefix", str(prefix), env=env, timeout=3600)
    seconds = time.monotonic() - start
    return SimpleNamespace(root=root, prefix=prefix, dest=prefix / "mpi4py" / "4.1.2", env=env, check=check,
                           build=build, seconds=seconds)
