"""A module file from its :class:`ModuleSpec`: Lua for Lmod, Tcl for Environment Modules.

``<package>.<fmt>.j2`` renders a spec when that template exists, else ``base.<fmt>.j2``; the
templates live in the checkout's ``modulefiles/`` (a step may put a directory of site overrides
first). No timestamps, strict Jinja: an unchanged spec gives byte-identical text.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sitestack.core import templates
from sitestack.core.errors import InputError, SitestackError
from sitestack.core.paths import MODULEFILE_DIR as TEMPLATE_DIR
from sitestack.installs.modulefile_text import Text, comment, lua, lua_long, message_problem, tcl, tcl_text

if TYPE_CHECKING:
    import jinja2

EXTENSIONS = {"lua": ".lua", "tcl": ""}

_VAR = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MODULE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*(/[A-Za-z0-9][A-Za-z0-9._+-]*)+")


@dataclass(frozen=True)
class PathOp:
    op: str      # prepend | append
    var: str
    value: Text
    sep: str = ":"


@dataclass(frozen=True)
class ModuleSpec:
    """Everything one module file says; rendered by :func:`render`."""

    name: str                      # e.g. pytorch (the part before the version)
    version: str                   # e.g. 2.3.1-gpu
    template: str                  # template key: stack, mpi4py, horovod, net-plugin, or base
    site: str
    summary: str
    whatis: tuple[tuple[str, str], ...]
    requires: tuple[str, ...] = ()
    #: directories added to MODULEPATH before ``requires`` are loaded (the site's ``module use``)
    modulepath: tuple[str, ...] = ()
    autoload: bool = True
    family: str | None = None
    conflicts: tuple[str, ...] = ()
    paths: tuple[PathOp, ...] = ()
    env: tuple[tuple[str, Text], ...] = ()
    #: settings that are only defaults (facts.env_defaults): set where the environment has no value (or an
    #: empty one), kept where it has one (the user's choice); unloading unsets only what the module set
    defaults: tuple[tuple[str, Text], ...] = ()
    #: settings ``invoke tune`` chose by measurement (name, value, evidence), set as ``defaults`` are, each
    #: under a comment line that cites its evidence (sitestack/installs/tuned.py, docs/tuning.md)
    tuned: tuple[tuple[str, Text, str], ...] = ()
    help: str = ""
    #: the Python packages it provides (name, version), declared with Lmod's ``extensions()`` so that
    #: ``module spider mpi4py`` names this module, as EasyBuild 5 writes them by default
    #: (https://lmod.readthedocs.io/en/latest/330_extensions.html; Lmod 8.2.8 and later, Lua files only)
    extensions: tuple[tuple[str, str], ...] = ()
    data: Mapping[str, Any] = field(default_factory=dict)
    #: (variable, link): the module resolves the link (a stack's stable path) to its generation once, when
    #: loaded, keeps it in the variable while loaded, and its paths say :func:`~sitestack.installs.
    #: modulefile_text.in_generation` for what lies in it (docs/operating.md)
    generation: tuple[str, str] | None = None
    #: a notice printed on every ``module load`` (the modulefiles step's ``deprecated``); None: none
    deprecated: str | None = None

    @property
    def full(self) -> str:
        return f"{self.name}/{self.version}"

    def relpath(self, fmt: str) -> str:
        return f"{self.name}/{self.version}{EXTENSIONS[fmt]}"

    def check(self) -> None:
        if not _MODULE.fullmatch(self.full):
            raise InputError(self.full, "a module name is name/version: letters, digits, . _ + -")
        for name in (*[p.var for p in self.paths], *[n for n, _ in (*self.env, *self.defaults)],
                     *[n for n, _, _ in self.tuned]):
            if not _VAR.fullmatch(name):
                raise InputError(self.full, f"{name!r} is not an environment variable name")
        if self.generation is not None and not _VAR.fullmatch(self.generation[0]):
            raise InputError(self.full, f"{self.generation[0]!r} is not an environment variable name")
        if self.family is not None and not _VAR.fullmatch(self.family):
            raise InputError(self.full, f"family {self.family!r}: Lmod exports LMOD_FAMILY_<NAME>, so a family is "
                             "letters, digits and _ (family_name() makes one from a module name)")
        for name in self.requires:
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+/-]*", name):
                raise InputError(self.full, f"{name!r} is not a module name")
        problem = message_problem(self.deprecated) if self.deprecated is not None else None
        if problem:
            raise InputError(self.full, f"deprecated: {problem}")
        for name, _, why in self.tuned:
            if message_problem(why):
                raise InputError(self.full, f"the evidence of the tuned {name}: {message_problem(why)}")


def family_name(module: str) -> str:
    """The Lmod family of modules named ``module``: Lmod exports ``LMOD_FAMILY_<FAMILY>`` (upper case)
    into the user's shell, so the family must be a variable name: ``aws-ofi-rccl`` is ``aws_ofi_rccl``
    (with a ``-``, every later ``module`` command printed "not a valid identifier" errors in bash)."""
    return re.sub(r"[^A-Za-z0-9_]", "_", module)


def environment(template_dirs: Sequence[str | Path] = ()) -> jinja2.Environment:
    """The Jinja2 environment: ``template_dirs`` first, then ``modulefiles/``; strict, no autoescape."""
    return _environment(tuple(str(d) for d in template_dirs))


@functools.lru_cache(maxsize=16)
def _environment(template_dirs: tuple[str, ...]) -> jinja2.Environment:
    return templates.environment([*template_dirs, TEMPLATE_DIR],
                                 {"lua": lua, "lua_long": lua_long, "tcl": tcl, "tcl_text": tcl_text,
                                  "comment": comment})


def template_name(spec: ModuleSpec, fmt: str, template_dirs: Sequence[str | Path] = ()) -> str:
    """``<template>.<fmt>.j2`` where one of the template directories has it, else ``base.<fmt>.j2``."""
    name = f"{spec.template}.{fmt}.j2"
    if any(os.path.isfile(os.path.join(d, name)) for d in (*template_dirs, TEMPLATE_DIR)):
        return name
    return f"base.{fmt}.j2"


def render(spec: ModuleSpec, fmt: str, template_dirs: Sequence[str | Path] = ()) -> str:
    """The module file ``spec`` in ``fmt`` (lua or tcl); the text of an earlier identical render
    while the templates and the code are unchanged (:func:`sitestack.core.templates.cached_text`)."""
    if fmt not in EXTENSIONS:
        raise InputError("facts.modules.format", f"must be lua or tcl, not {fmt!r}")
    spec.check()
    return templates.cached_text([*template_dirs, TEMPLATE_DIR], repr(("module file", spec, fmt)),
                                 lambda: _render(spec, fmt, template_dirs))


def _render(spec: ModuleSpec, fmt: str, template_dirs: Sequence[str | Path]) -> str:
    import jinja2

    env = environment(template_dirs)
    name = template_name(spec, fmt, template_dirs)
    view = _View(spec, name)
    try:
        text = env.get_template(name).render(m=view, d=spec.data)
    except jinja2.TemplateError as exc:
        raise SitestackError(f"module file template {name}: {exc}") from None
    return re.sub(r"\n{3,}", "\n\n", text).rstrip("\n") + "\n"


class _View:
    """What a template sees as ``m``: the spec, plus the template's file name."""

    def __init__(self, spec: ModuleSpec, template_file: str) -> None:
        self._spec = spec
        self.template_file = template_file

    def __getattr__(self, name: str) -> Any:
        return getattr(self._spec, name)


def render_all(specs: Sequence[ModuleSpec], fmt: str, template_dirs: Sequence[str | Path] = ()) -> dict[str, str]:
    """relative path -> text of every module file."""
    return {spec.relpath(fmt): render(spec, fmt, template_dirs) for spec in specs}
