"""The network plugin recipe's tables and version rules (``data:`` of sources/aws-ofi-rccl.yml), pure.

The plugin is built for one GPU toolkit, ROCm (RCCL loads it) or CUDA (NCCL loads it): the
``toolkit`` of a build. Each row of ``data.plugins`` is one plugin version range for one toolkit:
its configure option for the toolkit, the toolkit releases it fits, the library it installs and the
plugin interface versions it exports. What the communication library of a release looks up is
in sources/comm/libraries.yml (``plugin_apis``: RCCL by ROCm release, as RCCL ships with ROCm; NCCL by
its own version, as it ships apart from the CUDA toolkit). Nothing here touches a host.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from sitestack.core import schema, versions
from sitestack.core.errors import SitestackError
from sitestack.model import comm_libraries
from sitestack.model.recipe import Recipe, Requires, expand
from sitestack.model.site import Facts
from sitestack.model.toolkits import Cuda, Rocm

RECIPE_FILE = "sources/aws-ofi-rccl.yml"
R = TypeVar("R")
Kit = Literal["rocm", "cuda"]

#: How each toolkit is named in messages, and the communication library that loads its plugin.
KIT_NAMES: Mapping[str, tuple[str, str]] = {"rocm": ("ROCm", "RCCL"), "cuda": ("CUDA", "NCCL")}


@dataclass(frozen=True)
class RocmRow:
    """A row of a per-ROCm-release table: the releases it covers (a version range) and why."""

    rocm: str
    why: str = ""


@dataclass(frozen=True, kw_only=True)
class DefaultRow(RocmRow):
    version: str          # the plugin version built for those releases


@dataclass(frozen=True)
class CudaDefaultRow:
    cuda: str             # the CUDA releases (a range)
    version: str          # the plugin version built for them
    why: str = ""


@dataclass(frozen=True, kw_only=True)
class PrefixRow(RocmRow):
    prefix: str           # where their RCCL's include/rccl/rccl.h is ({rocm_home} placeholder)


@dataclass(frozen=True)
class PluginRow:
    """One plugin version range built for one toolkit."""

    versions: str
    toolkit: Kit
    upstream: str
    toolkit_option: str   # configure's option naming the toolkit's home (--with-hip, --with-rocm, --with-cuda)
    library: str          # the library the module file names (relative to the install)
    exports: tuple[str, ...]
    requires: Requires = field(default_factory=Requires)   # the toolkit releases it fits
    why: str = ""
    rccl_option: str | None = None
    hwloc_option: str | None = None
    whatis: str | None = None          # the module's whatis where it is not the recipe's
    sanity: tuple[str, ...] = ()       # the install's sanity paths where they are not the recipe's

    def check(self) -> str | None:
        return versions.check_spec(self.versions) and f"versions: {versions.check_spec(self.versions)}"


@dataclass(frozen=True)
class FilesRow:
    """What a toolkit's home must hold: each entry of ``files`` a list of alternatives (shell globs)."""

    toolkit: Kit
    what: str
    files: tuple[tuple[str, ...], ...]


@dataclass(frozen=True)
class PluginData:
    """``data:`` of sources/aws-ofi-rccl.yml."""

    install_name: str
    default_for_rocm: tuple[DefaultRow, ...]
    plugins: tuple[PluginRow, ...]
    rocm_releases: tuple[str, ...]
    rccl_prefix: tuple[PrefixRow, ...]
    default_for_cuda: tuple[CudaDefaultRow, ...] = ()
    toolkit_files: tuple[FilesRow, ...] = ()
    system_prefixes: tuple[str, ...] = ("/usr", "/usr/local", "/")
    mpi_home: Mapping[str, str] = field(default_factory=dict)


def plugin_data(recipe: Recipe) -> PluginData:
    return schema.build(PluginData, dict(recipe.data), recipe.path, line=1, key="data")


def _row(rows: Sequence[R], attr: str, value: str, what: str, recipe: str) -> R:
    """The first row of table ``what`` whose ``attr`` range covers ``value``."""
    for row in rows:
        if versions.matches(getattr(row, attr), value):
            return row
    raise SitestackError(f"{recipe}: no row of data.{what} covers {attr} {value}")


def known_rocm(data: PluginData, rocm: str, recipe: str = RECIPE_FILE) -> str:
    """The ROCm release as the recipe spells it (``7.0`` -> ``7.0.0``); unknown ones are refused."""
    try:
        versions.parse(rocm)
    except ValueError:
        raise SitestackError(f"--rocm {rocm!r} is not a ROCm version (like 5.7.1)") from None
    for release in data.rocm_releases:
        if versions.matches(f"=={release}", rocm):
            return release
    raise SitestackError(f"unknown ROCm version {rocm}: {recipe} knows {', '.join(data.rocm_releases)} "
                         "(add a release to data.rocm_releases once where its RCCL headers are and which plugin API "
                         "versions its RCCL loads are known)")


def known_version(text: str, option: str, example: str) -> str:
    """A CUDA or NCCL version as given, refused unless it is a version (``13.0``, ``2.18.3``)."""
    try:
        versions.parse(text)
    except (ValueError, SitestackError):
        raise SitestackError(f"{option} {text!r} is not a version (like {example})") from None
    return text


