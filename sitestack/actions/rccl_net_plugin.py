"""The RCCL network plugin (aws-ofi-rccl / aws-ofi-nccl) built for a ROCm release.

The ``rccl-net-plugin`` action (and ``invoke build-rccl-plugin --rocm X``) is a recipe install of
``sources/aws-ofi-rccl.yml`` into ``<prefix>/aws-ofi-rccl/<version>-rocm-<rocm>`` plus a module
file. What differs per ROCm release is data in that recipe:

- which plugin (``data.default_for_rocm``): the ROCm fork (cxi branch) before ROCm 6,
  aws-ofi-nccl built ``--with-rocm`` from ROCm 6;
- whether they fit: an unknown ROCm release, a plugin whose exported API versions the release's
  RCCL does not load (``data.rccl_loads``) or a version the recipe's rules exclude is refused
  before anything is built;
- where RCCL's headers are (``data.rccl_prefix``: the prefix must contain
  ``include/rccl/rccl.h``), which configure options each plugin has (``data.plugins``), which
  prefixes are the system's and never passed (``data.system_prefixes``).

Before building, the host must have HIP (``include/hip/hip_runtime.h`` and libamdhip64) and, for
the fork, RCCL's header. After building, ``nm -D`` must show the symbols the recipe lists. The
module file puts the library on ``LD_LIBRARY_PATH`` and sets ``NCCL_NET_PLUGIN`` (its absolute
path) and ``NCCL_NET`` explicitly, so a missing plugin is an error in RCCL instead of a silent
fallback to sockets, plus the site's ``FI_*`` and ``NCCL_*`` settings.

Sources: the recipe's URL when its sha256 is known; else ``--source`` with a tarball or a
directory (a checkout; packed reproducibly), whose sha256 is recorded in the install's stamp and
whose tarball is kept in the source cache, so later runs need no ``--source``.
"""

from __future__ import annotations

import dataclasses
import gzip
import os
import shlex
import tarfile
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sitestack.actions.base import unified_diff
from sitestack.actions.horovod_install import resolve_refs, site_environment
from sitestack.actions.recipe_install import RecipeInstall, Target, build_plan, read_stamp
from sitestack.builders import symbolic
from sitestack.core import schema, versions
from sitestack.core.errors import SitestackError
from sitestack.core.host import Host
from sitestack.installs import sources as sources_mod
from sitestack.model.context import RunContext
from sitestack.model.recipe import Check, Recipe, expand
from sitestack.model.site import Facts, Toolkit


# -- the recipe's tables -----------------------------------------------------------------------
@dataclass(frozen=True)
class DefaultRow:
    rocm: str
    version: str
    why: str = ""


@dataclass(frozen=True)
class PluginRow:
    versions: str
    upstream: str
    hip_option: str
    library: str
    exports: tuple[str, ...]
    net_name: str
    rccl_option: str | None = None
    hwloc_option: str | None = None

    def check(self) -> str | None:
        return versions.check_spec(self.versions) and f"versions: {versions.check_spec(self.versions)}"


@dataclass(frozen=True)
class PrefixRow:
    rocm: str
    prefix: str
    why: str = ""


@dataclass(frozen=True)
class LoadsRow:
    rocm: str
    api: tuple[int, ...]
    why: str = ""


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


def _row(rows: Sequence[Any], attr: str, value: str, what: str, recipe: str) -> Any:
    for row in rows:
        if versions.matches(getattr(row, attr), value):
            return row
    raise SitestackError(f"{recipe}: no row of data.{what} covers {attr} {value}")


# -- version rules (pure) ---------------------------------------------------------------------------
def known_rocm(data: PluginData, rocm: str, recipe: str = "sources/aws-ofi-rccl.yml") -> str:
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


def plugin_row(data: PluginData, version: str, recipe: str = "sources/aws-ofi-rccl.yml") -> PluginRow:
    return _row(data.plugins, "versions", version, "plugins", recipe)


def api_versions(symbols: Sequence[str]) -> list[int]:
    return [int(s.rsplit("_v", 1)[1]) for s in symbols if "_v" in s and s.rsplit("_v", 1)[1].isdigit()]


def choose_version(recipe: Recipe, data: PluginData, facts: Facts, asked: str | None, site: str) -> str:
    """The plugin version for the site's ROCm (``facts.rocm``): ``asked`` or the default for that
    release; refused when the recipe's rules or the RCCL's plugin API do not fit."""
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
    row = _row(data.rccl_prefix, "rocm", rocm, "rccl_prefix", "sources/aws-ofi-rccl.yml")
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
    return os.path.normpath(prefix) in {os.path.normpath(p) for p in data.system_prefixes}


