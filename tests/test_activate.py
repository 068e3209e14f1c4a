"""extend-venv-activate: idempotent, refuses what is not a venv, keeps the originals; and, with real
bash/zsh/fish/csh and Lmod on the session's stack, activating loads the module and lets the venv's
packages shadow the stack's, and deactivating gives back the environment (bash, zsh, fish: exactly;
csh: apart from Lmod's bookkeeping variables)."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import io
import json
import os
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from sitestack.onsite import activate_hook as hook
from sitestack.onsite.activate import BEGIN, CSH_DEACTIVATE, END, ORIG, Refused
from sitestack.onsite.activate.stack_settings import pick_packages
from tests.conftest import LMOD_INIT, REPO, clean_env, parse_env, shell, without_lmod_bookkeeping

CONFIG = {"site": "test", "module": "pytorch/2.13.0-cpu", "module_roots": ["/opt/site-modules", "/opt/stack/modules"],
          "init": {"bash": ["/usr/share/lmod/lmod/init/bash"], "zsh": ["/usr/share/lmod/lmod/init/zsh"],
                   "fish": ["/usr/share/lmod/lmod/init/fish"], "csh": ["/usr/share/lmod/lmod/init/csh"]},
          "python_version": f"{sys.version_info.major}.{sys.version_info.minor}", "stack": "/opt/stack/pytorch"}
#: Spaces, a quote, parentheses: what a user's path may hold (the venv's own activate copes with these).
ODD = "my venv's (test)"


def make_venv(path: Path, python: str = sys.executable, *extra: str) -> Path:
    subprocess.run([python, "-m", "venv", "--without-pip", *extra, str(path)], check=True)
    return path


def scripts(venv: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((venv / "bin").iterdir()) if p.name.startswith(("activate", "deactivate"))}


# -- the command itself ------------------------------------------------------------------------------------------
def test_extending_twice_gives_byte_identical_scripts_and_keeps_the_originals(tmp_path: Path):
    venv = make_venv(tmp_path / ODD)
    originals = scripts(venv)
    first = hook.extend(str(venv), CONFIG, out=io.StringIO())
    assert sorted(Path(p).name for p in first) == ["activate", "activate.csh", "activate.fish", CSH_DEACTIVATE]
    once = scripts(venv)
    out = io.StringIO()
    assert hook.extend(str(venv), CONFIG, out=out) == []
    assert scripts(venv) == once and "unchanged" in out.getvalue()
    for name in ("activate", "activate.fish", "activate.csh"):
        assert once[name + ORIG] == originals[name]  # recoverable
        assert BEGIN.encode() in once[name] and originals[name] in once[name]  # the original runs unchanged
    assert (venv / "bin" / "activate").stat().st_mode == (venv / "bin" / "activate.sitestack-orig").stat().st_mode
    hook.undo(str(venv), out=io.StringIO())
    assert scripts(venv) == originals


def test_a_remade_venv_is_extended_from_its_new_scripts(tmp_path: Path):
    venv = make_venv(tmp_path / "v")
    hook.extend(str(venv), CONFIG, out=io.StringIO())
    make_venv(venv, sys.executable, "--clear")  # made again: a new, plain activate
    fresh = (venv / "bin" / "activate").read_bytes()
    assert BEGIN.encode() not in fresh
    hook.extend(str(venv), CONFIG, out=io.StringIO())
    assert (venv / "bin" / "activate.sitestack-orig").read_bytes() == fresh


def test_an_original_whose_copy_is_gone_is_recovered_from_the_extended_script(tmp_path: Path):
    venv = make_venv(tmp_path / "v")
    original = (venv / "bin" / "activate").read_bytes()
    hook.extend(str(venv), CONFIG, out=io.StringIO())
    extended = (venv / "bin" / "activate").read_bytes()
    (venv / "bin" / "activate.sitestack-orig").unlink()
    hook.extend(str(venv), CONFIG, out=io.StringIO())
    assert (venv / "bin" / "activate.sitestack-orig").read_bytes() == original
    assert (venv / "bin" / "activate").read_bytes() == extended
    (venv / "bin" / "activate.sitestack-orig").unlink()
    (venv / "bin" / "activate").write_bytes(extended.replace(END.encode(), b"# edited", 1))
    with pytest.raises(Refused, match="its original .* is gone and the extension was edited"):
        hook.extend(str(venv), CONFIG, out=io.StringIO())


@pytest.mark.parametrize("case", ["missing", "file", "not-a-venv", "other-python", "the-stack"])
def test_what_is_not_the_users_venv_is_refused_with_one_message(case: str, tmp_path: Path, capsys):
    config = dict(CONFIG)
    target = tmp_path / "target"
    expect = {"missing": "does not exist", "file": "is not a directory", "not-a-venv": "is not a Python venv (no pyvenv.cfg",
              "other-python": "uses Python 3.11", "the-stack": "is the stack itself"}[case]
    if case == "file":
        target.write_text("x")
    elif case == "not-a-venv":
        (target / "bin").mkdir(parents=True)
        (target / "bin" / "activate").write_text("# not a venv\n")
    elif case in ("other-python", "the-stack"):
        make_venv(target)
        if case == "other-python":
            config["python_version"] = "3.99"
            expect = f"uses Python {CONFIG['python_version']}, the stack pytorch/2.13.0-cpu is Python 3.99"
        else:
            config["stack"] = str(target)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    assert hook.main([str(target)], config=config) == 1
    err = capsys.readouterr().err
    assert err.startswith("extend-venv-activate: error: ") and expect in err and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # nothing written


def test_csh_is_left_alone_when_csh_cannot_quote_the_settings(tmp_path: Path):
    venv = make_venv(tmp_path / "v")
    original = (venv / "bin" / "activate.csh").read_bytes()
    out = io.StringIO()
    hook.extend(str(venv), {**CONFIG, "module_roots": ["/opt/site modules"]}, out=out)  # a space
    assert "skipped   activate.csh: not extended (csh cannot quote '/opt/site modules' safely)" in out.getvalue()
    assert (venv / "bin" / "activate.csh").read_bytes() == original
    assert BEGIN in (venv / "bin" / "activate").read_text()


def test_a_generation_variable_that_is_not_a_name_is_refused(tmp_path: Path, capsys):
    venv = make_venv(tmp_path / "v")
    before = scripts(venv)
    assert hook.main([str(venv)], config={**CONFIG, "generation_var": "X;touch pwned"}) == 1
    assert "bad generation variable 'X;touch pwned' in this command's settings" in capsys.readouterr().err
    assert scripts(venv) == before


def test_the_settings_name_the_modules_generation_variable():
    """venv-hook's settings carry the variable the stack's module sets (one function names it for both);
    a container stack has no site-packages of its own, so no variable."""
    from sitestack.actions.venv_hook import hook_config
    from sitestack.engine import playbook as pb
    from sitestack.installs.venv_stack import generation_var, stack_for
    from tests.contexts import offline_context

    ctx = offline_context(pb.load(path=REPO / "playbooks" / "local.yml"), prefix="/p")
    stack = stack_for(ctx)
    config = hook_config(ctx, stack)
    assert config["generation_var"] == generation_var(stack) == "__SITESTACK_GENERATION_PYTORCH"
    pick = pick_packages(config, "bash")["pick"]
    assert f"""_sitestack_p="$__SITESTACK_GENERATION_PYTORCH"'/lib/python{stack.python_version}/site-packages'""" in pick
    assert generation_var(dataclasses.replace(stack, name="aws-ofi.rccl/1.0")) == "__SITESTACK_GENERATION_AWS_OFI_RCCL"
    container = hook_config(ctx, dataclasses.replace(stack, source="container"))
    assert container["site_packages"] is None and container["generation_var"] is None


def install_hook(stack: Path, config: dict) -> Path:
    """The command installed into ``stack`` as the venv-hook step writes it (:func:`hook_files`); its path."""
    from sitestack.actions.venv_hook import hook_files

    for relative, (text, mode) in hook_files(config).items():
        path = stack / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(mode)
    return stack / "bin" / "extend-venv-activate"


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_the_installed_command_carries_its_settings_and_runs_alone(tmp_path: Path):
    """The launcher, the modules it imports and the settings, in a tree of their own: it runs with an
    isolated Python (nothing of sitestack on the path), writes nothing into that tree, and says the
    module in its help."""
    from sitestack.actions.venv_hook import hook_files

    files = hook_files(CONFIG)
    assert hook_files(CONFIG) == files and list(files)[-1] == "bin/extend-venv-activate"
    assert files["bin/extend-venv-activate"][0].startswith("#!/usr/bin/env python3\n")
    command = install_hook(tmp_path / "stack", CONFIG)
    installed = tree(tmp_path / "stack")
    venv = make_venv(tmp_path / "v")
    out = subprocess.run([sys.executable, "-I", str(command), str(venv)], capture_output=True, text=True)
    assert out.returncode == 0 and "extended  " in out.stdout, out.stderr
    assert "pytorch/2.13.0-cpu" in (venv / "bin" / "activate").read_text()
    assert (venv / "bin" / "activate").read_bytes() == scripts(venv)["activate"]
    refused = subprocess.run([sys.executable, "-I", str(command), str(tmp_path / "nowhere")], capture_output=True, text=True)
    assert refused.returncode == 1 and refused.stderr.startswith("extend-venv-activate: error: ")
    helped = subprocess.run([str(command), "--help"], capture_output=True, text=True)
    assert helped.returncode == 0 and "loads the module pytorch/2.13.0-cpu and" in " ".join(helped.stdout.split())
    assert tree(tmp_path / "stack") == installed  # no bytecode, nothing else written into the stack


def test_the_installed_command_does_what_the_module_does(tmp_path: Path):
    """Run as the installed command, the venv gets the same scripts as from the module in the checkout."""
    command = install_hook(tmp_path / "stack", CONFIG)
    by_command, by_module = make_venv(tmp_path / "a" / "v"), make_venv(tmp_path / "b" / "v")
    assert subprocess.run([str(command), str(by_command)], capture_output=True).returncode == 0
    hook.extend(str(by_module), CONFIG, out=io.StringIO())
    assert {k: v.replace(b"/b/v", b"/a/v") for k, v in scripts(by_module).items()} == scripts(by_command)


@pytest.mark.parametrize("case", ["missing", "not-json", "not-an-object", "wrong-type", "missing-key", "unknown-key",
                                  "too-large"])
def test_settings_the_command_cannot_use_are_one_message(case: str, tmp_path: Path):
    """Settings missing, not JSON, or not the command's: one line naming the file (and the line or key),
    exit 1, the venv untouched."""
    command = install_hook(tmp_path / "stack", CONFIG)
    settings = tmp_path / "stack" / "share" / "sitestack" / "extend-venv-activate.json"
    text, expect = {
        "missing": (None, "this copy has no stack settings"),
        "not-json": ('{"module": "pytorch/2.13.0-cpu",\n "module_roots": [}', f"{settings}:2: the settings are not JSON"),
        "not-an-object": ("[]", f"{settings}: the settings are not a JSON object"),
        "wrong-type": (json.dumps({**CONFIG, "module_roots": "/opt/m"}), f"{settings}: key 'module_roots': must be a list"),
        "missing-key": (json.dumps({k: v for k, v in CONFIG.items() if k != "python_version"}),
                        f"{settings}: key 'python_version' is missing"),
        "unknown-key": (json.dumps({**CONFIG, "modul": "x"}), f"{settings}: key 'modul' is not a setting of this command"),
        "too-large": (" " * (1 << 16) + json.dumps(CONFIG), f"{settings}: larger than {1 << 16} bytes"),
    }[case]
    if text is None:
        settings.unlink()
    else:
        settings.write_text(text)
    venv = make_venv(tmp_path / "v")
    before = scripts(venv)
    out = subprocess.run([sys.executable, "-I", str(command), str(venv)], capture_output=True, text=True)
    assert out.returncode == 1 and out.stdout == "", out
    assert out.stderr.startswith("extend-venv-activate: error: ") and expect in out.stderr, out.stderr
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr, out.stderr
    assert scripts(venv) == before


def test_the_commands_modules_keep_to_python_3_6():
    """The command runs with the python3 a user's shell finds: its modules (and the package's
    __init__.py) parse as Python 3.6 and postpone no annotations."""
    import ast

    from sitestack.core.shipped import ONSITE, imported

    modules = imported("activate_hook")
    assert {"__init__.py", "activate_hook.py", "activate/bash.py", "activate/venv.py"} <= set(modules)
    for relative in modules:
        tree = ast.parse((ONSITE / relative).read_text(), relative, feature_version=(3, 6))
        futures = [a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == "__future__"
                   for a in n.names]
        assert futures == [], relative


# -- real shells, real Lmod, the session's stack -------------------------------------------------------------------
def shadow_wheel(directory: Path, name: str = "filelock", version: str = "99.0") -> Path:
    """A tiny wheel of a package the stack also has (torch needs filelock), at a version it has not."""
    files = {f"{name}/__init__.py": f'__version__ = "{version}"\nFROM = "user venv"\n'.encode(),
             f"{name}-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
             f"{name}-{version}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},{len(d)}\n"
                     for p, d in files.items()) + f"{name}-{version}.dist-info/RECORD,,\n"
    wheel = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for p, d in files.items():
            z.writestr(p, d)
        z.writestr(f"{name}-{version}.dist-info/RECORD", record)
    return wheel


@pytest.fixture(scope="module")
def user_venv(local_stack, tmp_path_factory):
    """A user's venv on top of the stack, with a package that shadows the stack's, extended by the
    stack's own extend-venv-activate (twice: the second run changes nothing)."""
    root = tmp_path_factory.mktemp("user")
    venv = root / ODD
    stack_python = str(local_stack.venv / "bin" / "python")
    subprocess.run([stack_python, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True)
    wheel = shadow_wheel(root)
    pip = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                          "--no-deps", "--no-index", str(wheel)], capture_output=True, text=True)
    assert pip.returncode == 0, pip.stderr
    command = local_stack.venv / "bin" / "extend-venv-activate"
    first = subprocess.run([str(command), str(venv)], capture_output=True, text=True, env=clean_env())
    assert first.returncode == 0, first.stderr
    extended = scripts(venv)
    second = subprocess.run([str(command), str(venv)], capture_output=True, text=True, env=clean_env())
    assert second.returncode == 0 and "extended " not in second.stdout, second.stdout
    assert scripts(venv) == extended  # byte-identical
    return venv


