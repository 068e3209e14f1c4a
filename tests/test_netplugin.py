"""The RCCL network plugin: version rules, golden configure lines for LUMI and Frontier, refusals.

The real upstream plugins are built in tests/test_netplugin_build.py.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import tarfile
from pathlib import Path

import pytest

from sitestack.builders import symbolic
from sitestack.core.errors import SitestackError
from sitestack.core.paths import PLAYBOOK_DIR
from sitestack.engine import playbook as pb
from sitestack.installs.given_source import pack_dir
from sitestack.installs.target import Target, build_plan
from sitestack.model.recipe import Recipe, load_recipe
from sitestack.model.site import Facts, Toolkit, expand
from sitestack.packages.aws_ofi_rccl import Homes, configure_args, module_settings, resolve_homes, site_recipe
from sitestack.packages.aws_ofi_rccl_rules import choose_version, known_rocm, plugin_data, plugin_row, rccl_prefix
from tests.twins.rocm import make_rocm

GOLDEN = Path(__file__).parent / "golden" / "netplugin"
# What the cray-mpich module sets on each site that builds the plugin (the golden lines are for these).
# LUMI builds none: its stack uses the plugin inside its container (playbooks/lumi.yml).
SITE_ENV = {
    "frontier": {"MPICH_DIR": "/opt/cray/pe/mpich/8.1.28/ofi/gnu/12.3"},
}
ROCMS = ["5.6.1", "5.7.1", "6.2.4", "7.0"]


@pytest.fixture(scope="module")
def recipe():
    return load_recipe("aws-ofi-rccl")


@pytest.fixture(scope="module")
def data(recipe):
    return plugin_data(recipe)


def configure_line(recipe: Recipe, facts: Facts, version: str, homes: Homes, dest: str, *,
                   tests: bool = False) -> str:
    """The exact configure command for ``version`` (build dirs as $SRC etc.): what the golden files pin."""
    data = plugin_data(recipe)
    full = site_recipe(recipe, version, configure_args(data, version, homes, tests=tests), tests=tests,
                       sha256="0" * 64)
    target = Target(full, version, facts, dest, os.path.dirname(dest), facts.python.executable)
    (command,) = [c for c in build_plan(target, symbolic(dest), has_configure=False) if c.phase == "configure"]
    return shlex.join(command.argv)


def site_facts(site: str, rocm: str):
    loaded = pb.load(site)
    values = loaded.placeholder_values(home="/home/user", user="user", account="project_465000123", prefix=None)
    home = expand(str(loaded.raw_facts["rocm"]["home"]), {**values, "rocm_version": rocm})
    return loaded, values, dataclasses.replace(loaded.facts, rocm=Toolkit(version=rocm, home=home))


def configure_for(site: str, rocm: str) -> str:
    recipe = load_recipe("aws-ofi-rccl")
    data = plugin_data(recipe)
    rocm = known_rocm(data, rocm)
    loaded, values, facts = site_facts(site, rocm)
    step = next(s for s in loaded.steps if s.action == "recipe-install" and s.args["recipe"] == "aws-ofi-rccl")
    package = step.args["package"]
    version = choose_version(recipe, data, facts, None, site)
    row = plugin_row(data, version)
    homes = resolve_homes(data, row, rocm, facts.rocm.home, SITE_ENV[site], mpi_flavour=facts.mpi.flavour,
                          pkg_prefix={"hwloc": "/usr"}, libfabric=package.get("libfabric"),
                          mpi_home=package.get("mpi_home"))
    dest = f"{values['prefix']}/aws-ofi-rccl/{version}-rocm-{rocm}"
    return configure_line(recipe, facts, version, homes, dest)


@pytest.mark.parametrize("site", sorted(SITE_ENV))
@pytest.mark.parametrize("rocm", ROCMS)
def test_golden_configure_lines(site, rocm):
    line = configure_for(site, rocm) + "\n"
    golden = GOLDEN / f"{site}-rocm-{rocm}.txt"
    if os.environ.get("SITESTACK_UPDATE_GOLDEN"):
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(line)
    assert line == golden.read_text(), f"configure line for {site} ROCm {rocm} changed; review and rerun with SITESTACK_UPDATE_GOLDEN=1"


def test_the_golden_lines_say_what_the_rules_say():
    fork = configure_for("frontier", "5.7.1")
    assert fork == ("'$SRC/configure' --prefix=/lustre/orion/project_465000123/world-shared/sitestack/aws-ofi-rccl/"
                    "1.4.0+17d41cb-rocm-5.7.1 --disable-tests --with-libfabric=/opt/cray/libfabric/1.15.2.0 "
                    "--with-hip=/opt/rocm-5.7.1 --with-rccl=/opt/rocm-5.7.1 "
                    "--with-mpi=/opt/cray/pe/mpich/8.1.28/ofi/gnu/12.3")
    upstream = configure_for("frontier", "7.0")
    assert "/aws-ofi-rccl/1.18.0-rocm-7.0.0 " in upstream and "--with-rocm=/opt/rocm-7.0.0" in upstream
    assert "--with-rccl" not in upstream and "--with-hip" not in upstream
    for site in SITE_ENV:
        for rocm in ROCMS:
            assert "--with-libfabric=/usr" not in configure_for(site, rocm)


def test_rccl_header_location_per_rocm_release(data):
    assert rccl_prefix(data, "5.1.3", "/opt/rocm-5.1.3") == "/opt/rocm-5.1.3/rccl"
    assert rccl_prefix(data, "5.2.0", "/opt/rocm-5.2.0") == "/opt/rocm-5.2.0"
    assert rccl_prefix(data, "5.7.1", "/opt/rocm-5.7.1") == "/opt/rocm-5.7.1"
    assert rccl_prefix(data, "6.0.0", "/opt/rocm-6.0.0") == "/opt/rocm-6.0.0"


@pytest.mark.parametrize("rocm, version", [("5.6.1", "1.4.0+17d41cb"), ("5.7.1", "1.4.0+17d41cb"),
                                           ("6.0.3", "1.18.0"), ("6.2.4", "1.18.0"), ("7.0", "1.18.0"),
                                           ("7.1.1", "1.18.0")])
def test_plugin_chosen_by_rocm_release(recipe, data, rocm, version):
    _, _, facts = site_facts("frontier", known_rocm(data, rocm))
    assert choose_version(recipe, data, facts, None, "frontier") == version


def test_refusals_before_building(recipe, data):
    with pytest.raises(SitestackError, match=r"unknown ROCm version 5\.8"):
        known_rocm(data, "5.8")
    with pytest.raises(SitestackError, match="not a ROCm version"):
        known_rocm(data, "latest")
    _, _, rocm7 = site_facts("lumi", "7.0.0")
    with pytest.raises(SitestackError, match=r"does not fit ROCm 7\.0\.0.*needs rocm <6\.3.*loads v12"):
        choose_version(recipe, data, rocm7, "1.4.0+17d41cb", "lumi")
    _, _, rocm5 = site_facts("frontier", "5.7.1")
    with pytest.raises(SitestackError, match=r"1\.18\.0 \(aws/aws-ofi-nccl\) does not fit ROCm 5\.7\.1.*versions that fit"):
        choose_version(recipe, data, rocm5, "1.18.0", "frontier")
    with pytest.raises(SitestackError, match="unknown version '9.9'"):
        choose_version(recipe, data, rocm5, "9.9", "frontier")


def test_system_prefixes_are_never_passed(data):
    fork = plugin_row(data, "1.4.0+17d41cb")
    homes = resolve_homes(data, fork, "5.7.1", "/opt/rocm-5.7.1", {}, libfabric="/usr/", rccl_home="/opt/rccl")
    assert configure_args(data, "1.4.0+17d41cb", homes) == ["--with-hip=/opt/rocm-5.7.1", "--with-rccl=/opt/rccl"]
    # A ROCm or RCCL prefix cannot be left out (configure would look in /opt/rocm): it is refused.
    for home in ("/usr", "/usr/local/", "//usr"):
        with pytest.raises(SitestackError, match=rf"ROCm home for ROCm 5.7.1 {home} is a system prefix: "
                                                  r"--with-hip=.* breaks GCC's #include_next"):
            resolve_homes(data, fork, "5.7.1", home, {})
    with pytest.raises(SitestackError, match=r"the RCCL prefix /usr is a system prefix: --with-rccl=/usr"):
        resolve_homes(data, fork, "5.7.1", "/opt/rocm-5.7.1", {}, rccl_home="/usr")
    upstream = plugin_row(data, "1.18.0")
    homes = resolve_homes(data, upstream, "6.2.4", "/opt/rocm-6.2.4", {"F": "/opt/cray/libfabric/1.22.0"},
                          libfabric="$F", pkg_prefix={"hwloc": "/usr/local"}, mpi_home="/usr")
    assert configure_args(data, "1.18.0", homes, tests=True) == [
        "--with-libfabric=/opt/cray/libfabric/1.22.0", "--with-rocm=/opt/rocm-6.2.4", "--enable-tests"]
    with pytest.raises(SitestackError, match=r"\$MPICH_DIR is not set"):
        resolve_homes(data, fork, "5.7.1", "/opt/rocm-5.7.1", {}, mpi_home="$MPICH_DIR")
    assert Homes(toolkit="/r").mpi is None


@pytest.mark.parametrize("site, fmt", [("frontier", "lua"), ("frontier", "tcl")])
def test_module_files_wire_the_plugin_as_rccl_opens_it(recipe, data, site, fmt):
    from sitestack.actions.recipe_install import module_spec
    from sitestack.installs.modulefile_render import render
    from tests.contexts import offline_context

    ctx = offline_context(pb.load(site), account="project_465000123")
    dest = "/p/aws-ofi-rccl/1.4.0+17d41cb-rocm-5.7.1"
    row = plugin_row(data, "1.4.0+17d41cb")
    spec = module_spec(ctx, recipe, module_settings(recipe, row, "rocm", "5.7.1", "1.4.0+17d41cb"), "1.4.0+17d41cb", dest, {"install": dest, "version": "1.4.0+17d41cb"})
    assert spec.full == "aws-ofi-rccl/1.4.0+17d41cb-rocm-5.7.1"
    text = render(spec, fmt)
    if fmt == "lua":
        assert 'prepend_path("LD_LIBRARY_PATH", "/p/aws-ofi-rccl/1.4.0+17d41cb-rocm-5.7.1/lib")' in text
        # RCCL of ROCm 5.7.1 opens librccl-net.so, its default name, from LD_LIBRARY_PATH; an absolute
        # NCCL_NET_PLUGIN would become librccl-net-/p/....so.so and load nothing (ROCm/rccl rocm-5.7.1 src/net.cc)
        assert 'pushenv("NCCL_NET_PLUGIN"' not in text and 'setenv("NCCL_NET_PLUGIN"' not in text
        # NCCL_NET is not forced by the module: its name varies by plugin release
        assert '"NCCL_NET"' not in text and 'pushenv("SITESTACK_NCCL_NET", "AWS Libfabric")' in text
        assert 'pushenv("SITESTACK_NCCL_NET_PLUGIN_APIS", "v5")' in text
        assert 'whatis("Description: libfabric network plugin for RCCL (Slingshot cxi); net plugin API v5")' in text
        # the site's settings (facts.env) only where the user has none (docs/modulefiles.md)
        assert 'sitestack_default("FI_CXI_ATS", "0")' in text and 'sitestack_default("NCCL_SOCKET_IFNAME", "hsn0")' in text
    else:
        assert text.startswith("#%Module") and "sitestack_setenv NCCL_NET_PLUGIN" not in text and "AWS Libfabric" in text
        assert 'sitestack_setenv SITESTACK_NCCL_NET_PLUGIN_APIS "v5"' in text


def test_a_bad_package_argument_is_refused_when_the_playbook_is_loaded(tmp_path: Path):
    text = (PLAYBOOK_DIR / "frontier.yml").read_text()
    bad = text.replace("site: frontier", "site: fr").replace("        libfabric: /opt/cray", "        libfabrik: /opt/cray")
    (tmp_path / "fr.yml").write_text(bad)
    line = bad[:bad.index("libfabrik:")].count("\n") + 1
    with pytest.raises(SitestackError, match=rf"fr\.yml:{line}: .*args\.package\.libfabrik: unknown key "
                                             r"\(known keys: cuda, cuda_home, hwloc, libfabric, mpi_home"):
        pb.load(None, tmp_path / "fr.yml")
    # a recipe without hooks takes no package arguments
    text = (PLAYBOOK_DIR / "local.yml").read_text().replace("site: local", "site: lo")
    (tmp_path / "lo.yml").write_text(text.replace('      version: "4.1.2"\n', '      version: "4.1.2"\n      package: {x: 1}\n'))
    with pytest.raises(SitestackError, match=r"lo\.yml:\d+: .*args\.package: recipe mpi4py takes no package arguments"):
        pb.load(None, tmp_path / "lo.yml")


def test_a_plugin_step_with_no_toolkit_to_build_for_is_refused_when_the_playbook_is_loaded(tmp_path: Path):
    """A site with neither facts.rocm nor facts.cuda (an NVIDIA site that has not said its CUDA) and a
    plugin step naming no release: refused at load, naming the file, the step's line and the step, not
    when the step runs. Naming the release in the step is enough."""
    text = (PLAYBOOK_DIR / "local.yml").read_text().replace("site: local", "site: lo")
    plugin = "  - name: net-plugin\n    action: recipe-install\n    args:\n      recipe: aws-ofi-rccl\n"
    (tmp_path / "lo.yml").write_text(text.replace("  - name: mpi4py\n", plugin + "  - name: mpi4py\n", 1))
    line = text.index("  - name: mpi4py\n")
    line = text[:line].count("\n") + 1
    with pytest.raises(SitestackError, match=rf"lo\.yml:{line}: .*step 'net-plugin': builds the network plugin, but the "
                                             r"site has neither facts\.rocm nor facts\.cuda"):
        pb.load(None, tmp_path / "lo.yml")
    given = plugin + "      package: {cuda: '13.0'}\n"
    (tmp_path / "lo.yml").write_text(text.replace("  - name: mpi4py\n", given + "  - name: mpi4py\n", 1))
    assert [s.name for s in pb.load(None, tmp_path / "lo.yml").steps if s.name == "net-plugin"] == ["net-plugin"]


def test_a_source_directory_is_packed_reproducibly(tmp_path: Path):
    tree = tmp_path / "src"
    (tree / "m4").mkdir(parents=True)
    (tree / "configure.ac").write_text("AC_INIT([p], [1])\n")
    (tree / "m4" / "a.m4").write_text("dnl\n")
    first = pack_dir(tree, "a.tar.gz", tmp_path / "one")
    os.utime(tree / "configure.ac", (1, 1))
    second = pack_dir(tree, "a.tar.gz", tmp_path / "two")
    assert first.read_bytes() == second.read_bytes()


# -- refusals of the CLI, before anything is built -------------------------------------------------


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {"SITESTACK_LOG_DIR": str(tmp_path / "logs"), "SITESTACK_SOURCE_CACHE": str(tmp_path / "sources"),
            "SITESTACK_BUILD_CACHE": str(tmp_path / "builds")}


@pytest.mark.integration
@pytest.mark.parametrize("extra, message", [
    (["--rocm", "5.8"], "unknown ROCm version 5.8"),
    (["--rocm", "5.7.1", "--rocm-home", "/nonexistent"], "missing HIP for ROCm 5.7.1 in /nonexistent"),
    (["--rocm", "7.0", "--version", "1.4.0+17d41cb"], "does not fit ROCm 7.0.0"),
    (["--rocm", "5.7.1", "--version", "1.18.0"], "does not fit ROCm 5.7.1"),
    (["--rocm", "5.2.3", "--rocm-home", "/usr"], "the ROCm home for ROCm 5.2.3 /usr is a system prefix"),
    (["--rocm", "6.2.4", "--rocm-home", "/usr"], "the ROCm home for ROCm 6.2.4 /usr is a system prefix"),
    (["--rocm", "5.7.1", "--rocm-home", "{twin}"], "no RCCL header {twin}/include/rccl/rccl.h for ROCm 5.7.1"),
    (["--rocm", "6.2.4", "--rocm-home", "{twin}"], "has no sha256 for aws-ofi-rccl 1.18.0"),
    (["--rocm", "6.2.4", "--rocm-home", "{twin}", "--source", "{bad}"], "--source: aws-ofi-rccl@1.18.0-rocm-6.2.4: aws-ofi-nccl-1.18.0.tar.gz is unsafe to unpack"),
])
def test_refusals(cli, tmp_path: Path, env, extra, message):
    twin = str(make_rocm(tmp_path / "rocm"))
    bad = tmp_path / "aws-ofi-nccl-1.18.0.tar.gz"
    with tarfile.open(bad, "w:gz") as tar:
        tar.add(__file__, arcname="../escape.py")
    extra = [a.format(twin=twin, bad=bad) for a in extra]
    message = message.format(twin=twin)
    result = cli("build-rccl-plugin", "--site", "local", *extra, "--prefix", str(tmp_path / "prefix"), env=env)
    assert result.returncode == 1
    assert message in result.stdout + result.stderr, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert not (tmp_path / "prefix" / "aws-ofi-rccl").exists()
