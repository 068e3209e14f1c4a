"""Module files without a host: golden Lua and Tcl output for Cirrus, Frontier, LUMI and Dawn, and the
template rules (StrictUndefined, no timestamps, quoting, load-time values, one block per package).

The goldens are rendered from each site's playbook (its ``modulefiles`` step's arguments) for a
fixed user (alice, account proj123), with mpi4py, Horovod and the network plugin (where the site
builds one) from their real recipes at the versions the playbook builds: the files ``invoke render``
writes for the site (tests/test_render.py compares them). After an intended change, regenerate them with
``SITESTACK_UPDATE_GOLDEN=1 python -m pytest tests/test_modulefile_golden.py`` and review the diff.
"""

from __future__ import annotations

import difflib
import functools
import os
from pathlib import Path

import jinja2
import pytest

from sitestack.actions import ACTIONS
from sitestack.core.errors import InputError, SitestackError
from sitestack.core.paths import SOURCES_DIR
from sitestack.engine import playbook as pb
from sitestack.installs import modulefile_render as mf
from sitestack.installs import modulefile_text as mt
from sitestack.installs.site_stack import recipe_targets
from sitestack.installs.venv_stack import Built
from sitestack.model.recipe import list_recipes
from tests.contexts import offline_context

GOLDEN = Path(__file__).parent / "golden" / "modulefiles"
SITES = ("cirrus", "frontier", "lumi", "dawn")
UPDATE = os.environ.get("SITESTACK_UPDATE_GOLDEN") == "1"


def context(site_name: str):
    site = pb.load(site_name)
    return site, offline_context(site, home="/home/alice", user="alice", account="proj123")


def step_of(site, ctx, action: str):
    spec = next(s for s in site.steps if s.action == action)
    return ACTIONS[action].from_spec(spec, ctx)


def built_for(ctx) -> list[Built]:
    """What the site's playbook builds (its recipe-install steps: mpi4py, Horovod and, where the site
    names one sitestack has a recipe of, the network plugin), from their real recipes, as ``invoke
    render`` renders them. A container's own plugin with no recipe (LUMI AI Factory's aws-ofi-nccl) is
    never built."""
    plugin = ctx.facts.network.net_plugin
    plugin = plugin if plugin and plugin in list_recipes(SOURCES_DIR) else None
    built, notes = recipe_targets(ctx, ["mpi4py", "horovod", *([plugin] if plugin else [])])
    assert not notes, notes
    return built


@functools.cache
def rendered(site_name: str, fmt: str) -> dict[str, str]:
    """The modulefiles step's files, and the network plugin's module as its recipe-install step writes it
    (the recipe's hooks add the name the plugin registers), in ``fmt``."""
    site, ctx = context(site_name)
    step = step_of(site, ctx, "modulefiles")
    files = step.render_files(built_for(ctx), fmt)
    plugin = ctx.facts.network.net_plugin
    for spec in site.steps:
        if spec.action == "recipe-install" and spec.args.get("recipe") == plugin:
            install = ACTIONS["recipe-install"].from_spec(spec, ctx)
            files[f"{step.root}/{install.module.relpath(fmt)}"] = mf.render(install.module, fmt)
    return {os.path.relpath(path, step.root): text for path, text in files.items()}


CASES = [(s, f) for s in SITES for f in ("lua", "tcl")]


@pytest.mark.parametrize(("site", "fmt"), CASES, ids=[f"{s}-{f}" for s, f in CASES])
def test_golden(site: str, fmt: str):
    files = rendered(site, fmt)
    root = GOLDEN / site / fmt
    if UPDATE:
        for old in root.rglob("*"):
            if old.is_file():
                old.unlink()
        for rel, text in files.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
    on_disk = {str(p.relative_to(root)): p.read_text() for p in root.rglob("*") if p.is_file()}
    assert sorted(files) == sorted(on_disk), f"module files for {site}/{fmt} differ from {root}"
    for rel, text in files.items():
        if text != on_disk[rel]:
            diff = "".join(difflib.unified_diff(on_disk[rel].splitlines(True), text.splitlines(True),
                                                f"golden/{site}/{fmt}/{rel}", "rendered"))
            pytest.fail(f"{rel} differs from its golden file (SITESTACK_UPDATE_GOLDEN=1 to accept):\n{diff}")


def test_every_site_and_format_has_its_stack_and_packages():
    assert sorted(os.listdir(GOLDEN)) == sorted(SITES)
    expected = {"cirrus": "pytorch/2.3.1-gpu", "frontier": "pytorch/2.2.2-rocm5.7", "lumi": "pytorch/2.10.0-rocm7.0",
                "dawn": "pytorch/2.8.0-xpu"}
    for site, stack in expected.items():
        lua = rendered(site, "lua")
        assert f"{stack}.lua" in lua and "mpi4py/4.1.2.lua" in lua and "horovod/0.28.1.lua" in lua
        assert f"{stack}" in rendered(site, "tcl")


