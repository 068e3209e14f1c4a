"""Module files with real Lmod (Debian's lmod, which loads Lua and Tcl module files): every generated
file loads, the stack works in the loaded environment, and `module unload` gives back the environment
exactly, apart from Lmod's own bookkeeping variables (tests/conftest.py: LMOD_BOOKKEEPING says which
and why). Also: `invoke install-modulefiles` writes atomically with a+rX and no group/world write, a
changed template shows as a diff, stale files go, and it refuses to run before the stack exists."""

from __future__ import annotations

import os
import shlex
import stat
import sys
import zlib
from pathlib import Path

import pytest

from sitestack.actions import ACTIONS
from sitestack.engine import playbook as pb
from sitestack.installs import modulefile_specs as mf
from tests.conftest import LMOD_INIT, clean_env, parse_env, playbook_copy, run_invoke, shell, without_lmod_bookkeeping
from tests.contexts import offline_context
from tests.test_modulefile_golden import built_for

pytestmark = pytest.mark.integration

if not Path(LMOD_INIT, "bash").exists():  # pragma: no cover - the test script installs lmod
    pytest.skip("Lmod is not installed (Debian package lmod)", allow_module_level=True)


def load_unload(module_paths: list[str], modules: list[str], run: str = "true",
                start: dict[str, str] | None = None) -> tuple[dict, dict, dict, str]:
    """Environments (before, loaded, after unload) around `module load MODULES`, and ``run``'s output;
    ``start``: variables the shell has before Lmod is set up."""
    q = " ".join(shlex.quote(m) for m in modules)
    uses = "\n".join(f"module use {shlex.quote(p)}" for p in module_paths)
    script = f"""set -e
. {LMOD_INIT}/bash
{uses}
env -0 > "$T/before"
module load {q}
env -0 > "$T/loaded"
{run} > "$T/out" 2>&1 || {{ cat "$T/out"; exit 7; }}
module unload {" ".join(shlex.quote(m) for m in reversed(modules))}
env -0 > "$T/after"
"""
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        out = shell(["bash", "-c"], script, clean_env(T=tmp, **(start or {})))
        assert out.returncode == 0, f"rc {out.returncode}\n{out.stdout}\n{out.stderr}"
        assert "Lmod has detected the following error" not in out.stderr, out.stderr
        # what bash says when Lmod exports a name that is no variable (a family with a '-' did)
        assert "not a valid identifier" not in out.stdout + out.stderr, out.stdout + out.stderr
        read = {n: parse_env(Path(tmp, n).read_text()) for n in ("before", "loaded", "after")}
        return read["before"], read["loaded"], read["after"], Path(tmp, "out").read_text()


def assert_restored(before: dict, after: dict) -> None:
    b, a = without_lmod_bookkeeping(before), without_lmod_bookkeeping(after)
    changed = {k: (b.get(k), a.get(k)) for k in set(b) | set(a) if b.get(k) != a.get(k)}
    assert not changed, f"module unload did not restore: {changed}"


def modules_in(root: Path) -> list[str]:
    """Module names of the module files under ``root`` (hidden directories are not modules)."""
    out = []
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if p.is_file() and not any(part.startswith(".") for part in rel.parts):
            out.append(str(rel).removesuffix(".lua"))
    return out


# -- the installed stack (Lua, as the local site has it) -----------------------------------------------------
def test_every_installed_module_loads_and_the_stack_works(local_stack):
    modules = modules_in(local_stack.modules)
    assert "pytorch/2.13.0-cpu" in modules and "mpi4py/4.1.2" in modules
    imports = "import torch, mpi4py; from mpi4py import MPI; assert MPI.Get_library_version().startswith('MPICH')"
    if "horovod/0.28.1" in modules:
        imports += "; import horovod.torch"
    for module in modules:
        before, loaded, after, out = load_unload([str(local_stack.modules)], [module],
                                                 f"python3 -c {shlex.quote(imports)}" if module.startswith("pytorch")
                                                 else "true")
        assert module in loaded["LOADEDMODULES"].split(":")
        assert_restored(before, after)
    before, loaded, after, out = load_unload([str(local_stack.modules)], ["pytorch/2.13.0-cpu"],
                                           "python3 -c 'import sys; print(sys.executable)'")
    # the generation the stack's path pointed at when loaded (docs/operating.md)
    assert loaded["PATH"].startswith(f"{local_stack.venv.resolve()}/bin:")
    assert "PYTHONPATH" not in loaded  # the stack's python finds its own packages (a staged copy too)
    assert out.strip() == f"{local_stack.venv.resolve()}/bin/python3"
    assert loaded["GLOO_SOCKET_IFNAME"] == "lo"  # the site's settings
    assert "PYTHONPATH" not in after and "GLOO_SOCKET_IFNAME" not in after


