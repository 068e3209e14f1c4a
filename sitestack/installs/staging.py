"""The stack environment packed into one tarball, for jobs that stage it on node-local storage.

OLCF's ``sbcast_conda`` guide (https://docs.olcf.ornl.gov/software/python/sbcast_conda.html; also
https://docs.olcf.ornl.gov/software/python/pytorch_frontier.html, "Environment Location") packs the
conda env once with ``conda-pack``, broadcasts the tarball to every node's NVMe with ``sbcast``,
unpacks it there and runs ``conda-unpack`` to rewrite the prefixes. Start-up drops from 51 s
(Orion) to 2 s. This module says where the pack lives and which commands make it; nothing here
runs (the ``stage-archive`` action does).

One pack per stack: each ``stage-archive`` step packs the env of its stack (its ``stack:``, else the
playbook's own), and ``sitestack-stage-env`` stages the pack of the stack whose module is loaded
(:func:`stack_packs`), refusing a loaded stack that has none.

Which of the two packs is made follows what the environment *is* when it is packed, not the
playbook's ``python.source``: a directory with ``conda-meta/`` is a conda env (conda-pack itself
requires it, https://conda.github.io/conda-pack/), one with ``pyvenv.cfg`` is a venv (PEP 405,
https://peps.python.org/pep-0405/); a stack built with ``python.source: conda`` may well be a venv
(``python3 -m venv`` over the conda module's Python). The kind is recorded in the pack's stamp.

- conda envs: ``conda-pack`` (0.9.2, from PyPI into a small tools venv beside the stack, so the
  stack itself is not changed), which puts ``bin/conda-unpack`` into the tarball.
- venvs: a plain ``tar`` of the environment plus ``.sitestack-unpack.py``
  (:mod:`sitestack.onsite.venv_unpack`) and ``.sitestack-pack.json`` naming the prefixes to
  rewrite. Not venv-pack: its last release (0.2.0) is from 2018, it would be one more package in
  every stack, and what a venv needs after a move is small: its interpreter finds its prefix from
  ``pyvenv.cfg`` beside ``bin/python`` wherever it lies, so only script shebangs, the activate
  scripts and ``.pth`` files name the old prefix.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass

from sitestack.core.errors import SitestackError
from sitestack.core.host import Host
from sitestack.installs.site_stack import site_stack
from sitestack.installs.venv_stack import Stack, generation_var
from sitestack.model.context import RunContext
from sitestack.onsite import venv_unpack
from sitestack.validation.launch_helpers import StackPack

#: conda-pack from PyPI, pinned (the tools venv installs exactly this).
CONDA_PACK = "conda-pack==0.9.2"
#: Files the venv pack carries at its top level besides the environment (named by the program that reads them).
UNPACK_PROGRAM, PACK_RECORD = venv_unpack.PROGRAM, venv_unpack.RECORD
#: What marks each kind of environment (a directory, a file), checked in this order.
CONDA_MARK = "conda-meta"
VENV_MARK = "pyvenv.cfg"
#: The fix-up program conda-pack puts into its pack, relative to an unpacked copy.
CONDA_UNPACK = venv_unpack.CONDA_UNPACK


def env_kind(host: Host, path: str) -> str:
    """``conda`` where ``path`` holds ``conda-meta/``, else ``venv`` where it holds ``pyvenv.cfg``;
    neither is a :class:`SitestackError` naming the path (nothing could pack or fix it up)."""
    if host.probe(["test", "-d", f"{path}/{CONDA_MARK}"]).ok:
        return "conda"
    if host.probe(["test", "-f", f"{path}/{VENV_MARK}"]).ok:
        return "venv"
    raise SitestackError(f"{path} is neither a conda env ({CONDA_MARK}/ missing) nor a venv ({VENV_MARK} "
                         "missing): stage-archive cannot pack it")


@dataclass(frozen=True)
class StageArchive:
    """Where a stack's pack lives and how it is made."""

    stack: Stack
    prefix: str

    @property
    def expected_kind(self) -> str:
        """The kind the playbook's facts lead one to expect (``python.source: conda``: conda), for a plan
        made before the environment exists; the pack itself follows :func:`env_kind`."""
        return "conda" if self.stack.source == "conda" else "venv"

    @property
    def path(self) -> str:
        """``{prefix}/packs/<stack name, / as ->.tar.gz``."""
        return f"{self.prefix.rstrip('/')}/packs/{self.stack.name.replace('/', '-')}.tar.gz"

    @property
    def stamp(self) -> str:
        return self.path + ".json"

    @property
    def generations(self) -> str:
        """Where the pack of each generation lies: :attr:`path` links to the current one's, and a job
        stages the pack of the generation its stack module loaded (docs/operating.md)."""
        return self.path[: -len(".tar.gz")] + ".generations"

    def generation_pack(self, real: str) -> str:
        """The pack of the generation at ``real`` (``.2.13.0-cpu.gen-TOKEN`` packs as ``2.13.0-cpu.gen-TOKEN.tar.gz``)."""
        return f"{self.generations}/{os.path.basename(real.rstrip('/')).lstrip('.')}.tar.gz"

    @property
    def tools(self) -> str:
        """The venv conda-pack runs from (conda envs only)."""
        return f"{self.prefix.rstrip('/')}/tools/conda-pack"

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


def stack_packs(ctx: RunContext) -> tuple[StackPack, ...]:
    """Every stack of the playbook that has an env (a stack-venv step), its own first, then ``stacks:`` in
    their order: its module and, where a ``stage-archive`` step of that stack packs it, the pack."""
    own = ctx.site.own or ctx.site
    out = []
    for key in (None, *own.stacks):
        stack = site_stack(ctx.for_stack(key))
        if stack is None:
            continue
        packed = any(s.action == "stage-archive" and s.stack == key for s in own.steps)
        pack = StageArchive(stack, ctx.values["prefix"]) if packed else None
        out.append(StackPack(module=stack.name, pack=pack.path if pack else None,
                             generations=pack.generations if pack else None, generation_var=generation_var(stack),
                             own=key is None))
    return tuple(out)


def stamp_text(manifest: str | None, real: str, kind: str) -> str:
    """What the pack was made from: the stack manifest's digest, the generation packed and its kind
    (:func:`env_kind`)."""
    digest = hashlib.sha256((manifest or "").encode()).hexdigest()
    return json.dumps({"kind": kind, "manifest_sha256": digest, "source": real}, indent=2, sort_keys=True) + "\n"