def dumps(tmp: Path, *names: str) -> list[dict[str, str]]:
    return [parse_env((tmp / n).read_bytes().decode()) for n in names]


PROBE = ("import filelock, torch, mpi4py, sys; "
         "print(filelock.__version__, filelock.FROM, torch.__version__, sys.executable)")


def check_active(out: str, venv: Path, module: str) -> None:
    lines = [line for line in out.splitlines() if line.startswith(("LOADED=", "99.0 "))]
    assert f"LOADED={module}" in lines[0] or f":{module}" in lines[0], out
    assert lines[1].startswith("99.0 user venv 2.13.0+cpu ") and lines[1].endswith(f"{venv}/bin/python"), out




@pytest.mark.integration
@pytest.mark.parametrize("sh", ["bash", "zsh"])
def test_bash_and_zsh_activate_loads_the_stack_and_deactivate_restores_exactly(sh: str, user_venv, local_stack,
                                                                             tmp_path: Path):
    if not shutil.which(sh):
        pytest.skip(f"{sh} is not installed")
    q = shlex.quote(str(user_venv))
    script = f"""set -eu
. {LMOD_INIT}/{sh}
env -0 > "$T/before"
. {q}/bin/activate
echo "LOADED=$LOADEDMODULES"
python -c {shlex.quote(PROBE)}
env -0 > "$T/during"
deactivate
env -0 > "$T/after"
. {q}/bin/activate
. {q}/bin/activate
deactivate
env -0 > "$T/again"
:  # not the last command: zsh execs that one, with SHLVL one lower
"""
    out = shell([sh, "-f", "-c"] if sh == "zsh" else ["bash", "-c"], script, clean_env(T=str(tmp_path)))
    assert out.returncode == 0, out.stdout + out.stderr
    check_active(out.stdout, user_venv, local_stack.name)
    before, during, after, again = dumps(tmp_path, "before", "during", "after", "again")
    assert during["VIRTUAL_ENV"] == str(user_venv)
    # the stack's site-packages: the generation's the module loaded where it names it, else the stable path's
    generation = during.get("__SITESTACK_GENERATION_PYTORCH")
    assert generation is None or generation == os.path.realpath(local_stack.venv), generation
    assert during["PYTHONPATH"].split(":")[:2] == [f"{user_venv}/lib/python3.11/site-packages",
                                                   f"{generation or local_stack.venv}/lib/python3.11/site-packages"]
    assert during["GLOO_SOCKET_IFNAME"] == "lo"  # the module's settings
    assert after == before  # exactly, Lmod's own variables included
    assert again == before  # activating twice, then deactivating


