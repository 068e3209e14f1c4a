"""The ``rccl-net-plugin`` action: the RCCL network plugin (aws-ofi-rccl / aws-ofi-nccl) for a ROCm release.

The action (and ``invoke build-rccl-plugin --rocm X``) is a recipe install of
``sources/aws-ofi-rccl.yml`` into ``<prefix>/aws-ofi-rccl/<version>-rocm-<rocm>`` whose version,
configure options and checks come from the plugin's hooks
(:class:`sitestack.packages.aws_ofi_rccl.PluginHooks`), plus a module file. The module file puts
the library on ``LD_LIBRARY_PATH`` and sets ``NCCL_NET_PLUGIN`` (its absolute path) and
``NCCL_NET`` explicitly, so a missing plugin is an error in RCCL instead of a silent fallback to
sockets, plus the site's ``FI_*`` and ``NCCL_*`` settings.

Sources: the recipe's URL when its sha256 is known; else ``--source`` with a tarball or a
directory (a checkout; packed reproducibly), whose sha256 is recorded in the install's stamp and
whose tarball is kept in the source cache, so later runs need no ``--source``.

``choose_version``, ``known_rocm`` and ``plugin_data`` are re-exported for callers that import them
from the action.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sitestack.actions.base import unified_diff
from sitestack.actions.hooked_install import HookedInstall
from sitestack.actions.modulefiles import ModuleSpec, package_module, render
from sitestack.actions.recipe_install import Target, build_plan, read_stamp
from sitestack.actions.stack_venv import Built
from sitestack.builders import symbolic
from sitestack.core.errors import SitestackError
from sitestack.core.host import Host
from sitestack.installs import sources as sources_mod
from sitestack.model.context import RunContext
from sitestack.model.recipe import Recipe
from sitestack.model.site import Facts
from sitestack.packages.aws_ofi_rccl import (
    Homes,
    PluginArgs,
    PluginHooks,
    PluginRow,
    choose_version,
    configure_args,
    known_rocm,
    module_settings,
    pack_dir,
    plugin_data,
    site_recipe,
)


def configure_line(recipe: Recipe, facts: Facts, version: str, homes: Homes, dest: str, *,
                   tests: bool = False) -> str:
    """The exact configure command for ``version`` (build dirs as $SRC etc.): what golden tests pin."""
    data = plugin_data(recipe)
    full = site_recipe(recipe, version, configure_args(data, version, homes, tests=tests), tests=tests,
                       sha256="0" * 64)
    target = Target(full, version, facts, dest, os.path.dirname(dest), facts.python.executable)
    (command,) = [c for c in build_plan(target, symbolic(dest), has_configure=False) if c.phase == "configure"]
    return shlex.join(command.argv)


def module_spec(ctx: RunContext, recipe: Recipe, row: PluginRow, version: str, dest: str,
                values: Mapping[str, str]) -> ModuleSpec:
    """The plugin's module (name/version = <recipe>/<basename of dest>), with the site's FI_* and NCCL_*."""
    built = Built(recipe=recipe.name, version=version, dest=dest, description=recipe.description,
                  homepage=recipe.homepage, settings=module_settings(recipe, row), values=values, installed=True)
    return package_module(ctx, built)


class RcclNetPlugin(HookedInstall):
    """The RCCL libfabric network plugin for a ROCm release, with its module file."""

    action = "rccl-net-plugin"
    hooks_class = PluginHooks
    hooks: PluginHooks

    @dataclass(frozen=True)
    class Args(PluginArgs):
        version: str | None = field(default=None, metadata={"doc": "plugin version (default: the recipe's choice for the ROCm release)"})
        dest: str | None = field(default=None, metadata={"doc": "install prefix (default: {prefix}/aws-ofi-rccl/<version>-rocm-<rocm>)"})
        mirror: str | None = field(default=None, metadata={"doc": "controller directory with source tarballs (air-gapped sites)"})
        recipe: str = field(default="aws-ofi-rccl", metadata={"doc": "recipe name (sources/<recipe>.yml)"})

    def __init__(self, spec: Any, args: Any, ctx: RunContext) -> None:
        super().__init__(spec, args, ctx)
        self.rocm = self.hooks.rocm
        self.row = self.hooks.row
        self.spec = module_spec(self.ctx, self.recipe, self.row, self.version, self.target.dest,
                                self.target.values(install=self.target.dest))
        root = str(self.ctx.resolved.get("modules", {}).get("install_root") or f"{self.ctx.values['prefix']}/modules")
        self.module_path = f"{root}/{self.spec.relpath(self.ctx.facts.modules.format)}"
        self._packed: Path | None = None

    # -- Step ---------------------------------------------------------------------------------------
    def pending(self, host: Host) -> str | None:
        reason = super().pending(host)
        if reason:
            return reason
        current = host.read_text(self.module_path)
        if current is None:
            return f"module file {self.module_path} missing"
        return None if current == self.module_file() else f"module file {self.module_path} differs"

    def diff(self, host: Host) -> str | None:
        return unified_diff(host.read_text(self.module_path), self.module_file(), self.module_path)

    def apply(self, host: Host) -> None:
        self.prepare(host)
        if self._packed is not None or self.options.source:
            self.keep_source()
        super().apply(host)
        host.run(["mkdir", "-p", os.path.dirname(self.module_path)])
        host.write_text(self.module_path, self.module_file(), 0o644)

    # -- the site's part ---------------------------------------------------------------------------------
    def module_file(self) -> str:
        return render(self.spec, self.ctx.facts.modules.format)

    def source_sha(self, host: Host) -> str | None:
        """The sha256 of the source to build: the recipe's, else that of --source, else the installed one."""
        known = self.base_recipe.versions[self.version].sha256
        source = self.options.source
        if source:
            path = Path(source)
            if path.is_dir():
                self._packed = pack_dir(path, sources_mod.filename_of(self.base_recipe, self.version),
                                        Path(tempfile.mkdtemp(prefix="sitestack-source-")))
                self.options = dataclasses.replace(self.options, source=str(self._packed))
                path = self._packed
            elif not path.is_file():
                raise SitestackError(f"--source {source}: no such file or directory")
            return known or sources_mod.sha256_file(path)
        if known:
            return known
        stamp = read_stamp(host, self.target.dest) or {}
        installed: str | None = stamp.get("inputs", {}).get("build", {}).get("source", {}).get("sha256")
        if installed:
            return installed
        url = sources_mod.url_of(self.base_recipe, self.version)
        raise SitestackError(f"{self.base_recipe.path} has no sha256 for {self.target.label} ({url}): pass the tarball "
                             f"or a checkout with --source, or check it (`invoke checksum {url}`) and write its sha256 "
                             "into the recipe")

    def keep_source(self) -> None:
        """Keep the --source tarball in the controller's source cache under its sha256."""
        source = Path(self.options.source or "")
        sha = self.recipe.versions[self.version].sha256
        if not sha or sources_mod.sha256_file(source) != sha:
            return   # a mismatch is refused by fetch, with both sums
        cached = sources_mod.cache_dir() / sha / sources_mod.filename_of(self.base_recipe, self.version)
        if not cached.is_file():
            sources_mod._store(source, cached)


__all__ = ["RcclNetPlugin", "choose_version", "configure_line", "known_rocm", "module_spec", "plugin_data"]
