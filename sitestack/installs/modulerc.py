"""The rc files of a module directory: which version ``module load pytorch`` loads (the default)
and which versions ``module avail`` does not list (hidden), for every stack in that directory.

Several stacks share one directory (``pytorch/2.2.2-rocm5.7`` and ``pytorch/2.10.0-rocm7.1`` in
``<install_root>/pytorch/``), each installed by its own modulefiles step. Each step owns only its
own stack's entry (a :class:`Mark`); the entries of every stack are kept in one record per
directory (``<install_root>/.sitestack/<dir>.modulerc.json``), and the rc files are rendered from
all of them, so one step rewriting them keeps the others' entries. With no entry at all there are
no rc files: Lmod and Environment Modules then load the highest version.

What each format writes (rendered by ``modulefiles/dot-*.j2``):

- ``lua``: ``.modulerc.lua`` with ``module_version("pytorch/X", "default")`` and
  ``hide_version("pytorch/Y")`` (https://lmod.readthedocs.io/en/latest/093_modulerc.html;
  ``hide_version`` rather than ``hide{}``, which Lmod has only from 8.7 on: Debian 12 ships 8.6);
- ``tcl``: ``.version`` with ``set ModulesVersion "X"`` for the default, which Environment
  Modules and Lmod both read, and ``.modulerc`` hiding versions with ``module-hide`` where the
  module system has it (Environment Modules 4.6+,
  https://modules.readthedocs.io/en/latest/modulefile.html#mfcmd-module-hide), else Lmod's
  ``hide-version`` (the Lmod page above). ``.modulerc`` names the default too
  (``module-version X default``): Lmod takes the default from the first rc file it finds, and
  ``.modulerc`` comes before ``.version`` (8.6 with both loaded the highest version).

The default moves only by promotion. A stack whose step claims the default while another stack of the
directory holds it *awaits* it (``Mark.awaiting``): it is written hidden (loadable by its full name, so
its validation job can load it) and the old default stays, until :func:`promoted` (``invoke promote``,
or ``invoke provision`` after its validation passed: :mod:`sitestack.engine.promotion`) moves it. A
directory with no default yet gives it to the first claim: there is no default to protect.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from sitestack.core import templates
from sitestack.core.errors import SitestackError
from sitestack.core.paths import MODULEFILE_DIR
from sitestack.installs.modulefile_render import EXTENSIONS, environment
from sitestack.onsite.fileio import parse_json

#: The rc files of each format, in the module directory; the template of each is ``dot-<name>.<fmt>.j2``.
RC_FILES = {"lua": (".modulerc.lua",), "tcl": (".version", ".modulerc")}


@dataclass(frozen=True)
class Mark:
    """One stack's entry in its directory's rc files: its module files' format, and whether it is
    the directory's default and whether ``module avail`` hides it."""

    format: str
    default: bool = False
    hidden: bool = False
    awaiting: bool = False           # claims the default; hidden until promoted (the module docstring)


@dataclass(frozen=True)
class State:
    """A module directory's record: every stack's :class:`Mark` (stack name -> mark) and the rc
    files (relative to the install root) the last run wrote."""

    stacks: Mapping[str, Mark]
    files: tuple[str, ...] = ()

    def text(self) -> str:
        stacks = {name: {"format": m.format, "default": m.default, "hidden": m.hidden,
                         **({"awaiting": True} if m.awaiting else {})} for name, m in sorted(self.stacks.items())}
        return json.dumps({"stacks": stacks, "files": sorted(self.files)}, indent=2) + "\n"


def module_dir(stack: str) -> str:
    """The directory (relative to the install root) of module ``stack``: ``pytorch`` for ``pytorch/2.3.1-gpu``."""
    return stack.rsplit("/", 1)[0]


def record_path(root: str, directory: str) -> str:
    return f"{root}/.sitestack/{directory.replace('/', '--')}.modulerc.json"


def read_state(text: str | None) -> State:
    """The record ``text`` (None or unreadable: no entries, no files)."""
    try:
        data = parse_json(text, "record") if text else {}
        stacks = {str(name): Mark(str(m["format"]), bool(m["default"]), bool(m["hidden"]), m.get("awaiting") is True)
                  for name, m in data.get("stacks", {}).items() if m["format"] in RC_FILES}
        return State(stacks, tuple(str(f) for f in data.get("files", [])))
    except (ValueError, KeyError, TypeError, AttributeError):   # ReadError is a ValueError
        return State({})


