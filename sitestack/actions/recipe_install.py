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

A recipe with hooks (:data:`sitestack.packages.HOOKS`: Horovod, the RCCL network plugin) is
installed the same way; its hooks choose version, dest and build interpreter, probe the host for
the site's part of the recipe (build environment, configure options, checks), make what is missing
first (``setup``), and may ask for a module file written beside the install and for a source given
with ``--source`` (:mod:`sitestack.installs.given_source`). The step gives the package's own
arguments under ``package:``, checked against the hooks' ``Args`` when the playbook is loaded.

This module is the action only; the machinery is :mod:`sitestack.installs` (target, inputs,
toolchain, stamp and lock, installer) and the build systems are :data:`sitestack.builders.BUILDERS`.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

from sitestack.actions.action import Action, unified_diff
from sitestack.core import schema, versions
from sitestack.core.errors import InputError, SitestackError
from sitestack.core.host import Host
from sitestack.core.quoting import in_prefix_problem
from sitestack.installs import sources as sources_mod
from sitestack.installs.given_source import keep_source, source_file, source_sha256
from sitestack.installs.inputs import build_inputs, install_inputs
from sitestack.installs.installer import Installer
from sitestack.installs.modulefile_render import ModuleSpec, render
from sitestack.installs.modulefile_specs import package_module
from sitestack.installs.site_stack import stack_interpreter
from sitestack.installs.stamp import STAMP_FORMAT, install_lock, install_reason, lock_path
from sitestack.installs.target import Target
from sitestack.installs.toolchain import Toolchain, probe_toolchain, require_tools
from sitestack.installs.venv_stack import Built, module_root
from sitestack.model.context import RunContext
from sitestack.model.recipe import ModuleSettings, Recipe, load_recipe
from sitestack.packages import HOOKS, InstallInfo, NotReady, PackageHooks, hooks_for