def test_horovod_module_loads_with_the_stack(local_stack):
    if local_stack.horovod:
        pytest.skip(local_stack.horovod)
    _, loaded, _, out = load_unload([str(local_stack.modules)], ["pytorch/2.13.0-cpu", "horovod/0.28.1"],
                                    "python3 -c 'import torch, mpi4py, horovod.torch as h; print(h.__file__)'")
    assert "horovod" in out


@pytest.mark.parametrize("mine", ["eth7", ""])
def test_a_site_setting_the_user_has_is_kept(local_stack, mine):
    """facts.env (GLOO_SOCKET_IFNAME: lo): a value the user has wins while loaded and stays after unloading,
    as in the launch helper; an empty one counts as none; without one the site's value comes and goes."""
    q = shlex.quote(str(local_stack.modules))
    script = f""". {LMOD_INIT}/bash; module use {q}
module load pytorch/2.13.0-cpu; echo "${{GLOO_SOCKET_IFNAME-unset}} $PYTHONPATH"
module unload pytorch/2.13.0-cpu; echo "${{GLOO_SOCKET_IFNAME-unset}} $PYTHONPATH"
module load pytorch/2.13.0-cpu; module load pytorch/2.13.0-cpu; echo "${{GLOO_SOCKET_IFNAME-unset}}" """
    out = shell(["bash", "-c"], script, clean_env(GLOO_SOCKET_IFNAME=mine, PYTHONPATH="/mine"))
    loaded, after, reloaded = out.stdout.splitlines()[-3:]
    assert loaded == f"{mine or 'lo'} /mine", out.stdout + out.stderr  # the module leaves PYTHONPATH alone
    assert after == ("eth7 /mine" if mine else "unset /mine"), out.stdout + out.stderr
    assert reloaded == (mine or "lo"), out.stdout + out.stderr
    # without a value of the user's: the site's, gone after unloading
    out = shell(["bash", "-c"], script, clean_env(PYTHONPATH="/mine"))
    assert out.stdout.splitlines()[-3:] == ["lo /mine", "unset /mine", "lo"], out.stdout + out.stderr