@pytest.mark.integration
@pytest.mark.parametrize("sh", ["fish", "csh"])
def test_fish_and_csh_activate_loads_the_stack_and_deactivate_restores(sh: str, user_venv, local_stack, tmp_path: Path):
    binary = "fish" if sh == "fish" else "tcsh"
    if not shutil.which(binary):
        pytest.skip(f"{binary} is not installed")
    venv = str(user_venv)
    if sh == "fish":
        argv = ["fish", "--no-config", "-c"]
        script = f"""source {LMOD_INIT}/fish
env -0 > "$T/before"
source {shlex.quote(venv)}/bin/activate.fish
echo "LOADED=$LOADEDMODULES"
python -c {shlex.quote(PROBE)}
deactivate
env -0 > "$T/after"
"""
    else:
        argv = ["tcsh", "-f", "-c"]
        # csh runs `-c` as one line: use a script file; `prompt` as an interactive csh has it
        body = f"""set prompt = "> "
source {LMOD_INIT}/csh
env -0 > "$T/before"
source "{venv}/bin/activate.csh"
echo "LOADED=$LOADEDMODULES"
python -c '{PROBE}'
deactivate
env -0 > "$T/after"
"""
        (tmp_path / "run.csh").write_text(body)
        argv, script = ["tcsh", "-f"], str(tmp_path / "run.csh")
    out = shell(argv, script, clean_env(T=str(tmp_path)))
    assert out.returncode == 0, out.stdout + out.stderr
    check_active(out.stdout, user_venv, local_stack.name)
    before, after = dumps(tmp_path, "before", "after")
    if sh == "fish":
        assert after == before  # exactly, Lmod's own variables included
    else:
        assert without_lmod_bookkeeping(after) == without_lmod_bookkeeping(before)


