"""The RCCL network plugin's package knowledge (aws-ofi-rccl / aws-ofi-nccl for a ROCm release).

What differs per ROCm release is data in ``sources/aws-ofi-rccl.yml``:

- which plugin (``data.default_for_rocm``): the ROCm fork (cxi branch) before ROCm 6,
  aws-ofi-nccl built ``--with-rocm`` from ROCm 6;
- whether they fit: an unknown ROCm release, a plugin whose exported API versions the release's
  RCCL does not load (``data.rccl_loads``) or a version the recipe's rules exclude is refused
  before anything is built;
- where RCCL's headers are (``data.rccl_prefix``: the prefix must contain
  ``include/rccl/rccl.h``), which configure options each plugin has (``data.plugins``), which
  prefixes are the system's (``data.system_prefixes``): libfabric, hwloc and MPI there are left
  out of the configure line, a ROCm or RCCL prefix there is refused (:func:`refuse_system`).

Before building, the host must have HIP (``include/hip/hip_runtime.h`` and libamdhip64) and, for
the fork, RCCL's header (:class:`PluginHooks`). After building, ``nm -D --defined-only`` must show
exactly the plugin symbols the recipe lists (:func:`symbol_checks`). The module file wires the plugin the
way the release's RCCL opens one (``sources/comm/libraries.yml``), names the ``NCCL_NET`` name in
``SITESTACK_NCCL_NET`` and records the interface versions the plugin offers
(``SITESTACK_NCCL_NET_PLUGIN_APIS``, :func:`module_settings`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sitestack.core import schema, versions
from sitestack.core.errors import SitestackError
from sitestack.core.host import Host
from sitestack.model import comm_libraries
from sitestack.model.context import RunContext
from sitestack.model.recipe import Check, ModuleSettings, Recipe, expand
from sitestack.model.site import Facts, Toolkit
from sitestack.model.site import expand as site_expand
from sitestack.model.siteenv import probe_in_site_env
from sitestack.packages.hooks import InstallInfo, PackageHooks, Prepared
from sitestack.packages.shared import braces, replace_recipe, resolve_refs, site_environment

RECIPE_FILE = "sources/aws-ofi-rccl.yml"
R = TypeVar("R")


# -- the recipe's tables -----------------------------------------------------------------------
@dataclass(frozen=True)
class RocmRow:
    """A row of a per-ROCm-release table: the releases it covers (a version range) and why."""

    rocm: str
    why: str = ""


@dataclass(frozen=True, kw_only=True)
class DefaultRow(RocmRow):
    version: str          # the plugin version built for those releases


@dataclass(frozen=True, kw_only=True)
class PrefixRow(RocmRow):
    prefix: str           # where their RCCL's include/rccl/rccl.h is ({rocm_home} placeholder)


@dataclass(frozen=True, kw_only=True)
class LoadsRow(RocmRow):
    api: tuple[int, ...]  # the net plugin API versions their RCCL loads


@dataclass(frozen=True)
class PluginRow:
    versions: str
    upstream: str
    hip_option: str
    library: str
    exports: tuple[str, ...]
    rccl_option: str | None = None
    hwloc_option: str | None = None

    def check(self) -> str | None:
        return versions.check_spec(self.versions) and f"versions: {versions.check_spec(self.versions)}"


@dataclass(frozen=True)
class PluginData:
    """``data:`` of sources/aws-ofi-rccl.yml."""

    install_name: str
    default_for_rocm: tuple[DefaultRow, ...]
    plugins: tuple[PluginRow, ...]
    rocm_releases: tuple[str, ...]
    rccl_prefix: tuple[PrefixRow, ...]
    rccl_loads: tuple[LoadsRow, ...]
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


# -- version rules (pure) ---------------------------------------------------------------------------
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


def plugin_row(data: PluginData, version: str, recipe: str = RECIPE_FILE) -> PluginRow:
    return _row(data.plugins, "versions", version, "plugins", recipe)


def api_versions(symbols: Sequence[str]) -> list[int]:
    return [int(s.rsplit("_v", 1)[1]) for s in symbols if "_v" in s and s.rsplit("_v", 1)[1].isdigit()]


def choose_version(recipe: Recipe, data: PluginData, facts: Facts, asked: str | None, site: str) -> str:
    """The plugin version for the site's ROCm (``facts.rocm``): ``asked`` or the default for that
    release; refused when the recipe's rules or the RCCL's plugin API do not fit."""
    if facts.rocm is None:
        raise SitestackError(f"site {site} has no facts.rocm: say which ROCm release to build for (--rocm)")
    rocm = facts.rocm.version
    version = asked or _row(data.default_for_rocm, "rocm", rocm, "default_for_rocm", recipe.path).version
    if version not in recipe.versions:
        raise SitestackError(f"unknown version {version!r} of {recipe.name} (known versions in {recipe.path}: "
                             f"{', '.join(recipe.known_versions())})")
    row = plugin_row(data, version, recipe.path)
    problems = recipe.unmet(version, facts)
    loads = _row(data.rccl_loads, "rocm", rocm, "rccl_loads", recipe.path)
    if not set(api_versions(row.exports)) & set(loads.api):
        problems.append(f"it exports plugin API {', '.join(f'v{v}' for v in api_versions(row.exports))} and the RCCL "
                        f"of ROCm {rocm} loads {', '.join(f'v{v}' for v in loads.api)} ({loads.why})")
    if problems:
        fits = [v for v in recipe.known_versions() if not recipe.unmet(v, facts)]
        hint = f"versions that fit ROCm {rocm}: {', '.join(fits)}" if fits else f"no known version fits ROCm {rocm}"
        raise SitestackError(f"{recipe.name} {version} ({row.upstream}) does not fit ROCm {rocm} on {site}: "
                             f"{'; '.join(problems)}. {hint}")
    return version


def rccl_prefix(data: PluginData, rocm: str, rocm_home: str) -> str:
    row = _row(data.rccl_prefix, "rocm", rocm, "rccl_prefix", RECIPE_FILE)
    return expand(row.prefix, {"rocm_home": rocm_home})


@dataclass(frozen=True)
class Homes:
    """The prefixes configure is given (None: not given)."""

    rocm: str
    rccl: str | None = None
    libfabric: str | None = None
    hwloc: str | None = None
    mpi: str | None = None


def is_system(data: PluginData, prefix: str) -> bool:
    """Whether ``prefix`` is one of the system's (``/usr``, ``/usr/local``): never given to configure."""
    def norm(path: str) -> str:
        return "/" + os.path.normpath(path).lstrip("/")
    return norm(prefix) in {norm(p) for p in data.system_prefixes}


