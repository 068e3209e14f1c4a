"""The stack environment packed into one tarball, for jobs that stage it on node-local storage.

OLCF's ``sbcast_conda`` guide (https://docs.olcf.ornl.gov/software/python/sbcast_conda.html; also
https://docs.olcf.ornl.gov/software/python/pytorch_frontier.html, "Environment Location") packs the
conda env once with ``conda-pack``, broadcasts the tarball to every node's NVMe with ``sbcast``,
unpacks it there and runs ``conda-unpack`` to rewrite the prefixes. Start-up drops from 51 s
(Orion) to 2 s. This module says where the pack lives and which commands make it; nothing here
runs (the ``stage-archive`` action does).

- conda envs: ``conda-pack`` (0.9.2, from PyPI into a small tools venv beside the stack, so the
  stack itself is not changed), which puts ``bin/conda-unpack`` into the tarball.
- venvs: a plain ``tar`` of the environment plus ``.sitestack-unpack.py``
  (:mod:`sitestack.programs.venv_unpack`) and ``.sitestack-pack.json`` naming the prefixes to
  rewrite. Not venv-pack: its last release (0.2.0) is from 2018, it would be one more package in
  every stack, and what a venv needs after a move is small: its interpreter finds its prefix from
  ``pyvenv.cfg`` beside ``bin/python`` wherever it lies, so only script shebangs, the activate
  scripts and ``.pth`` files name the old prefix.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from sitestack.installs.venv_stack import Stack

#: conda-pack from PyPI, pinned (the tools venv installs exactly this).
CONDA_PACK = "conda-pack==0.9.2"
#: Files the venv pack carries at its top level besides the environment.
UNPACK_PROGRAM = ".sitestack-unpack.py"
PACK_RECORD = ".sitestack-pack.json"


@dataclass(frozen=True)
class StageArchive:
    """Where a stack's pack lives and how it is made."""

    stack: Stack
    prefix: str

    @property
    def kind(self) -> str:
        """conda (conda-pack) or venv (tar + sitestack's fix-up)."""
        return "conda" if self.stack.source == "conda" else "venv"

    @property
    def path(self) -> str:
        """``{prefix}/packs/<stack name, / as ->.tar.gz``."""
        return f"{self.prefix.rstrip('/')}/packs/{self.stack.name.replace('/', '-')}.tar.gz"

    @property
    def stamp(self) -> str:
        return self.path + ".json"

    @property
    def tools(self) -> str:
        """The venv conda-pack runs from (conda envs only)."""
        return f"{self.prefix.rstrip('/')}/tools/conda-pack"

    @property
    def fixup_program(self) -> str:
        """The program, relative to an unpacked copy, that fixes it up (run with the copy's own Python)."""
        return "bin/conda-unpack" if self.kind == "conda" else UNPACK_PROGRAM

    def record(self, real: str) -> str:
        """``.sitestack-pack.json`` of a venv pack: the prefixes the fix-up replaces (the generation's
        real path, which pip wrote into shebangs, and the stable path that links to it)."""
        return json.dumps({"prefixes": sorted({real, self.stack.path}, key=len, reverse=True)}, indent=2) + "\n"

    def tar_argv(self, real: str, extra_dir: str, output: str) -> list[str]:
        """A venv pack: the environment's contents plus the fix-up files from ``extra_dir``, gzip
        level 1 (a torch env is about 1 GB; level 6 costs minutes and saves little on wheels'
        already compressed libraries)."""
        return ["tar", "--use-compress-program=gzip -1", "-cf", output, "-C", real, ".",
                "-C", extra_dir, UNPACK_PROGRAM, PACK_RECORD]

    def conda_pack_argv(self, real: str, output: str) -> list[str]:
        """A conda pack, as OLCF's guide makes it (``--format tar.gz --n-threads -1``)."""
        return [f"{self.tools}/bin/conda-pack", "--prefix", real, "--output", output, "--format", "tar.gz",
                "--n-threads", "-1", "--force", "--quiet"]


def stamp_text(manifest: str | None, real: str, kind: str) -> str:
    """What the pack was made from: the stack manifest's digest and the generation packed."""
    digest = hashlib.sha256((manifest or "").encode()).hexdigest()
    return json.dumps({"kind": kind, "manifest_sha256": digest, "source": real}, indent=2, sort_keys=True) + "\n"
