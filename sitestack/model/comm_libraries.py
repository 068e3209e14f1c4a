"""What each communication library version does with a network plugin: one table,
``sources/comm/libraries.yml``, and the rules read from it.

Every place that decides how a plugin is wired asks here; nothing else spells a plugin's file name,
its NET name or a library's loading rule:

- :func:`loaders`: the rows for the stack's library (NCCL by its version, RCCL by the ROCm release);
  with no version known, every row of that library, so that a wiring fits all of them;
- :func:`wiring`: how a module file makes those loaders open one plugin library: its directory on
  ``LD_LIBRARY_PATH`` and, unless it has the default name, ``NCCL_NET_PLUGIN`` set to the suffix
  (``librccl-net-ofi.so`` -> ``ofi``). An absolute path is used only where every row takes one
  (NCCL >= 2.21): older loaders make ``libnccl-net-/abs/path.so.so`` of it and load nothing, silently;
- :func:`net_names`: the NET name a plugin registers (what ``NCCL_NET`` must say) and the others its
  versions are known by.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar

from sitestack.core import schema, versions
from sitestack.core.errors import SitestackError
from sitestack.core.paths import SOURCES_DIR
from sitestack.core.yamlfile import display_path, load_yaml

TABLE = SOURCES_DIR / "comm" / "libraries.yml"
#: The variable NCCL and RCCL read the plugin's name or path from.
PLUGIN_VARIABLE = "NCCL_NET_PLUGIN"


@dataclass(frozen=True)
class Loader:
    """How one range of a library's versions opens its net plugin (the YAML file's comment says each field)."""

    library: Literal["nccl", "rccl"]
    versions: str
    default_name: str
    suffix_name: str
    path_first: bool
    opened: Literal["init", "communicator"]
    source: str
    rocm: str | None = None

    def check(self) -> str | None:
        for spec in (self.versions, self.rocm or ">=0"):
            if versions.check_spec(spec):
                return f"versions: {versions.check_spec(spec)}"
        if self.suffix_name.count("%s") != 1:
            return f"suffix_name: {self.suffix_name!r} must hold %s once"
        return None

    def opens(self, value: str | None) -> list[str]:
        """The names dlopen() is given, in order, for ``NCCL_NET_PLUGIN=value`` (None: unset)."""
        if not value:
            return [self.default_name]
        return ([value] if self.path_first else []) + [self.suffix_name.replace("%s", value)]


@dataclass(frozen=True)
class PluginApis:
    """The ``ncclNetPlugin_vN`` interface versions a range of a library's versions looks up, newest first."""

    library: Literal["nccl", "rccl"]
    versions: str
    apis: tuple[int, ...]
    source: str
    rocm: str | None = None

    def check(self) -> str | None:
        return _spec_problem(self.versions, self.rocm)


def _spec_problem(*specs: str | None) -> str | None:
    for spec in specs:
        if spec is not None and versions.check_spec(spec):
            return f"{spec!r}: {versions.check_spec(spec)}"
    return None


@dataclass(frozen=True)
class PluginName:
    """The NET name a plugin's versions register, and the other names they are known by."""

    plugin: str
    versions: str
    net_name: str
    source: str
    also: tuple[str, ...] = ()


@dataclass(frozen=True)
class KnownIssue:
    """A setting known to break a library version (``values``: the values that do; empty: any)."""

    id: str
    library: Literal["nccl", "rccl"]
    variable: str
    effect: str
    workaround: str
    source: str
    values: tuple[str, ...] = ()
    versions: str | None = None    # the library's versions; an issue with only these applies where the stack's is known
    rocm: str | None = None        # RCCL: the ROCm releases

    def check(self) -> str | None:
        return _spec_problem(self.versions, self.rocm)

    def applies(self, library: str | None, rocm: str | None) -> bool:
        """Whether the issue is one of a stack of ``library`` (of ROCm ``rocm``). One that names only the
        library's own versions applies nowhere yet: facts name no NCCL version."""
        if library != self.library:
            return False
        if self.rocm is not None:
            return rocm is not None and versions.matches(self.rocm, rocm)
        return self.versions is None

    def matches(self, name: str, value: str) -> bool:
        return name == self.variable and (not self.values or value.strip().upper() in {v.upper() for v in self.values})


@dataclass(frozen=True)
class Table:
    loaders: tuple[Loader, ...]
    plugin_apis: tuple[PluginApis, ...]
    plugins: tuple[PluginName, ...]
    known_issues: tuple[KnownIssue, ...] = ()

    def check(self) -> str | None:
        ids = [issue.id for issue in self.known_issues]
        twice = sorted({i for i in ids if ids.count(i) > 1})
        return f"known_issues: id {twice[0]!r} is used twice" if twice else None


@functools.lru_cache(maxsize=4)
def table(path: Path = TABLE) -> Table:
    """The table, checked against its schema (an error names file, line and key)."""
    return schema.build(Table, load_yaml(path), display_path(path))