@pytest.mark.integration
def test_a_module_loaded_before_activation_stays_loaded(user_venv, local_stack, tmp_path: Path):
    q = shlex.quote(str(user_venv))
    script = f"""set -eu
. {LMOD_INIT}/bash
module use {shlex.quote(str(local_stack.modules))}
module load {local_stack.name}
env -0 > "$T/before"
. {q}/bin/activate
deactivate
env -0 > "$T/after"
echo "LOADED=$LOADEDMODULES"
"""
    out = shell(["bash", "-c"], script, clean_env(T=str(tmp_path)))
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"LOADED={local_stack.name}" in out.stdout
    before, after = dumps(tmp_path, "before", "after")
    assert after == before


@pytest.mark.integration
def test_a_module_that_does_not_load_is_said_and_undone(local_stack, tmp_path: Path):
    venv = make_venv(tmp_path / "v", str(local_stack.venv / "bin" / "python"), "--system-site-packages")
    config = {**CONFIG, "module": "pytorch/0.0-missing", "module_roots": [str(local_stack.modules)],
              "stack": str(local_stack.venv)}
    hook.extend(str(venv), config, out=io.StringIO())
    script = f""". {LMOD_INIT}/bash
env -0 > "$T/before"
. {shlex.quote(str(venv))}/bin/activate; echo "rc=$?"
command -v python
deactivate
env -0 > "$T/after"
"""
    out = shell(["bash", "-c"], script, clean_env(T=str(tmp_path)))
    assert "rc=1" in out.stdout and f"{venv}/bin/python" in out.stdout, out.stdout + out.stderr
    assert "extend-venv-activate: module load pytorch/0.0-missing failed; the venv is active without the stack" in out.stderr
    before, after = dumps(tmp_path, "before", "after")
    assert after == before