# -- the action ----------------------------------------------------------------------------------
class RecipeInstall(Action):
    """A package built from its recipe in sources/ and installed atomically (stamped, locked, cached).

    A recipe with hooks (sitestack/packages: horovod, aws-ofi-rccl) gets its site-specific part from
    them: version, dest and build interpreter, the build environment and checks, a module file written
    beside the install; its own arguments are given under `package:` (listed below per recipe).
    """

    action = "recipe-install"
    installs_recipe = True  # sitestack.installs.site_stack finds the installs of a site by this
    #: Builds run beside each other: no recipe's build reads another's install (mpi4py and Horovod build
    #: against the site's MPI, Horovod against its own build environment's torch, the RCCL plugin against
    #: ROCm and libfabric); each has its own build dir, log, lock and cache entry.
    concurrent_by_default = True
    #: recipe name -> its hooks (the `package:` arguments each accepts are their ``Args``).
    hooks_table: ClassVar[Mapping[str, type[PackageHooks]]] = HOOKS

    @dataclass(frozen=True)
    class Args:
        recipe: str = field(metadata={"doc": "recipe name: sources/<recipe>.yml"})
        version: str | None = field(default=None, metadata={"doc": "version to build (default: the recipe's default_version, or its hooks' choice)"})
        dest: str | None = field(default=None, metadata={"doc": "install prefix of the package (default: {prefix}/<recipe>/<version>, or its hooks' choice)"})
        python: str | None = field(default=None, metadata={"doc": (
            "interpreter that builds Python packages (default: the stack env's bin/python where a stack-venv "
            "step installs the package into a conda env, else facts.python.executable; for Horovod, "
            "`invoke build-horovod --python` overrides)")})
        mirror: str | None = field(default=None, metadata={"doc": "controller directory with source tarballs (air-gapped sites)"})
        package: Mapping[str, Any] = field(default_factory=dict, metadata={"doc": (
            "the recipe's own arguments, where its hooks have some (below); the build tasks take them as options of the "
            "same name (`invoke build-rccl-plugin --rocm`)")})

        def check(self) -> str | None:
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", self.recipe):
                return f"recipe: {self.recipe!r} is not a recipe name"
            if self.dest is not None and in_prefix_problem(self.dest, "dest"):
                return in_prefix_problem(self.dest, "dest")
            if self.version is not None and versions.check_version(self.version):
                return f"version: {versions.check_version(self.version)}"
            return None

    @classmethod
    def independent(cls, args: Any) -> bool:
        """Independent unless it names its own ``python`` (that interpreter may be one another step makes;
        so may the stack env's, which a build for a conda stack uses: :meth:`__init__` says so)."""
        return args.python is None

    @classmethod
    def check_args(cls, raw: Any, file: str, line: int, key: str) -> Any:
        """The install's arguments, and ``package:`` against the recipe's hooks' ``Args``."""
        args = super().check_args(raw, file, line, key)
        package = (raw or {}).get("package") or {}
        where = getattr(raw, "lines", {}).get("package", line)
        own = hooks_for(args.recipe).Args
        if package and not dataclasses.fields(own):
            raise InputError(f"{file}:{where}", f"recipe {args.recipe} takes no package arguments (it has no hooks "
                             "with arguments in sitestack/packages)", key=f"{key}.package")
        schema.build(own, package, file, line=where, key=f"{key}.package")
        return args

    @classmethod
    def site_problem(cls, args: Any, facts: Any, options: Any = None) -> str | None:
        """The recipe's hooks decide (:meth:`PackageHooks.site_problem`): e.g. a network plugin built on
        the host for a stack that uses its container's own plugin."""
        return hooks_for(args.recipe).site_problem(facts, args.python or getattr(options, "python", None), args.package)

    def __init__(self, spec: Any, args: Any, ctx: RunContext) -> None:
        options = ctx.options
        sources_dir = options.sources_dir
        recipe = load_recipe(args.recipe, Path(sources_dir) if sources_dir else None)
        given = dict(options.recipe_sources).get(recipe.name)
        if given:   # provision --source NAME=PATH: this recipe's source, as build-recipe's --source
            options = dataclasses.replace(options, source=given)
            ctx = dataclasses.replace(ctx, options=options)
        own = schema.build(hooks_for(recipe.name).Args, dict(args.package), ctx.site.path, key="args.package")
        step = SimpleNamespace(**vars(own), version=args.version, dest=args.dest, python=args.python,
                               mirror=args.mirror)
        self.hooks = hooks_for(recipe.name)(ctx, recipe, step)
        chosen = {"version": args.version, "dest": args.dest, "python": args.python, **self.hooks.install_args()}
        ctx = self.hooks.ctx   # the hooks may adjust the facts (another ROCm release)
        super().__init__(spec, args, ctx)
        self.base_recipe = self.recipe = recipe
        self.version = self.recipe.select_version(chosen["version"], ctx.facts, f"site {ctx.site.name}")
        site_prefix = ctx.values["prefix"]
        dest = chosen["dest"] or f"{site_prefix}/{self.recipe.name}/{self.version}"
        #: the stack env's interpreter, where this build is for it (installs/site_stack.py:stack_interpreter)
        self.env_python = None if chosen["python"] else stack_interpreter(ctx, recipe.name)
        if self.env_python and spec.concurrent is None:
            self.concurrent = False  # it builds with (and for) the stack env another step makes: in order
        self.target = Target(self.recipe, self.version, ctx.facts, dest.rstrip("/"), site_prefix,
                             chosen["python"] or self.env_python or ctx.facts.python.executable)
        self.options = options
        self.report = ctx.note
        self._toolchain: Toolchain | None = None
        self._rebuilt = False  # --rebuild: done once this run
        self._prepared = False
        self._given: Path | None = None
        settings = self.hooks.module_file()
        self.module = None if settings is None else module_spec(ctx, self.recipe, settings, self.version, self.target.dest,
                                                                self.target.values(install=self.target.dest))

    # -- Step ----------------------------------------------------------------------------------
    def describe(self) -> str:
        return self.hooks.describe(self.info(None)) or f"build and install {self.target.label} into {self.target.dest}"

    def pending(self, host: Host) -> str | None:
        self.check_given_source()
        missing = self.missing_interpreter(host)
        if missing is not None:
            return missing
        try:
            self.prepare(host)
        except NotReady as exc:
            return str(exc)
        if host.read_only:
            reason = self.reason(host)
        else:
            with self._lock(host):
                reason = self.reason(host)
        return reason or self.module_reason(host)

    def diff(self, host: Host) -> str | None:
        if self.module is None:
            return None
        return unified_diff(host.read_text(self.module_path()), self.module_text(), self.module_path())

    def apply(self, host: Host) -> None:
        missing = self.missing_interpreter(host)
        if missing is not None:
            raise SitestackError(f"{self.target.label}: {missing}: run that step first")
        try:
            self.prepare(host)
        except NotReady:
            self.hooks.setup(host, self.info(host))
            self.prepare(host)
        if self._given is not None:
            keep_source(self.base_recipe, self.version, self._given, self.recipe.versions[self.version].sha256)
        self.hooks.before_install(host)
        with self._lock(host):
            if self.reason(host) is not None:  # else a concurrent run installed it while we waited
                Installer(host, self.target, inputs=self.inputs(host), toolchain=self.toolchain(host),
                          options=self.options, log_dir=self.ctx.log_dir, report=self.report,
                          mirror=self.args.mirror).run()
                self._rebuilt = True
        if self.module is not None:
            host.run(["mkdir", "-p", os.path.dirname(self.module_path())])
            host.write_text(self.module_path(), self.module_text(), 0o644)

    # -- the hooks' part -------------------------------------------------------------------------
    def info(self, host: Host | None) -> InstallInfo:
        """What the hooks are told about this install (``host`` None: no cache root yet)."""
        t = self.target
        cache = self.options.build_cache or (f"{host.home()}/.cache/sitestack/builds" if host else "")
        return InstallInfo(label=t.label, version=self.version, dest=t.dest, python=t.python, cache_root=cache,
                           source_sha256=(lambda: self.source_sha(host)) if host else (lambda: None))

    def source_sha(self, host: Host) -> str | None:
        """The sha256 of the source to build: the recipe's (hooks with ``given_source``: see
        :mod:`sitestack.installs.given_source`)."""
        if not self.hooks.given_source:
            return self.base_recipe.versions[self.version].sha256
        if self.options.source and self._given is None:
            self._given = source_file(self.base_recipe, self.version, self.options.source)
            self.options = dataclasses.replace(self.options, source=str(self._given))
        mirrors = [Path(m) for m in (self.options.mirror, self.args.mirror) if m] + sources_mod.env_mirrors()
        return source_sha256(host, self.base_recipe, self.version, self.target.label, self.target.dest, self._given,
                             mirrors)

    def prepare(self, host: Host) -> None:
        """The recipe (and build interpreter) with the site's part, from the hooks; once per step."""
        if self._prepared:
            return
        prepared = self.hooks.prepare(host, self.info(host))
        self.recipe = prepared.recipe
        self.target = dataclasses.replace(self.target, recipe=prepared.recipe,
                                          python=prepared.python or self.target.python)
        self._prepared = True

    def missing_interpreter(self, host: Host) -> str | None:
        """Why the build cannot be planned yet: the stack env it is built with is not made (None: it is,
        or the build does not use it). The playbook's stack-venv step, before this one, makes it."""
        python = self.env_python
        if python is None or host.exists(python):
            return None
        return f"the stack environment's interpreter {python}, which builds it, is not there yet (made by the stack-venv step)"

    def check_given_source(self) -> None:
        """A --source for a recipe version with a sha256 must have that sum, even where nothing is built
        (the install is current, or its wheel is in the build cache): a wrong file is never passed over."""
        known = self.base_recipe.versions[self.version].sha256
        if self.options.source and known and not self.hooks.given_source:
            given = Path(self.options.source)
            if not given.is_file():
                raise SitestackError(f"--source {given}: {self.target.label} has a sha256 in {self.base_recipe.path}, "
                                     "so its source must be that tarball, not a directory")
            sources_mod.verify(given, known, f"{given} ({self.target.label}, from --source)")

    def rendered(self, earlier: Mapping[str, str]) -> dict[str, tuple[str, int]]:
        """The module file the recipe's hooks ask for (the build itself happens on the site)."""
        return {} if self.module is None else {self.module_path(): (self.module_text(), 0o644)}

    def module_path(self) -> str:
        assert self.module is not None
        # facts.modules.install_root filled in: its default "{prefix}/modules" is not a path yet (unfilled,
        # the plugin's module file went to a relative "{prefix}/modules" under the current directory)
        return f"{module_root(self.ctx)}/{self.module.relpath(self.ctx.facts.modules.format)}"

    def module_text(self) -> str:
        assert self.module is not None
        return render(self.module, self.ctx.facts.modules.format)

    def module_reason(self, host: Host) -> str | None:
        """Why the module file the hooks ask for must be written (None: it is there as it should be)."""
        if self.module is None:
            return None
        current = host.read_text(self.module_path())
        if current is None:
            return f"module file {self.module_path()} missing"
        return None if current == self.module_text() else f"module file {self.module_path()} differs"

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
        """Why the install is needed (None: it is done). Read-only. ``--rebuild NAME`` makes a done
        install needed once per run (EasyBuild's --rebuild): after its apply the stamp is new."""
        reason = install_reason(host, self.target.dest, self.inputs(host), self.recipe.sanity)
        if reason is None and self.recipe.name in self.options.rebuild and not self._rebuilt:
            return f"--rebuild {self.recipe.name}: build again from source"
        return reason


def module_spec(ctx: RunContext, recipe: Recipe, settings: ModuleSettings, version: str, dest: str,
                values: Mapping[str, str]) -> ModuleSpec:
    """The module file of an install whose hooks ask for one (name/version = <recipe>/<basename of dest>)."""
    built = Built(recipe=recipe.name, version=version, dest=dest, description=recipe.description,
                  homepage=recipe.homepage, settings=settings, values=values, installed=True)
    return package_module(ctx, built)


__all__ = ["RecipeInstall", "module_spec"]
