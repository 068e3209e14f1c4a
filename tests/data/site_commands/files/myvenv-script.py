#!/usr/bin/env python
"""Stand-in for myvenv-script.py of Cirrus' Python guide (its pip-venv job runs it through srun):
prints where torch and the venv's own package come from (standin.py)."""

import importlib.util
import os

from standin import PROBE, probe

if __name__ == "__main__":
    probe("VIRTUAL_ENV", "LOADEDMODULES")
    spec = importlib.util.find_spec("tabulate")
    print(f"{PROBE} env USER_PACKAGE={spec.origin if spec else ''}", flush=True)
    print(f"{PROBE} env RANK={os.environ.get('SLURM_PROCID', '')}", flush=True)
