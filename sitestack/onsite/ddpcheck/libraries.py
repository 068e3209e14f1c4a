"""The shared libraries each rank mapped, and whether they are the stack's: part of the environment check.

Each rank reads ``/proc/self/maps`` (:mod:`.mapped`) once the process group is up and again after the
collectives (NCCL/RCCL open their network plugin and libfabric at their first communicator), and records
the libraries of :data:`LIBRARIES` it mapped: per kind, each file's resolved path, soname and version.
result.json lists them per rank (``ranks[].libraries``), summary.md in its "Libraries" section.

The environment check fails, naming the rank and both paths, when

- a rank mapped a copy of a kind the stack's manifest names somewhere else than the manifest says
  (``libraries`` of the manifest check-config.json names: kind -> the directories its copies live in;
  a kind the manifest does not name is recorded, not judged by place);
- a rank mapped two copies of one library (two files of one name stem: two ``libnccl``, numpy's
  ``_multiarray_umath`` from two directories), as when ``LD_PRELOAD`` or ``LD_LIBRARY_PATH`` puts
  another copy first and a later ``dlopen`` by path maps the stack's own too;
- two ranks mapped one library from different paths (rank 0 ``/a/libX``, rank 1 ``/b/libX``).

Why: PyTorch has silently used the RCCL bundled in its wheel instead of the image's, bypassing the
network plugin and libfabric, and scaled badly with no error
(https://github.com/lumi-ai-factory/laifs-container-recipes/issues/18).
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..fileio import ReadError, read_json
from .checks import COLLECTIVES, ENVIRONMENT, PROCESS_GROUP
from .mapped import Mapping as Mapped
from .mapped import elf_soname, name_soname, name_version, package_version, parse_maps, read_maps
from .state import Run
from .verdicts import FAILED


@dataclass(frozen=True)
class Kind:
    """One kind of library: file-name globs, or the Python package whose extension modules (``.so``
    files under its directory) it is; ``dist`` is the distribution whose version a file without one
    in its name takes."""

    name: str
    files: tuple[str, ...] = ()
    package: str | None = None
    dist: str | None = None


#: Every kind of library a rank records, first match wins (the net plugin's ``libnccl-net.so`` is not NCCL).
LIBRARIES: tuple[Kind, ...] = (
    Kind("nccl", files=("libnccl.so*", "librccl.so*")),
    Kind("net-plugin", files=("libnccl-net*.so*", "librccl-net*.so*")),
    Kind("libfabric", files=("libfabric.so*",)),
    Kind("mpi", files=("libmpi*.so*", "libmpich*")),
    Kind("gpu-runtime", files=("libcudart.so*", "libamdhip64.so*", "libze_loader.so*")),
    Kind("torch", files=("libtorch*.so*", "libc10*.so*"), dist="torch"),
    Kind("numpy", package="numpy"),
    Kind("mpi4py", package="mpi4py"),
    Kind("horovod", package="horovod"),
)
KINDS = {k.name: k for k in LIBRARIES}
#: The most files recorded per kind and rank, and directories taken per kind from the manifest.
FILES_MAX = 64
DIRS_MAX = 16
#: The largest manifest read (a stack of a few hundred distributions is well under 1 MiB).
MANIFEST_MAX = 64 << 20


def kind_of(path: str) -> Kind | None:
    """The kind of library the file at ``path`` is, or None."""
    base = os.path.basename(path)
    for kind in LIBRARIES:
        if any(fnmatch.fnmatchcase(base, glob) for glob in kind.files):
            return kind
        if kind.package and ".so" in base and kind.package in path.split("/")[:-1]:
            return kind
    return None


def stem(path: str) -> str:
    """What two copies of one library share: the file name up to its first dot (``libnccl``, ``_multiarray_umath``)."""
    return os.path.basename(path).split(".", 1)[0]


def classify(mappings: Sequence[Mapped], since: str) -> dict[str, list[dict[str, Any]]]:
    """The libraries of :data:`LIBRARIES` among ``mappings``, by kind: ``path`` (resolved), ``soname``
    (the ELF's, else from the file name), ``version`` (from the file name, else the distribution's),
    ``file`` (device:inode), ``since`` (when first seen) and ``deleted`` where the file was unlinked.
    A file outside a package's directory with the name of one of its extension modules (a copy put
    first by LD_PRELOAD) is of that package's kind."""
    found: dict[str, list[dict[str, Any]]] = {}
    modules: dict[str, Kind] = {}
    rest = []
    for m in mappings:
        kind = kind_of(m.path)
        if kind is None:
            rest.append(m)
            continue
        if kind.package:
            modules[os.path.basename(m.path)] = kind
        _add(found, kind, m, since)
    for m in rest:
        if os.path.basename(m.path) in modules:
            _add(found, modules[os.path.basename(m.path)], m, since)
    return found


