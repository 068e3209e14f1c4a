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

- the stack's module (``pytorch/2.3.1-gpu``): PATH of the stack environment (no PYTHONPATH)
  (inside the container for container sites: SIF, the bind path, the container's PATH and
  PYTHONPATH), the site's settings (``facts.env``, each only where the user has no value of their
  own, docs/modulefiles.md), the site modules it needs (loaded with it
  with ``autoload``), one ``pytorch`` at a time;
- one module per package sitestack built for the site (mpi4py, Horovod), from the ``module``
  settings of its recipe. The network plugin's module is written by the plugin's build step (it
  knows NCCL_NET_PLUGIN); the stack's module loads it. ``net-plugin.<fmt>.j2`` renders it from
  the recipe too (:func:`site_modules` with ``plugins=True``).

Values keep what must be decided when the module is loaded, not when it is written: ``{user}``
and ``{home}`` in a fact become the loading user's ``$USER``/``$HOME``, and ``$VAR``/``${VAR}``
are read from the environment at load time.

Several stacks can share a module directory (``pytorch/2.2.2-rocm5.7`` and ``pytorch/2.10.0-rocm7.1``),
each installed by its own step. A step's ``default``, ``hidden`` and ``deprecated`` say whether
``module load pytorch`` loads its stack (once validated, where another stack held the default:
:mod:`sitestack.engine.promotion`), whether ``module avail`` lists it, and what a load of it
prints; the directory's rc files (``.modulerc.lua``; Tcl: ``.version``, ``.modulerc``) hold every
stack's entry (:mod:`sitestack.installs.modulerc`), so each step rewrites them keeping the others'.

Files are written atomically (temp file + rename) with mode 0644 in directories of mode 0755
(a+rX, no group or world write). Module files a previous run installed for the stack that are
no longer wanted are removed (a record in ``<install_root>/.sitestack/``).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from sitestack.actions.action import Action, unified_diff
from sitestack.core.bounded import read_bounded
from sitestack.core.errors import SitestackError
from sitestack.core.host import Host
from sitestack.installs.modulefile_render import render_all
from sitestack.installs.modulefile_specs import site_modules
from sitestack.installs.modulefile_text import literal, message_problem
from sitestack.installs.modulerc import Mark, State, merged, module_dir, module_file, rc_files, read_state, record_path
from sitestack.installs.record_paths import removable
from sitestack.installs.site_stack import find_built, recipe_targets
from sitestack.installs.tuned import Tuned, read_tuned
from sitestack.installs.venv_stack import (
    DEFAULT_RECIPES,
    Built,
    default_name,
    module_root,
    require_module_system,
    stack_for,
)
from sitestack.model.context import RunContext
from sitestack.model.site import Facts, StepSpec

