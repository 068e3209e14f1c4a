"""Module files: Lua for Lmod, Tcl for Environment Modules (Lmod reads both), rendered from the
Jinja2 templates in ``modulefiles/``.

Every module file is a :class:`ModuleSpec` (data: name, whatis, help, the site modules it
needs, family/conflicts, path edits, settings) rendered by ``<package>.<fmt>.j2`` when that
template exists, else ``base.<fmt>.j2``. The per-package templates extend the base one and
override one block (``help``, whose text is ``<package>.help.j2``). Templates are rendered with
``StrictUndefined`` and contain no timestamps, so an unchanged input gives byte-identical
output and compare-before-write works.

``modulefiles`` (``invoke install-modulefiles``) installs, under ``facts.modules.install_root``
and in ``facts.modules.format``:

- the stack's module (``pytorch/2.3.1-gpu``): PATH and PYTHONPATH of the stack environment
  (inside the container for container sites: SIF, the bind path, the container's PATH and
  PYTHONPATH), the site's settings (``facts.env``), the site modules it needs (loaded with it
  with ``autoload``), one ``pytorch`` at a time;
- one module per package sitestack built for the site (mpi4py, Horovod), from the ``module``
  settings of its recipe. The network plugin's module is written by the plugin's build step (it
  knows NCCL_NET_PLUGIN); the stack's module loads it. ``net-plugin.<fmt>.j2`` renders it from
  the recipe too (:func:`site_modules` with ``plugins=True``).

Values keep what must be decided when the module is loaded, not when it is written: ``{user}``
and ``{home}`` in a fact become the loading user's ``$USER``/``$HOME``, and ``$VAR``/``${VAR}``
are read from the environment at load time.

Files are written atomically (temp file + rename) with mode 0644 in directories of mode 0755
(a+rX, no group or world write). Module files a previous run installed for the stack that are
no longer wanted are removed (a record in ``<install_root>/.sitestack/``).
"""

from __future__ import annotations

import functools
import json
import os
import re
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2

from sitestack.actions.base import Action, unified_diff
from sitestack.actions.stack_venv import (
    DEFAULT_RECIPES,
    Built,
    Stack,
    find_built,
    module_root,
    recipe_targets,
    require_module_system,
    stack_for,
)
from sitestack.core.errors import InputError, SitestackError
from sitestack.core.host import Host
from sitestack.core.paths import MODULEFILE_DIR as TEMPLATE_DIR
from sitestack.model.context import RunContext
from sitestack.model.site import Facts, Site, StepSpec

EXTENSIONS = {"lua": ".lua", "tcl": ""}
#: Placeholders that must be the loading user's, not the installing user's.
RUNTIME = {"user": "USER", "home": "HOME"}
FILE_MODE = 0o644
DIR_MODE = 0o755

_VAR = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ENV_REF = re.compile(r"\$(?:\x00([A-Za-z_][A-Za-z0-9_]*)\x00|([A-Za-z_][A-Za-z0-9_]*))")
_MODULE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*(/[A-Za-z0-9][A-Za-z0-9._+-]*)+")


# -- values ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Text:
    """A value in a module file: literal parts and environment variables read at load time."""

    parts: tuple[tuple[str, str], ...]  # ("lit", text) or ("env", NAME)

    def __str__(self) -> str:
        return "".join(t if k == "lit" else f"${{{t}}}" for k, t in self.parts)


def literal(text: str) -> Text:
    return Text((("lit", text),))