def refuse_system(data: PluginData, prefix: str, what: str, option: str, how: str) -> None:
    """A prefix configure must be given (HIP, RCCL) that is a system prefix is refused: ``-I/usr/include``
    (and aws-ofi-nccl's ``-isystem /usr/include``) breaks GCC's ``#include_next <stdlib.h>``
    (found building the plugin on Debian 12), and leaving the option out would make configure look in /opt/rocm instead."""
    if is_system(data, prefix):
        raise SitestackError(f"{what} {prefix} is a system prefix: {option}={prefix} would put -I{prefix.rstrip('/')}"
                             f"/include on the compiler line, which breaks GCC's #include_next <stdlib.h>; {how}")


def resolve_homes(data: PluginData, row: PluginRow, rocm: str, rocm_home: str, env: Mapping[str, str], *,
                  rccl_home: str | None = None, libfabric: str | None = None, hwloc: str | None = None,
                  mpi_home: str | None = None, mpi_flavour: str | None = None,
                  pkg_prefix: Mapping[str, str | None] | None = None) -> Homes:
    """The prefixes for configure: as given ($VARIABLES from ``env``, the site environment), else
    pkg-config's (``pkg_prefix``), the recipe's RCCL location for the release and MPI per flavour."""
    pkg = pkg_prefix or {}
    refuse_system(data, rocm_home, f"the ROCm home for ROCm {rocm}", row.hip_option,
                  "give --rocm-home a ROCm tree whose include/ holds hip/ (like /opt/rocm-5.7.1)")
    rccl = None
    if row.rccl_option:
        rccl = resolve_refs(rccl_home or rccl_prefix(data, rocm, rocm_home), env, "the RCCL prefix")
        refuse_system(data, rccl, "the RCCL prefix", row.rccl_option,
                      "give --rccl-home a tree whose include/ holds only rccl/")
    fabric = resolve_refs(libfabric, env, "libfabric") if libfabric else pkg.get("libfabric")
    hw = (resolve_refs(hwloc, env, "hwloc") if hwloc else pkg.get("hwloc")) if row.hwloc_option else None
    mpi = None
    if mpi_home:
        mpi = resolve_refs(mpi_home, env, "mpi_home")
    elif mpi_flavour is not None and mpi_flavour in data.mpi_home:
        try:
            mpi = resolve_refs(data.mpi_home[mpi_flavour], env, "the MPI prefix")
        except SitestackError:
            mpi = None    # only the plugin's tests need it
    return Homes(rocm=rocm_home, rccl=rccl, libfabric=fabric, hwloc=hw, mpi=mpi)