FILE_MODE = 0o644
#: The largest module file, rc file or record the step reads back (each a few KiB).
TEXT_MAX = 1 << 20
DIR_MODE = 0o755


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
        default: bool = field(default=False, metadata={
            "doc": "the stack's module is its directory's default (`module load pytorch` loads it); where another "
                   "stack holds the default, this one awaits it, hidden, until its validation passes (`invoke "
                   "promote`, docs/operating.md); no stack marked: the module system loads the highest version"})
        hidden: bool = field(default=False, metadata={
            "doc": "`module avail` does not list the stack's module (`--show_hidden` does); loading it "
                   "by its full name works"})
        deprecated: str | None = field(default=None, metadata={
            "doc": "a notice every `module load` of the stack's module prints (one line; no double quotes, "
                   "backslashes, brackets, $, backticks or braces but those of {placeholders})"})

        def check(self) -> str | None:
            if self.templates is not None and not self.templates.startswith("/"):
                return f"templates: {self.templates!r} must be absolute"
            if self.default and self.hidden:
                # Environment Modules does not resolve `module load pytorch` to a hidden default
                # (https://modules.readthedocs.io/en/latest/modulefile.html#mfcmd-module-hide); Lmod does
                return "default and hidden: the default must be listed by `module avail` (mark one of them)"
            problem = message_problem(self.deprecated, placeholders=True) if self.deprecated is not None else None
            return f"deprecated: {problem}" if problem else None

    @classmethod
    def steps_problem(cls, steps: Sequence[tuple[StepSpec, Any, Facts]]) -> tuple[int, str] | None:
        """Two steps of one playbook that write one module (each run of one would rewrite it and remove the
        other's files, its record naming them), or whose stacks share a module directory and both claim
        its default."""
        writes: dict[str, StepSpec] = {}
        claims: dict[str, tuple[StepSpec, str]] = {}
        for i, (spec, args, facts) in enumerate(steps):
            name = args.name or default_name(facts)
            if name in writes:
                first = writes[name]
                return i, (f"name: {name} is also the module of step {first.name!r} (line {first.line}): each run "
                           "would rewrite it and remove the other's files; give each stack its own name")
            writes[name] = spec
            if not args.default:
                continue
            if module_dir(name) in claims:
                first, other = claims[module_dir(name)]
                return i, (f"default: {name} and {other} (step {first.name!r}, line {first.line}) both claim "
                           f"the default of {module_dir(name)}/: mark one")
            claims[module_dir(name)] = (spec, name)
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

    def render_files(self, built: Sequence[Built], fmt: str | None = None, *, plugins: bool = False,
                     tuned: Sequence[Tuned] = ()) -> dict[str, str]:
        """path -> text of the module files for the packages ``built`` (no host needed); the stack's
        module sets the ``tuned`` settings (:mod:`sitestack.installs.tuned`)."""
        specs = site_modules(self.ctx, self.stack, built, requires=self.args.requires, autoload=self.args.autoload,
                             plugins=plugins)
        mine = {"deprecated": self.args.deprecated,
                "tuned": tuple((t.name, literal(t.value), t.evidence) for t in tuned)}
        specs = [dataclasses.replace(s, **mine) if s.full == self.stack.name else s for s in specs]
        return {f"{self.root}/{rel}": text for rel, text in render_all(specs, fmt or self.fmt, self.template_dirs()).items()}

    def template_dirs(self) -> list[str]:
        return [self.args.templates] if self.args.templates else []

    def files(self, host: Host, tuned: Sequence[Tuned] | None = None) -> dict[str, str]:
        """path -> text of the module files on ``host``; ``tuned``: the settings of :meth:`tuned` (None: read them)."""
        built, _notes = find_built(host, self.ctx, self.recipes())
        return self.render_files(built, tuned=self.tuned(host) if tuned is None else tuned)

    def tuned(self, host: Host) -> list[Tuned]:
        """The settings ``invoke tune`` chose that the stack's module sets (``{prefix}/tuning/tuning.json``);
        each problem with that file is a warning, once per run of the step."""
        tuned, warnings = read_tuned(host, self.ctx.facts, self.ctx.values["prefix"], self.stack.name)
        told: set[str] = self.__dict__.setdefault("_warned", set())
        for warning in warnings:
            if warning not in told:
                told.add(warning)
                self.ctx.note(f"    [{host.name}] warning: {warning}")
        return tuned

    def rc_plan(self, host: Host) -> RcPlan:
        """The stack's module directory's rc files after this step: every stack's entry from the
        directory's record, this stack's from the step's arguments (:func:`modulerc.merged`)."""
        plan, state = self.rc_after(self.read(host, record_path(self.root, module_dir(self.stack.name))), host.exists)
        return plan._replace(stale=self.confined(host, [f"{self.root}/{r}" for r in state.files
                                                        if f"{self.root}/{r}" not in plan.files]))

    def rc_after(self, before: str | None, exists: Callable[[str], bool]) -> tuple[RcPlan, State]:
        """:meth:`rc_plan` from the directory's record text ``before`` (None: none) and which module files
        ``exists``, without a host (nothing stale yet), with the state the record held."""
        state = read_state(before)
        mine = module_file(self.root, self.stack.name, self.fmt)
        mark = Mark(self.fmt, self.args.default, self.args.hidden) if self.args.default or self.args.hidden else None
        stacks, notes = merged(state, self.stack.name, mark, lambda p: p == mine or exists(p), self.root)
        rel = rc_files(stacks, self.template_dirs())
        files = {f"{self.root}/{r}": text for r, text in rel.items()}
        text = State(stacks, tuple(rel)).text() if stacks or before is not None else None
        return RcPlan(files, [], record_path(self.root, module_dir(self.stack.name)), text, notes), state

    def rendered(self, earlier: Mapping[str, str]) -> dict[str, tuple[str, int]]:
        """The module files of the packages the playbook's recipe-install steps build
        (:func:`~sitestack.installs.site_stack.recipe_targets`), with no tuned settings (``invoke tune``
        chooses them on the site), the module directory's rc files holding the stacks of ``earlier``
        steps too, and the step's records."""
        built, _notes = recipe_targets(self.ctx, self.recipes())
        files = self.render_files(built)
        record = record_path(self.root, module_dir(self.stack.name))
        rc, _state = self.rc_after(earlier.get(record), lambda p: p in earlier or p in files)
        out = {**files, **rc.files, self.record: self._record_text(files)}
        if rc.record_text is not None:
            out[rc.record] = rc.record_text
        return {path: (text, FILE_MODE) for path, text in out.items()}

    def dirs(self, files: Mapping[str, str]) -> list[str]:
        out = [self.root, os.path.dirname(self.record)]
        for path in files:
            d = os.path.dirname(path)
            while d.startswith(self.root + "/") and d not in out:
                out.append(d)
                d = os.path.dirname(d)
        return sorted(out)

    def read(self, host: Host, path: str) -> str | None:
        """The text of a file this step writes (a module file, an rc file, a record); None where missing.
        A link, FIFO or device there, or a file over :data:`TEXT_MAX`, is refused with one line naming
        it: the step neither shows nor writes through what it did not write."""
        return read_bounded(host, path, TEXT_MAX, "not a file the modulefiles step wrote; move it aside",
                            follow=False)

    def stale(self, host: Host, files: Mapping[str, str]) -> list[str]:
        """The files the record lists that the step no longer writes and may remove
        (:func:`sitestack.installs.record_paths.removable`); each other one it lists is a warning."""
        before = (host.read_json(self.record) or {}).get("files")
        return self.confined(host, [p for p in before if not isinstance(p, str) or p not in files] if isinstance(before, list) else [])

    def confined(self, host: Host, paths: Sequence[object]) -> list[str]:
        """``paths`` (named by a record) that :func:`removable` lets go; the others a warning, once a run."""
        ok, refused = removable(host, self.root, paths)
        told: set[str] = self.__dict__.setdefault("_warned", set())
        for why in refused:
            if why not in told:
                told.add(why)
                self.ctx.note(f"    [{host.name}] warning: {why}: named by a record under {self.root}/.sitestack, "
                              "left alone")
        return ok

    def pending(self, host: Host) -> str | None:
        require_module_system(facts=self.ctx.facts)
        tuned = self.tuned(host)
        files = self.files(host, tuned)
        rc = self.rc_plan(host)
        problems = self._problems(host, {**files, **rc.files})
        change = self._tuned_change(host, tuned)
        if change:  # the stack's module differs because of it: say why
            mine = module_file(self.root, self.stack.name, self.fmt)
            problems = [change, *(p for p in problems if p != f"{mine} differs")]
        problems += [f"{p} no longer wanted" for p in [*self.stale(host, files), *rc.stale]]
        if self.read(host, self.record) != self._record_text(files, tuned):
            problems = problems or [f"{self.record} out of date"]
        if rc.record_text is not None and self.read(host, rc.record) != rc.record_text:
            problems = problems or [f"{rc.record} out of date"]
        return "; ".join([*problems, *rc.notes]) if problems else None

    def _problems(self, host: Host, files: Mapping[str, str]) -> list[str]:
        """Why ``files`` (path -> text) and their directories are not as wanted: missing, differing, modes."""
        problems = []
        modes = self._modes(host, [*self.dirs(files), *files])
        for path, text in files.items():
            current = self.read(host, path)
            if current is None:
                problems.append(f"{path} missing")
            elif current != text:
                problems.append(f"{path} differs")
            elif modes.get(path) != FILE_MODE:
                problems.append(f"{path} mode {modes.get(path, 0):04o}, want {FILE_MODE:04o}")
        for d in self.dirs(files):
            if d in modes and modes[d] != DIR_MODE:
                problems.append(f"{d} mode {modes[d]:04o}, want {DIR_MODE:04o}")
        return problems

    @staticmethod
    def _modes(host: Host, paths: Sequence[str]) -> dict[str, int]:
        out = host.probe(["stat", "-c", "%a|%n", "--", *paths])
        modes = {}
        for line in out.stdout.splitlines():
            mode, _, name = line.partition("|")
            modes[name] = int(mode, 8)
        return modes

    def _record_text(self, files: Mapping[str, str], tuned: Sequence[Tuned] = ()) -> str:
        """The step's record: the stack, the format, the files it installed and (where there are any) the
        tuned settings its module sets, which tell ``--check`` what changed (:meth:`_tuned_change`)."""
        record: dict[str, Any] = {"stack": self.stack.name, "format": self.fmt, "files": sorted(files)}
        if tuned:
            record["tuned"] = {t.name: t.value for t in tuned}
        return json.dumps(record, indent=2) + "\n"

    def _tuned_change(self, host: Host, tuned: Sequence[Tuned]) -> str | None:
        """``tuned settings changed: A=1, B unset`` where the settings differ from those the record says the
        installed module sets; None where they do not (or nothing is installed yet)."""
        record = host.read_json(self.record)
        if record is None:
            return None
        before = record.get("tuned") or {}
        wanted = {t.name: t.value for t in tuned}
        before = before if isinstance(before, dict) else {}
        if before == wanted:
            return None
        changed = [f"{k}={v}" for k, v in wanted.items() if before.get(k) != v]
        changed += [f"{k} unset" for k in before if k not in wanted]
        return f"tuned settings changed: {', '.join(changed)}"

    def diff(self, host: Host) -> str | None:
        files = {**self.files(host), **(rc := self.rc_plan(host)).files}
        out = [unified_diff(self.read(host, p), text, p) for p, text in files.items() if self.read(host, p) != text]
        out += [unified_diff(self.read(host, p) or "", "", p) for p in [*self.stale(host, files), *rc.stale]]
        return "".join(out) or None

    def apply(self, host: Host) -> None:
        require_module_system(facts=self.ctx.facts)
        if not host.exists(self.stack.manifest):
            raise SitestackError(f"the stack environment {self.stack.path} is not installed ({self.stack.manifest} "
                                 f"missing): run `invoke install-venv --site {self.ctx.site.name}` first")
        tuned = self.tuned(host)
        files = self.files(host, tuned)
        rc = self.rc_plan(host)
        dirs = self.dirs({**files, **rc.files})
        host.run(["mkdir", "-p", "--", *dirs])
        host.run(["chmod", f"{DIR_MODE:o}", "--", *dirs])
        for path, text in {**files, **rc.files}.items():
            if self.read(host, path) != text or self._modes(host, [path]).get(path) != FILE_MODE:
                host.write_text(path, text, FILE_MODE)
        for path in [*self.stale(host, files), *rc.stale]:
            host.run(["rm", "-f", "--", path])
        for record, wanted in ((self.record, self._record_text(files, tuned)), (rc.record, rc.record_text)):
            if wanted is not None and self.read(host, record) != wanted:
                host.write_text(record, wanted, FILE_MODE)


class RcPlan(NamedTuple):
    """What :meth:`ModuleFiles.rc_plan` found: the rc files (path -> text), those to remove, the
    directory's record (its path and text; None: no record needed) and notes on other stacks."""

    files: dict[str, str]
    stale: list[str]
    record: str
    record_text: str | None
    notes: list[str]

#: The rendering names are re-exported: other actions (the network plugin's) and the build task import
#: them from here.
__all__ = ["ModuleFiles"]
