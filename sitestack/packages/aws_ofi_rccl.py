"""The network plugin's package knowledge: aws-ofi-rccl / aws-ofi-nccl for a ROCm or a CUDA release.

What differs per toolkit and release is data in ``sources/aws-ofi-rccl.yml``, read and checked in
:mod:`sitestack.packages.aws_ofi_rccl_rules`:

- which toolkit: ROCm (RCCL loads the plugin) where the step or task names a ROCm release or the
  site has ``facts.rocm``, else CUDA (NCCL) where it names a CUDA release or has ``facts.cuda``;
- which plugin (``data.default_for_rocm``, ``data.default_for_cuda``): the ROCm fork (cxi branch)
  before ROCm 6, aws-ofi-nccl built ``--with-rocm`` from ROCm 6 and ``--with-cuda`` for CUDA;
- whether they fit: an unknown ROCm release, a version not built for the toolkit, a plugin whose
  exported API versions the library does not load (``plugin_apis`` of sources/comm/libraries.yml; for
  NCCL where its version is given) or a toolkit release the row's ``requires`` excludes is refused before
  anything is built;
- where RCCL's headers are (``data.rccl_prefix``: the prefix must contain
  ``include/rccl/rccl.h``), which configure options each plugin has (``data.plugins``), which
  prefixes are the system's (``data.system_prefixes``): libfabric, hwloc and MPI there are left
  out of the configure line, a toolkit or RCCL prefix there is refused (:func:`refuse_system`).

Before building, the toolkit's home must hold what ``data.toolkit_files`` lists (HIP for ROCm; cuda.h
and the static cudart for CUDA) and, for the fork, RCCL's header (:class:`PluginHooks`). After
building, ``nm -D --defined-only`` must show exactly the plugin symbols the recipe lists
(:func:`symbol_checks`). The module file sets
``NCCL_NET_PLUGIN`` (and the ``NCCL_NET`` name in ``SITESTACK_NCCL_NET``) and records the interface versions the plugin offers
(``SITESTACK_NCCL_NET_PLUGIN_APIS``, :func:`module_settings`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sitestack.core.errors import SitestackError
from sitestack.core.host import Host
from sitestack.model import comm_libraries
from sitestack.model.context import RunContext
from sitestack.model.recipe import Check, ModuleSettings, Recipe
from sitestack.model.site import Facts
from sitestack.model.site import expand as site_expand
from sitestack.model.siteenv import probe_in_site_env
from sitestack.packages.aws_ofi_rccl_rules import (
    KIT_NAMES,
    Kit,
    PluginData,
    PluginRow,
    api_versions,
    choose_version,
    is_system,
    known_rocm,
    known_version,
    plugin_data,
    plugin_row,
    rccl_prefix,
    with_toolkit,
)
from sitestack.packages.hooks import InstallInfo, PackageHooks, Prepared
from sitestack.packages.package_args import PluginArgs
from sitestack.packages.shared import braces, replace_recipe, resolve_refs, site_environment

RECIPE_NAME = "aws-ofi-rccl"


@dataclass(frozen=True)
class Homes:
    """The prefixes configure is given (None: not given); ``toolkit``: the ROCm or CUDA home."""

    toolkit: str
    rccl: str | None = None
    libfabric: str | None = None
    hwloc: str | None = None
    mpi: str | None = None


def refuse_system(data: PluginData, prefix: str, what: str, option: str, how: str) -> None:
    """A prefix configure must be given (HIP, CUDA, RCCL) that is a system prefix is refused: ``-I/usr/include``
    (and aws-ofi-nccl's ``-isystem /usr/include``) breaks GCC's ``#include_next <stdlib.h>``
    (found building the plugin on Debian 12), and leaving the option out would make configure look in /opt/rocm
    instead, or (CUDA) find cuda.h but link no cudart: aws-ofi-nccl 1.18 m4/check_pkg_cuda.m4 sets CUDA_LIBS
    (-lcudart_static) only when --with-cuda names a path."""
    if is_system(data, prefix):
        raise SitestackError(f"{what} {prefix} is a system prefix: {option}={prefix} would put -I{prefix.rstrip('/')}"
                             f"/include on the compiler line, which breaks GCC's #include_next <stdlib.h>; {how}")


def resolve_homes(data: PluginData, row: PluginRow, release: str, home: str, env: Mapping[str, str], *,
                  rccl_home: str | None = None, libfabric: str | None = None, hwloc: str | None = None,
                  mpi_home: str | None = None, mpi_flavour: str | None = None,
                  pkg_prefix: Mapping[str, str | None] | None = None) -> Homes:
    """The prefixes for configure: the toolkit's ``home`` for ``release`` (ROCm or CUDA, as ``row`` is built
    for), the others as given ($VARIABLES from ``env``, the site environment), else pkg-config's
    (``pkg_prefix``), the recipe's RCCL location for the release and MPI per flavour."""
    pkg = pkg_prefix or {}
    kit = KIT_NAMES[row.toolkit][0]
    example = {"rocm": "include/ holds hip/ (like /opt/rocm-5.7.1)",
               "cuda": "include/ holds cuda.h (like /usr/local/cuda-13.0 or $NVHPC_ROOT/cuda/12.4)"}[row.toolkit]
    refuse_system(data, home, f"the {kit} home for {kit} {release}", row.toolkit_option,
                  f"give --{row.toolkit}-home a {kit} tree whose {example}")
    rccl = None
    if row.rccl_option:
        rccl = resolve_refs(rccl_home or rccl_prefix(data, release, home), env, "the RCCL prefix")
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
    return Homes(toolkit=home, rccl=rccl, libfabric=fabric, hwloc=hw, mpi=mpi)


