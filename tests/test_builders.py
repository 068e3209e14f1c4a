"""Builders are pure: the exact commands and environment for each build system and site, and the
digest of an install's inputs (what changes it, what does not)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from sitestack.builders import Command, Layout, autotools, cmake, pip, symbolic
from sitestack.builders.builder import venv_commands
from sitestack.installs.inputs import build_inputs, digest, explain_change, install_inputs
from sitestack.installs.target import Target, build_plan, check_commands, host_argv
from sitestack.installs.toolchain import Toolchain
from sitestack.model.recipe import load_recipe
from tests.recipe_facts import FRONTIER, LUMI, facts

L = Layout(src="/b/src", build="/b/build", stage="/b/stage", prefix="/opt/x/1.0", jobs="8")


# -- autotools ------------------------------------------------------------------------------------
def test_autotools_release_tarball():
    plan = autotools.plan(layout=L, args=["--disable-tests", "--with-foo=/usr"], env={"CC": "cc"})
    assert [(c.phase, c.argv, c.cwd) for c in plan] == [
        ("configure", ("/b/src/configure", "--prefix=/opt/x/1.0", "--disable-tests", "--with-foo=/usr"), "/b/src"),
        ("build", ("make", "-j8"), "/b/src"),
        ("stage", ("make", "install", "DESTDIR=/b/stage"), "/b/src"),
    ]
    assert all(c.env == {"CC": "cc"} for c in plan)
    assert autotools.staged_tree(L) == "/b/stage/opt/x/1.0"


def test_autotools_bootstrap_only_when_needed():
    assert autotools.plan(layout=L, has_configure=False)[0] == Command("bootstrap", ("autoreconf", "-fi"), "/b/src", {})
    assert autotools.plan(layout=L, has_configure=True)[0].phase == "configure"
    always = autotools.plan(layout=L, bootstrap="always", bootstrap_command=["./autogen.sh"], has_configure=True)
    assert always[0].argv == ("./autogen.sh",)
    assert autotools.plan(layout=L, bootstrap="never", has_configure=False)[0].phase == "configure"


def test_autotools_out_of_tree_and_make_args():
    plan = autotools.plan(layout=L, out_of_tree=True, make_args=["V=1"])
    assert [c.cwd for c in plan] == ["/b/build"] * 3
    assert plan[1].argv == ("make", "-j8", "V=1")
    assert plan[2].argv == ("make", "V=1", "install", "DESTDIR=/b/stage")


# -- cmake ------------------------------------------------------------------------------------------
def test_cmake_plan():
    plan = cmake.plan(layout=L, args=["-DFOO=ON"], env={"CXX": "CC"})
    assert [c.argv for c in plan] == [
        ("cmake", "-S", "/b/src", "-B", "/b/build", "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
         "-DCMAKE_INSTALL_PREFIX=/opt/x/1.0", "-DFOO=ON"),
        ("cmake", "--build", "/b/build", "--parallel", "8"),
        ("cmake", "--install", "/b/build"),
    ]
    assert plan[2].env == {"CXX": "CC", "DESTDIR": "/b/stage"}


def test_cmake_from_pypi():
    plan = cmake.plan(layout=L, cmake="/c/tools/bin/cmake", make_program="/c/tools/bin/ninja", source_subdir="sub",
                      generator="Unix Makefiles", build_type="RelWithDebInfo")
    assert plan[0].argv[:9] == ("/c/tools/bin/cmake", "-S", "/b/src/sub", "-B", "/b/build", "-G", "Unix Makefiles",
                                "-DCMAKE_BUILD_TYPE=RelWithDebInfo", "-DCMAKE_INSTALL_PREFIX=/opt/x/1.0")
    assert "-DCMAKE_MAKE_PROGRAM=/c/tools/bin/ninja" in plan[0].argv
    venv = venv_commands("python3", "/c/tools", cmake.venv_packages("3.26", "Ninja"))
    assert venv[1].argv == ("/c/tools/bin/python", "-m", "pip", "install", "--no-cache-dir",
                            "--disable-pip-version-check", "cmake>=3.26", "ninja")


# -- pip ----------------------------------------------------------------------------------------------
def test_pip_wheel_never_uses_a_cache():
    (build,) = pip.plan(layout=L, python="python3", env={"MPICC": "mpicc"})
    assert build.argv == ("python3", "-m", "pip", "wheel", "--verbose", "--no-deps", "--no-cache-dir",
                          "--wheel-dir", "/b/stage", "/b/src")
    assert build.env == {"MPICC": "mpicc", "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_CACHE_DIR": "1"}
    (no_iso,) = pip.plan(layout=L, python="python3", build_isolation=False, args=["--config-settings=x=1"])
    assert no_iso.argv[7:] == ("--no-build-isolation", "--wheel-dir", "/b/stage", "--config-settings=x=1", "/b/src")
    install = pip.install(python="python3", wheel="/c/a.whl", target="/opt/t")
    assert install.argv == ("python3", "-m", "pip", "install", "--no-deps", "--no-index", "--no-cache-dir",
                            "--target", "/opt/t", "/c/a.whl")


# -- mpi4py on Frontier, LUMI and here ----------------------------------------------------------------------
def mpi4py_target(site_facts, dest="/p/mpi4py/4.1.2"):
    recipe = load_recipe("mpi4py")
    return Target(recipe, "4.1.2", site_facts, dest, "/p", site_facts.python.executable)


def prelude_of(argv):
    assert argv[0:2] == ["bash", "-c"] and argv[3] == "sitestack"
    return argv[2]


def test_mpi4py_on_frontier():
    target = mpi4py_target(facts(FRONTIER))
    (build,) = build_plan(target, L)
    argv = host_argv(target.facts, build)
    script = prelude_of(argv)
    assert argv[4:] == [
        "env", "MPICC=cc -shared", "PIP_DISABLE_PIP_VERSION_CHECK=1", "PIP_NO_CACHE_DIR=1",
        "python3", "-m", "pip", "wheel", "--verbose", "--no-deps", "--no-cache-dir",
        "--wheel-dir", "/b/stage", "/b/src"]
    assert "for f in /opt/cray/pe/lmod/lmod/init/bash; do" in script
    loads = [line.split()[2] for line in script.splitlines() if line.startswith("module load ")]
    assert loads == ["PrgEnv-gnu/8.5.0", "rocm/5.7.1", "craype-accel-amd-gfx90a", "miniforge3/23.11.0-0",
                     "gcc-native/12.3", "cray-mpich/8.1.28", "libtool"]
    assert script.endswith('exec "$@"')
    checks = check_commands(target, "/p/.tree")
    name, argv, env, expect, ranks = checks[0]
    assert argv[:2] == ["python3", "-c"] and "Get_library_version" in argv[2]
    assert env == {"PYTHONPATH": "/p/.tree"} and expect == "CRAY MPICH"
    assert checks[1][1][:5] == ["srun", "-n", "2", "python3", "-c"]


def test_mpi4py_on_lumi():
    target = mpi4py_target(facts(LUMI))
    (build,) = build_plan(target, L)
    argv = host_argv(target.facts, build)
    assert argv[4:8] == ["env", "MPICC=cc -shared", "PIP_DISABLE_PIP_VERSION_CHECK=1", "PIP_NO_CACHE_DIR=1"]
    assert argv[8:12] == ["/opt/miniconda3/envs/pytorch/bin/python", "-m", "pip", "wheel"]
    assert "--no-cache-dir" in argv
    loads = [line.split()[2] for line in prelude_of(argv).splitlines() if line.startswith("module load ")]
    assert loads == ["LUMI/24.03", "partition/G", "PrgEnv-gnu", "rocm/6.0.3", "craype-accel-amd-gfx90a"]
    assert target.tools() == ["cc", "/opt/miniconda3/envs/pytorch/bin/python"]


def test_mpi4py_here():
    target = mpi4py_target(facts())
    (build,) = build_plan(target, L)
    assert build.env["MPICC"] == "mpicc"
    assert target.tools() == ["mpicc", "python3"]
    assert check_commands(target, "/t")[1][1][:3] == ["mpiexec", "-n", "2"]


def test_no_module_system_means_no_wrapper():
    f = facts(modules={"system": "none"})
    assert host_argv(f, ["make"], {"A": "1"}) == ["env", "A=1", "make"]


# -- the digest ---------------------------------------------------------------------------------------
TOOLS = Toolchain({"mpicc": "/usr/bin/mpicc | gcc 12.2.0", "python3": "/usr/bin/python3 | Python 3.11.2",
                   "tar": "/usr/bin/tar | tar 1.34"}, ())


def full_digest(target, toolchain=TOOLS):
    return digest({"build": build_inputs(target, toolchain), "install": install_inputs(target)})


def test_digest_is_stable_and_ignores_run_to_run_paths():
    target = mpi4py_target(facts())
    first = build_inputs(target, TOOLS)
    assert json.dumps(first, sort_keys=True) == json.dumps(build_inputs(target, TOOLS), sort_keys=True)
    assert first["plan"][0]["argv"][-3:] == ["--wheel-dir", "$STAGE", "$SRC"]
    assert "tar" not in first["toolchain"]["tools"]  # helpers are not inputs
    assert full_digest(target) == full_digest(mpi4py_target(facts(build_jobs=32)))


def test_digest_changes_with_every_input():
    base = mpi4py_target(facts())
    seen = {full_digest(base)}
    changed = [
        mpi4py_target(facts(mpi__cc="mpicc -shared")),                       # wrapper
        mpi4py_target(facts(modules={"system": "lmod", "load": ["mpich/4"]})),  # modules
        dataclasses.replace(base, dest="/q/mpi4py/4.1.2"),                    # install location
    ]
    for target in changed:
        seen.add(full_digest(target))
    newer_compiler = Toolchain({**TOOLS.tools, "mpicc": "/usr/bin/mpicc | gcc 13.1.0"}, ())
    seen.add(full_digest(base, newer_compiler))
    recipe = base.recipe
    other_sha = dataclasses.replace(recipe.versions["4.1.2"], sha256="0" * 64)
    seen.add(full_digest(dataclasses.replace(base, recipe=dataclasses.replace(
        recipe, versions={**recipe.versions, "4.1.2": other_sha}))))
    seen.add(full_digest(dataclasses.replace(base, recipe=dataclasses.replace(recipe, env={**recipe.env, "X": "1"}))))
    assert len(seen) == 7


def test_wheel_build_digest_does_not_depend_on_dest_but_prefix_builds_do(tmp_path):
    wheel = mpi4py_target(facts())
    assert digest(build_inputs(wheel, TOOLS)) == digest(build_inputs(dataclasses.replace(wheel, dest="/q/m"), TOOLS))
    recipe = dataclasses.replace(wheel.recipe, build="autotools", pip=None)
    tree = dataclasses.replace(wheel, recipe=recipe)
    assert digest(build_inputs(tree, TOOLS)) != digest(build_inputs(dataclasses.replace(tree, dest="/q/m"), TOOLS))


def test_explain_change_names_the_input():
    base = mpi4py_target(facts())
    old = {"build": build_inputs(base, TOOLS), "install": install_inputs(base)}
    recipe = dataclasses.replace(base.recipe, args=("--config-settings=x=1",), env={**base.recipe.env, "MPI4PY_BUILD_CONFIGURE": "1"})
    new_target = dataclasses.replace(base, recipe=recipe)
    new = {"build": build_inputs(new_target, TOOLS), "install": install_inputs(new_target)}
    assert explain_change(old, new) == ("build arguments changed: +--config-settings=x=1; "
                                        "build environment changed: MPI4PY_BUILD_CONFIGURE")
    other = Toolchain({**TOOLS.tools, "mpicc": "/usr/bin/mpicc | gcc 13"}, ())
    assert explain_change(old, {"build": build_inputs(base, other), "install": install_inputs(base)}) == \
        "site toolchain changed: mpicc"
    patched = json.loads(json.dumps(old))
    patched["build"]["patches"] = [{"file": "0001-x.patch", "sha256": "1" * 64}]
    assert explain_change(old, patched) == "patch 0001-x.patch added"
    assert explain_change(patched, old) == "patch 0001-x.patch removed"


def test_symbolic_layout():
    assert symbolic("/p") == Layout("$SRC", "$BUILD", "$STAGE", "/p", "$JOBS")


@pytest.mark.parametrize("launcher,expected", [("srun", ["srun", "-n", "4"]), ("mpiexec", ["mpiexec", "-n", "4"]),
                                               ("mpirun", ["mpirun", "-np", "4"])])
def test_launchers(launcher, expected):
    from sitestack.installs.target import launcher_argv
    assert launcher_argv(facts(mpi__launcher=launcher), 4) == expected


# -- the registry --------------------------------------------------------------------------------
def test_every_build_system_a_recipe_may_name_has_a_builder():
    import typing

    from sitestack.builders import BUILDERS
    from sitestack.model.recipe import Recipe

    allowed = set(typing.get_args(typing.get_type_hints(Recipe)["build"]))
    assert set(BUILDERS) == allowed
    assert {name: b.name for name, b in BUILDERS.items()} == {name: name for name in allowed}
    assert {name: b.artefact for name, b in BUILDERS.items()} == {"autotools": "tree", "cmake": "tree", "pip": "wheel"}


@pytest.mark.parametrize("found,program,venv,make", [
    ({"cmake": "/usr/bin/cmake | cmake version 3.27.1", "ninja": "/usr/bin/ninja | 1.11"}, "/usr/bin/cmake", (), None),
    ({"cmake": "/usr/bin/cmake | cmake version 3.10.2", "ninja": "/usr/bin/ninja | 1.11"}, None,
     ("cmake>=3.18", "ninja"), None),
    ({"cmake": "/usr/bin/cmake | cmake version 3.27.1"}, "/usr/bin/cmake", ("cmake>=3.18", "ninja"), "ninja"),
    ({}, None, ("cmake>=3.18", "ninja"), "ninja"),
])
def test_cmake_host_tools(found, program, venv, make):
    from sitestack.builders import BUILDERS
    from sitestack.model.recipe import CMake

    tools = BUILDERS["cmake"].host_tools(CMake(), found)
    assert (tools.program, tools.venv_packages, tools.venv_make_program) == (program, venv, make)
    assert tools.venv_name == ("cmake-3.18" if venv else "")


def test_swap_points_the_link_at_the_new_tree_and_keeps_the_old(tmp_path):
    import subprocess

    from sitestack.core.swap import swap_argv

    (tmp_path / ".v.tree-a").mkdir()
    (tmp_path / ".v.tree-b").mkdir()
    (tmp_path / "v").mkdir()  # a foreign directory: moved aside
    subprocess.run(swap_argv(str(tmp_path), "v", ".v.tree-a", "t1"), check=True)
    assert (tmp_path / "v").is_symlink() and (tmp_path / "v").readlink().name == ".v.tree-a"
    subprocess.run(swap_argv(str(tmp_path), "v", ".v.tree-b", "t2"), check=True)
    assert (tmp_path / "v").readlink().name == ".v.tree-b"
    # the old tree is retired, not removed: a job may still read it (sitestack.installs.generations)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".v.old-t1", ".v.tree-a", ".v.tree-b", "v"]
    with pytest.raises(ValueError):
        swap_argv(str(tmp_path), "v", "/abs/tree", "t3")
