"""ansible-core in a venv of its own (``<bench dir>/ansible-core``), installed from PyPI with pip the
first time a benchmark needs it; benchmarks compare sitestack with the same checks in Ansible."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from _common import BENCH_DIR

VENV = BENCH_DIR / "ansible-core"


def ansible_playbook() -> Path | None:
    """The venv's ``ansible-playbook`` (made on first use); None when it cannot be installed here."""
    exe = VENV / "bin" / "ansible-playbook"
    if exe.exists():
        return exe
    print(f"  installing ansible-core into {VENV} (once)")
    try:
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True, capture_output=True)
        subprocess.run([str(VENV / "bin" / "python"), "-m", "pip", "install", "--quiet", "ansible-core"], check=True,
                       capture_output=True)
    except subprocess.CalledProcessError as exc:
        print(f"  cannot install ansible-core: {(exc.stderr or b'').decode()[-500:]}")
        return None
    return exe if exe.exists() else None


def ansible_env() -> dict[str, str]:
    """Quiet, local, with the venv's Python for the modules (no interpreter discovery)."""
    home = BENCH_DIR / "ansible-home"
    return {**os.environ, "ANSIBLE_HOME": str(home), "ANSIBLE_LOCAL_TEMP": str(home / "tmp"),
            "ANSIBLE_PYTHON_INTERPRETER": str(VENV / "bin" / "python"), "ANSIBLE_LOCALHOST_WARNING": "False",
            "ANSIBLE_INVENTORY_UNPARSED_WARNING": "False", "ANSIBLE_NOCOLOR": "1", "ANSIBLE_RETRY_FILES_ENABLED": "False"}
