"""The sitestack MPI probe: where its executable is, and a way to run it (``python -m sitestack_mpi_probe``)."""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig

NAME = "sitestack-mpi-probe"


def executable() -> str:
    """Path of the probe executable installed with this package."""
    candidates = [os.path.join(sysconfig.get_path("scripts"), NAME), os.path.join(os.path.dirname(sys.executable), NAME)]
    for path in candidates:
        if os.access(path, os.X_OK):
            return path
    found = shutil.which(NAME)
    if found:
        return found
    raise FileNotFoundError(f"{NAME} is not installed next to this Python ({', '.join(candidates)})")