def _env_refs(text: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    for match in _ENV_REF.finditer(text):
        if match.start() > pos:
            out.append(("lit", text[pos:match.start()]))
        out.append(("env", match.group(1) or match.group(2)))
        pos = match.end()
    if pos < len(text):
        out.append(("lit", text[pos:]))
    return out


def text_of(raw: str, values: Mapping[str, str]) -> Text:
    """A fact string as a module value: ``{user}``/``{home}`` and ``$VAR`` are read at load time,
    other placeholders are filled from ``values``."""
    parts: list[tuple[str, str]] = []
    raw = re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", "$\x00\\1\x00", raw)  # ${VAR} is not a placeholder
    for lit, name, _spec, _conv in string.Formatter().parse(raw):
        if lit:
            parts += _env_refs(lit)
        if name is None:
            continue
        if name in RUNTIME:
            parts.append(("env", RUNTIME[name]))
        elif name in values:
            parts += _env_refs(values[name])
        else:
            parts.append(("lit", "{" + name + "}"))
    merged: list[tuple[str, str]] = []
    for kind, text in parts:
        if merged and kind == "lit" and merged[-1][0] == "lit":
            merged[-1] = ("lit", merged[-1][1] + text)
        elif text or kind == "env":
            merged.append((kind, text))
    return Text(tuple(merged) or (("lit", ""),))


# -- quoting for each language ------------------------------------------------------------------------
def _lua_string(text: str) -> str:
    out = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    return '"' + re.sub(r"[\x00-\x08\x0b\x0c\x0e-\x1f]", lambda m: f"\\{ord(m.group()):03d}", out) + '"'


def lua(value: Any) -> str:
    """A Lua expression for a string or :class:`Text`."""
    if not isinstance(value, Text):
        return _lua_string(str(value))
    pieces = [_lua_string(t) if k == "lit" else f'(os.getenv({_lua_string(t)}) or "")' for k, t in value.parts]
    return " .. ".join(pieces) if pieces else '""'


def lua_long(text: str) -> str:
    """A Lua long string holding ``text`` verbatim."""
    level = 0
    while f"]{'=' * level}]" in text:
        level += 1
    eq = "=" * level
    return f"[{eq}[\n{text.rstrip()}\n]{eq}]"


def _tcl_escape(text: str) -> str:
    return re.sub(r'([\\"$\[\]{}])', r"\\\1", text).replace("\n", "\\n").replace("\r", "\\r")


def tcl_text(text: str) -> str:
    """A double-quoted Tcl word for text that may span lines (help)."""
    return '"' + re.sub(r'([\\"$\[\]{}])', r"\\\1", text.rstrip()) + '"'


def tcl(value: Any) -> str:
    """A double-quoted Tcl word for a string or :class:`Text`."""
    if not isinstance(value, Text):
        return '"' + _tcl_escape(str(value)) + '"'
    return '"' + "".join(_tcl_escape(t) if k == "lit" else f"$::env({t})" for k, t in value.parts) + '"'


# -- what a module file holds ------------------------------------------------------------------------
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
    autoload: bool = True
    family: str | None = None
    conflicts: tuple[str, ...] = ()
    paths: tuple[PathOp, ...] = ()
    env: tuple[tuple[str, Text], ...] = ()
    help: str = ""
    data: Mapping[str, Any] = field(default_factory=dict)

    @property
    def full(self) -> str:
        return f"{self.name}/{self.version}"

    def relpath(self, fmt: str) -> str:
        return f"{self.name}/{self.version}{EXTENSIONS[fmt]}"

    def check(self) -> None:
        if not _MODULE.fullmatch(self.full):
            raise InputError(self.full, "a module name is name/version: letters, digits, . _ + -")
        for name in (*[p.var for p in self.paths], *[n for n, _ in self.env]):
            if not _VAR.fullmatch(name):
                raise InputError(self.full, f"{name!r} is not an environment variable name")
        for name in self.requires:
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+/-]*", name):
                raise InputError(self.full, f"{name!r} is not a module name")


def environment(template_dirs: Sequence[str | Path] = ()) -> jinja2.Environment:
    """The Jinja2 environment: ``template_dirs`` first, then ``modulefiles/``; strict, no autoescape."""
    return _environment(tuple(str(d) for d in template_dirs))


@functools.lru_cache(maxsize=16)
def _environment(template_dirs: tuple[str, ...]) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader([str(d) for d in (*template_dirs, TEMPLATE_DIR)]),
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True,
        autoescape=False)
    env.filters.update(lua=lua, lua_long=lua_long, tcl=tcl, tcl_text=tcl_text)
    return env


def template_name(spec: ModuleSpec, fmt: str, env: jinja2.Environment) -> str:
    name = f"{spec.template}.{fmt}.j2"
    try:
        env.get_template(name)
        return name
    except jinja2.TemplateNotFound:
        return f"base.{fmt}.j2"