def loaders(library: str, *, version: str | None = None, rocm: str | None = None) -> tuple[Loader, ...]:
    """The rows for ``library`` at ``version`` (or, for RCCL, the ROCm release ``rocm``); every row of the
    library when neither is known. An unknown library is refused."""
    return _rows(table().loaders, library, version, rocm)


def plugin_apis(library: str, *, version: str | None = None, rocm: str | None = None) -> PluginApis:
    """The plugin interface versions ``library`` at ``version`` (RCCL: of ROCm ``rocm``) looks up."""
    return _rows(table().plugin_apis, library, version, rocm)[0]


R = TypeVar("R", Loader, PluginApis)


def _rows(every: Sequence[R], library: str, version: str | None, rocm: str | None) -> tuple[R, ...]:
    rows = [r for r in every if r.library == library]
    if not rows:
        raise SitestackError(f"{display_path(TABLE)} has no rows for {library!r}")
    if rocm is not None and library == "rccl":
        chosen = [r for r in rows if r.rocm and versions.matches(r.rocm, rocm)]
    elif version is not None:
        chosen = [r for r in rows if versions.matches(r.versions, version)]
    else:
        return tuple(rows)
    if not chosen:
        what = f"ROCm {rocm}" if rocm is not None else f"{library} {version}"
        raise SitestackError(f"{display_path(TABLE)}: no row for {library} covers {what}")
    return tuple(chosen)


@dataclass(frozen=True)
class Wiring:
    """What a module file sets so that every one of some loaders opens one plugin library."""

    directory: str                 # prepended to LD_LIBRARY_PATH
    plugin_variable: str | None    # NCCL_NET_PLUGIN's value; None: leave it unset (the default name)
    why: str


def wiring(rows: Sequence[Loader], library: str) -> Wiring:
    """How to make each of ``rows`` open ``library`` (a path; may hold placeholders such as ``{install}``).

    The default name needs only its directory on ``LD_LIBRARY_PATH``; a suffix name
    (``lib{nccl,rccl}-net-NAME.so``) also ``NCCL_NET_PLUGIN=NAME``; any other name needs the path
    itself, which only path-first loaders take. Refused when some row can open it in no way."""
    directory, name = os.path.dirname(library), os.path.basename(library)
    if all(r.default_name == name for r in rows):
        return Wiring(directory, None, f"{name} is the default name of {_versions(rows)}")
    suffixes = {_suffix(r.suffix_name, name) for r in rows}
    if len(suffixes) == 1 and None not in suffixes:
        (suffix,) = suffixes
        assert suffix is not None
        return Wiring(directory, suffix, f"{_versions(rows)} open {name} for {PLUGIN_VARIABLE}={suffix}")
    if all(r.path_first for r in rows):
        return Wiring(directory, library, f"{_versions(rows)} take {PLUGIN_VARIABLE} as a path")
    blocking = [r for r in rows if not r.path_first and r.default_name != name and _suffix(r.suffix_name, name) is None]
    raise SitestackError(
        f"{library}: {_versions(blocking)} cannot open this plugin library: it opens only {blocking[0].default_name} or "
        f"{blocking[0].suffix_name} (an absolute {PLUGIN_VARIABLE} becomes {blocking[0].suffix_name.replace('%s', '/...')}; "
        f"{blocking[0].source}); install it under one of those names")


def _suffix(pattern: str, name: str) -> str | None:
    """X where ``name`` is ``pattern`` with X for ``%s`` (a file name, no ``/``), else None."""
    head, tail = pattern.split("%s")
    middle = name[len(head):len(name) - len(tail)] if name.startswith(head) and name.endswith(tail) else ""
    return middle if middle and "/" not in middle else None


def _versions(rows: Sequence[Loader]) -> str:
    """``RCCL of ROCm <6.2`` / ``NCCL <2.21, >=2.21,<2.23``: the rows as a reader names them."""
    if rows and rows[0].library == "rccl":
        return "RCCL of ROCm " + ", ".join(r.rocm or r.versions for r in rows)
    return "NCCL " + ", ".join(r.versions for r in rows)


def net_names(plugin: str, version: str | None = None) -> tuple[str, ...]:
    """The NET names of ``plugin`` (``version``: one version's; None: all its versions'), the name to force
    it with first. Empty for a plugin the table does not know."""
    names: list[str] = []
    for row in table().plugins:
        if row.plugin == plugin and (version is None or versions.matches(row.versions, version)):
            names += [n for n in (row.net_name, *row.also) if n not in names]
    return tuple(names)


def net_name(plugin: str | None, version: str | None = None) -> str | None:
    """The name ``NCCL_NET`` forces ``plugin`` with (None: no plugin, or one the table does not know)."""
    names = net_names(plugin, version) if plugin else ()
    return names[0] if names else None