def configure_args(data: PluginData, version: str, homes: Homes, *, tests: bool = False) -> list[str]:
    """The site's configure options of plugin ``version`` (the recipe adds its own, e.g. --disable-tests)."""
    row = plugin_row(data, version)
    args = []
    if homes.libfabric and not is_system(data, homes.libfabric):
        args.append(f"--with-libfabric={homes.libfabric}")
    args.append(f"{row.hip_option}={homes.rocm}")
    if row.rccl_option and homes.rccl:
        args.append(f"{row.rccl_option}={homes.rccl}")
    if row.hwloc_option and homes.hwloc and not is_system(data, homes.hwloc):
        args.append(f"{row.hwloc_option}={homes.hwloc}")
    if homes.mpi and not is_system(data, homes.mpi):
        args.append(f"--with-mpi={homes.mpi}")
    if tests:
        args.append("--enable-tests")
    return args


def site_recipe(recipe: Recipe, version: str, args: Sequence[str], *, tests: bool = False,
                sha256: str | None = None, checks: Sequence[Check] = ()) -> Recipe:
    """``recipe`` with the site's configure options, the sha256 of the source used, and checks."""
    source = recipe.versions[version]
    own = tuple(a for a in source.args if not (tests and a == "--disable-tests"))
    source = dataclasses.replace(source, args=own + tuple(braces(a) for a in args),
                                 sha256=sha256 or source.sha256)
    return replace_recipe(recipe, versions={**recipe.versions, version: source}, checks=(*recipe.checks, *checks))


#: Prints the plugin interface symbols a library exports, sorted, framed as ``exports: A B.`` so that
#: ``expect`` matches the whole set (no braces: check arguments are expanded as placeholders).
EXPORTS_SCRIPT = ("printf 'exports: %s.\\n' \"$(nm -D --defined-only \"$1\" "
                  "| sed -n 's/^.* \\(ncclNetPlugin_v[0-9][0-9]*\\)$/\\1/p' | sort -V | tr '\\n' ' ' | sed 's/ $//')\"")


def symbol_checks(row: PluginRow) -> list[Check]:
    """``nm -D --defined-only`` of the installed library must list exactly the plugin interface
    versions the recipe says the version exports: a missing one, or one more than RCCL is known to
    load, fails the install before it is put in place."""
    exports = " ".join(sorted(row.exports, key=lambda s: api_versions([s]) or [0]))
    return [Check(name=f"exports exactly {exports}", run=("sh", "-c", EXPORTS_SCRIPT, "sitestack", "{install}/" + row.library),
                  expect=f"exports: {exports}.")]


def api_list(row: PluginRow) -> str:
    """The plugin interface versions ``row`` offers, as the module file records them (``v2,v3``)."""
    return ",".join(f"v{v}" for v in api_versions(row.exports))


