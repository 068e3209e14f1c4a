"""Where each rank imports the stack's Python packages from: part of the environment check.

Each of :data:`PACKAGES` (torch, numpy, mpi4py, horovod) must come from the stack's own environment,
whatever its version: a copy put first by ``PYTHONPATH``, the user's site-packages (``~/.local``,
``pip install --user``) or another prefix runs other code with the same version number. The stack's
directories are the manifest's (``libraries`` of check-config.json's ``stack.manifest``: kind -> the
package's directory), else the site-packages of the interpreter's own prefix and what the ``.pth``
files there add (a venv over a container's Python). A package imported from elsewhere is named with
the rank, its host and both paths.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import site
import sys
from collections.abc import Mapping, Sequence

from ..fileio import ReadError, read_text
from .libraries import LIBRARIES

#: The packages whose origin each rank reports: torch and the Python packages whose libraries are judged
#: by place (numpy, mpi4py, horovod: :data:`.libraries.LIBRARIES`).
PACKAGES: tuple[str, ...] = ("torch", *(kind.package for kind in LIBRARIES if kind.package))
#: The most bytes read of a ``.pth`` file.
PTH_MAX = 64 << 10


def origin(name: str) -> str | None:
    """The directory package ``name`` is (or would be) imported from, resolved; None where it cannot be."""
    module = sys.modules.get(name)
    file = getattr(module, "__file__", None) if module is not None else None
    if file is None:
        with contextlib.suppress(ImportError, ValueError):
            spec = importlib.util.find_spec(name)  # a top-level package: found, not imported
            file = spec.origin if spec is not None else None
    return os.path.realpath(os.path.dirname(file)) if isinstance(file, str) and file != "namespace" else None


def origins() -> dict[str, str]:
    """Package -> :func:`origin`, for each of :data:`PACKAGES` this rank can import."""
    return {name: path for name in PACKAGES if (path := origin(name))}


def own_dirs(prefix: str | None = None) -> list[str]:
    """The interpreter's own site-packages (of ``sys.prefix``, or ``prefix``) and the directories the
    ``.pth`` files there add (as :mod:`site` reads them: a line that is a path, not an ``import``)."""
    dirs = site.getsitepackages([prefix]) if prefix else site.getsitepackages()
    out = [d for d in dirs if os.path.isdir(d)]
    for d in list(out):
        with contextlib.suppress(OSError):
            for entry in sorted(os.listdir(d)):
                if entry.endswith(".pth"):
                    out += _pth_dirs(os.path.join(d, entry), d)
    return list(dict.fromkeys(os.path.realpath(d) for d in out))


def _pth_dirs(path: str, base: str) -> list[str]:
    with contextlib.suppress(ReadError):
        lines = read_text(path, PTH_MAX).splitlines()
        return [d for line in lines if line.strip() and not line.startswith(("#", "import ", "import\t"))
                and os.path.isdir(d := os.path.join(base, line.strip()))]
    return []


def expected(libraries: Mapping[str, Sequence[str]], name: str, own: Sequence[str]) -> list[str]:
    """Where package ``name`` is expected: the manifest's directories for it (``libraries``), else its
    directory under each of the interpreter's own site directories ``own``."""
    return list(libraries.get(name) or [os.path.join(d, name) for d in own])


def within(path: str, dirs: Sequence[str]) -> bool:
    roots = {d.rstrip("/") for d in dirs} | {os.path.realpath(d) for d in dirs}
    return any(path == r or path.startswith(r + "/") for r in roots)


def import_problems(found: Mapping[str, str], libraries: Mapping[str, Sequence[str]], own: Sequence[str],
                    who: str) -> list[str]:
    """Each package of ``found`` (package -> directory) outside where :func:`expected` puts it, named with
    ``who`` (rank and host), both paths and the variable that commonly puts a copy first."""
    problems = []
    for name, path in found.items():
        want = expected(libraries, name, own)
        if want and not within(path, want):
            theirs = next((w for w in want if os.path.isdir(w)), None) or " or ".join(want)
            problems.append(f"{who} imports {name} from {path}, not the stack's ({theirs}){_why(path)}")
    return problems


def _why(path: str) -> str:
    """What likely put ``path`` first on the module path."""
    if any(p and within(path, [os.path.realpath(p)]) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)):
        return ": PYTHONPATH puts it first"
    with contextlib.suppress(Exception):
        if within(path, [os.path.realpath(site.getusersitepackages())]):
            return ": the user's site-packages (pip install --user; PYTHONNOUSERSITE=1 leaves it out)"
    return ""