def test_the_site_facts_reach_the_module_files():
    cirrus = rendered("cirrus", "tcl")["pytorch/2.3.1-gpu"]
    assert cirrus.startswith("#%Module1.0\n")
    assert 'depends-on "python/3.12.1-gpu"' in cirrus and 'module load "python/3.12.1-gpu"' in cirrus
    assert 'conflict "pytorch"' in cirrus
    # the stack's bin in the generation its path points at when loaded (docs/operating.md)
    assert 'sitestack_generation "/work/proj123/shared/sitestack/pytorch/2.3.1-gpu"' in cirrus
    assert 'prepend-path PATH "${sitestack_root}/bin"' in cirrus
    # no PYTHONPATH: it would win over a copy of the stack staged on node-local storage
    assert "PYTHONPATH" not in cirrus and "PYTHONPATH" not in rendered("frontier", "lua")["pytorch/2.2.2-rocm5.7.lua"]
    # the site's settings (facts.env) only where the user has none (docs/modulefiles.md)
    assert 'sitestack_default HOROVOD_MPI_THREADS_DISABLE "1"' in cirrus
    frontier = rendered("frontier", "lua")["pytorch/2.2.2-rocm5.7.lua"]
    for module in ("PrgEnv-gnu/8.5.0", "rocm/5.7.1", "craype-accel-amd-gfx90a", "aws-ofi-rccl/1.4.0+17d41cb-rocm-5.7.1"):
        assert f'depends_on("{module}")' in frontier
    assert 'sitestack_default("NCCL_SOCKET_IFNAME", "hsn0")' in frontier
    assert 'sitestack_default("FI_MR_CACHE_MONITOR", "userfaultfd")' in frontier
    # {user} in a fact is the user who loads the module, not the one who installed it
    # and the MIOpen cache is the job's own, read from SLURM_JOB_ID when the module is loaded
    assert 'pushenv("MIOPEN_USER_DB_PATH", "/tmp/" .. (os.getenv("USER") or "") .. "-miopen-" .. ' \
           '(os.getenv("SLURM_JOB_ID") or ""))' in frontier
    assert "alice-miopen" not in frontier
    plugin = rendered("frontier", "lua")["aws-ofi-rccl/1.4.0+17d41cb-rocm-5.7.1.lua"]
    assert '"NCCL_NET"' not in plugin and 'pushenv("SITESTACK_NCCL_NET", "AWS Libfabric")' in plugin and 'sitestack_default("NCCL_SOCKET_IFNAME", "hsn0")' in plugin
    assert 'prepend_path("LD_LIBRARY_PATH", "/lustre/orion/proj123/world-shared/sitestack/aws-ofi-rccl/1.4.0+17d41cb-rocm-5.7.1/lib")' in plugin
    lumi = rendered("lumi", "lua")["pytorch/2.10.0-rocm7.0.lua"]
    assert 'append_path("SINGULARITY_BINDPATH", "/projappl/proj123/sitestack", ",")' in lumi
    assert 'sitestack_generation("/projappl/proj123/sitestack/pytorch/2.10.0-rocm7.0", ' in lumi
    assert 'prepend_path("SINGULARITYENV_PREPEND_PATH", sitestack_root .. "/bin")' in lumi
    assert 'prepend_path("PATH"' not in lumi  # the venv's python is the container's: not on the host PATH
    # LUMI AI Factory's bindings module, found where LUMI's AI Guide says (module use first), does the binds;
    # no EasyBuild run scripts for an image without conda
    use, load = lumi.index('prepend_path("MODULEPATH", "/appl/local/laifs/modules")'), \
        lumi.index('depends_on("lumi-aif-singularity-bindings")')
    assert use < load and "EBROOTPYTORCH" not in lumi and "RUNSCRIPTS" not in lumi and "libjansson" not in lumi
    assert 'sitestack_default("FI_MR_CACHE_MONITOR", "userfaultfd")' in lumi and "NCCL_NET_GDR_LEVEL" not in lumi
    tcl = rendered("lumi", "tcl")["pytorch/2.10.0-rocm7.0"]
    assert tcl.index('module use "/appl/local/laifs/modules"') < tcl.index('"lumi-aif-singularity-bindings"')
    dawn = rendered("dawn", "tcl")["pytorch/2.8.0-xpu"]
    assert "append-path -d \",\" APPTAINER_BINDPATH" in dawn and 'depends-on "rhel9/default-dawn"' in dawn
    # the hierarchy is the user's choice at submission: FLAT is only the default (facts.env_defaults)
    assert 'sitestack_default ZE_FLAT_DEVICE_HIERARCHY "FLAT"' in dawn and "sitestack_setenv ZE_FLAT" not in dawn
    assert 'sitestack_setenv SIF "/home/alice/sitestack/dawn/apptainer/pytorch2.8.sif"' in dawn