def module_settings(recipe: Recipe, row: PluginRow, rocm: str, version: str) -> ModuleSettings:
    """The recipe's module settings plus the plugin's own, wired the way the RCCL of ROCm ``rocm`` opens
    a plugin (:func:`sitestack.model.comm_libraries.wiring`): the library's directory on LD_LIBRARY_PATH
    and, unless it has RCCL's default name, NCCL_NET_PLUGIN set to its suffix, never to a path, which
    RCCL before ROCm 6.3 turns into ``librccl-net-/path.so.so`` and then silently uses sockets.
    SITESTACK_NCCL_NET is the name to force it with (``NCCL_NET``) between nodes;
    SITESTACK_NCCL_NET_PLUGIN_APIS and the whatis line say which plugin interface versions it offers
    (checked with nm after the build). NCCL_NET itself is not set: on one node the plugin is opened but
    not used, and a forced network then stops every single-node job."""
    base = recipe.module or ModuleSettings()
    wired = comm_libraries.wiring(comm_libraries.loaders("rccl", rocm=rocm), "{install}/" + row.library)
    whatis = f"{(base.whatis or recipe.description).rstrip('.')}; net plugin API {api_list(row)}"
    paths = base.prepend.get("LD_LIBRARY_PATH", ())
    prepend = {**base.prepend, "LD_LIBRARY_PATH": paths if wired.directory in paths else (wired.directory, *paths)}
    plugin = {comm_libraries.PLUGIN_VARIABLE: wired.plugin_variable} if wired.plugin_variable else {}
    return dataclasses.replace(base, whatis=whatis, prepend=prepend, set={
        **base.set, **plugin, "SITESTACK_NCCL_NET": comm_libraries.net_name(recipe.name, version) or "",
        "SITESTACK_NCCL_NET_PLUGIN_APIS": api_list(row)})


def default_rocm_home(ctx: RunContext, rocm: str) -> str:
    """facts.rocm.home with {rocm_version} set to ``rocm`` (placeholders of the site filled), else /opt/rocm-<rocm>."""
    raw = (ctx.site.raw_facts.get("rocm") or {}).get("home") if ctx.site.raw_facts else None
    if not raw:
        return f"/opt/rocm-{rocm}"
    return site_expand(str(raw), {**ctx.values, "rocm_version": rocm})



# -- the hooks ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PluginArgs:
    """The step arguments the plugin adds to a recipe install."""

    rocm: str | None = field(default=None, metadata={"doc": "ROCm release to build for (default: facts.rocm.version)"})
    rocm_home: str | None = field(default=None, metadata={"doc": (
        "ROCm/HIP prefix (default: facts.rocm.home for that release, else /opt/rocm-<rocm>)")})
    rccl_home: str | None = field(default=None, metadata={"doc": (
        "prefix with include/rccl/rccl.h, for an RCCL outside ROCm (default: from the ROCm release)")})
    libfabric: str | None = field(default=None, metadata={"doc": (
        "libfabric prefix (may use $VARIABLES of the site modules; default: pkg-config's; system prefixes are not passed)")})
    hwloc: str | None = field(default=None, metadata={"doc": "hwloc prefix (aws-ofi-nccl; default: pkg-config's)"})
    mpi_home: str | None = field(default=None, metadata={"doc": (
        "MPI prefix for --with-mpi (default: the recipe's per MPI flavour, e.g. $MPICH_DIR on Cray)")})
    tests: bool = field(default=False, metadata={"doc": "build the plugin's MPI test programs too"})


