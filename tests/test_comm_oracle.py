"""The communication library itself decides whether our plugin wiring works: real NCCL from PyPI where it
runs here, and for RCCL a stand-in loader that follows sources/comm/libraries.yml, itself checked against
the real NCCL of the same rule (tests/twins/comm_oracle.py says why and how).

- the table's rows agree with what the real NCCL 2.17.1 (suffix only, as RCCL of ROCm 5.7) and 2.21.5
  (the value as a path first) open, for every way of naming a plugin;
- each site that builds a plugin gets a module file (rendered and loaded with Lmod) under which its
  library opens the plugin: "Loaded net plugin", and the old wiring (an absolute NCCL_NET_PLUGIN) says
  "No plugin found";
- the validation job's net-plugin check, on one node, fails with NCCL's own reason on a live log whose
  plugin did not load and passes one whose plugin did.

The NCCL wheels are downloaded from PyPI once (about 200 MB each) into ~/.cache/sitestack/test-nccl.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from sitestack.engine import playbook as pb
from sitestack.model import comm_libraries
from sitestack.model.recipe import load_recipe
from sitestack.model.site import list_sites
from sitestack.onsite import nccl_log
from sitestack.onsite.ddpcheck.netplugin import judge_net_plugin
from sitestack.packages.aws_ofi_rccl import module_settings
from sitestack.packages.aws_ofi_rccl_rules import choose_version, plugin_data, plugin_row
from tests.contexts import offline_context
from tests.twins import comm_oracle, sites

#: The real NCCL releases tried: the last of the suffix-only rule (as RCCL of ROCm 5.7.1, whose base is NCCL
#: 2.17.1) and the first that takes NCCL_NET_PLUGIN as a path (the newer ones open plugins only in a communicator).
REAL = ("2.17.1", "2.21.5")


def opened(log: str) -> str | None:
    """The plugin name a log says was loaded, or None where it says none was (nccl_log's reading)."""
    lines, _ = nccl_log.parse(log)
    (report,) = nccl_log.classify(lines)
    return report.plugin if report.plugin_state == "loaded" else None


@pytest.fixture(scope="module")
def real_nccl() -> dict[str, Path]:
    return {version: comm_oracle.nccl_library(version) for version in REAL}


@pytest.fixture(scope="module")
def plugins(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory with a plugin under NCCL's default name and one under a suffix name."""
    lib = tmp_path_factory.mktemp("plugins")
    comm_oracle.stub_plugin(lib / "libnccl-net.so", "by-default-name")
    comm_oracle.stub_plugin(lib / "libnccl-net-ofi.so", "by-suffix")
    return lib


def cases(lib: Path) -> dict[str, dict[str, str]]:
    return {"default name": {"LD_LIBRARY_PATH": str(lib)},
            "suffix": {"LD_LIBRARY_PATH": str(lib), "NCCL_NET_PLUGIN": "ofi"},
            "absolute path": {"NCCL_NET_PLUGIN": str(lib / "libnccl-net-ofi.so")},
            "nothing": {}}


@pytest.mark.integration
@pytest.mark.parametrize("version", REAL)
def test_the_table_reads_the_real_nccl_loader(real_nccl, plugins, version):
    """Real NCCL, the table's rule and the stand-in that follows it agree on which file each environment opens."""
    (row,) = comm_libraries.loaders("nccl", version=version)
    apis = comm_libraries.plugin_apis("nccl", version=version).apis
    expected = {"default name": "by-default-name", "suffix": "by-suffix",
                "absolute path": "by-suffix" if row.path_first else None, "nothing": None}
    for case, env in cases(plugins).items():
        real = comm_oracle.real_init(real_nccl[version], env)
        assert opened(real) == expected[case], f"NCCL {version}, {case}: {real}"
        stand_in = comm_oracle.stand_in_init(row, apis, env)
        assert opened(stand_in) == expected[case], f"stand-in for NCCL {version}, {case}: {stand_in}"
    # the old Frontier wiring on a suffix-only NCCL: NCCL's own words
    if not row.path_first:
        log = comm_oracle.real_init(real_nccl[version], cases(plugins)["absolute path"])
        assert "No plugin found" in log and f"libnccl-net-{plugins}/libnccl-net-ofi.so.so" in log


def plugin_steps() -> list[tuple[str, str]]:
    """(site, toolkit) for every playbook with a step that builds the network plugin."""
    found = []
    for site in list_sites():
        loaded = pb.load(site)
        if any(s.args.get("recipe") == "aws-ofi-rccl" for s in loaded.steps):
            found.append((site, "rocm" if loaded.facts.rocm else "cuda"))
    return found


def module_environment(tmp_path: Path, site: str, toolkit: str, nccl: str | None = None) -> tuple[dict[str, str], str]:
    """The plugin module of ``site`` rendered, loaded with Lmod: (the variables it set, the library's path)."""
    from sitestack.actions.recipe_install import module_spec
    from sitestack.installs.modulefile_render import render

    recipe, loaded = load_recipe("aws-ofi-rccl"), pb.load(site)
    ctx = offline_context(loaded, account="proj123")
    kit = loaded.facts.rocm if toolkit == "rocm" else loaded.facts.cuda
    assert kit is not None
    data = plugin_data(recipe)
    version = choose_version(recipe, data, ctx.facts, None, site, toolkit=toolkit)   # type: ignore[arg-type]
    row = plugin_row(data, version, recipe.path, toolkit)   # type: ignore[arg-type]
    dest = str(tmp_path / "plugin")
    settings = module_settings(recipe, row, toolkit, kit.version, version, nccl)   # type: ignore[arg-type]
    spec = module_spec(ctx, recipe, settings, version, dest, {"install": dest, "version": version})
    tree = tmp_path / "modules" / "net-plugin"
    tree.mkdir(parents=True)
    # its site modules are not here: the file alone (the dependencies are Lmod's business)
    text = "\n".join(ln for ln in render(spec, "lua").splitlines() if not ln.startswith(("depends_on", "load(")))
    (tree / "1.lua").write_text(text + "\n")
    out = subprocess.run(["bash", "-c", f". {sites.LMOD_INIT}; module use {tree.parent}; module load net-plugin/1 && "
                          "echo \"LD_LIBRARY_PATH=$LD_LIBRARY_PATH\"; echo \"NCCL_NET_PLUGIN=${NCCL_NET_PLUGIN-}\""],
                         capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    env = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
    return {k: v for k, v in env.items() if v}, f"{dest}/{row.library}"


@pytest.mark.integration
@pytest.mark.parametrize("site, toolkit", plugin_steps())
def test_each_site_plugin_module_makes_its_library_open_the_plugin(tmp_path, site, toolkit):
    if not Path(sites.LMOD_INIT).exists():
        pytest.fail("needs Lmod (scripts/test.sh installs it)")
    env, library = module_environment(tmp_path, site, toolkit)
    comm_oracle.stub_plugin(Path(library), "AWS Libfabric")
    kit = pb.load(site).facts.rocm
    assert kit is not None and toolkit == "rocm"
    (row,) = comm_libraries.loaders("rccl", rocm=kit.version)
    apis = comm_libraries.plugin_apis("rccl", rocm=kit.version).apis
    assert opened(comm_oracle.stand_in_init(row, apis, env)) == "AWS Libfabric", env
    # the wiring it had before: the library's absolute path in NCCL_NET_PLUGIN
    old = comm_oracle.stand_in_init(row, apis, {**env, "NCCL_NET_PLUGIN": library})
    assert opened(old) is None and "No plugin found" in old
    assert comm_libraries.table().plugins and row.rocm   # the site's RCCL is one the table knows by ROCm release


@pytest.mark.integration
@pytest.mark.parametrize("version", REAL)
def test_a_cuda_plugin_module_makes_real_nccl_open_the_plugin(real_nccl, tmp_path, version):
    """The CUDA build's module (NCCL version unknown: wired for every NCCL) under real NCCL."""
    env, library = module_environment(tmp_path, "cirrus", "cuda")
    comm_oracle.stub_plugin(Path(library), "AWS Libfabric")
    assert opened(comm_oracle.real_init(real_nccl[version], env)) == "AWS Libfabric", env


@pytest.mark.integration
def test_one_node_validation_judges_a_live_nccl_init(real_nccl, tmp_path):
    """NCCL's own log, on one node: a plugin that does not load fails the net-plugin check with NCCL's reason;
    one that loads passes and is named; another plugin loading in its place fails."""
    lib, names = real_nccl["2.17.1"], list(comm_libraries.net_names("aws-ofi-nccl"))
    comm_oracle.stub_plugin(tmp_path / "ours" / "libnccl-net-ofi.so", "AWS Libfabric")
    comm_oracle.stub_plugin(tmp_path / "theirs" / "libnccl-net.so", "NCCL RDMA Plugin v6")

    def judged(env: dict[str, str]) -> tuple[str, str]:
        status, summary, _ = judge_net_plugin(comm_oracle.real_init(lib, env), hosts=1, plugin="aws-ofi-nccl",
                                              provider="cxi", names=names)
        return status, summary

    status, summary = judged({"NCCL_NET_PLUGIN": str(tmp_path / "ours" / "libnccl-net-ofi.so")})
    assert status == "failed" and "did not load" in summary, summary
    assert f"libnccl-net-{tmp_path}/ours/libnccl-net-ofi.so.so: cannot open shared object file" in summary, summary
    status, summary = judged({"LD_LIBRARY_PATH": str(tmp_path / "ours"), "NCCL_NET_PLUGIN": "ofi"})
    assert status == "passed" and "AWS Libfabric" in summary, summary
    status, summary = judged({"LD_LIBRARY_PATH": f"{tmp_path / 'theirs'}:{tmp_path / 'ours'}"})
    assert status == "failed" and "the plugin 'NCCL RDMA Plugin v6' loaded" in summary, summary