def plugin_row(data: PluginData, version: str, recipe: str = RECIPE_FILE, toolkit: Kit = "rocm") -> PluginRow:
    """The row of plugin ``version`` for ``toolkit``; a version built for the other toolkit only is refused."""
    for row in data.plugins:
        if row.toolkit == toolkit and versions.matches(row.versions, version):
            return row
    other = [r for r in data.plugins if versions.matches(r.versions, version)]
    kit, lib = KIT_NAMES[toolkit]
    if other:
        built = " and ".join(sorted({KIT_NAMES[r.toolkit][0] for r in other}))
        fits = [r.versions for r in data.plugins if r.toolkit == toolkit]
        raise SitestackError(f"{version} ({other[0].upstream}) is built for {built} only; {lib} ({kit}) needs a "
                             f"version in {' or '.join(fits) or 'none'} ({recipe}, data.plugins)")
    raise SitestackError(f"{recipe}: no row of data.plugins covers version {version} for {kit}")


def api_versions(symbols: Sequence[str]) -> list[int]:
    return [int(s.rsplit("_v", 1)[1]) for s in symbols if "_v" in s and s.rsplit("_v", 1)[1].isdigit()]


def with_toolkit(facts: Facts, toolkit: Kit, version: str, home: str) -> Facts:
    """``facts`` with the toolkit the plugin is built for set to ``version`` at ``home``."""
    if toolkit == "rocm":
        return dataclasses.replace(facts, rocm=Rocm(version=version, home=home))
    return dataclasses.replace(facts, cuda=Cuda(version=version, home=home))


def toolkit_release(facts: Facts, toolkit: Kit) -> str:
    kit = facts.rocm if toolkit == "rocm" else facts.cuda
    assert kit is not None   # the hooks set the toolkit they build for
    return kit.version


def _loads(toolkit: Kit, release: str, nccl: str | None) -> tuple[tuple[int, ...], str, str] | None:
    """(API versions, why, whose) the communication library looks up (sources/comm/libraries.yml); None
    where it is not known (a CUDA build with no NCCL version given)."""
    if toolkit == "rocm":
        row = comm_libraries.plugin_apis("rccl", rocm=release)
        return row.apis, row.source, f"the RCCL of ROCm {release}"
    if nccl is None:
        return None
    known_version(nccl, "--nccl", "2.18.3")
    row = comm_libraries.plugin_apis("nccl", version=nccl)
    return row.apis, row.source, f"NCCL {nccl}"


def choose_version(recipe: Recipe, data: PluginData, facts: Facts, asked: str | None, site: str, *,
                   toolkit: Kit = "rocm", nccl: str | None = None) -> str:
    """The plugin version for the site's toolkit (``facts.rocm`` or ``facts.cuda``): ``asked`` or the
    default for that release; refused when the row's requires, the recipe's rules or the plugin API
    the library loads (RCCL of the ROCm release; NCCL ``nccl`` where given) do not fit."""
    kit, _ = KIT_NAMES[toolkit]
    if (facts.rocm if toolkit == "rocm" else facts.cuda) is None:
        raise SitestackError(f"site {site} has no facts.{toolkit}: say which {kit} release to build for (--{toolkit})")
    release = toolkit_release(facts, toolkit)
    if asked:
        version = asked
    elif toolkit == "rocm":
        version = _row(data.default_for_rocm, "rocm", release, "default_for_rocm", recipe.path).version
    else:
        version = _row(data.default_for_cuda, "cuda", release, "default_for_cuda", recipe.path).version
    if version not in recipe.versions:
        raise SitestackError(f"unknown version {version!r} of {recipe.name} (known versions in {recipe.path}: "
                             f"{', '.join(recipe.known_versions())})")
    row = plugin_row(data, version, recipe.path, toolkit)
    problems = _unmet(recipe, data, version, facts, toolkit)
    loads = _loads(toolkit, release, nccl)
    if loads and not set(api_versions(row.exports)) & set(loads[0]):
        problems.append(f"it exports plugin API {', '.join(f'v{v}' for v in api_versions(row.exports))} and "
                        f"{loads[2]} loads {', '.join(f'v{v}' for v in loads[0])} ({loads[1]})")
    if problems:
        fits = [v for v in recipe.known_versions() if not _unmet(recipe, data, v, facts, toolkit)]
        hint = f"versions that fit {kit} {release}: {', '.join(fits)}" if fits else f"no known version fits {kit} {release}"
        raise SitestackError(f"{recipe.name} {version} ({row.upstream}) does not fit {kit} {release} on {site}: "
                             f"{'; '.join(problems)}. {hint}")
    return version


def _unmet(recipe: Recipe, data: PluginData, version: str, facts: Facts, toolkit: Kit) -> list[str]:
    """Why ``version`` does not fit: the recipe's own rules, the toolkit row's requires (or no row)."""
    rows = [r for r in data.plugins if r.toolkit == toolkit and versions.matches(r.versions, version)]
    if not rows:
        return [f"it is not built for {KIT_NAMES[toolkit][0]}"]
    return recipe.unmet(version, facts) + [f"{p} ({rows[0].why})" for p in rows[0].requires.unmet(facts)]


def rccl_prefix(data: PluginData, rocm: str, rocm_home: str) -> str:
    row = _row(data.rccl_prefix, "rocm", rocm, "rccl_prefix", RECIPE_FILE)
    return expand(row.prefix, {"rocm_home": rocm_home})


def is_system(data: PluginData, prefix: str) -> bool:
    """Whether ``prefix`` is one of the system's (``/usr``, ``/usr/local``): never given to configure."""
    def norm(path: str) -> str:
        return "/" + os.path.normpath(path).lstrip("/")
    return norm(prefix) in {norm(p) for p in data.system_prefixes}