# -- real shells, real Lmod, a stand-in module: the user's own values come back --------------------------------------
#: The stand-in module sets a variable with setenv (unloading unsets it: deactivate must put the user's
#: value back), one with pushenv (unloading puts it back itself) and prepends to PYTHONPATH.
STUB_MODULE = """setenv("STUB_SET", "module's")
pushenv("STUB_PUSHED", "module's")
prepend_path("PYTHONPATH", "/stub/site-packages")
"""


def stub_packages(tmp_path: Path) -> str:
    """The stand-in stack's site-packages, which activation puts after the venv's own."""
    return f"{tmp_path}/no-stack/lib/python{CONFIG['python_version']}/site-packages"


#: The variable in which the stand-in module keeps its generation (when it is given one).
STUB_GENERATION = "__SITESTACK_GENERATION_STUB"


def stub_venv(tmp_path: Path, generation: str | None = None) -> Path:
    """A plain venv extended to load module ``stub/1.0`` (written under ``tmp_path/modules``). With
    ``generation``, the module also sets :data:`STUB_GENERATION` to it, as a stack's module does with
    the generation it loaded; without, it is a module file older than generations."""
    (tmp_path / "modules" / "stub").mkdir(parents=True)
    extra = f'setenv("{STUB_GENERATION}", "{generation}")\n' if generation else ""
    (tmp_path / "modules" / "stub" / "1.0.lua").write_text(STUB_MODULE + extra)
    venv = make_venv(tmp_path / ODD)
    hook.extend(str(venv), {**CONFIG, "module": "stub/1.0", "module_roots": [str(tmp_path / "modules")],
                            "stack": str(tmp_path / "no-stack"), "site_packages": stub_packages(tmp_path),
                            "generation_var": STUB_GENERATION}, out=io.StringIO())
    return venv


