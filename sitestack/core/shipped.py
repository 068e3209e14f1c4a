"""The on-site package (:mod:`sitestack.onsite`) as the controller ships it.

A directory that runs on-site programs by name gets the modules of ``onsite/`` its programs import
(:func:`imported`) and, for each entry of :data:`sitestack.onsite.ENTRY_POINTS` it needs, a small
launcher of that name. The launcher puts its own directory first on ``sys.path`` itself (the job runs
Python with ``-E -s -S``, and ``-P`` or ``-I`` would drop it) and runs the module as ``__main__``, so
``python3 ddp_check.py ...`` in a job directory is what ``python3 -m onsite.ddp_check ...`` would be.

A command installed into a published tree (a stack's ``bin/extend-venv-activate``, :func:`installed`)
gets the same launcher, pointed at the package's directory elsewhere in the tree, and only the modules
its entry imports (:func:`imported`): the tree changes only when that program's own code does.
A program in :data:`sitestack.onsite.SINGLE_FILE` ships as its own text (:func:`single_file`).
"""

from __future__ import annotations

import ast
import functools
import os
from collections.abc import Iterator
from pathlib import Path

from sitestack.onsite import ENTRY_POINTS, SINGLE_FILE

ONSITE = Path(__file__).resolve().parent.parent / "onsite"

LAUNCHER = '''#!/usr/bin/env python3
"""{name}: runs {where} (sitestack's on-site programs, standard library only)."""
import os
import runpy
import sys

{setup}sys.path.insert(0, {path})
runpy.run_module("onsite.{module}", run_name="__main__", alter_sys=True)
'''


def launcher(name: str, package: str | None = None) -> str:
    """The launcher file ``name`` of :data:`~sitestack.onsite.ENTRY_POINTS` (KeyError for another name):
    it runs ``onsite/`` beside itself, or with ``package`` (a path relative to the launcher's directory)
    the ``onsite/`` in that directory, and then writes no bytecode there (an installed tree stays as
    it was installed)."""
    module = ENTRY_POINTS[name]
    here = "os.path.dirname(os.path.abspath(__file__))"
    if package is None:
        return LAUNCHER.format(name=name, module=module, where=f"onsite/{module}.py beside this file", setup="",
                               path=here)
    return LAUNCHER.format(name=name, module=module, where=f"{package}/onsite/{module}.py from this file's directory",
                           setup="sys.dont_write_bytecode = True  # the installed tree stays as installed\n",
                           path=f"os.path.join({here}, {package!r})")


def shipped(names: tuple[str, ...] | list[str]) -> dict[str, tuple[str, int]]:
    """Relative path -> (text, mode): the modules the entries ``names`` import (:func:`imported`) under
    ``onsite/``, then their launchers, executable (last: a launcher never runs before its modules)."""
    modules = sorted({relative for name in names for relative in imported(ENTRY_POINTS[name])})
    files = {f"onsite/{relative}": ((ONSITE / relative).read_text(encoding="utf-8"), 0o644) for relative in modules}
    files.update({name: (launcher(name), 0o755) for name in names})
    return files


def installed(name: str, *, package: str, bindir: str = "bin") -> dict[str, tuple[str, int]]:
    """Relative path -> (text, mode): the entry ``name`` of :data:`~sitestack.onsite.ENTRY_POINTS` installed
    as a command of a tree: the modules it imports (:func:`imported`) under ``<package>/onsite/``, then
    the launcher ``<bindir>/<name>``, executable (last: written in this order, a launcher never runs
    before its modules are there)."""
    files = {f"{package}/onsite/{relative}": ((ONSITE / relative).read_text(encoding="utf-8"), 0o644)
             for relative in imported(ENTRY_POINTS[name])}
    files[f"{bindir}/{name}"] = (launcher(name, package=os.path.relpath(package, bindir)), 0o755)
    return files


def imported(module: str) -> list[str]:
    """The files of ``onsite/`` that running ``onsite.<module>`` loads, as paths relative to ``onsite/``,
    sorted: the module, every module of the package it imports (relatively, from any module reached)
    and the ``__init__.py`` of each package on the way."""
    start = _module_file(ONSITE.joinpath(*module.split(".")))
    if start is None:
        raise ValueError(f"onsite has no module {module}")
    seen: set[Path] = set()
    todo = [start]
    while todo:
        path = todo.pop()
        if path not in seen:
            seen.add(path)
            todo += [*_packages(path), *_imports(path)]
    return sorted(path.relative_to(ONSITE).as_posix() for path in seen)


def _module_file(where: Path) -> Path | None:
    """The module at ``where`` (a path without suffix): ``where.py``, ``where/__init__.py``, or None."""
    for path in (where.parent / f"{where.name}.py", where / "__init__.py"):
        if path.is_file():
            return path
    return None


def _packages(path: Path) -> Iterator[Path]:
    """The ``__init__.py`` of each package that holds ``path``, up to ``onsite/``'s own; and for a
    subpackage of ``onsite/`` (``ddpcheck/``, ``activate/``), every module of it: a subpackage ships
    whole, so a module it names in a table rather than imports (the check table's
    ``"module:function"`` rows, :mod:`sitestack.onsite.ddpcheck.checks`) is there too."""
    for parent in path.parents:
        if parent == ONSITE.parent:
            return
        if (parent / "__init__.py").is_file():
            yield parent / "__init__.py"
            if parent != ONSITE:
                yield from sorted(parent.rglob("*.py"))


def _imports(path: Path) -> Iterator[Path]:
    """The package's modules that ``path`` imports (``from .x import y``, ``from . import x``, ``from .. import x``)."""
    st = path.stat()
    yield from _imports_of(path, st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=1024)
def _imports_of(path: Path, _mtime_ns: int, _size: int) -> tuple[Path, ...]:
    """:func:`_imports` of the file as it is at this (mtime, size): parsing every module of ``onsite/`` is
    most of the time a validation job's or a render's files take, and the same files are asked for by
    several steps of one run."""
    return tuple(_parse_imports(path))


def _parse_imports(path: Path) -> Iterator[Path]:
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if not isinstance(node, ast.ImportFrom) or not node.level:
            continue
        base = path.parent
        for _ in range(node.level - 1):
            base = base.parent
        target = base.joinpath(*node.module.split(".")) if node.module else base
        for where in (target, *(target / alias.name for alias in node.names)):
            found = _module_file(where)
            if found is not None:
                yield found


def single_file(module: str) -> str:
    """The text of ``onsite/<module>.py``, one of :data:`~sitestack.onsite.SINGLE_FILE` (ValueError for
    another: its imports would not be there)."""
    if module not in SINGLE_FILE:
        raise ValueError(f"onsite/{module}.py is not a single-file program")
    return (ONSITE / f"{module}.py").read_text(encoding="utf-8")
