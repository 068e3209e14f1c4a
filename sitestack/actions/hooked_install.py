"""A recipe install that asks its package's hooks (:mod:`sitestack.packages`) for the site's part.

:class:`HookedInstall` is what :class:`~sitestack.actions.recipe_install.RecipeInstall` does for a
recipe with hooks: the hooks choose version/dest/python, describe the step, ``prepare`` the recipe
from read-only probes (``NotReady`` -> the pending reason), ``setup`` what was missing and make
their links before the install. The ``horovod-install`` and ``rccl-net-plugin`` actions are this
with their own argument lists.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, ClassVar

from sitestack.actions.recipe_install import RecipeInstall
from sitestack.core.host import Host
from sitestack.model.context import RunContext
from sitestack.model.recipe import load_recipe
from sitestack.packages import InstallInfo, NotReady, PackageHooks, hooks_for


class HookedInstall(RecipeInstall):
    """A recipe install whose site-specific part comes from the recipe's hooks."""

    #: The hooks class (None: ``HOOKS[recipe name]``).
    hooks_class: ClassVar[type[PackageHooks] | None] = None

    def __init__(self, spec: Any, args: Any, ctx: RunContext) -> None:
        sources_dir = ctx.options.sources_dir
        recipe = load_recipe(args.recipe, Path(sources_dir) if sources_dir else None)
        hooks = (self.hooks_class or hooks_for(recipe.name))(ctx, recipe, args)
        chosen = {"version": getattr(args, "version", None), "dest": getattr(args, "dest", None),
                  "python": getattr(args, "python", None), **hooks.install_args()}
        base = RecipeInstall.Args(recipe=args.recipe, mirror=getattr(args, "mirror", None), **chosen)
        super().__init__(spec, base, hooks.ctx)
        self.step_args = args
        self.hooks = hooks
        self.base_recipe = self.recipe
        self._prepared = False

    def describe(self) -> str:
        return self.hooks.describe(self.info(None)) or super().describe()

    def info(self, host: Host | None) -> InstallInfo:
        """What the hooks are told about this install (``host`` None: no cache root yet)."""
        t = self.target
        cache = self.options.build_cache or (f"{host.home()}/.cache/sitestack/builds" if host else "")
        return InstallInfo(label=t.label, version=self.version, dest=t.dest, python=t.python, cache_root=cache,
                           source_sha256=(lambda: self.source_sha(host)) if host else (lambda: None))

    def source_sha(self, host: Host) -> str | None:
        """The sha256 of the source to build (the recipe's; an action may know it otherwise)."""
        return self.base_recipe.versions[self.version].sha256

    def prepare(self, host: Host) -> None:
        """The recipe (and build interpreter) with the site's part, from the hooks; once per step."""
        if self._prepared:
            return
        prepared = self.hooks.prepare(host, self.info(host))
        self.recipe = prepared.recipe
        self.target = dataclasses.replace(self.target, recipe=prepared.recipe,
                                          python=prepared.python or self.target.python)
        self._prepared = True

    # -- Step --------------------------------------------------------------------------------------
    def pending(self, host: Host) -> str | None:
        try:
            self.prepare(host)
        except NotReady as exc:
            return str(exc)
        return super().pending(host)

    def apply(self, host: Host) -> None:
        try:
            self.prepare(host)
        except NotReady:
            self.hooks.setup(host, self.info(host))
            self.prepare(host)
        self.hooks.before_install(host)
        super().apply(host)