@pytest.mark.integration
@pytest.mark.parametrize("sh", ["bash", "zsh", "fish", "csh"])
def test_deactivate_gives_back_the_values_the_user_had_before(sh: str, tmp_path: Path):
    """The user had their own PYTHONPATH and values for what the module sets: after deactivate the
    environment is the one before activation (csh: what its deactivate puts back, PYTHONPATH and the
    module's pushenv, apart from Lmod's bookkeeping)."""
    binary = "tcsh" if sh == "csh" else sh
    if not shutil.which(binary):
        pytest.skip(f"{binary} is not installed")
    venv = stub_venv(tmp_path)
    mine = {"PYTHONPATH": "/mine/a:/mine/b", "STUB_PUSHED": "user's pushed", "MODULEPATH": "/opt/user/modules"}
    if sh != "csh":  # csh's deactivate puts back PYTHONPATH only; the rest is `module unload`'s
        mine["STUB_SET"] = "user's set"
    steps = {"bash": (". {init}/bash", ". {venv}/bin/activate"), "zsh": (". {init}/zsh", ". {venv}/bin/activate"),
             "fish": ("source {init}/fish", "source {venv}/bin/activate.fish"),
             "csh": ("source {init}/csh", "source {venv}/bin/activate.csh")}[sh]
    init, activate = (s.format(init=LMOD_INIT, venv=shlex.quote(str(venv))) for s in steps)
    prompt = 'set prompt = "> "' if sh == "csh" else ""   # as an interactive csh has it
    body = (f'{prompt}\n{init}\nenv -0 > "$T/before"\n{activate}\n'
            'env -0 > "$T/during"\ndeactivate\nenv -0 > "$T/after"\n:\n')
    argv = {"bash": ["bash", "-c"], "zsh": ["zsh", "-f", "-c"], "fish": ["fish", "--no-config", "-c"],
            "csh": ["tcsh", "-f"]}[sh]
    if sh == "csh":  # csh runs `-c` as one line: a script file
        (tmp_path / "run.csh").write_text(body)
        body = str(tmp_path / "run.csh")
    out = shell(argv, body, clean_env(T=str(tmp_path), **mine))
    assert out.returncode == 0, out.stdout + out.stderr
    before, during, after = dumps(tmp_path, "before", "during", "after")
    assert all(before[k] == v for k, v in mine.items())
    assert during["STUB_PUSHED"] == "module's" and during.get("STUB_SET") == "module's", during
    # the venv's packages, then the stack's (a venv on the stack's base Python sees them only so), then the module's
    assert during["PYTHONPATH"] == f"{venv}/lib/python{CONFIG['python_version']}/site-packages:" \
                                   f"{stub_packages(tmp_path)}:/stub/site-packages:/mine/a:/mine/b"
    if sh == "csh":
        assert without_lmod_bookkeeping(after) == without_lmod_bookkeeping(before)
    else:
        assert after == before  # exactly, Lmod's own variables included