def resolve_homes(data: PluginData, row: PluginRow, rocm: str, rocm_home: str, env: Mapping[str, str], *,
                  rccl_home: str | None = None, libfabric: str | None = None, hwloc: str | None = None,
                  mpi_home: str | None = None, mpi_flavour: str | None = None,
                  pkg_prefix: Mapping[str, str | None] | None = None) -> Homes:
    """The prefixes for configure: as given ($VARIABLES from ``env``, the site environment), else
    pkg-config's (``pkg_prefix``), the recipe's RCCL location for the release and MPI per flavour."""
    pkg = pkg_prefix or {}
    rccl = None
    if row.rccl_option:
        rccl = resolve_refs(rccl_home or rccl_prefix(data, rocm, rocm_home), env, "the RCCL prefix")
    fabric = resolve_refs(libfabric, env, "libfabric") if libfabric else pkg.get("libfabric")
    hw = (resolve_refs(hwloc, env, "hwloc") if hwloc else pkg.get("hwloc")) if row.hwloc_option else None
    mpi = None
    if mpi_home:
        mpi = resolve_refs(mpi_home, env, "mpi_home")
    elif mpi_flavour in data.mpi_home:
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


def _braces(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


def site_recipe(recipe: Recipe, version: str, args: Sequence[str], *, tests: bool = False,
                sha256: str | None = None, checks: Sequence[Check] = ()) -> Recipe:
    """``recipe`` with the site's configure options, the sha256 of the source used, and checks."""
    source = recipe.versions[version]
    own = tuple(a for a in source.args if not (tests and a == "--disable-tests"))
    source = dataclasses.replace(source, args=own + tuple(_braces(a) for a in args),
                                 sha256=sha256 or source.sha256)
    new = dataclasses.replace(recipe, versions={**recipe.versions, version: source},
                              checks=(*recipe.checks, *checks))
    object.__setattr__(new, "path", recipe.path)
    object.__setattr__(new, "patch_dir", recipe.patch_dir)
    return new


def symbol_checks(row: PluginRow) -> list[Check]:
    """``nm -D`` of the installed library must list each exported plugin symbol."""
    return [Check(name=f"exports {sym}", run=("nm", "-D", "--defined-only", "{install}/" + row.library),
                  expect=f" {sym}\n") for sym in row.exports]


def configure_line(recipe: Recipe, facts: Facts, version: str, homes: Homes, dest: str, *,
                   tests: bool = False) -> str:
    """The exact configure command for ``version`` (build dirs as $SRC etc.): what golden tests pin."""
    data = plugin_data(recipe)
    full = site_recipe(recipe, version, configure_args(data, version, homes, tests=tests), tests=tests,
                       sha256="0" * 64)
    target = Target(full, version, facts, dest, os.path.dirname(dest), facts.python.executable)
    (command,) = [c for c in build_plan(target, symbolic(dest), has_configure=False) if c.phase == "configure"]
    return shlex.join(command.argv)


# -- module file (rendered by the module-file templates: modulefiles/net-plugin.<fmt>.j2) ------------
def module_settings(recipe: Recipe, row: PluginRow) -> Any:
    """The recipe's module settings plus the plugin's own: NCCL_NET_PLUGIN (the library's absolute
    path) and NCCL_NET, so that RCCL fails instead of falling back to sockets when it cannot load it."""
    from sitestack.model.recipe import ModuleSettings

    base = recipe.module or ModuleSettings()
    return dataclasses.replace(base, set={**base.set, "NCCL_NET_PLUGIN": "{install}/" + row.library,
                                          "NCCL_NET": row.net_name})


def module_spec(ctx: RunContext, recipe: Recipe, row: PluginRow, version: str, dest: str, values: Mapping[str, str]):
    """The plugin's module (name/version = <recipe>/<basename of dest>), with the site's FI_* and NCCL_*."""
    from sitestack.actions.modulefiles import package_module
    from sitestack.actions.stack_venv import Built

    built = Built(recipe=recipe.name, version=version, dest=dest, description=recipe.description,
                  homepage=recipe.homepage, settings=module_settings(recipe, row), values=values, installed=True)
    return package_module(ctx, built)


# -- sources given as a directory ------------------------------------------------------------------
def pack_dir(directory: Path, name: str, out_dir: Path) -> Path:
    """A reproducible tar.gz of ``directory`` (sorted, no owners, mtime 0) named ``name``."""
    directory = Path(directory).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / name
    top = directory.name

    def reset(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mtime = 0
        return info

    with open(out, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.GNU_FORMAT) as tar:
        tar.add(directory, arcname=top, recursive=False, filter=reset)
        for root, dirs, files in os.walk(directory):
            dirs.sort()
            for entry in sorted(dirs + files):
                path = Path(root) / entry
                tar.add(path, arcname=f"{top}/{path.relative_to(directory)}", recursive=False, filter=reset)
    return out


# -- the action ---------------------------------------------------------------------------------------
class RcclNetPlugin(RecipeInstall):
    """The RCCL libfabric network plugin for a ROCm release, with its module file."""

    action = "rccl-net-plugin"

    @dataclass(frozen=True)
    class Args:
        rocm: str | None = field(default=None, metadata={"doc": "ROCm release to build for (default: facts.rocm.version)"})
        rocm_home: str | None = field(default=None, metadata={"doc": (
            "ROCm/HIP prefix (default: facts.rocm.home for that release, else /opt/rocm-<rocm>)")})
        version: str | None = field(default=None, metadata={"doc": "plugin version (default: the recipe's choice for the ROCm release)"})
        rccl_home: str | None = field(default=None, metadata={"doc": (
            "prefix with include/rccl/rccl.h, for an RCCL outside ROCm (default: from the ROCm release)")})
        libfabric: str | None = field(default=None, metadata={"doc": (
            "libfabric prefix (may use $VARIABLES of the site modules; default: pkg-config's; system prefixes are not passed)")})
        hwloc: str | None = field(default=None, metadata={"doc": "hwloc prefix (aws-ofi-nccl; default: pkg-config's)"})
        mpi_home: str | None = field(default=None, metadata={"doc": (
            "MPI prefix for --with-mpi (default: the recipe's per MPI flavour, e.g. $MPICH_DIR on Cray)")})
        tests: bool = field(default=False, metadata={"doc": "build the plugin's MPI test programs too"})
        dest: str | None = field(default=None, metadata={"doc": "install prefix (default: {prefix}/aws-ofi-rccl/<version>-rocm-<rocm>)"})
        mirror: str | None = field(default=None, metadata={"doc": "controller directory with source tarballs (air-gapped sites)"})
        recipe: str = field(default="aws-ofi-rccl", metadata={"doc": "recipe name (sources/<recipe>.yml)"})

    def __init__(self, spec: Any, args: Any, ctx: RunContext) -> None:
        from sitestack.model.recipe import load_recipe

        options = ctx.options
        sources_dir = options.sources_dir
        recipe = load_recipe(args.recipe, Path(sources_dir) if sources_dir else None)
        data = plugin_data(recipe)
        rocm = options.rocm or args.rocm or (ctx.facts.rocm.version if ctx.facts.rocm else None)
        if not rocm:
            raise SitestackError(f"site {ctx.site.name} has no facts.rocm: say which ROCm release to build for (--rocm)")
        rocm = known_rocm(data, rocm, recipe.path)
        home = options.rocm_home or args.rocm_home or default_rocm_home(ctx, rocm)
        facts = dataclasses.replace(ctx.facts, rocm=Toolkit(version=rocm, home=home))
        ctx = dataclasses.replace(ctx, facts=facts)
        version = choose_version(recipe, data, facts, options.plugin_version or args.version, ctx.site.name)
        dest = args.dest or f"{ctx.values['prefix']}/{data.install_name}/{version}-rocm-{rocm}"
        base = RecipeInstall.Args(recipe=args.recipe, version=version, dest=dest, mirror=args.mirror)
        super().__init__(spec, base, ctx)
        self.plugin_args = args
        self.data = data
        self.rocm = rocm
        self.row = plugin_row(data, version, recipe.path)
        self.base_recipe = self.recipe
        self.spec = module_spec(self.ctx, recipe, self.row, version, self.target.dest,
                                self.target.values(install=self.target.dest))
        root = str(ctx.resolved.get("modules", {}).get("install_root") or f"{ctx.values['prefix']}/modules")
        self.module_path = f"{root}/{self.spec.relpath(facts.modules.format)}"
        self._prepared = False
        self._packed: Path | None = None

    def describe(self) -> str:
        return f"build {self.target.label} ({self.row.upstream}) for ROCm {self.rocm} into {self.target.dest}"

    # -- Step ---------------------------------------------------------------------------------------
    def pending(self, host: Host) -> str | None:
        self.prepare(host)
        reason = super().pending(host)
        if reason:
            return reason
        current = host.read_text(self.module_path)
        if current is None:
            return f"module file {self.module_path} missing"
        return None if current == self.module_file() else f"module file {self.module_path} differs"

    def diff(self, host: Host) -> str | None:
        return unified_diff(host.read_text(self.module_path), self.module_file(), self.module_path)

    def apply(self, host: Host) -> None:
        self.prepare(host)
        if self._packed is not None or self.options.source:
            self.keep_source()
        super().apply(host)
        host.run(["mkdir", "-p", os.path.dirname(self.module_path)])
        host.write_text(self.module_path, self.module_file(), 0o644)

    # -- the site's part ---------------------------------------------------------------------------------
    def module_file(self) -> str:
        from sitestack.actions.modulefiles import render

        return render(self.spec, self.ctx.facts.modules.format)

    def prepare(self, host: Host) -> None:
        if self._prepared:
            return
        facts, args = self.ctx.facts, self.plugin_args
        home = facts.rocm.home
        missing_hip = [p for p in ("include/hip/hip_runtime.h",) if not host.exists(f"{home}/{p}")]
        libs = host.probe(["bash", "-c", 'compgen -G "$1/lib/libamdhip64.so*" || compgen -G "$1/lib64/libamdhip64.so*" '
                           '|| compgen -G "$1/lib/*-linux-gnu/libamdhip64.so*"', "sitestack", home])
        if missing_hip or not libs.ok:
            what = ", ".join(missing_hip + ([] if libs.ok else ["libamdhip64.so"]))
            raise SitestackError(f"missing HIP for ROCm {self.rocm} in {home}: no {what} (load the site's rocm module, "
                                 "or give --rocm-home)")
        env = site_environment(host, facts)
        given = {k: getattr(self.options, k) or getattr(args, k) for k in ("rccl_home", "libfabric", "hwloc", "mpi_home")}
        pkg = {name: self.pkg_prefix(host, name) for name in ("libfabric", "hwloc") if not given[name]}
        homes = resolve_homes(self.data, self.row, self.rocm, home, env, mpi_flavour=facts.mpi.flavour,
                              pkg_prefix=pkg, **given)
        if homes.rccl and not host.exists(f"{homes.rccl}/include/rccl/rccl.h"):
            raise SitestackError(
                f"no RCCL header {homes.rccl}/include/rccl/rccl.h for ROCm {self.rocm}: {self.row.upstream} includes "
                "<rccl/rccl.h> (ROCm <= 5.1 installs only <rocm>/rccl/include/rccl.h); install RCCL or give --rccl-home")
        mpi = homes.mpi
        tests = bool(self.options.tests or args.tests)
        if tests and not mpi:
            raise SitestackError("the plugin's tests need MPI: give --mpi-home")
        sha = self.source_sha(host)
        recipe = site_recipe(self.base_recipe, self.version, configure_args(self.data, self.version, homes, tests=tests),
                             tests=tests, sha256=sha, checks=symbol_checks(self.row))
        self.recipe = recipe
        self.target = dataclasses.replace(self.target, recipe=recipe)
        self.homes = homes
        self._prepared = True

    def pkg_prefix(self, host: Host, package: str) -> str | None:
        """What pkg-config says the package's prefix is, with the site's modules loaded."""
        from sitestack.model.siteenv import probe_in_site_env
        out = probe_in_site_env(host, self.ctx.facts, ["pkg-config", "--variable=prefix", package])
        return (out.stdout.strip() or None) if out.ok else None

    def source_sha(self, host: Host) -> str | None:
        """The sha256 of the source to build: the recipe's, else that of --source, else the installed one."""
        known = self.base_recipe.versions[self.version].sha256
        source = self.options.source
        if source:
            path = Path(source)
            if path.is_dir():
                self._packed = pack_dir(path, sources_mod.filename_of(self.base_recipe, self.version),
                                        Path(tempfile.mkdtemp(prefix="sitestack-source-")))
                self.options = dataclasses.replace(self.options, source=str(self._packed))
                path = self._packed
            elif not path.is_file():
                raise SitestackError(f"--source {source}: no such file or directory")
            return known or sources_mod.sha256_file(path)
        if known:
            return known
        stamp = read_stamp(host, self.target.dest) or {}
        installed = stamp.get("inputs", {}).get("build", {}).get("source", {}).get("sha256")
        if installed:
            return installed
        url = sources_mod.url_of(self.base_recipe, self.version)
        raise SitestackError(f"{self.base_recipe.path} has no sha256 for {self.target.label} ({url}): pass the tarball "
                             f"or a checkout with --source, or check it (`invoke checksum {url}`) and write its sha256 "
                             "into the recipe")

    def keep_source(self) -> None:
        """Keep the --source tarball in the controller's source cache under its sha256."""
        source = Path(self.options.source or "")
        sha = self.recipe.versions[self.version].sha256
        if not sha or sources_mod.sha256_file(source) != sha:
            return   # a mismatch is refused by fetch, with both sums
        cached = sources_mod.cache_dir() / sha / sources_mod.filename_of(self.base_recipe, self.version)
        if not cached.is_file():
            sources_mod._store(source, cached)


def default_rocm_home(ctx: RunContext, rocm: str) -> str:
    """facts.rocm.home with {rocm_version} set to ``rocm`` (placeholders of the site filled), else /opt/rocm-<rocm>."""
    raw = (ctx.site.raw_facts.get("rocm") or {}).get("home") if ctx.site.raw_facts else None
    if not raw:
        return f"/opt/rocm-{rocm}"
    from sitestack.model.site import expand as site_expand
    return site_expand(str(raw), {**ctx.values, "rocm_version": rocm})