def configure_args(data: PluginData, version: str, homes: Homes, *, tests: bool = False,
                   toolkit: Kit = "rocm") -> list[str]:
    """The site's configure options of plugin ``version`` built for ``toolkit`` (the recipe adds its own,
    e.g. --disable-tests)."""
    row = plugin_row(data, version, toolkit=toolkit)
    args = []
    if homes.libfabric and not is_system(data, homes.libfabric):
        args.append(f"--with-libfabric={homes.libfabric}")
    args.append(f"{row.toolkit_option}={homes.toolkit}")
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
                sha256: str | None = None, checks: Sequence[Check] = (), sanity: Sequence[str] = ()) -> Recipe:
    """``recipe`` with the site's configure options, the sha256 of the source used, checks, and the
    plugin row's sanity paths where it has its own (``sanity``; empty: the recipe's)."""
    source = recipe.versions[version]
    own = tuple(a for a in source.args if not (tests and a == "--disable-tests"))
    source = dataclasses.replace(source, args=own + tuple(braces(a) for a in args),
                                 sha256=sha256 or source.sha256)
    return replace_recipe(recipe, versions={**recipe.versions, version: source}, checks=(*recipe.checks, *checks),
                          sanity=tuple(sanity) or recipe.sanity)


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


def module_settings(recipe: Recipe, row: PluginRow, toolkit: Kit, release: str, version: str,
                    nccl: str | None = None) -> ModuleSettings:
    """The recipe's module settings plus the plugin's own, wired the way the stack's library opens a
    plugin (:func:`sitestack.model.comm_libraries.wiring`: RCCL of ROCm ``release``, or NCCL ``nccl``,
    every NCCL version when that is not given): the library's directory on LD_LIBRARY_PATH and, unless
    it has the library's default name, NCCL_NET_PLUGIN set to its suffix, never to a path, which RCCL
    before ROCm 6.3 and NCCL before 2.21 turn into ``lib...-net-/path.so.so`` and then silently use
    sockets. SITESTACK_NCCL_NET is the name to force it with (``NCCL_NET``); SITESTACK_NCCL_NET_PLUGIN_APIS
    and the whatis line say which plugin interface versions it offers (checked with nm after the build).
    NCCL_NET itself is not set: its name varies by plugin release, and a wrong one stops every job."""
    base = recipe.module or ModuleSettings()
    rows = (comm_libraries.loaders("rccl", rocm=release) if toolkit == "rocm"
            else comm_libraries.loaders("nccl", version=nccl))
    wired = comm_libraries.wiring(rows, "{install}/" + row.library)
    whatis = f"{(base.whatis or recipe.description).rstrip('.')}; net plugin API {api_list(row)}"
    paths = base.prepend.get("LD_LIBRARY_PATH", ())
    prepend = {**base.prepend, "LD_LIBRARY_PATH": paths if wired.directory in paths else (wired.directory, *paths)}
    plugin = {comm_libraries.PLUGIN_VARIABLE: wired.plugin_variable} if wired.plugin_variable else {}
    return dataclasses.replace(base, whatis=whatis, prepend=prepend, set={
        **base.set, **plugin, "SITESTACK_NCCL_NET": comm_libraries.net_name(recipe.name, version) or "",
        "SITESTACK_NCCL_NET_PLUGIN_APIS": api_list(row)})