def render(spec: ModuleSpec, fmt: str, template_dirs: Sequence[str | Path] = ()) -> str:
    """The module file ``spec`` in ``fmt`` (lua or tcl)."""
    if fmt not in EXTENSIONS:
        raise InputError("facts.modules.format", f"must be lua or tcl, not {fmt!r}")
    spec.check()
    env = environment(template_dirs)
    name = template_name(spec, fmt, env)
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


# -- the specs of a site ------------------------------------------------------------------------------
def default_requires(facts: Facts) -> tuple[str, ...]:
    """The site modules the stack's module needs by default: the base Python's module."""
    if facts.python.source in ("module", "conda") and facts.python.module:
        return (facts.python.module,)
    return ()


def site_env(site: Site, values: Mapping[str, str]) -> list[tuple[str, Text]]:
    raw = site.raw_facts.get("env") or {}
    return [(name, text_of(str(value), values)) for name, value in sorted(raw.items())]


def is_plugin(b: Built, facts: Facts) -> bool:
    return b.recipe == facts.network.net_plugin or b.recipe.startswith(("aws-ofi-", "rccl-net", "nccl-net"))


def stack_module(ctx: RunContext, stack: Stack, built: Sequence[Built], *, requires: Sequence[str] | None = None,
                 autoload: bool = True) -> ModuleSpec:
    facts = ctx.facts
    name, version = stack.name.rsplit("/", 1)
    plugins = [b.module_name for b in built if is_plugin(b, facts)]
    needs = tuple(dict.fromkeys([*(default_requires(facts) if requires is None else requires), *plugins]))
    container = facts.container if stack.source == "container" else None
    paths: list[PathOp] = []
    env: list[tuple[str, Text]] = []
    if container is not None:
        runtime = container.runtime.upper()
        if container.image:
            env.append(("SIF", text_of(container.image, ctx.values)))
        for bind in dict.fromkeys([ctx.values["prefix"].rstrip("/"), *container.bind]):
            paths.append(PathOp("append", f"{runtime}_BINDPATH", text_of(bind, ctx.values), ","))
        paths.append(PathOp("prepend", f"{runtime}ENV_PREPEND_PATH", literal(stack.bin)))
        paths.append(PathOp("prepend", f"{runtime}ENV_PYTHONPATH", literal(stack.site_packages)))
    else:
        paths.append(PathOp("prepend", "PATH", literal(stack.bin)))
        paths.append(PathOp("prepend", "PYTHONPATH", literal(stack.site_packages)))
    env += site_env(ctx.site, ctx.values)
    torch = facts.torch
    summary = f"PyTorch {torch.version} ({torch.variant}) stack for {ctx.site.name}"
    built_lines = [f"{b.recipe} {b.version} ({b.dest})" for b in built if not is_plugin(b, facts)]
    built_lines += [f"{b.recipe} {b.version} (module {b.module_name})" for b in built if is_plugin(b, facts)]
    own = [b.recipe for b in built if not is_plugin(b, facts)]
    description = f"{summary}: {', '.join(['torch', *sorted(torch.packages)])}" + (
        f"; built for the site: {', '.join(own)}" if own else "")
    data = {
        "site_description": facts.description,
        "path": stack.path,
        "python": stack.python_version,
        "torch_version": torch.version,
        "variant": torch.variant,
        "index_url": stack.index_url,
        "requirements": list(stack.requirements),
        "extras": list(stack.extras),
        "built": built_lines,
        "manifest": stack.manifest,
        "container": ({"runtime": container.runtime, "image": container.image} if container else None),
    }
    return ModuleSpec(
        name=name, version=version, template="stack", site=ctx.site.name, summary=summary,
        whatis=(("Name", name), ("Version", version), ("Category", "machine learning"),
                ("Description", description), ("URL", "https://pytorch.org")),
        requires=needs, autoload=autoload, family=stack.family, paths=tuple(paths), env=tuple(env), data=data)


