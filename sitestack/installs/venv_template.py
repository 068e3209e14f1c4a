"""Stack environments from a template: build once with pip, then fill later generations from a copy.

A fresh generation of a stack (a new prefix, a new host home, a rebuilt base) is usually the same
set of packages as one built before on the host: torch, the extras and the wheels sitestack built,
for the same plan. After pip builds a generation, :meth:`VenvTemplates.store` copies it into the
host's build cache, ``<cache>/venvs/<family>-<key>/tree`` (key: the plan's digest, which holds the
pins, the index, the base interpreter and each built wheel's sha256, plus the venv options), with
``template.json`` (where it was built, pip's report). :meth:`VenvTemplates.clone` fills the next
fresh generation from it with :mod:`sitestack.onsite.venv_clone`: files hard-linked (copied across
file systems), scripts' ``#!`` lines and their RECORD lines rewritten for the new path, nothing of
the template written. The generation is then scanned and its manifest written as after pip, so
the result is checked the same way (the same dist-info set as the template's manifest).

``invoke gc`` trims templates with the built artefacts (each has an ``artefact.json``): by age and
size; a run that needs a removed one builds the stack with pip and stores it again.

Hard links share the file with the template: sitestack never edits a stack's files in place (pip
replaces files), but a hand edit inside an installed stack would change the template too.
``SITESTACK_VENV_TEMPLATE=copy`` copies instead of linking; ``off`` (or ``--no-cache``) builds with
pip. Templates are made for venvs only (``python.source`` system or module), not conda or
container environments, and not where the site shares its installs with a group.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from collections.abc import Mapping
from typing import Any

from sitestack.core import envvars
from sitestack.core.errors import CommandFailed
from sitestack.installs.installer import build_cache
from sitestack.installs.venv_env import EnvTools, program
from sitestack.installs.venv_manifest import dump
from sitestack.model.context import RunOptions

#: Run by the new venv's interpreter: fills it from the template (stdlib only).
CLONE = program("venv_clone")


def template_mode() -> str:
    """link (default), copy, or off: ``$SITESTACK_VENV_TEMPLATE``."""
    return str(envvars.get("SITESTACK_VENV_TEMPLATE") or "link")


class VenvTemplates:
    """The template of one stack plan on one host."""

    def __init__(self, tools: EnvTools, plan: dict[str, Any], options: RunOptions, wheels: Mapping[str, str], *,
                 shared: bool = False) -> None:
        """``wheels``: recipe -> the wheel file of each package sitestack built that the stack installs;
        ``shared``: the site gives its installs to a group (facts.install): no template, since linked
        files would keep the template's modes and a ``chgrp`` of the stack would change the template."""
        self.tools, self.host, self.stack, self.wheels = tools, tools.host, tools.stack, dict(wheels)
        # Where a built wheel lies (its install) is not content: the same wheel (sha256) in another
        # prefix gives the same environment.
        content = {**plan, "built": {name: {k: v for k, v in b.items() if k != "install"}
                                     for name, b in plan.get("built", {}).items()}}
        key = hashlib.sha256(dump({"plan": content, "system_site_packages": self.stack.system_site_packages,
                                   "compile": self.stack.compile}).encode()).hexdigest()[:24]
        self.path = f"{build_cache(self.host, options)}/venvs/{self.stack.family}-{key}"
        #: templates are kept for venvs (not conda/container environments) unless switched off;
        #: --no-cache builds with pip (and replaces the template)
        self.kept = self.stack.source in ("system", "module") and template_mode() != "off" and not shared
        self.mode = template_mode() if self.kept and not options.no_cache else "off"

    def clone(self, gen: str) -> str | None:
        """Fill the fresh venv ``gen`` from the template; pip's report of the template's build, or None
        when there is no usable template (then nothing was added to ``gen``)."""
        if self.mode == "off":
            return None
        meta = self.host.read_json(f"{self.path}/template.json")
        if not meta or not isinstance(meta.get("root"), str):
            return None
        old_wheels = meta.get("wheels")
        old_wheels = old_wheels if isinstance(old_wheels, dict) else {}
        moved = [f"{old}={self.wheels[name]}" for name, old in sorted(old_wheels.items())
                 if name in self.wheels and isinstance(old, str) and old != self.wheels[name]]
        argv = self.tools.base.env_python(gen, ["-c", CLONE, f"{self.path}/tree", gen, meta["root"], self.mode,
                                                *moved])
        try:
            self.tools.run(argv)
        except CommandFailed as exc:
            if exc.rc != 3:  # 3: a template for another interpreter; anything else is a real failure
                raise
            return None
        report = meta.get("report")
        return report if isinstance(report, str) else ""

    def store(self, gen: str, report: str | None) -> None:
        """Keep a copy of the finished venv ``gen`` as the template (replacing an older one)."""
        if not self.kept:
            return
        parent = os.path.dirname(self.path)
        tmp = f"{parent}/.{os.path.basename(self.path)}.tmp-{secrets.token_hex(4)}"
        try:
            # private, as the rest of the build cache (the installer makes ~/.cache/sitestack 0700)
            self.tools.run(["sh", "-c", 'mkdir -p -- "$1" && chmod 700 -- "$1" && mkdir -- "$2"', "sh", parent, tmp])
            self.tools.run(["cp", "-a", "--", gen, f"{tmp}/tree"])
            self.host.write_text(f"{tmp}/template.json",
                                 json.dumps({"root": gen, "report": report or "", "wheels": self.wheels}), 0o600)
            # what `invoke gc` looks for (<cache>/*/*/artefact.json): templates are trimmed by age and size too
            self.host.write_text(f"{tmp}/artefact.json", json.dumps({"kind": "venv-template", "file": "tree"}), 0o600)
            self.tools.run(["sh", "-c", 'rm -rf -- "$2" && mv -T -- "$1" "$2"', "sh", tmp, self.path])
        except BaseException:
            self.host.probe(["rm", "-rf", "--", tmp])
            raise
