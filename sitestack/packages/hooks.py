"""The per-package part of a recipe install (like Spack's package.py).

A recipe in ``sources/`` says how a package is built; a recipe whose build depends on the site
beyond placeholders (which GPU operations, which torch, which ROCm release) also has hooks: a
:class:`PackageHooks` subclass listed in :data:`sitestack.packages.HOOKS` under the recipe's
name. A generic install asks the hooks, in this order:

1. ``Args``: the step arguments the package adds (a dataclass; its own fields only);
2. ``install_args()``: version, dest and python for the install, where the package chooses them
   (``ctx``, the hooks' run context, may carry adjusted facts, e.g. another ROCm release);
3. ``describe(info)``: the step's line;
4. ``prepare(host, info)``: probe the host read-only and return the recipe with the site's part
   (build environment, configure options, checks). :class:`NotReady` means something must be made
   first; its text is the pending reason;
5. ``setup(host, info)``: make that (only in apply), then ``prepare`` is asked again;
6. ``before_install(host)``: host-side preparations just before building (links);
7. ``module_file()``: data for a module file the install step writes beside the install (the
   generic install renders and writes it; None: none).

And two class-level rules:

- ``Args`` is given in the step under ``package:`` (checked when the playbook is loaded);
- ``given_source``: the source may be given with ``--source`` as a tarball or a checkout directory
  (packed reproducibly); its sha256 stands where the recipe has none, the tarball is kept in the
  source cache, and later runs take the sum recorded by the install.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from sitestack.core.host import Host
from sitestack.model.context import RunContext
from sitestack.model.recipe import ModuleSettings, Recipe
from sitestack.model.site import Facts


class NotReady(Exception):
    """``prepare`` cannot finish before ``setup`` made something; the text says what (pending's reason)."""


@dataclass(frozen=True)
class InstallInfo:
    """What the generic install tells the hooks about the install being planned."""

    label: str              # "<recipe> <version>"
    version: str
    dest: str
    python: str             # the build interpreter as the install has it now
    cache_root: str         # the host's build cache (build environments and links go beside it)
    #: the source's sha256 where the install knows it (called only when needed: finding it may
    #: refuse, e.g. a recipe without a sum and no --source)
    source_sha256: Callable[[], str | None] = lambda: None


@dataclass(frozen=True)
class Prepared:
    """The recipe with the site's part, and another build interpreter where the package needs one."""

    recipe: Recipe
    python: str | None = None


@dataclass(frozen=True)
class NoArgs:
    """A package without step arguments of its own."""


class PackageHooks:
    """Default hooks: the recipe as it is (a recipe without hooks behaves like this)."""

    #: The package's own step arguments (given under ``package:``).
    Args: ClassVar[type[Any]] = NoArgs
    #: Whether ``--source`` may stand for a source the recipe has no sha256 for (see the module).
    given_source: ClassVar[bool] = False

    def __init__(self, ctx: RunContext, recipe: Recipe, args: Any) -> None:
        """``args``: the fields of ``Args`` and the install's own (version, dest, python, mirror)."""
        self.ctx = ctx
        self.recipe = recipe
        self.args = args

    @classmethod
    def site_problem(cls, facts: Facts, python: str | None, package: Mapping[str, Any] | None = None) -> str | None:
        """Why building this package on the host contradicts the site's facts (None: it does not).
        Asked when the playbook is loaded and before a build task connects, so a step the site
        could never use is refused by name before anything is built. ``python``: the interpreter the
        step (or the run's --python) names, if any; ``package``: the step's ``package:`` arguments."""
        return None

    def install_args(self) -> Mapping[str, str | None]:
        """Overrides of the install's version / dest / python (absent keys: the step's own)."""
        return {}

    def describe(self, info: InstallInfo) -> str | None:
        """The step's line (None: the generic one)."""
        return None

    def prepare(self, host: Host, info: InstallInfo) -> Prepared:
        """The recipe with the site's part (read-only probes only); raises :class:`NotReady`."""
        return Prepared(self.recipe)

    def setup(self, host: Host, info: InstallInfo) -> None:
        """Make what ``prepare`` reported missing (apply only)."""

    def before_install(self, host: Host) -> None:
        """Host-side preparations before the install runs (apply only, after ``prepare``)."""

    def module_file(self) -> ModuleSettings | None:
        """Settings of a module file the install step writes for the install (None: none)."""
        return None