def test_tcl_module_files_of_the_stack_load_too(local_stack, tmp_path: Path):
    root = tmp_path / "tcl-modules"
    book = playbook_copy(tmp_path / "book", facts={"modules": {"format": "tcl", "install_root": str(root)}})
    out = run_invoke("install-modulefiles", "--playbook", str(book), "--prefix", str(local_stack.prefix),
                     env=local_stack.env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert (root / "pytorch" / "2.13.0-cpu").read_text().startswith("#%Module1.0\n")
    for module in modules_in(root):
        run = "python3 -c 'import torch, mpi4py'" if module.startswith("pytorch") else "true"
        before, loaded, after, _ = load_unload([str(root)], [module], run)
        assert module in loaded["LOADEDMODULES"].split(":")
        assert_restored(before, after)
    # the same place in Lua: the Tcl files are no longer wanted, so they go
    book = playbook_copy(tmp_path / "book2", facts={"modules": {"format": "lua", "install_root": str(root)}})
    out = run_invoke("install-modulefiles", "--playbook", str(book), "--prefix", str(local_stack.prefix),
                     env=local_stack.env)
    assert out.returncode == 0 and "no longer wanted" in out.stdout, out.stdout
    assert sorted(modules_in(root)) == sorted(modules_in(local_stack.modules))
    assert not (root / "pytorch" / "2.13.0-cpu").exists() and (root / "pytorch" / "2.13.0-cpu.lua").exists()


# -- every site's module files, Lua and Tcl, with stand-ins for the site modules they load ---------------------
SITE_CASES = [(s, f) for s in ("cirrus", "frontier", "lumi", "dawn") for f in ("lua", "tcl")]


def write_site_modules(ctx, fmt: str, root: Path, stubs: Path) -> list:
    """The site's module files (as its modulefiles step renders them, the plugin's included) under ``root``,
    and under ``stubs`` stand-ins for the site's own modules they load, each setting one variable; the specs."""
    step = ACTIONS["modulefiles"].from_spec(next(s for s in ctx.site.steps if s.action == "modulefiles"), ctx)
    for path, text in step.render_files(built_for(ctx), fmt, plugins=True).items():
        target = root / os.path.relpath(path, step.root)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    specs = mf.site_modules(ctx, step.stack, built_for(ctx), requires=step.args.requires)   # as the step names them
    for name in {m for spec in specs for m in spec.requires}:
        if (root / f"{name}.lua").exists() or (root / name).exists():
            continue
        stub = stubs / f"{name}.lua"
        stub.parent.mkdir(parents=True, exist_ok=True)
        stub.write_text(f'setenv("STUB_{zlib.crc32(name.encode())}", "{name}")\n')
    return specs


@pytest.mark.parametrize(("site", "fmt"), SITE_CASES, ids=[f"{s}-{f}" for s, f in SITE_CASES])
def test_site_module_files_load_and_unload_with_lmod(site: str, fmt: str, tmp_path: Path):
    ctx = offline_context(pb.load(site), home="/home/alice", user="alice", account="proj123")
    root, stubs = tmp_path / "modules", tmp_path / "site-modules"
    specs = write_site_modules(ctx, fmt, root, stubs)
    for module in modules_in(root):
        spec = next(s for s in specs if s.full == module)
        # The user had values of their own for every variable the module sets itself (Lua: pushenv gives
        # them back on unload; Lmod's Tcl has no such pushenv, base.tcl.j2 says why: not there), and for
        # the site's settings (facts.env), which the module leaves as they are, in Lua and Tcl.
        start = {name: f"user's {name}" for name, _ in (*(spec.env if fmt == "lua" else ()), *spec.defaults)}
        before, loaded, after, _ = load_unload([str(stubs), str(root)], [module], start=start)
        assert module in loaded["LOADEDMODULES"].split(":")
        assert all(before[name] == value for name, value in start.items())
        for dep in spec.requires:
            assert dep in loaded["LOADEDMODULES"].split(":"), (module, dep)  # loaded with it
        for name, value in spec.env:
            if all(kind == "lit" for kind, _ in value.parts):
                assert loaded[name] == str(value), (module, name)
        for name, _ in spec.defaults:
            assert loaded[name] == f"user's {name}", (module, name)
        assert_restored(before, after)
        assert not [m for m in after.get("LOADEDMODULES", "").split(":") if m]  # dependencies unloaded too


def test_module_spider_names_the_stack_that_provides_a_python_package(tmp_path: Path):
    """``module spider mpi4py`` (real Lmod, no spider cache) names the stack module as well as mpi4py's
    own: the stack's Lua file declares its Python packages with ``extensions()``; a package the stack
    does not have is not found."""
    ctx = offline_context(pb.load("frontier"), home="/home/alice", user="alice", account="proj123")
    root, stubs = tmp_path / "modules", tmp_path / "site-modules"
    write_site_modules(ctx, "lua", root, stubs)
    script = f". {LMOD_INIT}/bash\nmodule use {shlex.quote(str(root))}\n" \
             "module --ignore_cache spider torchvision 2>&1\necho =====\nmodule --ignore_cache spider tensorflow 2>&1\n"
    out = shell(["bash", "-c"], script, clean_env())
    provided, missing = out.stdout.split("=====\n")
    assert "torchvision/0.17.2" in provided and "pytorch/2.2.2-rocm5.7" in provided, provided
    assert "pytorch" not in missing and "Unable to find" in missing, missing


# -- installing: modes, atomic writes, diffs, order ----------------------------------------------------------
def test_install_gives_a_plus_rx_and_no_group_or_world_write(local_stack, tmp_path: Path):
    root = tmp_path / "modules"
    book = playbook_copy(tmp_path / "book", facts={"modules": {"install_root": str(root)}})
    cmd = f"umask 077; exec {shlex.quote(sys.executable)} -m invoke install-modulefiles --playbook " \
          f"{shlex.quote(str(book))} --prefix {shlex.quote(str(local_stack.prefix))}"
    out = shell(["bash", "-c"], cmd, {**os.environ, **local_stack.env}, cwd=Path(__file__).parent.parent)
    assert out.returncode == 0, out.stdout + out.stderr
    for p in [root, *root.rglob("*")]:
        mode = stat.S_IMODE(p.stat().st_mode)
        assert mode == (0o755 if p.is_dir() else 0o644), (p, oct(mode))
    assert not [p for p in root.rglob("*") if p.name.endswith(".tmp")]  # nothing half-written left
    (root / "pytorch").chmod(0o700)
    (root / "pytorch" / "2.13.0-cpu.lua").chmod(0o600)
    check = run_invoke("install-modulefiles", "--playbook", str(book), "--prefix", str(local_stack.prefix), "--check",
                       "--fail-on-change", env=local_stack.env)
    assert check.returncode == 2 and "mode 0600, want 0644" in check.stdout and "mode 0700, want 0755" in check.stdout
    fixed = run_invoke("install-modulefiles", "--playbook", str(book), "--prefix", str(local_stack.prefix),
                       env=local_stack.env)
    assert fixed.returncode == 0 and stat.S_IMODE((root / "pytorch" / "2.13.0-cpu.lua").stat().st_mode) == 0o644


def test_a_changed_template_shows_as_a_diff(local_stack, tmp_path: Path):
    templates = tmp_path / "templates"
    templates.mkdir()
    (templates / "stack.lua.j2").write_text(
        '{% extends "base.lua.j2" %}\n{% block help -%}\nhelp([[Ask the helpdesk about {{ m.full }}.]])\n{% endblock %}\n')
    book = playbook_copy(tmp_path / "book", step_args={"modulefiles": {"templates": str(templates)}})
    prefix = str(local_stack.prefix)
    check = run_invoke("install-modulefiles", "--playbook", str(book), "--prefix", prefix, "--check", "--diff",
                       "--fail-on-change", env=local_stack.env)
    assert check.returncode == 2, check.stdout
    assert "+help([[Ask the helpdesk about pytorch/2.13.0-cpu.]])" in check.stdout
    assert "-PyTorch 2.13.0 (cpu) stack for local." in check.stdout
    assert "mpi4py/4.1.2.lua" not in check.stdout  # only the file whose template changed
    unchanged = (local_stack.modules / "pytorch" / "2.13.0-cpu.lua").read_text()
    assert "helpdesk" not in unchanged  # check mode wrote nothing
    plain = run_invoke("install-modulefiles", "--site", "local", "--prefix", prefix, "--check", "--fail-on-change",
                       env=local_stack.env)
    assert plain.returncode == 0, plain.stdout


def test_install_refuses_before_the_stack_exists(tmp_path: Path):
    prefix = tmp_path / "prefix"
    out = run_invoke("install-modulefiles", "--site", "local", "--prefix", str(prefix),
                     env={"SITESTACK_LOG_DIR": str(tmp_path / "logs")})
    assert out.returncode == 1 and "run `invoke install-venv --site local` first" in out.stdout, out.stdout
    assert not (prefix / "modules").exists()


# -- a stack's generation: resolved once at load, kept while loaded -------------------------------------------
@pytest.mark.parametrize("fmt", ["lua", "tcl"])
def test_the_stack_module_keeps_the_generation_it_loaded(fmt: str, tmp_path: Path):
    """Loading resolves the stack's stable link to its generation; after the link is switched (an upgrade),
    the loaded environment still names the old generation, unloading removes exactly that, and a new load
    gets the new one (docs/operating.md)."""
    from sitestack.engine import playbook as pb
    from sitestack.installs.modulefile_render import render
    from sitestack.installs.modulefile_specs import stack_module
    from sitestack.installs.venv_stack import stack_for
    from tests.contexts import offline_context

    ctx = offline_context(pb.load("local"), prefix=str(tmp_path / "prefix"))
    stack = stack_for(ctx)
    spec = stack_module(ctx, stack, [])
    parent = Path(stack.path).parent
    for token in ("a", "b"):
        (parent / f".2.13.0-cpu.gen-{token}" / "bin").mkdir(parents=True)
    Path(stack.path).symlink_to(".2.13.0-cpu.gen-a")
    root = tmp_path / "modules"
    (root / "pytorch").mkdir(parents=True)
    (root / spec.relpath(fmt)).write_text(render(spec, fmt))
    var = "__SITESTACK_GENERATION_PYTORCH"
    switch = f"ln -sfn .2.13.0-cpu.gen-b {shlex.quote(stack.path)}"
    script = f"""set -e
. {LMOD_INIT}/bash
module use {shlex.quote(str(root))}
module load pytorch/2.13.0-cpu
echo "loaded $PATH ${var}"
{switch}
echo "after $PATH ${var}"
module unload pytorch/2.13.0-cpu
echo "unloaded $PATH ${{{var}-unset}}"
module load pytorch/2.13.0-cpu
echo "again $PATH ${var}"
"""
    out = shell(["bash", "-c"], script, clean_env())
    assert out.returncode == 0, out.stdout + out.stderr
    lines = {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in out.stdout.splitlines() if " " in line}
    gen_a, gen_b = f"{parent}/.2.13.0-cpu.gen-a", f"{parent}/.2.13.0-cpu.gen-b"
    assert lines["loaded"].startswith(f"{gen_a}/bin:") and lines["loaded"].endswith(f" {gen_a}")
    assert lines["after"] == lines["loaded"]           # the switch does not reach a loaded environment
    assert gen_a not in lines["unloaded"] and lines["unloaded"].endswith(" unset")  # unload removed what load added
    assert lines["again"].startswith(f"{gen_b}/bin:") and lines["again"].endswith(f" {gen_b}")