def generations(tmp_path: Path) -> str:
    """The stand-in stack's two generations, ``a`` and ``b``, each with a module ``stackgen`` that says
    which it is; the stable path (``no-stack``, as :func:`stub_packages` has it) links to ``a``, the
    current one, whose path this returns."""
    for token in ("a", "b"):
        packages = tmp_path / f".no-stack.gen-{token}" / "lib" / f"python{CONFIG['python_version']}" / "site-packages"
        packages.mkdir(parents=True)
        (packages / "stackgen.py").write_text(f'GEN = "{token}"\n')
    (tmp_path / "no-stack").symlink_to(".no-stack.gen-a")
    return str(tmp_path / ".no-stack.gen-a")


@pytest.mark.integration
@pytest.mark.parametrize("module", ["sets-generation", "older"])
@pytest.mark.parametrize("sh", ["bash", "zsh", "fish", "csh"])
def test_a_shell_keeps_the_generation_its_module_loaded_through_an_upgrade(sh: str, module: str, tmp_path: Path):
    """The module says which generation it loaded: activation puts that generation's site-packages on
    PYTHONPATH, not the stable link's, so a process started after the link moved to a new generation
    still imports from the loaded one. An older module file (no variable): the stable path, as before,
    and the new generation after the move. Deactivate gives back the environment either way."""
    binary = "tcsh" if sh == "csh" else sh
    if not shutil.which(binary):
        pytest.skip(f"{binary} is not installed")
    loaded = generations(tmp_path)
    venv = stub_venv(tmp_path, loaded if module == "sets-generation" else None)
    init, activate = {"bash": ("bash", "activate"), "zsh": ("zsh", "activate"), "fish": ("fish", "activate.fish"),
                      "csh": ("csh", "activate.csh")}[sh]
    source = "." if sh in ("bash", "zsh") else "source"
    probe = "python -c 'import stackgen; print(\"GEN=\" + stackgen.GEN)'"
    body = "\n".join([
        'set prompt = "> "' if sh == "csh" else "", f"{source} {LMOD_INIT}/{init}", 'env -0 > "$T/before"',
        f"{source} {shlex.quote(str(venv))}/bin/{activate}", 'env -0 > "$T/during"', probe,
        'ln -sfn .no-stack.gen-b "$T/no-stack"', probe,  # the upgrade: the stable link moves on
        "deactivate", 'env -0 > "$T/after"', ":\n"])
    argv = {"bash": ["bash", "-c"], "zsh": ["zsh", "-f", "-c"], "fish": ["fish", "--no-config", "-c"], "csh": ["tcsh", "-f"]}[sh]
    if sh == "csh":  # csh runs `-c` as one line: a script file
        (tmp_path / "run.csh").write_text(body)
        body = str(tmp_path / "run.csh")
    out = shell(argv, body, clean_env(T=str(tmp_path), PYTHONPATH="/mine"))
    assert out.returncode == 0, out.stdout + out.stderr
    before, during, after = dumps(tmp_path, "before", "during", "after")
    stack = loaded if module == "sets-generation" else str(tmp_path / "no-stack")
    assert during["PYTHONPATH"] == f"{venv}/lib/python{CONFIG['python_version']}/site-packages:" \
                                   f"{stack}/lib/python{CONFIG['python_version']}/site-packages:/stub/site-packages:/mine"
    gens = [line for line in out.stdout.splitlines() if line.startswith("GEN=")]
    assert gens == (["GEN=a", "GEN=a"] if module == "sets-generation" else ["GEN=a", "GEN=b"]), out.stdout + out.stderr
    if sh == "csh":
        assert without_lmod_bookkeeping(after) == without_lmod_bookkeeping(before)
    else:
        assert after == before  # exactly: the module's variable and the generation's path are gone