def package_module(ctx: RunContext, b: Built, *, autoload: bool = True) -> ModuleSpec:
    """The module of a package sitestack built (from its recipe's module settings)."""
    from sitestack.model.recipe import expand

    facts = ctx.facts
    settings = b.settings
    name, version = b.module_name.rsplit("/", 1)
    summary = (getattr(settings, "whatis", None) or b.description).strip().rstrip(".")
    values = dict(b.values)
    paths = []
    for var, dirs in sorted((getattr(settings, "prepend", None) or {}).items()):
        for d in dirs:
            paths.append(PathOp("prepend", var, text_of(expand(d, values).replace("{", "{{").replace("}", "}}"),
                                                        ctx.values)))
    env: dict[str, Text] = {}
    plugin = is_plugin(b, facts)
    if plugin:  # the site's network settings go with the plugin
        for var, value in site_env(ctx.site, ctx.values):
            if var.startswith(("NCCL_", "FI_")):
                env[var] = value
    for var, value in sorted((getattr(settings, "set", None) or {}).items()):
        env[var] = text_of(expand(value, values).replace("{", "{{").replace("}", "}}"), ctx.values)
    requires = tuple(facts.modules.load) if getattr(settings, "site_modules", True) else ()
    template = "net-plugin" if plugin else b.recipe
    launcher = {"srun": "srun -n 2", "mpirun": "mpirun -np 2"}.get(facts.mpi.launcher, "mpiexec -n 2")
    data = {"version": b.version, "dest": b.dest, "recipe": b.recipe, "mpi": facts.mpi.flavour,
            "launcher": launcher, "collectives": facts.collectives}
    return ModuleSpec(
        name=name, version=version, template=template, site=ctx.site.name, summary=summary,
        whatis=(("Name", name), ("Version", version), ("Description", summary), ("URL", b.homepage)),
        requires=requires, autoload=autoload, family=name, paths=tuple(paths), env=tuple(sorted(env.items())),
        help=summary, data=data)


def site_modules(ctx: RunContext, stack: Stack, built: Sequence[Built], *, requires: Sequence[str] | None = None,
                 autoload: bool = True, plugins: bool = True) -> list[ModuleSpec]:
    """The stack's module and one per built package (``plugins=False``: not the network plugin's,
    which the plugin's build step writes itself; the stack's module still loads it)."""
    return [stack_module(ctx, stack, built, requires=requires, autoload=autoload),
            *(package_module(ctx, b, autoload=autoload) for b in built if plugins or not is_plugin(b, ctx.facts))]


def render_all(specs: Sequence[ModuleSpec], fmt: str, template_dirs: Sequence[str | Path] = ()) -> dict[str, str]:
    """relative path -> text of every module file."""
    return {spec.relpath(fmt): render(spec, fmt, template_dirs) for spec in specs}



# -- the step ---------------------------------------------------------------------------------------------
def plugin_recipes(facts: Facts) -> tuple[str, ...]:
    return (facts.network.net_plugin,) if facts.network.net_plugin else ()


