"""The on-site package (:mod:`sitestack.onsite`) as the controller ships it.

A directory that runs on-site programs by name gets ``onsite/`` whole (every module, so any entry's
imports are there) and, for each entry of :data:`sitestack.onsite.ENTRY_POINTS` it needs, a small
launcher of that name. The launcher puts its own directory first on ``sys.path`` itself (the job runs
Python with ``-E -s -S``, and ``-P`` or ``-I`` would drop it) and runs the module as ``__main__``, so
``python3 ddp_check.py ...`` in a job directory is what ``python3 -m onsite.ddp_check ...`` would be.
A program in :data:`sitestack.onsite.SINGLE_FILE` ships as its own text (:func:`single_file`).
"""

from __future__ import annotations

from pathlib import Path

from sitestack.onsite import ENTRY_POINTS, SINGLE_FILE

ONSITE = Path(__file__).resolve().parent.parent / "onsite"

LAUNCHER = '''#!/usr/bin/env python3
"""{name}: runs onsite/{module}.py beside this file (sitestack's on-site programs, standard library only)."""
import os
import runpy
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
runpy.run_module("onsite.{module}", run_name="__main__", alter_sys=True)
'''


def package_files() -> dict[str, str]:
    """``onsite/<relative path>`` -> text, for every module of the package (caches left out)."""
    return {f"onsite/{path.relative_to(ONSITE).as_posix()}": path.read_text(encoding="utf-8")
            for path in sorted(ONSITE.rglob("*.py")) if "__pycache__" not in path.parts}


def launcher(name: str) -> str:
    """The launcher file ``name`` of :data:`~sitestack.onsite.ENTRY_POINTS`; KeyError for another name."""
    return LAUNCHER.format(name=name, module=ENTRY_POINTS[name])


def shipped(names: tuple[str, ...] | list[str]) -> dict[str, tuple[str, int]]:
    """Relative path -> (text, mode): the package and the launchers ``names``, executable."""
    files = {path: (text, 0o644) for path, text in package_files().items()}
    files.update({name: (launcher(name), 0o755) for name in names})
    return files


def single_file(module: str) -> str:
    """The text of ``onsite/<module>.py``, one of :data:`~sitestack.onsite.SINGLE_FILE` (ValueError for
    another: its imports would not be there)."""
    if module not in SINGLE_FILE:
        raise ValueError(f"onsite/{module}.py is not a single-file program")
    return (ONSITE / f"{module}.py").read_text(encoding="utf-8")
