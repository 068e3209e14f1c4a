"""A tool's identity in the install digest is what it is (its real executable, its version, for the
interpreter its ABI), not how ``PATH`` spells it; and sitestack's own virtual environment is invisible
to the site's commands (sitestack/core/host.py: site_environ).

An administrator's second ``invoke provision`` rebuilt mpi4py ("site toolchain changed: python3")
because ``python3`` was a pyenv shim in one shell (https://github.com/pyenv/pyenv#understanding-shims)
and the real binary in another; run from sitestack's activated ``.venv`` it was the venv's. Here
``python3`` is reached in each of those ways, for real, and the recipe's digest must not move; a
genuinely other interpreter (a ``--copies`` venv's binary, the system's Python) must move it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from sitestack.core.host import LocalHost
from sitestack.installs.inputs import build_inputs, digest, explain_change
from sitestack.installs.target import Target
from sitestack.installs.toolchain import probe_toolchain
from sitestack.model.recipe import load_recipe
from tests.conftest import REPO, run_invoke
from tests.recipe_facts import facts
from tests.recipe_projects import hello_recipe, make_hello

#: The interpreter running the tests, as it really is (behind sitestack's venv link).
REAL = os.path.realpath(sys.executable)
REST = "/usr/bin:/bin"   # make, cc, tar, readlink...


def hello_sources(root: Path) -> Path:
    """A sources/ dir with the small autotools recipe, which names ``python3`` among its tools (its
    digest records the tool and the interpreter)."""
    sources = root / "sources"
    if not sources.is_dir():
        sources.mkdir(parents=True)
        (sources / "hello.yml").write_text(hello_recipe({"1.0": make_hello(root, "1.0")}, tools=["python3"]))
    return sources


def build_digest(root: Path) -> dict:
    """The hello recipe's build inputs for a site without modules whose Python is ``python3``, with the
    toolchain probed for real on this machine under the current ``PATH``."""
    recipe = load_recipe("hello", hello_sources(root))
    target = Target(recipe, "1.0", facts(modules={"system": "none"}), str(root / "prefix" / "hello" / "1.0"),
                    str(root / "prefix"), "python3")
    return build_inputs(target, probe_toolchain(LocalHost(), target))


def executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def spellings(root: Path) -> dict[str, str]:
    """``PATH`` values under which ``python3`` is the same interpreter, spelled another way each (and
    ``make`` the same tool: in the symlink farm too)."""
    links = root / "links"
    links.mkdir()
    (links / "python3").symlink_to(REAL)
    (links / "make").symlink_to(shutil.which("make", path=REST) or "/usr/bin/make")
    shim = executable(root / "shims" / "python3", f'#!/bin/sh\nexec {REAL} "$@"\n')
    return {"real": f"{os.path.dirname(REAL)}:{REST}", "symlink": f"{links}:{REST}", "shim": f"{shim.parent}:{REST}"}


def copies_venv(root: Path) -> Path:
    """A venv with a binary of its own (``--copies``): the same version, but another executable. It sees
    sitestack and its packages through a .pth file (as tests/test_install.py's venv does)."""
    venv = root / "copies"
    subprocess.run([REAL, "-m", "venv", "--copies", "--without-pip", str(venv)], check=True)
    purelib = subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "sitestack-tests.pth").write_text(f"{REPO}\n{sysconfig.get_path('purelib')}\n")
    return venv


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A HOME of its own (the probe cache under it) and the logs beside the prefix."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SITESTACK_LOG_DIR", str(tmp_path / "logs"))
    monkeypatch.delenv("VIRTUAL_ENV", raising=False)
    return tmp_path / "home"


FROM_VENV = """
import json, sys
from pathlib import Path
from sitestack.core.host import LocalHost
from tests.test_toolchain_identity import build_digest
script = 'printf "%s\\n%s\\n%s\\n" "$PATH" "${VIRTUAL_ENV-unset}" "${PYTHONPATH-unset}"'
seen = LocalHost().probe(["sh", "-c", script]).stdout.splitlines()
print(json.dumps({"inputs": build_digest(Path(sys.argv[1])), "path": seen[0], "virtual_env": seen[1],
                  "pythonpath": seen[2]}))
"""