def default_home(ctx: RunContext, toolkit: Kit, release: str) -> str:
    """facts.<toolkit>.home with {<toolkit>_version} set to ``release`` (placeholders of the site filled),
    else /opt/rocm-<release> (ROCm) or /usr/local/cuda-<release> (CUDA, NVIDIA's installer's default)."""
    raw = (ctx.site.raw_facts.get(toolkit) or {}).get("home") if ctx.site.raw_facts else None
    if not raw:
        return f"/opt/rocm-{release}" if toolkit == "rocm" else f"/usr/local/cuda-{release}"
    return site_expand(str(raw), {**ctx.values, f"{toolkit}_version": release})


def build_toolkit(ctx: RunContext, rocm: str | None, cuda: str | None) -> Kit:
    """ROCm or CUDA: the release given (step or task), else the site's facts.rocm, else facts.cuda."""
    if rocm and cuda:
        raise SitestackError(f"both a ROCm ({rocm}) and a CUDA ({cuda}) release given: the plugin is built for one "
                             "(--rocm for RCCL, --cuda for NCCL)")
    if rocm or cuda:
        return "rocm" if rocm else "cuda"
    if ctx.facts.rocm is not None:
        return "rocm"
    if ctx.facts.cuda is not None:
        return "cuda"
    raise SitestackError(
        f"the network plugin step ({RECIPE_NAME} recipe) on site {ctx.site.name}: {ctx.site.path} has neither "
        "facts.rocm nor facts.cuda, so there is no toolkit to build it for: add `rocm: {version: ..., home: ...}` "
        "(RCCL) or `cuda: {version: ..., home: ...}` (NCCL) under facts: in that file, or name the release in the "
        "step (package: {rocm: X} or {cuda: X}) or the task (build-rccl-plugin --rocm X, build-nccl-plugin --cuda X)")