def _add(found: dict[str, list[dict[str, Any]]], kind: Kind, m: Mapped, since: str) -> None:
    entries = found.setdefault(kind.name, [])
    if len(entries) >= FILES_MAX:
        return
    path = m.path if m.deleted else os.path.realpath(m.path)
    soname = None if m.deleted else elf_soname(path)
    entry: dict[str, Any] = {"path": path, "soname": soname or name_soname(path),
                             "version": name_version(path) or package_version(path, kind.package or kind.dist or ""),
                             "file": f"{m.dev}:{m.inode}", "since": since}
    if m.deleted:
        entry["deleted"] = True
    entries.append(entry)


def merge(before: Mapping[str, list[dict[str, Any]]], after: Mapping[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    """``before`` with the files of ``after`` it does not list (by path and file) added."""
    out = {kind: list(entries) for kind, entries in before.items()}
    for kind, entries in after.items():
        have = {(e["path"], e.get("file")) for e in out.get(kind, [])}
        out.setdefault(kind, []).extend(e for e in entries if (e["path"], e.get("file")) not in have)
    return out


def expected_dirs(config: Mapping[str, Any], staged: str | None = None) -> dict[str, list[str]]:
    """Where the stack's manifest (check-config.json ``stack.manifest``) says each kind's copies live:
    its ``libraries`` (kind -> directories), the kinds of :data:`LIBRARIES` only, absolute paths only;
    ``{}`` where there is no manifest, or it names none. ``staged``: the copy of the stack the job staged
    on node-local storage (``SITESTACK_STAGED_ENV``, stage-env.sh): a directory under the stack's own
    path (the manifest's ``path``) is expected at the same place under the copy too."""
    stack = config.get("stack") if isinstance(config.get("stack"), dict) else {}
    path = stack.get("manifest") if isinstance(stack, dict) else None
    data: Any = None
    if isinstance(path, str) and path.startswith("/"):
        with contextlib.suppress(ReadError):
            data = read_json(path, MANIFEST_MAX)
    named = data.get("libraries") if isinstance(data, dict) else None
    if not isinstance(named, dict):
        return {}
    out = {}
    home = data.get("path") if isinstance(data.get("path"), str) else None
    for kind, dirs in named.items():
        if kind in KINDS and isinstance(dirs, list):
            good = [d.rstrip("/") or "/" for d in dirs[:DIRS_MAX] if isinstance(d, str) and d.startswith("/")]
            if good:
                out[kind] = good + _in_copy(good, home, staged)
    return out


def _in_copy(dirs: Sequence[str], home: str | None, staged: str | None) -> list[str]:
    """``dirs`` that lie under the stack's path ``home`` (as spelled or resolved), at the same place under
    its staged copy ``staged``; none where either is not an absolute path."""
    if not (home and staged and home.startswith("/") and staged.startswith("/")):
        return []
    roots = {home.rstrip("/"), os.path.realpath(home)}
    return [staged.rstrip("/") + d[len(root):] for d in dirs for root in roots
            if d == root or d.startswith(root + "/")]


def under(path: str, dirs: Sequence[str]) -> bool:
    """Whether ``path`` lies in one of ``dirs``, as spelled or resolved (a stable path that links to a generation)."""
    roots = {d for d in dirs} | {os.path.realpath(d) for d in dirs}
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def rank_problems(rank: Mapping[str, Any], expected: Mapping[str, Sequence[str]]) -> list[str]:
    """What one rank's libraries break: a copy outside the manifest's directories, two copies of one library."""
    problems = []
    who = f"rank {rank.get('rank')} on {rank.get('host', '?')}"
    libraries = rank.get("libraries") or {}
    for kind, entries in libraries.items():
        stack_copies = {stem(e["path"]): e["path"] for e in entries if kind in expected and under(e["path"], expected[kind])}
        for e in entries:
            if kind in expected and not under(e["path"], expected[kind]):
                theirs = stack_copies.get(stem(e["path"])) or " or ".join(expected[kind])
                problems.append(f"{who} mapped {kind} library {e['path']}, not the stack's copy ({theirs}, "
                                "as the stack's manifest says)")
        by_stem: dict[str, dict[str, str]] = {}
        for e in entries:
            by_stem.setdefault(stem(e["path"]), {}).setdefault(e.get("file") or e["path"], e["path"])
        for name, files in sorted(by_stem.items()):
            paths = list(files.values())
            if len(paths) > 1:
                problems.append(f"{who} mapped two copies of {name}: {paths[0]} and {paths[1]}")
    return problems


def disagreements(ranks: Sequence[Mapping[str, Any]]) -> list[str]:
    """One library mapped from different paths by two ranks: the first two that differ, by library."""
    paths: dict[tuple[str, str], dict[int, tuple[str, ...]]] = {}
    for r in ranks:
        for kind, entries in (r.get("libraries") or {}).items():
            mine: dict[str, set[str]] = {}
            for e in entries:
                mine.setdefault(stem(e["path"]), set()).add(e["path"])
            for name, found in mine.items():
                paths.setdefault((kind, name), {})[int(r.get("rank", -1))] = tuple(sorted(found))
    problems = []
    for (kind, name), by_rank in sorted(paths.items()):
        first, *others = sorted(by_rank)
        other = next((o for o in others if by_rank[o] != by_rank[first]), None)
        if other is not None:
            problems.append(f"ranks disagree on {kind} library {name}: rank {first} mapped "
                            f"{', '.join(by_rank[first])}, rank {other} {', '.join(by_rank[other])}")
    return problems


def record_libraries(run: Run) -> None:
    """This rank's libraries once the process group is up, into its report (``run.me``) before the ranks gather it."""
    run.me["libraries"] = classify(parse_maps(read_maps()), PROCESS_GROUP.name)


def judge_libraries(run: Run) -> None:
    """Add what the ranks' libraries break to the environment check (each problem once, in the
    check's own form: the first in the summary, "(and N more)")."""
    expected = expected_dirs(run.config, run.env.get("SITESTACK_STAGED_ENV"))
    problems = [p for r in run.ranks for p in rank_problems(r, expected)] + disagreements(run.ranks)
    check = run.checks[ENVIRONMENT.name]
    check.details["libraries_expected"] = expected
    known = list(check.details.get("problems", [])) if check.status == FAILED else []
    new = [p for p in problems if p not in known]
    if new:
        every = known + new
        run.set(ENVIRONMENT.name, FAILED, every[0] + (f" (and {len(every) - 1} more)" if len(every) > 1 else ""),
                problems=every)


def record_libraries_again(run: Run) -> None:
    """Read this rank's mappings again after the collectives, share them, and judge every rank's."""
    mine = run.me["libraries"] = merge(run.me.get("libraries") or {}, classify(parse_maps(read_maps()), COLLECTIVES.name))
    gathered = run.all_gather(mine)
    for rank, libraries in zip(run.ranks, gathered):
        rank["libraries"] = libraries
    judge_libraries(run)
