"""The ``stage-archive`` action: the stack environment packed once into ``{prefix}/packs/``, for
jobs that stage it on node-local storage (``facts.node.stage_env``; :mod:`sitestack.installs.staging`).

One pack per stack: a step packs the env of its ``stack:`` (else the playbook's own stack), and a
playbook gives each stack whose env jobs stage a step of its own. ``sitestack-stage-env`` stages the
pack of the stack whose module is loaded and refuses a loaded stack that no step packs.

On a site that does not stage (``stage_env: false``) the step has nothing to do. Otherwise the
pack's kind follows what the stack env is when it is packed (``conda-meta/``: conda-pack;
``pyvenv.cfg``: tar + fix-up; :func:`sitestack.installs.staging.env_kind`), and the pack is made
again when the stack changes: ``<pack>.json`` records the digest of the stack's manifest, the
generation that was packed and its kind. A plan made before the env exists says which kind the
facts lead to expect. The tarball is written beside its final name and
renamed into place, and the stamp is written last, so a failed pack leaves the old one or none.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path

from sitestack.actions.action import Action, log_name
from sitestack.core.errors import SitestackError
from sitestack.core.host import Host
from sitestack.core.shipped import single_file
from sitestack.core.swap import relink_argv
from sitestack.installs.site_stack import site_stack
from sitestack.installs.staging import (
    CONDA_MARK,
    CONDA_PACK,
    PACK_RECORD,
    UNPACK_PROGRAM,
    VENV_MARK,
    StageArchive,
    env_kind,
    stamp_text,
)
from sitestack.installs.venv_stack import Base


def site_archive(action: Action) -> StageArchive | None:
    """The pack of the step's stack (its ``stack:``, else the playbook's own), or None where the playbook makes
    no env for that stack."""
    stack = site_stack(action.ctx)
    return StageArchive(stack, action.ctx.values["prefix"]) if stack else None


class MakeStageArchive(Action):
    """The environment of the step's stack (its `stack:`, else the playbook's own) is packed for node-local
    staging, by what it is when packed: conda-pack for a conda env (conda-meta/), tar + fix-up for a venv
    (pyvenv.cfg). One step per stack whose env jobs stage: sitestack-stage-env stages the loaded stack's pack."""

    action = "stage-archive"

    @dataclass(frozen=True)
    class Args:
        pass

    def pack(self) -> StageArchive:
        pack = site_archive(self)
        if pack is None:
            which = f"of stack {self.ctx.site.stack}" if self.ctx.site.stack else "of the playbook's own stack"
            raise SitestackError(f"stage-archive needs a stack-venv step {which} (the env it packs)")
        return pack

    def describe(self) -> str:
        if not self.ctx.facts.node.stage_env:
            return "archive the stack env for node-local staging (not needed: facts.node.stage_env is false)"
        return (f"archive the stack env for node-local staging into {self.pack().path} (conda-pack for a conda "
                "env, tar + fix-up for a venv, as the env is when packed)")

    def _real(self, host: Host, pack: StageArchive) -> str | None:
        out = host.probe(["readlink", "-e", "--", pack.stack.path])
        return out.stdout.strip() or None if out.ok else None

    def _wanted(self, host: Host, pack: StageArchive, real: str, kind: str) -> str:
        return stamp_text(host.read_text(pack.stack.manifest), real, kind)

    def pending(self, host: Host) -> str | None:
        if not self.ctx.facts.node.stage_env:
            return None
        pack = self.pack()
        real = self._real(host, pack)
        if real is None:
            # Nothing to look at yet: the facts say what to expect; the pack follows what is made.
            return (f"stack env {pack.stack.path} missing (made by the stack-venv step); expected a "
                    f"{pack.expected_kind} pack from facts.python.source {pack.stack.source}, to be "
                    "confirmed by what the env is when it is packed")
        kind = env_kind(host, real)
        stamp = host.read_text(pack.stamp)
        if stamp is None or not host.exists(pack.path):
            return f"{pack.path} missing ({kind} pack of {real})"
        if stamp == self._wanted(host, pack, real, kind):
            stale = self._stale(host, pack)
            return f"remove the packs of removed generations: {', '.join(stale)}" if stale else None
        recorded = (host.read_json(pack.stamp) or {}).get("kind")
        if recorded != kind:
            return f"the stack env is a {kind} now, packed as {recorded or 'an unknown kind'}"
        return "the stack changed since it was packed"

    def apply(self, host: Host) -> None:
        pack = self.pack()
        real = self._real(host, pack)
        if real is None:
            raise SitestackError(f"no stack env at {pack.stack.path} to pack: run the stack-venv step first")
        kind = env_kind(host, real)
        log = self.ctx.log_dir / log_name(self.name) if self.ctx.log_dir else None
        tmp = f"{pack.path}.new"
        host.run(["mkdir", "-p", "--", pack.path.rsplit("/", 1)[0]])
        host.run(["rm", "-rf", "--", tmp, f"{tmp}.d"])
        mark = f"{CONDA_MARK}/" if kind == "conda" else VENV_MARK
        self.ctx.note(f"packing {real} into {pack.path}: a {kind} ({mark} found)")
        if not host.exists(pack.generation_pack(real)):
            if kind == "conda":
                self._conda_pack(host, pack, real, tmp, log)
            else:
                self._venv_pack(host, pack, real, tmp, log)
            host.run(["mkdir", "-p", "--", pack.generations])
            host.run(["mv", "-f", "--", tmp, pack.generation_pack(real)])
        # the stable name links to the current generation's pack (one rename); a job that loaded an older
        # generation stages that one's pack, kept while the generation is (sitestack-stage-env)
        target = f"{pack.generations.rsplit('/', 1)[1]}/{pack.generation_pack(real).rsplit('/', 1)[1]}"
        host.run(relink_argv(pack.path, target, secrets.token_hex(4)))
        host.write_text(pack.stamp, self._wanted(host, pack, real, kind), 0o644)
        stale = self._stale(host, pack)
        if stale:
            host.run(["rm", "-f", "--", *(f"{pack.generations}/{name}" for name in stale)])

    def _stale(self, host: Host, pack: StageArchive) -> list[str]:
        """The packs (names in :attr:`StageArchive.generations`) whose generation is gone from disk, but
        the one the stable name links to."""
        script = ('cd -- "$1" 2>/dev/null || exit 0; cur=$(readlink -- "$3" 2>/dev/null); cur=${cur##*/}; '
                  'for f in *.tar.gz; do [ -e "$f" ] || continue; [ "$f" = "$cur" ] && continue; '
                  '[ -d "$2/.${f%.tar.gz}" ] || echo "$f"; done')
        parent = pack.stack.path.rsplit("/", 1)[0]
        return host.probe(["sh", "-c", script, "sh", pack.generations, parent, pack.path]).stdout.split()

    def _conda_pack(self, host: Host, pack: StageArchive, real: str, tmp: str, log: Path | None) -> None:
        """conda-pack from its tools venv (made on first use), as OLCF's guide runs it."""
        if not host.exists(f"{pack.tools}/bin/conda-pack"):
            base = Base(self.ctx.facts, pack.stack, self.ctx.values["prefix"])
            host.run(base.base(["python", "-m", "venv", pack.tools]), log=log)
            host.run([f"{pack.tools}/bin/python", "-m", "pip", "install", "--disable-pip-version-check",
                      CONDA_PACK], log=log)
        host.run(pack.conda_pack_argv(real, tmp), log=log)

    def _venv_pack(self, host: Host, pack: StageArchive, real: str, tmp: str, log: Path | None) -> None:
        """A tar of the venv with sitestack's fix-up and the prefixes it replaces."""
        extra = f"{tmp}.d"
        host.write_text(f"{extra}/{UNPACK_PROGRAM}", single_file("venv_unpack"), 0o755)
        host.write_text(f"{extra}/{PACK_RECORD}", pack.record(real), 0o644)
        host.run(pack.tar_argv(real, extra, tmp), log=log)
        host.run(["rm", "-rf", "--", extra])