def test_rendering_is_deterministic_with_no_timestamps():
    first, second = rendered.__wrapped__("cirrus", "lua"), rendered.__wrapped__("cirrus", "lua")
    assert first == second
    import re
    import time
    year = time.strftime("%Y")
    for text in first.values():
        assert not re.search(rf"\b{year}-\d\d-\d\d|\d\d:\d\d:\d\d", text)


# -- templates -----------------------------------------------------------------------------------------
def spec(**extra) -> mf.ModuleSpec:
    base = dict(name="pkg", version="1.0", template="base", site="test", summary="a package",
                whatis=(("Name", "pkg"),), help="help text")
    return mf.ModuleSpec(**{**base, **extra})


def test_strict_undefined_refuses_a_template_that_uses_an_unknown_name(tmp_path: Path):
    (tmp_path / "stack.lua.j2").write_text('{% extends "base.lua.j2" %}{% block help %}{{ d.no_such_key }}{% endblock %}')
    with pytest.raises(SitestackError, match="no_such_key"):
        mf.render(spec(template="stack", data={}), "lua", [tmp_path])


def test_a_site_template_overrides_one_block(tmp_path: Path):
    (tmp_path / "pkg.lua.j2").write_text('{% extends "base.lua.j2" %}{% block footer %}-- site footer\n{% endblock %}')
    plain = mf.render(spec(), "lua")
    site = mf.render(spec(template="pkg"), "lua", [tmp_path])
    assert site.replace("modulefiles/pkg.lua.j2", "modulefiles/base.lua.j2") == plain + "-- site footer\n"


def test_per_package_templates_override_only_the_help_block():
    for fmt in ("lua", "tcl"):
        env = mf.environment()
        for package in ("stack", "mpi4py", "horovod", "net-plugin"):
            source = env.loader.get_source(env, f"{package}.{fmt}.j2")[0]
            blocks = [line.split()[2] for line in source.splitlines() if line.startswith("{% block ")]
            assert blocks == ["help"], (package, fmt, blocks)


def test_values_are_quoted_for_each_language():
    tricky = 'a "b" $c [d] {e} \\f\nnext'
    s = spec(env=(("X", mt.literal(tricky)), ("Y", mt.text_of("/tmp/{user}/${SCRATCH}/x", {}))), help="ends ]] here")
    lua = mf.render(s, "lua")
    assert 'pushenv("X", "a \\"b\\" $c [d] {e} \\\\f\\nnext")' in lua
    assert 'pushenv("Y", "/tmp/" .. (os.getenv("USER") or "") .. "/" .. (os.getenv("SCRATCH") or "") .. "/x")' in lua
    assert "help([=[\nends ]] here\n]=])" in lua
    tcl = mf.render(s, "tcl")
    assert 'sitestack_setenv X "a \\"b\\" \\$c \\[d\\] \\{e\\} \\\\f\\nnext"' in tcl
    assert 'sitestack_setenv Y "/tmp/[expr {[info exists ::env(USER)] ? $::env(USER) : ""}]/' \
        '[expr {[info exists ::env(SCRATCH)] ? $::env(SCRATCH) : ""}]/x"' in tcl


def test_bad_names_are_refused():
    with pytest.raises(InputError, match="not an environment variable name"):
        mf.render(spec(env=(("BAD-NAME", mt.literal("x")),)), "lua")
    with pytest.raises(InputError, match="name/version"):
        mf.render(spec(name="bad name"), "tcl")
    with pytest.raises(InputError, match="lua or tcl"):
        mf.render(spec(), "yaml")


def test_text_of_fills_install_time_placeholders_and_keeps_load_time_ones():
    t = mt.text_of("{prefix}/x-{user}-{home}-$HOST", {"prefix": "/p", "user": "alice", "home": "/home/alice"})
    assert t.parts == (("lit", "/p/x-"), ("env", "USER"), ("lit", "-"), ("env", "HOME"), ("lit", "-"), ("env", "HOST"))
    assert str(mt.text_of("{{literal}}", {})) == "{literal}"


def test_jinja_environment_is_strict():
    assert mf.environment().undefined is jinja2.StrictUndefined
