"""Contracts of core/ and installs/ that a one-line change could silently break: each test here
fails when its rule is switched off (placeholders without a value, the atomic generation swap,
check mode's read-only host, the quoting seam, control characters, redaction, the umask, the YAML
limits, install stamps)."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import tarfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

import pytest

from sitestack.core import placeholders
from sitestack.core.errors import SitestackError
from tests.conftest import REPO, tree


# -- placeholders: a recipe string must be complete ---------------------------------------------------
def test_a_placeholder_without_a_value_raises_naming_it_when_asked_to():
    with pytest.raises(SitestackError, match=r"placeholder \{rocm_home\} has no value"):
        placeholders.expand("--with-rocm={rocm_home}", {"version": "1"}, missing="raise")
    with pytest.raises(SitestackError, match=r"\{cuda_home\}"):
        placeholders.expand_all({"env": ["a={version}", "b={cuda_home}"]}, {"version": "1"}, missing="raise")
    assert placeholders.expand("{a}-{b}", {"a": "x"}, missing="keep") == "x-{b}"
    assert placeholders.expand("{a}-{{b}}", {"a": "x"}, missing="raise") == "x-{b}"


def _recipe_dir(root: Path, args: str, configure: bytes = b"#!/bin/sh\n") -> tuple[Path, Path]:
    """A source directory with recipe ``demo`` (autotools, build ``args``, its ``configure`` script)
    and its verified tarball."""
    tarball = root / "demo-1.0.tar.gz"
    with tarfile.open(tarball, "w:gz") as tar:
        info = tarfile.TarInfo("demo-1.0/configure")
        data = configure
        info.size, info.mode = len(data), 0o755
        tar.addfile(info, io.BytesIO(data))
    sha = hashlib.sha256(tarball.read_bytes()).hexdigest()
    sources = root / "sources"
    sources.mkdir()
    (sources / "demo.yml").write_text(
        "name: demo\ndescription: a recipe of the tests\nhomepage: https://example.invalid/demo\nbuild: autotools\n"
        f'default_version: "1.0"\nargs: [{args}]\nversions:\n  "1.0":\n'
        f"    url: https://example.invalid/demo-{{version}}.tar.gz\n    sha256: {sha}\nsanity: [bin/demo]\n")
    return sources, tarball


def test_a_recipe_placeholder_the_site_has_no_value_for_fails_the_build_naming_it(tmp_path: Path):
    """The local site has no ROCm: a recipe argument using {rocm_home} is an error, in check mode
    too, not a build run with a literal ``{rocm_home}`` in its configure line."""
    sources, tarball = _recipe_dir(tmp_path, '"--with-rocm={rocm_home}"')
    prefix = tmp_path / "prefix"
    run = subprocess.run([sys.executable, "-m", "invoke", "--search-root", str(REPO), "build-recipe", "demo", "--site",
                          "local", "--sources-dir", str(sources), "--source", str(tarball), "--prefix", str(prefix),
                          "--check"], cwd=tmp_path, text=True, capture_output=True, timeout=120,
                         env={**os.environ, "SITESTACK_LOG_DIR": str(tmp_path / "logs")})
    assert run.returncode == 1, run.stdout + run.stderr
    assert "demo@1.0: would fail: placeholder {rocm_home} has no value on this site" in run.stdout, run.stdout
    assert "Traceback" not in run.stdout + run.stderr
    assert not prefix.exists()


def test_a_failed_build_command_leaves_a_kit_that_runs_it_again(tmp_path: Path):
    """configure fails: the failure names the re-run kit in the build directory; its cmd.sh runs the same
    command in the same directory with the same environment (the same output, the same exit code), and
    its env.sh, sourced, gives the command's variables; the kit is the user's alone."""
    script = b'#!/bin/sh\necho "configure in $PWD with $*"\nexit 3\n'
    sources, tarball = _recipe_dir(tmp_path, '"--with-demo=yes"', script)
    run = subprocess.run([sys.executable, "-m", "invoke", "--search-root", str(REPO), "build-recipe", "demo", "--site",
                          "local", "--sources-dir", str(sources), "--source", str(tarball), "--prefix",
                          str(tmp_path / "prefix")], cwd=tmp_path, text=True, capture_output=True, timeout=300,
                         env={**os.environ, "SITESTACK_LOG_DIR": str(tmp_path / "logs")})
    assert run.returncode == 1, run.stdout + run.stderr
    match = re.search(r"re-run kit: (\S+)/cmd\.sh \(its environment: \. (\S+)/env\.sh\)", run.stdout)
    assert match and match.group(1) == match.group(2), run.stdout
    kit = Path(match.group(1))
    first = re.search(r"configure in (\S+) with (.*)", run.stdout)
    assert first, run.stdout
    again = subprocess.run(["bash", str(kit / "cmd.sh")], cwd="/", text=True, capture_output=True, timeout=60,
                           env={"PATH": os.environ["PATH"], "HOME": os.environ["HOME"]})
    assert again.returncode == 3 and again.stdout.strip() == first.group(0).strip(), (again.stdout, first.group(0))
    assert stat.S_IMODE((kit / "env.sh").stat().st_mode) == 0o600 and stat.S_IMODE(kit.stat().st_mode) == 0o700
    sourced = subprocess.run(["bash", "-c", f". {shlex.quote(str(kit / 'env.sh'))} && env"], text=True,
                             capture_output=True, timeout=60, env={"PATH": os.environ["PATH"]})
    assert sourced.returncode == 0 and re.search(r"(?m)^MAKEFLAGS=-j\d+$", sourced.stdout), sourced.stdout + sourced.stderr


def test_the_kit_never_writes_a_credential():
    from sitestack.engine import playbook as pb
    from sitestack.installs.rerun import env_script

    text = env_script(pb.load("local").facts, {"PIP_INDEX_URL": "https://alice:s3cret@pypi.example/simple", "CC": "gcc"},
                      True, "demo 1.0")
    assert "s3cret" not in text and "# export PIP_INDEX_URL=... (holds a credential" in text and "export CC=gcc" in text


# -- the generation swap: a reader never sees the path missing -------------------------------------
def test_the_generation_swap_never_leaves_the_path_missing(tmp_path: Path):
    """A reader resolving the link in a tight loop during many swaps always finds a tree."""
    from sitestack.core.swap import swap_argv

    leaf = tmp_path / "v"
    missing: list[str] = []
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            try:
                os.readlink(leaf)   # the link itself (resolving it may race the removal of the old tree)
            except FileNotFoundError as exc:
                missing.append(str(exc))

    (tmp_path / ".v.tree-0").mkdir()
    subprocess.run(swap_argv(str(tmp_path), "v", ".v.tree-0", "t0"), check=True)
    watcher = threading.Thread(target=reader)
    watcher.start()
    try:
        for i in range(1, 120):
            (tmp_path / f".v.tree-{i}").mkdir()
            subprocess.run(swap_argv(str(tmp_path), "v", f".v.tree-{i}", f"t{i}"), check=True)
            if missing:
                break
    finally:
        stop.set()
        watcher.join()
    assert not missing, f"the swapped path was missing {len(missing)} times: {missing[0]}"
    assert os.readlink(leaf) == f".v.tree-{i}"
    assert len([p for p in tmp_path.iterdir() if p.name.startswith(".v.link-")]) == 0



# -- check mode: the host is read-only ----------------------------------------------------------------
def test_a_check_mode_provision_writes_nothing_on_the_host(tmp_path: Path):
    """`provision --check` plans every step against a read-only host: the prefix it would make stays
    absent (a writable host would leave, at least, the lock directory of each recipe install's probe)."""
    prefix, home = tmp_path / "prefix", tmp_path / "home"
    home.mkdir()
    run = subprocess.run([sys.executable, "-m", "invoke", "provision", "--site", "local", "--check", "--prefix",
                          str(prefix)], cwd=REPO, text=True, capture_output=True, timeout=300,
                         env={**os.environ, "SITESTACK_LOG_DIR": str(tmp_path / "logs")})
    assert run.returncode == 0, run.stdout + run.stderr
    assert "check mode: nothing will be changed" in run.stdout and "would change" in run.stdout, run.stdout
    assert tree(prefix) == [] and not prefix.exists()
    assert not (tmp_path / "logs").exists()


def test_the_check_mode_host_refuses_every_mutation(tmp_path: Path):
    from sitestack.core.errors import MutationRefused
    from sitestack.core.host import local_host

    host = local_host("checked", read_only=True)
    target = tmp_path / "f"
    for attempt in (lambda: host.write_text(str(target), "x"), lambda: host.run(["touch", str(target)]),
                    lambda: host.put_file(Path(__file__), str(target))):
        with pytest.raises(MutationRefused, match=r"\[checked\] check mode: refusing to"):
            attempt()
    assert host.probe(["true"]).rc == 0   # probes still run for real
    assert list(tmp_path.iterdir()) == []


# -- the quoting seam ---------------------------------------------------------------------------------------
def test_sh_expanding_expands_references_and_runs_nothing():
    from sitestack.core.quoting import sh_expanding
    value = 'a `touch x` $(touch y) $((1+1)) $1 $$ \\ " ${HOME}/$USER'
    out = subprocess.run(["bash", "-c", f"printf %s {sh_expanding(value)}"], capture_output=True, text=True,
                         env={"HOME": "/h", "USER": "u", "PATH": os.environ["PATH"]}, cwd="/")
    assert out.stdout == 'a `touch x` $(touch y) $((1+1)) $1 $$ \\ " /h/u', out


@pytest.mark.parametrize("shell", [s for s in ("bash", "dash", "zsh", "sh") if shutil.which(s)])
@pytest.mark.parametrize("value", ['a `touch x` $(touch y) $((1+1)) $1 $$ \\ " ${HOME}/$USER } {',
                                   "it's } ${HOME} `touch z`", "FLAT"])
def test_sh_default_keeps_a_set_value_and_else_gives_the_value_inert(shell: str, value: str, tmp_path: Path):
    """``"${NAME:-value}"``: the variable's own value where set and not empty, else the value with only
    its $NAME references expanded, alike in every shell (a ' and a } inside ${...} differ in bash)."""
    from sitestack.core.quoting import sh_default
    expected = value.replace("${HOME}", "/h").replace("$USER", "u")
    for start, want in (({}, expected), ({"X": ""}, expected), ({"X": "mine"}, "mine")):
        out = subprocess.run([shell, "-c", f"printf %s {sh_default('X', value)}"], capture_output=True, text=True,
                             env={"HOME": "/h", "USER": "u", "PATH": os.environ["PATH"], **start}, cwd=tmp_path)
        assert (out.returncode, out.stdout) == (0, want), (start, out.stderr)
    assert not list(tmp_path.iterdir())  # nothing ran


@dataclasses.dataclass(frozen=True)
class Data:
    """A schema of the tests: a one-line string and a mapping."""
    name: str = ""
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)


