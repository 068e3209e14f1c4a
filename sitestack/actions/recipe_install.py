"""Recipe installs: a recipe version built from source and installed atomically, stamped, locked.

The ``recipe-install`` action (and ``invoke build-recipe`` / ``invoke build-mpi4py``) makes
``<dest>`` (default ``<site prefix>/<recipe>/<version>``) hold the package built from its
recipe in ``sources/``:

- **done** when ``<dest>/.sitestack/install.json`` holds the digest of every input (source
  sha256, each patch's sha256, builder and its options, the resolved commands and
  environment, the site toolchain, the install location, sanity paths and checks) and the
  recipe's sanity paths exist. An unchanged install is ``ok`` after a few probes.
- otherwise, under a per-install lock (re-checked once taken): the artefact (a wheel, or a
  tarball of the staged prefix) is taken from the build cache by its build digest, or built:
  fresh build dir, source fetched on the controller (sha256 verified), patches applied
  (already-applied ones detected), the builder's commands run with the site's modules
  loaded, the result stored in the cache. The artefact is installed into a hidden tree beside
  ``<dest>``, sanity paths and checks run on it, then ``<dest>`` (a symlink) is switched to
  it with one rename, and the stamp is written last.

A kill at any moment leaves ``<dest>`` as it was (the old install, or nothing) or the new
complete tree without its stamp, which the next run finishes from the cache. Leftovers of a
killed run (hidden trees, build dirs) are removed by the next install under the lock.

Build logs are files (one per install, controller side); phases are written there as
``==> sitestack: ... phase NAME (+ELAPSED)`` lines and reported while the build runs.

This module is the action only; the machinery is :mod:`sitestack.installs` (target, inputs,
toolchain, stamp and lock, installer) and the build systems are :data:`sitestack.builders.BUILDERS`.
The names other modules used to import from here are re-exported (``__all__``).
"""

from __future__ import annotations

import re
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sitestack.actions.base import Action
from sitestack.core import versions
from sitestack.core.errors import InputError
from sitestack.core.host import Host
from sitestack.installs.inputs import build_inputs, digest, explain_change, install_inputs
from sitestack.installs.installer import Installer
from sitestack.installs.stamp import STAMP_FORMAT, install_lock, install_reason, installed_wheel, lock_path, read_stamp
from sitestack.installs.target import Target, build_plan, check_commands, host_argv, launcher_argv
from sitestack.installs.toolchain import Toolchain, probe_toolchain, require_tools
from sitestack.model.context import RunContext
from sitestack.model.recipe import load_recipe


# -- the action ----------------------------------------------------------------------------------
class RecipeInstall(Action):
    """A package built from its recipe in sources/ and installed atomically (stamped, locked, cached)."""

    action = "recipe-install"

    @dataclass(frozen=True)
    class Args:
        recipe: str = field(metadata={"doc": "recipe name: sources/<recipe>.yml"})
        version: str | None = field(default=None, metadata={"doc": "version to build (default: the recipe's default_version)"})
        dest: str | None = field(default=None, metadata={"doc": "install prefix of the package (default: {prefix}/<recipe>/<version>)"})
        python: str | None = field(default=None, metadata={"doc": "interpreter that builds Python packages (default: facts.python.executable)"})
        mirror: str | None = field(default=None, metadata={"doc": "controller directory with source tarballs (air-gapped sites)"})

        def check(self) -> str | None:
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", self.recipe):
                return f"recipe: {self.recipe!r} is not a recipe name"
            if self.dest is not None and not (self.dest.startswith("/") or self.dest.startswith("{")):
                return f"dest: {self.dest!r} must be absolute"
            if self.version is not None and versions.check_version(self.version):
                return f"version: {versions.check_version(self.version)}"
            return None

    def __init__(self, spec: Any, args: Any, ctx: RunContext) -> None:
        super().__init__(spec, args, ctx)
        options = ctx.options
        sources_dir = options.sources_dir
        self.recipe = load_recipe(args.recipe, Path(sources_dir) if sources_dir else None)
        self.version = self.recipe.select_version(args.version, ctx.facts,
                                                  f"site {ctx.site.name}")
        site_prefix = ctx.values["prefix"]
        dest = args.dest or f"{site_prefix}/{self.recipe.name}/{self.version}"
        self.target = Target(self.recipe, self.version, ctx.facts, dest.rstrip("/"), site_prefix,
                             args.python or ctx.facts.python.executable)
        self.options = options
        self.report = ctx.note
        self._toolchain: Toolchain | None = None

    # -- Step ----------------------------------------------------------------------------------
    def describe(self) -> str:
        return f"build and install {self.target.label} into {self.target.dest}"

    def pending(self, host: Host) -> str | None:
        if host.read_only:
            return self.reason(host)
        with self._lock(host):
            return self.reason(host)

    def apply(self, host: Host) -> None:
        with self._lock(host):
            if self.reason(host) is None:  # a concurrent run installed it while we waited
                return
            Installer(host, self.target, inputs=self.inputs(host), toolchain=self.toolchain(host),
                      options=self.options, log_dir=self.ctx.log_dir, report=self.report,
                      mirror=self.args.mirror).run()

    # -- helpers ---------------------------------------------------------------------------------
    def lock_path(self) -> str:
        return lock_path(self.target.dest)

    def _lock(self, host: Host) -> AbstractContextManager[None]:
        return install_lock(host, self.lock_path(), self.options.install_lock_wait,
                            self.report, f"[{host.name}] {self.target.label}")

    def toolchain(self, host: Host) -> Toolchain:
        if self._toolchain is None:
            extra = ["tar"] + (["patch"] if self.recipe.patches_for(self.version) else [])
            self._toolchain = probe_toolchain(host, self.target, extra)
        return self._toolchain

    def inputs(self, host: Host) -> dict[str, Any]:
        toolchain = self.toolchain(host)
        require_tools(toolchain, self.target, host)
        build = build_inputs(self.target, toolchain)
        return {"format": STAMP_FORMAT, "build": build, "install": install_inputs(self.target)}

    def reason(self, host: Host) -> str | None:
        """Why the install is needed (None: it is done). Read-only."""
        return install_reason(host, self.target.dest, self.inputs(host), self.recipe.sanity)


__all__ = ["InputError", "RecipeInstall", "Target", "Toolchain", "build_inputs", "build_plan", "check_commands",
           "digest", "explain_change", "host_argv", "install_inputs", "installed_wheel", "launcher_argv",
           "read_stamp"]