def test_the_digest_is_the_interpreters_whatever_path_names_it(tmp_path: Path, home: Path,
                                                               monkeypatch: pytest.MonkeyPatch):
    inputs = {}
    paths = spellings(tmp_path)
    for name, path in paths.items():
        monkeypatch.setenv("PATH", path)
        inputs[name] = build_digest(tmp_path)
    assert len({digest(i) for i in inputs.values()}) == 1, {k: i["toolchain"] for k, i in inputs.items()}
    toolchain = inputs["shim"]["toolchain"]
    assert toolchain["tools"]["make"].startswith(os.path.realpath(shutil.which("make", path=REST) or "") + " | ")
    assert toolchain["tools"]["python3"].startswith(f"{REAL} | Python ")
    assert toolchain["interpreter"]["realpath"] == REAL
    assert toolchain["interpreter"]["abi"] == f"{sys.implementation.cache_tag} {sysconfig.get_config_var('SOABI')}"

    # sitestack run from an activated venv of its own (a --copies one: its python3 is another binary):
    # its bin first on PATH, VIRTUAL_ENV set; its steps see neither
    venv = copies_venv(tmp_path)
    env = {**os.environ, "PATH": f"{venv}/bin:{paths['shim']}", "VIRTUAL_ENV": str(venv),
           "PYTHONPATH": f"{venv}/lib/extra"}
    out = subprocess.run([str(venv / "bin" / "python"), "-c", FROM_VENV, str(tmp_path)], cwd="/", env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    answer = json.loads(out.stdout)
    assert answer["path"] == paths["shim"] and answer["virtual_env"] == answer["pythonpath"] == "unset"
    assert digest(answer["inputs"]) == digest(inputs["real"]), answer["inputs"]["toolchain"]

    # a genuinely other interpreter: that venv's binary when it is the site's python3 (it is not
    # sitestack's venv here), or the system's Python
    monkeypatch.setenv("PATH", f"{venv}/bin:{REST}")
    other = build_digest(tmp_path)
    assert other["toolchain"]["interpreter"]["realpath"] == f"{venv}/bin/python3"
    assert digest(other) != digest(inputs["real"])
    assert explain_change({"build": inputs["real"]}, {"build": other}) == "site toolchain changed: interpreter, python3"
    system = "/usr/bin/python3"
    if os.path.realpath(system) != REAL and os.access(system, os.X_OK):
        monkeypatch.setenv("PATH", REST)
        assert digest(build_digest(tmp_path)) != digest(inputs["real"])



@pytest.mark.integration
def test_a_built_install_stays_current_whatever_path_names_python3(tmp_path: Path, home: Path):
    """Built once, then checked under the other spellings and from an activated venv of sitestack's own:
    nothing to change; under another interpreter it would be built again, and the message says why."""
    paths = spellings(tmp_path)
    env = {"SITESTACK_BUILD_CACHE": str(tmp_path / "cache"), "SITESTACK_SOURCE_CACHE": str(tmp_path / "src"),
           "PATH": paths["real"]}
    args = ["build-recipe", "hello", "--site", "local", "--sources-dir", str(hello_sources(tmp_path)),
            "--prefix", str(tmp_path / "prefix")]
    built = run_invoke(*args, env=env, timeout=600)
    assert built.returncode == 0, built.stdout + built.stderr
    for name in ("symlink", "shim"):
        out = run_invoke(*args, "--check", env={**env, "PATH": paths[name]})
        assert out.returncode == 0 and status(out.stdout) == "ok", (name, out.stdout + out.stderr)
    venv = copies_venv(tmp_path)
    out = subprocess.run([str(venv / "bin" / "python"), "-m", "invoke", *args, "--check"], cwd=REPO, text=True,
                         capture_output=True, timeout=300,
                         env={**os.environ, **env, "PATH": f"{venv}/bin:{paths['shim']}", "VIRTUAL_ENV": str(venv)})
    assert out.returncode == 0 and status(out.stdout) == "ok", out.stdout + out.stderr
    other = run_invoke(*args, "--check", env={**env, "PATH": f"{venv}/bin:{REST}"})
    assert "hello@1.0: would change: inputs changed: site toolchain changed: interpreter, python3" in other.stdout, \
        other.stdout + other.stderr


def status(out: str) -> str:
    """The hello install's status in a run's report."""
    found = re.findall(r"^\[localhost\] (\w+) +hello@1\.0\b", out, re.M)
    return found[0] if len(found) == 1 else out


def older_stamp(stamp_path: Path, spelled: dict[str, str], interpreter: dict[str, str]) -> None:
    """Rewrite the stamp as sitestack wrote it before tool identities: each tool by the path ``PATH``
    gave (``spelled``), the interpreter with its ``sys.executable`` (and no ABI)."""
    stamp = json.loads(stamp_path.read_text())
    toolchain = stamp["inputs"]["build"]["toolchain"]
    for name, path in spelled.items():
        toolchain["tools"][name] = f"{path} | {toolchain['tools'][name].split(' | ', 1)[1]}"
    toolchain["interpreter"] = interpreter
    stamp["digest"] = digest(stamp["inputs"])
    stamp_path.write_text(json.dumps(stamp))


@pytest.mark.integration
def test_an_older_sitestacks_stamp_of_the_same_tools_needs_no_rebuild(tmp_path: Path, home: Path):
    paths = spellings(tmp_path)
    env = {"SITESTACK_BUILD_CACHE": str(tmp_path / "cache"), "SITESTACK_SOURCE_CACHE": str(tmp_path / "src"),
           "PATH": paths["shim"]}
    args = ["build-recipe", "hello", "--site", "local", "--sources-dir", str(hello_sources(tmp_path)),
            "--prefix", str(tmp_path / "prefix")]
    built = run_invoke(*args, env=env, timeout=600)
    assert built.returncode == 0, built.stdout + built.stderr
    stamp_path = tmp_path / "prefix" / "hello" / "1.0" / ".sitestack" / "install.json"
    current = json.loads(stamp_path.read_text())
    version = current["inputs"]["build"]["toolchain"]["interpreter"]["version"]
    spelled = {"python3": str(tmp_path / "shims" / "python3"), "make": str(tmp_path / "links" / "make")}
    older_stamp(stamp_path, spelled, {"executable": REAL, "realpath": REAL, "version": version})

    checked = run_invoke(*args, "--check", env=env)
    assert status(checked.stdout) == "ok", checked.stdout + checked.stderr
    assert json.loads(stamp_path.read_text())["digest"] != current["digest"]   # check mode writes nothing
    again = run_invoke(*args, env=env)
    assert status(again.stdout) == "ok", again.stdout + again.stderr
    assert json.loads(stamp_path.read_text())["digest"] == current["digest"]   # the stamp in the current form

    # an older stamp of another interpreter is another interpreter still
    older_stamp(stamp_path, spelled, {"executable": "/usr/bin/python3", "realpath": "/usr/bin/python3.11",
                                      "version": version})
    other = run_invoke(*args, "--check", env=env)
    assert "would change: inputs changed: site toolchain changed: interpreter" in other.stdout, other.stdout