@pytest.mark.parametrize("char", ["\n", "\r", "\x00", "\x1b", "\x7f", "\x85", "\u2028", "\u2029", "\u200b", "\u202e",
                                  "\u2066", "\ufeff"])
def test_control_characters_are_refused_in_values_and_keys(char: str):
    """A value or a mapping key with a line break, a NUL or a "trojan source" format character is an
    error naming file, line and key, wherever the schema reads it."""
    from sitestack.core import schema
    from sitestack.core.errors import InputError
    from sitestack.core.quoting import control_problem

    assert control_problem(f"a{char}b") and control_problem("a\tb") is None
    assert schema.build(Data, {"name": "a\tb", "env": {"K": "v"}}, "f.yml").name == "a\tb"
    with pytest.raises(InputError, match=r"f\.yml:1: name: .*values must be one line"):
        schema.build(Data, {"name": f"a{char}b"}, "f.yml")
    with pytest.raises(InputError, match=r"(?s)f\.yml:1: env\.K.*: key contains"):
        schema.build(Data, {"env": {f"K{char}": "v"}}, "f.yml")


@dataclasses.dataclass(frozen=True)
class Choice:
    """A schema of the tests: one field with a fixed set of values."""
    runtime: Literal["singularity", "apptainer"] = "singularity"