def test_the_step_installs_the_command_upgrades_a_single_file_one_and_leaves_a_retired_generation_alone(tmp_path: Path):
    """venv-hook on a stack behind its stable link: missing -> written (the launcher 0755, last); a command of
    the single-file kind (what sitestack installed before) differs and --diff shows it; a wrong mode is put
    right; a generation switched out keeps its own files (every write is a rename: hard links stay)."""
    from sitestack.actions import ACTIONS
    from sitestack.core.host import LocalHost
    from sitestack.engine import playbook as pb
    from tests.contexts import offline_context

    site = pb.load(path=REPO / "playbooks" / "local.yml")
    ctx = offline_context(site, prefix=str(tmp_path / "prefix"))
    step = ACTIONS["venv-hook"].from_spec(next(s for s in site.steps if s.action == "venv-hook"), ctx)
    stable = Path(step.stack.path)
    first = stable.parent / ".gen-1"
    (first / "bin").mkdir(parents=True)
    (first / "bin" / "python").symlink_to(sys.executable)
    stable.symlink_to(first.name)
    host = LocalHost()
    assert step.pending(host) == (f"{stable}/share/sitestack/onsite/__init__.py missing; "
                                  f"{stable}/share/sitestack/onsite/activate/__init__.py missing; "
                                  f"and {len(step.files()) - 2} more")
    step.apply(host)
    assert step.pending(host) is None and step.diff(host) is None
    command = stable / "bin" / "extend-venv-activate"
    assert command.stat().st_mode & 0o777 == 0o755 and (stable / "share/sitestack/extend-venv-activate.json").is_file()
    command.write_text("#!/usr/bin/env python3\n# The stack's extend-venv-activate, installed by sitestack; do not edit.\n")
    assert step.pending(host) == f"{command} differs"
    diff = step.diff(host)
    assert diff is not None and f"--- {command} (on host)" in diff and "+runpy.run_module(\"onsite.activate_hook\"" in diff
    step.apply(host)
    command.chmod(0o644)
    assert step.pending(host) == f"{command} mode 644, want 755"
    step.apply(host)
    assert step.pending(host) is None
    # The next generation, made as stack-venv makes one (files hard-linked), switched in, while the stack held settings
    # of an older run: the step puts the new ones into the current generation; the retired one keeps its bytes.
    settings = stable / "share/sitestack/extend-venv-activate.json"
    settings.write_text("{}\n")
    second = stable.parent / ".gen-2"
    subprocess.run(["cp", "-al", str(first), str(second)], check=True)
    (stable.parent / "next").symlink_to(second.name)
    os.replace(stable.parent / "next", stable)
    retired = tree(first)
    assert step.pending(host) == f"{settings} differs"
    step.apply(host)
    assert step.pending(host) is None and tree(first) == retired and settings.read_text() != "{}\n"