class ModuleFiles(Action):
    """Module files for the stack and each package sitestack built for the site, in the site's format
    (facts.modules.format), installed atomically under facts.modules.install_root (files 0644, dirs 0755)."""

    action = "modulefiles"

    @dataclass(frozen=True)
    class Args:
        name: str | None = field(default=None, metadata={"doc": "the stack's name, as the stack-venv step has it"})
        requires: tuple[str, ...] | None = field(default=None, metadata={
            "doc": "site modules the stack's module needs (default: the base Python's module, if any)"})
        autoload: bool = field(default=True, metadata={
            "doc": "load the site modules with the module (depends_on); false: require them loaded (prereq)"})
        recipes: tuple[str, ...] = field(default=DEFAULT_RECIPES, metadata={
            "doc": "recipes that get a module file when built (the site's network plugin is added)"})
        templates: str | None = field(default=None, metadata={
            "doc": "a controller directory of templates searched before modulefiles/ (site overrides)"})

        def check(self) -> str | None:
            if self.templates is not None and not self.templates.startswith("/"):
                return f"templates: {self.templates!r} must be absolute"
            return None

    def __init__(self, spec: StepSpec, args: Any, ctx: RunContext) -> None:
        super().__init__(spec, args, ctx)
        self.stack = stack_for(ctx, args.name)
        self.root = module_root(ctx)
        self.fmt = ctx.facts.modules.format
        self.record = f"{self.root}/.sitestack/{self.stack.name.replace('/', '--')}.json"

    def describe(self) -> str:
        return f"install the module files of {self.stack.name} under {self.root}"

    def recipes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys([*self.args.recipes, *plugin_recipes(self.ctx.facts)]))

    def render_files(self, built: Sequence[Built], fmt: str | None = None, *, plugins: bool = False) -> dict[str, str]:
        """path -> text of the module files for the packages ``built`` (no host needed)."""
        specs = site_modules(self.ctx, self.stack, built, requires=self.args.requires, autoload=self.args.autoload,
                             plugins=plugins)
        dirs = [self.args.templates] if self.args.templates else []
        return {f"{self.root}/{rel}": text for rel, text in render_all(specs, fmt or self.fmt, dirs).items()}

    def files(self, host: Host) -> dict[str, str]:
        built, _notes = find_built(host, self.ctx, self.recipes())
        return self.render_files(built)

    def dirs(self, files: Mapping[str, str]) -> list[str]:
        out = [self.root, os.path.dirname(self.record)]
        for path in files:
            d = os.path.dirname(path)
            while d.startswith(self.root + "/") and d not in out:
                out.append(d)
                d = os.path.dirname(d)
        return sorted(out)

    def stale(self, host: Host, files: Mapping[str, str]) -> list[str]:
        text = host.read_text(self.record)
        try:
            before = json.loads(text)["files"] if text else []
        except (ValueError, KeyError, TypeError):
            before = []
        return [p for p in before if p not in files and host.exists(p)]

    def pending(self, host: Host) -> str | None:
        require_module_system(facts=self.ctx.facts)
        files = self.files(host)
        problems = []
        modes = self._modes(host, [*self.dirs(files), *files])
        for path, text in files.items():
            current = host.read_text(path)
            if current is None:
                problems.append(f"{path} missing")
            elif current != text:
                problems.append(f"{path} differs")
            elif modes.get(path) != FILE_MODE:
                problems.append(f"{path} mode {modes.get(path, 0):04o}, want {FILE_MODE:04o}")
        for d in self.dirs(files):
            if d in modes and modes[d] != DIR_MODE:
                problems.append(f"{d} mode {modes[d]:04o}, want {DIR_MODE:04o}")
        problems += [f"{p} no longer wanted" for p in self.stale(host, files)]
        if host.read_text(self.record) != self._record_text(files):
            problems = problems or [f"{self.record} out of date"]
        return "; ".join(problems) or None

    @staticmethod
    def _modes(host: Host, paths: Sequence[str]) -> dict[str, int]:
        out = host.probe(["stat", "-c", "%a|%n", "--", *paths])
        modes = {}
        for line in out.stdout.splitlines():
            mode, _, name = line.partition("|")
            modes[name] = int(mode, 8)
        return modes

    def _record_text(self, files: Mapping[str, str]) -> str:
        return json.dumps({"stack": self.stack.name, "format": self.fmt, "files": sorted(files)}, indent=2) + "\n"

    def diff(self, host: Host) -> str | None:
        files = self.files(host)
        out = [unified_diff(host.read_text(p), text, p) for p, text in files.items() if host.read_text(p) != text]
        out += [unified_diff(host.read_text(p) or "", "", p) for p in self.stale(host, files)]
        return "".join(out) or None

    def apply(self, host: Host) -> None:
        require_module_system(facts=self.ctx.facts)
        if not host.exists(self.stack.manifest):
            raise SitestackError(f"the stack environment {self.stack.path} is not installed ({self.stack.manifest} "
                                 f"missing): run `invoke install-venv --site {self.ctx.site.name}` first")
        files = self.files(host)
        dirs = self.dirs(files)
        host.run(["mkdir", "-p", "--", *dirs])
        host.run(["chmod", f"{DIR_MODE:o}", "--", *dirs])
        for path, text in files.items():
            if host.read_text(path) != text or self._modes(host, [path]).get(path) != FILE_MODE:
                host.write_text(path, text, FILE_MODE)
        for path in self.stale(host, files):
            host.run(["rm", "-f", "--", path])
        host.write_text(self.record, self._record_text(files), FILE_MODE)


__all__ = ["ModuleSpec", "ModuleFiles", "Text", "text_of", "render", "render_all", "site_modules", "stack_module",
           "package_module", "recipe_targets"]
