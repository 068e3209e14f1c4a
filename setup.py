"""Build hook (the project's metadata is pyproject.toml): the wheel carries the checkout's data
folders, playbooks/, sources/, patches/ and modulefiles/, as ``sitestack/_data/``, where
sitestack/core/paths.py finds them in an install. The checkout's folders stay the only copy in git."""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
DATA_FOLDERS = ("playbooks", "sources", "patches", "modulefiles")  # sitestack.core.paths.DATA_FOLDERS


class BuildPyWithData(build_py):
    """build_py, then the data folders into ``<build_lib>/sitestack/_data/`` (an editable install
    reads them from the checkout instead)."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        target = Path(self.build_lib, "sitestack", "_data")
        for name in DATA_FOLDERS:
            shutil.rmtree(target / name, ignore_errors=True)
            shutil.copytree(HERE / name, target / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


setup(cmdclass={"build_py": BuildPyWithData})
