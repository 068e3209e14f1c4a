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