def module_file(root: str, stack: str, fmt: str) -> str:
    return f"{root}/{stack}{EXTENSIONS[fmt]}"


def merged(state: State, stack: str, mark: Mark | None, exists: Callable[[str], bool],
           root: str) -> tuple[dict[str, Mark], list[str]]:
    """The entries after ``stack``'s step, and notes on what its claim does to the default.

    ``stack``'s entry becomes ``mark`` (None: neither default nor hidden, no entry), except that the
    default moves only by promotion: a claim of the default while another stack of the same format
    holds it becomes an awaiting (hidden) entry, and a stack that holds the default keeps it while
    another one awaits it. Other stacks keep their entries while their module file is there (``exists``:
    a path on the host)."""
    others = {name: old for name, old in sorted(state.stacks.items())
              if name != stack and exists(module_file(root, name, old.format))}
    notes: list[str] = []
    if mark is not None and mark.default:
        holder = next((name for name, old in others.items() if old.default and old.format == mark.format), None)
        if holder is not None:
            mark = Mark(mark.format, default=False, hidden=True, awaiting=True)
            notes.append(f"{stack} awaits validation: {holder} stays the default until it passes (`invoke promote`)")
    before = state.stacks.get(stack)
    if before is not None and before.default and (mark is None or not mark.default):
        waiting = next((name for name, old in others.items() if old.awaiting and old.format == before.format), None)
        if waiting is not None:
            mark = Mark(before.format, default=True)
            notes.append(f"{stack} stays the default until {waiting} is promoted")
    out = {name: old for name, old in others.items() if old.default or old.hidden}
    if mark is not None and (mark.default or mark.hidden):
        out[stack] = mark
    return out, notes


def awaiting(state: State) -> list[str]:
    """The stacks of a directory's record that await the default (hidden until promoted)."""
    return [name for name, mark in sorted(state.stacks.items()) if mark.awaiting]


def promoted(state: State, stack: str) -> dict[str, Mark]:
    """The entries once ``stack`` is its directory's default: listed and loaded by ``module load <dir>``;
    the stack of its format that held the default keeps only its hidden mark (its module file stays,
    loadable by its full name)."""
    mine = state.stacks.get(stack)
    if mine is None:
        raise SitestackError(f"{stack} has no entry in its module directory's record: its modulefiles step has "
                             "not installed it")
    out: dict[str, Mark] = {}
    for name, old in sorted(state.stacks.items()):
        if name == stack:
            continue
        if old.default and old.format == mine.format:
            old = Mark(old.format, default=False, hidden=old.hidden)
        if old.default or old.hidden:
            out[name] = old
    out[stack] = Mark(mine.format, default=True)
    return out


def rc_files(stacks: Mapping[str, Mark], template_dirs: Sequence[str | Path] = ()) -> dict[str, str]:
    """relative path -> text of the rc files for ``stacks`` (all in one directory); none for a
    format without a default or a hidden stack, and no ``.version`` (Tcl) without a default."""
    out: dict[str, str] = {}
    directories = {module_dir(name) for name in stacks}
    if len(directories) > 1:
        raise SitestackError(f"rc files for several module directories at once: {sorted(directories)}")
    for fmt, names in RC_FILES.items():
        mine = {name: m for name, m in sorted(stacks.items()) if m.format == fmt}
        default = next((name for name, m in mine.items() if m.default), None)
        hidden = [name for name, m in mine.items() if m.hidden]
        for rc in names:
            if (rc == ".version" and default is None) or (rc == ".modulerc" and not hidden) or not mine:
                continue
            directory = module_dir(next(iter(mine)))
            template = f"dot-{rc.lstrip('.').split('.')[0]}.{fmt}.j2"
            out[f"{directory}/{rc}"] = templates.cached_text(
                [*template_dirs, MODULEFILE_DIR], repr(("module rc", template, directory, default, hidden)),
                functools.partial(_render, template, directory, default, hidden, template_dirs))
    return out


def _render(template: str, directory: str, default: str | None, hidden: Sequence[str],
            template_dirs: Sequence[str | Path]) -> str:
    import jinja2

    try:
        text = environment(template_dirs).get_template(template).render(
            directory=directory, default=default, version=default.rsplit("/", 1)[1] if default else None,
            hidden=list(hidden), template_file=template)
    except jinja2.TemplateError as exc:
        raise SitestackError(f"module rc template {template}: {exc}") from None
    return text.rstrip("\n") + "\n"