# -- the hooks ---------------------------------------------------------------------------------------
class PluginHooks(PackageHooks):
    """The libfabric network plugin for a ROCm (RCCL) or CUDA (NCCL) release: version, dest and configure options."""

    Args = PluginArgs
    given_source = True   # its forks often have no release tarball with a known sum: --source

    @classmethod
    def site_problem(cls, facts: Facts, python: str | None, package: Mapping[str, Any] | None = None) -> str | None:
        """A stack run in a container that uses the image's own plugin (``container.net_plugin:
        container``) never loads a plugin built on the host: refused, so that provisioning neither
        builds what nobody uses nor stops on a ROCm tree that is only inside the image. A site with
        no toolkit to build for (neither facts.rocm nor facts.cuda, nor a release in ``package``) is
        refused here too, when the playbook is loaded, not when the step runs."""
        given = package or {}
        if facts.rocm is None and facts.cuda is None and not given.get("rocm") and not given.get("cuda"):
            return ("builds the network plugin, but the site has neither facts.rocm nor facts.cuda, so there is no "
                    "toolkit to build it for: add `rocm: {version: ..., home: ...}` (RCCL) or `cuda: {version: ..., "
                    "home: ...}` (NCCL) under facts:, or name the release in the step (package: {rocm: X} or "
                    "{cuda: X})")
        c = facts.container
        if facts.python.source == "container" and c is not None and c.net_plugin != "host":
            whose = "the image's own plugin" if c.net_plugin == "container" else "the plugin its runtime injects"
            return (f"builds the RCCL network plugin on the host, but the stack runs in the container with {whose} "
                    f"(facts.container.net_plugin: {c.net_plugin}), so this build would never be "
                    "loaded: remove the step, or set facts.container.net_plugin: host to use it")
        return None

    def __init__(self, ctx: RunContext, recipe: Recipe, args: Any) -> None:
        super().__init__(ctx, recipe, args)
        self.data = data = plugin_data(recipe)
        self.toolkit = kit = build_toolkit(ctx, args.rocm, args.cuda)
        facts = ctx.facts.rocm if kit == "rocm" else ctx.facts.cuda
        asked = getattr(args, kit) or (facts.version if facts else None)
        assert asked is not None   # build_toolkit found one
        if kit == "rocm":
            self.release = known_rocm(data, asked, recipe.path)
        else:
            self.release = known_version(asked, "--cuda", "13.0")
        self.nccl = nccl = args.nccl
        if nccl is not None:
            known_version(nccl, "--nccl", "2.18.3")
        home = getattr(args, f"{kit}_home") or default_home(ctx, kit, self.release)
        # The install is for this release: its placeholders ({rocm_home}, {cuda_version}, ...) and rules see it.
        self.ctx = dataclasses.replace(ctx, facts=with_toolkit(ctx.facts, kit, self.release, home))
        version = getattr(args, "version", None)
        self.version = choose_version(recipe, data, self.ctx.facts, version, ctx.site.name, toolkit=kit, nccl=nccl)
        self.row = plugin_row(data, self.version, recipe.path, kit)
        if self.row.whatis:   # the module's description, where the row's is not the recipe's
            self.recipe = replace_recipe(recipe, module=dataclasses.replace(recipe.module or ModuleSettings(),
                                                                            whatis=self.row.whatis))
        self.dest = (getattr(args, "dest", None)
                     or f"{ctx.values['prefix']}/{data.install_name}/{self.version}-{kit}-{self.release}")
        self.homes: Homes | None = None

    def install_args(self) -> Mapping[str, str | None]:
        return {"version": self.version, "dest": self.dest}

    def describe(self, info: InstallInfo) -> str:
        return f"build {info.label} ({self.row.upstream}) for {KIT_NAMES[self.toolkit][0]} {self.release} into {info.dest}"

    def prepare(self, host: Host, info: InstallInfo) -> Prepared:
        """Check the toolkit's files (and RCCL's header for the fork); the recipe with the site's configure options."""
        facts = self.ctx.facts
        home = facts.rocm if self.toolkit == "rocm" else facts.cuda
        assert home is not None   # set by __init__
        env = site_environment(host, facts)
        given = {k: getattr(self.args, k) for k in ("rccl_home", "libfabric", "hwloc", "mpi_home")}
        pkg = {name: self.pkg_prefix(host, name) for name in ("libfabric", "hwloc") if not given[name]}
        homes = resolve_homes(self.data, self.row, self.release, home.home, env, mpi_flavour=facts.mpi.flavour,
                              pkg_prefix=pkg, **given)   # a system prefix is refused before its files are looked at
        self.check_toolkit(host, home.home)
        if homes.rccl and not host.exists(f"{homes.rccl}/include/rccl/rccl.h"):
            raise SitestackError(
                f"no RCCL header {homes.rccl}/include/rccl/rccl.h for ROCm {self.release}: {self.row.upstream} includes "
                "<rccl/rccl.h> (ROCm <= 5.1 installs only <rocm>/rccl/include/rccl.h); install RCCL or give --rccl-home")
        tests = bool(self.args.tests)
        if tests and not homes.mpi:
            raise SitestackError("the plugin's tests need MPI: give --mpi-home")
        self.homes = homes
        args = configure_args(self.data, self.version, homes, tests=tests, toolkit=self.toolkit)
        return Prepared(site_recipe(self.recipe, self.version, args, tests=tests, sha256=info.source_sha256(),
                                    checks=symbol_checks(self.row), sanity=self.row.sanity))

    def check_toolkit(self, host: Host, home: str) -> None:
        """The toolkit's home holds what ``data.toolkit_files`` lists (one alternative of each entry)."""
        rows = [r for r in self.data.toolkit_files if r.toolkit == self.toolkit]
        missing = []
        for row in rows:
            for alternatives in row.files:
                found = host.probe(["bash", "-c", 'for g in "${@:2}"; do compgen -G "$1/$g" && exit 0; done; exit 1',
                                    "sitestack", home, *alternatives])
                if not found.ok:
                    missing.append(alternatives[0].replace("*", ""))
        if missing:
            what = rows[0].what if rows else "the toolkit"
            kit = KIT_NAMES[self.toolkit][0]
            raise SitestackError(f"missing {what} for {kit} {self.release} in {home}: no {', '.join(missing)} (load the "
                                 f"site's {self.toolkit} module, or give --{self.toolkit}-home)")

    def module_file(self) -> ModuleSettings:
        return module_settings(self.recipe, self.row, self.toolkit, self.release, self.version, self.nccl)

    def pkg_prefix(self, host: Host, package: str) -> str | None:
        """What pkg-config says the package's prefix is, with the site's modules loaded."""
        out = probe_in_site_env(host, self.ctx.facts, ["pkg-config", "--variable=prefix", package])
        return (out.stdout.strip() or None) if out.ok else None