@pytest.mark.parametrize(("value", "said"), [
    ("shifter", "not 'shifter'"), ("apptainr", "not 'apptainr' (did you mean 'apptainer'?)"),
    (3, "not an integer (3)"), (None, "not nothing (null)")])
def test_a_value_outside_a_choice_is_shown_as_it_is_with_the_closest_choice(value: object, said: str):
    """A string that is none of the choices is shown as it is, not described as "a string" (which it
    is), with the closest choice when one is close; a value of another type is named by its type."""
    from sitestack.core import schema
    from sitestack.core.errors import InputError

    with pytest.raises(InputError) as raised:
        schema.build(Choice, {"runtime": value}, "f.yml")
    assert str(raised.value).endswith(f"f.yml:1: runtime: must be one of 'singularity', 'apptainer', {said}"), raised.value


# -- redaction ----------------------------------------------------------------------------------------------
def test_redact_hides_secret_assignments_of_any_case_and_url_passwords():
    from sitestack.core.redact import redact
    text = ("GITHUB_TOKEN=abc1 db_password='p w' AWS_SECRET_ACCESS_KEY=k3 SSH_KEY=k4 MY_APIKEY=k5 "
            "https://alice:hunter2@example.org/x KEYBOARD=fine PATH=/bin")
    out = redact(text)
    for secret in ("abc1", "p w", "k3", "k4", "k5", "hunter2"):
        assert secret not in out, (secret, out)
    assert "https://***@example.org/x" in out and "KEYBOARD=fine" in out and "PATH=/bin" in out