class PluginHooks(PackageHooks):
    """The RCCL libfabric network plugin for a ROCm release: version, dest and configure options."""

    Args = PluginArgs
    given_source = True   # its forks often have no release tarball with a known sum: --source

    @classmethod
    def site_problem(cls, facts: Facts, python: str | None) -> str | None:
        """A stack run in a container that uses the image's own plugin (``container.net_plugin:
        container``) never loads a plugin built on the host: refused, so that provisioning neither
        builds what nobody uses nor stops on a ROCm tree that is only inside the image."""
        c = facts.container
        if facts.python.source == "container" and c is not None and c.net_plugin == "container":
            return ("builds the RCCL network plugin on the host, but the stack runs in the container with the "
                    "image's own plugin (facts.container.net_plugin: container), so this build would never be "
                    "loaded: remove the step, or set facts.container.net_plugin: host to use it")
        return None

    def __init__(self, ctx: RunContext, recipe: Recipe, args: Any) -> None:
        super().__init__(ctx, recipe, args)
        self.data = data = plugin_data(recipe)
        rocm = self.option("rocm") or (ctx.facts.rocm.version if ctx.facts.rocm else None)
        if not rocm:
            raise SitestackError(f"site {ctx.site.name} has no facts.rocm: say which ROCm release to build for (--rocm)")
        self.rocm = rocm = known_rocm(data, rocm, recipe.path)
        home = self.option("rocm_home") or default_rocm_home(ctx, rocm)
        # The install is for this release: its placeholders ({rocm_home}, {rocm_version}) and rules see it.
        self.ctx = dataclasses.replace(ctx, facts=dataclasses.replace(ctx.facts, rocm=Toolkit(version=rocm, home=home)))
        asked = ctx.options.plugin_version or getattr(args, "version", None)
        self.version = choose_version(recipe, data, self.ctx.facts, asked, ctx.site.name)
        self.row = plugin_row(data, self.version, recipe.path)
        self.dest = getattr(args, "dest", None) or f"{ctx.values['prefix']}/{data.install_name}/{self.version}-rocm-{rocm}"
        self.homes: Homes | None = None

    def install_args(self) -> Mapping[str, str | None]:
        return {"version": self.version, "dest": self.dest}

    def describe(self, info: InstallInfo) -> str:
        return f"build {info.label} ({self.row.upstream}) for ROCm {self.rocm} into {info.dest}"

    def prepare(self, host: Host, info: InstallInfo) -> Prepared:
        """Check HIP (and RCCL's header for the fork); the recipe with the site's configure options."""
        facts = self.ctx.facts
        assert facts.rocm is not None   # set by __init__
        home = facts.rocm.home
        missing_hip = [p for p in ("include/hip/hip_runtime.h",) if not host.exists(f"{home}/{p}")]
        libs = host.probe(["bash", "-c", 'compgen -G "$1/lib/libamdhip64.so*" || compgen -G "$1/lib64/libamdhip64.so*" '
                           '|| compgen -G "$1/lib/*-linux-gnu/libamdhip64.so*"', "sitestack", home])
        if missing_hip or not libs.ok:
            what = ", ".join(missing_hip + ([] if libs.ok else ["libamdhip64.so"]))
            raise SitestackError(f"missing HIP for ROCm {self.rocm} in {home}: no {what} (load the site's rocm module, "
                                 "or give --rocm-home)")
        env = site_environment(host, facts)
        given = {k: self.option(k) for k in ("rccl_home", "libfabric", "hwloc", "mpi_home")}
        pkg = {name: self.pkg_prefix(host, name) for name in ("libfabric", "hwloc") if not given[name]}
        homes = resolve_homes(self.data, self.row, self.rocm, home, env, mpi_flavour=facts.mpi.flavour,
                              pkg_prefix=pkg, **given)
        if homes.rccl and not host.exists(f"{homes.rccl}/include/rccl/rccl.h"):
            raise SitestackError(
                f"no RCCL header {homes.rccl}/include/rccl/rccl.h for ROCm {self.rocm}: {self.row.upstream} includes "
                "<rccl/rccl.h> (ROCm <= 5.1 installs only <rocm>/rccl/include/rccl.h); install RCCL or give --rccl-home")
        tests = bool(self.option("tests"))
        if tests and not homes.mpi:
            raise SitestackError("the plugin's tests need MPI: give --mpi-home")
        self.homes = homes
        args = configure_args(self.data, self.version, homes, tests=tests)
        return Prepared(site_recipe(self.recipe, self.version, args, tests=tests, sha256=info.source_sha256(),
                                    checks=symbol_checks(self.row)))

    def module_file(self) -> ModuleSettings:
        return module_settings(self.recipe, self.row, self.rocm, self.version)

    def pkg_prefix(self, host: Host, package: str) -> str | None:
        """What pkg-config says the package's prefix is, with the site's modules loaded."""
        out = probe_in_site_env(host, self.ctx.facts, ["pkg-config", "--variable=prefix", package])
        return (out.stdout.strip() or None) if out.ok else None