# -- the umask commands run under --------------------------------------------------------------------------
def test_commands_run_under_the_stack_umask_whatever_the_callers(tmp_path: Path):
    from sitestack.core.host import LocalHost
    old = os.umask(0o077)
    try:
        LocalHost().run(["bash", "-c", 'mkdir "$1/d" && touch "$1/f"', "x", str(tmp_path)])
    finally:
        os.umask(old)
    assert (tmp_path / "d").stat().st_mode & 0o777 == 0o755
    assert (tmp_path / "f").stat().st_mode & 0o777 == 0o644


# -- YAML limits --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "message"), [
    ("a: &x [1]\n" + "".join(f"k{i}: *x\n" for i in range(70)), r"more than 64 YAML aliases"),
    ("a: " + "[" * 120 + "]" * 120 + "\n", r"nested more than 100 levels deep"),
    ("a: " + "x" * (1 << 20) + "\n", r"larger than 1024 KiB"),
    ("a: 1\nb: \x00\n", r"big\.yml:2: contains a NUL byte"),
], ids=["aliases", "depth", "size", "nul"])
def test_yaml_files_over_the_limits_are_refused(tmp_path: Path, text: str, message: str):
    from sitestack.core.errors import InputError
    from sitestack.core.yamlfile import load_yaml
    path = tmp_path / "big.yml"
    path.write_text(text)
    with pytest.raises(InputError, match=message):
        load_yaml(path)


# -- install stamps -----------------------------------------------------------------------------------------
def test_an_install_is_redone_when_its_inputs_change_or_a_sanity_path_is_gone(tmp_path: Path):
    import json

    from sitestack.core.host import LocalHost
    from sitestack.installs.inputs import digest
    from sitestack.installs.stamp import STAMP, install_reason

    dest, host, inputs = tmp_path / "pkg", LocalHost(), {"version": "1.0", "args": ["--a"]}
    (dest / "bin").mkdir(parents=True)
    (dest / "bin" / "tool").write_text("")
    (dest / STAMP).parent.mkdir()
    (dest / STAMP).write_text(json.dumps({"digest": digest(inputs), "inputs": inputs}))
    assert install_reason(host, str(dest), inputs, ["bin/tool"]) is None
    assert install_reason(host, str(dest), {**inputs, "args": ["--b"]}, ["bin/tool"]).startswith("inputs changed")
    (dest / "bin" / "tool").unlink()
    assert install_reason(host, str(dest), inputs, ["bin/tool"]) == f"sanity paths missing in {dest}: bin/tool"


def test_a_host_that_changed_then_failed_is_failed_in_the_json_document():
    """The run document's host status: a failure wins over the changes made before it."""
    from sitestack.core.report import HostRun
    from sitestack.core.step import Result
    from sitestack.engine.results import host_document

    run = HostRun("login", [Result("prefix-layout", "changed"), Result("mpi4py", "failed", "build failed")])
    assert host_document(run)["status"] == "failed"
    assert host_document(HostRun("login", [Result("prefix-layout", "changed")]))["status"] == "changed"
    assert host_document(HostRun("login", [Result("prefix-layout", "ok")], error="unreachable"))["status"] == "failed"


def test_a_json_file_goes_where_a_user_names_it_private_and_whole(tmp_path):
    """``--json ~/run.json``: ``~`` is the user's home; the document is private (0600, as the run's
    logs are) whatever the umask; a second run replaces it whole."""
    import json
    import stat

    from tests.conftest import run_invoke

    home = tmp_path / "home"
    home.mkdir()
    for _ in range(2):
        out = run_invoke("sites", "--json", "~/run.json", env={"HOME": str(home)}, timeout=120)
        assert out.returncode == 0, out.stderr
    written = home / "run.json"
    assert json.loads(written.read_text())["command"] == "sites"
    assert stat.S_IMODE(written.stat().st_mode) == 0o600
