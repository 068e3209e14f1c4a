"""Hostile values in what the shipped programs read when a job runs, and per-job scratch another user
prepared.

The launch helper (every site's rendering), ``sitestack-launch``, LUMI's run script, the stage helper,
the validation job and its check program read Slurm's, the MPI launchers' and the user's variables.
Each hostile value is tried in each variable, under bash, dash, zsh and ``sh`` that is bash (RHEL,
SLES and Cray OS link /bin/sh to bash, which evaluates array subscripts in ``$(( ))``): the marker an
injected command would make never appears, the program fails with one line naming the variable and
sets or runs nothing else, and nothing hangs. Host lists go through the one parser (no ``scontrol``
on PATH); per-job scratch (the MIOpen cache, the staged env) is this user's and private, and a
directory another user made first, or a symbolic link, is refused by name and left as it was.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sitestack.actions import ACTIONS
from sitestack.engine import playbook as pb
from sitestack.installs.runscripts import scripts
from sitestack.model.context import RunContext, RunOptions
from sitestack.onsite import hostlist
from sitestack.onsite.ddpcheck import envvalues, ranks
from sitestack.validation import jobs, runtime_checks
from sitestack.validation.launch_helpers import LaunchInputs, StackPack, render_stage
from tests.onsite_dir import install_programs
from tests.test_hostile import MARK
from tests.test_launch_env import render

SITES = ("local", "frontier", "dawn", "lumi", "cirrus")
#: Each shell as a job would run it; "sh" is bash as /bin/sh (a link named sh: bash's POSIX mode).
SHELLS = [s for s in ("bash", "dash", "zsh") if shutil.which(s)] + ["sh=bash"]
#: Values that would run a command if a shell evaluated them (bash's arithmetic runs the command in an
#: array subscript), or that are not the whole number the variable must hold.
HOSTILE = ["a[$(touch {mark})]", "x[0$(touch {mark})]", "$(touch {mark})", "`touch {mark}`", "1;touch {mark}",
           "-1", "99999999999999999999", "0x10", "010", "1 2", "\u0661"]
#: The numbers the helper reads, with what else must be set for it to be read.
NUMBERS = {
    "SLURM_JOB_ID": {}, "SLURM_JOB_NUM_NODES": {}, "SLURM_NTASKS": {}, "SLURM_NTASKS_PER_NODE": {},
    "SLURM_CPUS_PER_TASK": {}, "SLURM_CPUS_ON_NODE": {}, "SLURM_GPUS_ON_NODE": {},
    "SLURM_TASKS_PER_NODE": {"SLURM_NTASKS": "4"}, "SLURM_PROCID": {"SLURM_STEP_ID": "0"},
    "SLURM_LOCALID": {"SLURM_STEP_ID": "0", "SLURM_PROCID": "1"}, "PMI_RANK": {}, "PMI_SIZE": {"PMI_RANK": "0"},
    "MPI_LOCALRANKID": {"PMI_RANK": "0"}, "OMPI_COMM_WORLD_RANK": {},
    "OMPI_COMM_WORLD_LOCAL_RANK": {"OMPI_COMM_WORLD_RANK": "0"}, "OMPI_COMM_WORLD_SIZE": {"OMPI_COMM_WORLD_RANK": "0"},
}
#: After sourcing: the status and two of the helper's variables (unset when it failed).
SHOW = '. "$1"; rc=$?; printf "%s|%s|%s" "$rc" "${NODELIST-unset}" "${MASTER_PORT-unset}"'


@pytest.fixture(scope="module")
def shells(tmp_path_factory) -> dict[str, list[str]]:
    """argv prefix per shell; "sh=bash" is a link named sh to bash, which makes bash run as sh."""
    bindir = tmp_path_factory.mktemp("shbin")
    (bindir / "sh").symlink_to(shutil.which("bash") or "/bin/bash")
    return {s: [str(bindir / "sh")] if s == "sh=bash" else [s] for s in SHELLS}


@pytest.fixture(scope="module")
def helpers(tmp_path_factory) -> dict[str, Path]:
    """Every site's sitestack-launch-env, rendered as its install-launch-env step does."""
    return {site: render(site, tmp_path_factory.mktemp(site)) for site in SITES}


#: What the shipped programs call, linked into a directory of their own: PATH has no scontrol.
TOOLS = ("bash", "dash", "zsh", "python3", "python", "awk", "uname", "id", "mkdir", "ls", "chmod", "rm", "cat",
         "touch", "env", "sed", "tr", "sort", "seq", "sleep", "date", "head", "tail", "hostname", "tar", "true", "dirname")


@pytest.fixture(scope="session")
def tools(tmp_path_factory) -> Path:
    bindir = tmp_path_factory.mktemp("tools")
    for name in TOOLS:
        found = os.path.realpath(sys.executable) if name.startswith("python") else shutil.which(name)
        if found:
            (bindir / name).symlink_to(found)
    (bindir / "sh").symlink_to(shutil.which("dash") or shutil.which("sh") or "/bin/sh")
    return bindir


@pytest.fixture(scope="session")
def clean_path(tools: Path) -> str:
    """PATH for the programs under test: the tools above, and no scontrol (the helper must not need it)."""
    assert shutil.which("scontrol", path=str(tools)) is None
    return str(tools)


def run(argv: list[str], env: dict[str, str], cwd: Path, path: str, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    """``argv`` with exactly ``env`` (and ``path`` as PATH unless it has its own); a hang past ``timeout``
    fails the test."""
    start = time.monotonic()
    out = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, timeout=timeout,
                         env={"PATH": path, "HOME": str(cwd), **env})
    assert time.monotonic() - start < timeout
    return out


def assert_refused(out: subprocess.CompletedProcess[str], name: str, mark: Path, stdout: str = "") -> None:
    """Non-zero, one line on stderr naming ``name``, no traceback, ``stdout`` only, no marker."""
    assert not mark.exists(), f"injected command ran: {out}"
    assert out.stdout == stdout, out
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and name in lines[0] and "Traceback" not in out.stderr, out


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("site", SITES)
def test_the_launch_helper_refuses_hostile_numbers(site: str, shell: str, shells, helpers, tmp_path: Path, clean_path: str):
    mark = tmp_path / MARK
    for name, needs in NUMBERS.items():
        for value in HOSTILE:
            env = {"USER": "sitestack-hostile-rt", **needs, name: value.replace("{mark}", str(mark))}
            out = run([*shells[shell], "-c", SHOW, "sh", str(helpers[site])], env, tmp_path, clean_path)
            assert out.returncode == 0, out  # the shell itself goes on: the helper only returns non-zero
            assert_refused(out, name, mark, stdout="1|unset|unset")
    assert not list(Path("/tmp").glob("sitestack-hostile-rt-miopen*"))  # refused before the cache is made


@pytest.mark.parametrize("shell", SHELLS)
def test_an_empty_value_is_unset_and_the_default_applies(shell: str, shells, helpers, tmp_path: Path, clean_path: str):
    """Slurm never sets an empty variable: an empty one is one that is not set (the site's default)."""
    env = {name: "" for name in NUMBERS} | {"SLURM_JOB_NODELIST": ""}
    out = run([*shells[shell], "-c", SHOW, "sh", str(helpers["local"])], env, tmp_path, clean_path)
    rc, nodelist, port = out.stdout.split("|")
    assert (rc, out.stderr) == ("0", "") and nodelist and 20000 <= int(port) < 30000, out


@pytest.mark.parametrize("shell", SHELLS)
def test_sitestack_launch_runs_nothing_on_a_hostile_value(shell: str, shells, helpers, tmp_path: Path, clean_path: str):
    """``sitestack-launch`` (#!/bin/sh, which is bash on RHEL, SLES and Cray OS) stops before the command."""
    mark, ran = tmp_path / MARK, tmp_path / "command-ran"
    for site in ("local", "frontier", "dawn"):
        launch = helpers[site].parent / "sitestack-launch"
        for name in ("SLURM_JOB_ID", "SLURM_CPUS_ON_NODE", "SLURM_NTASKS_PER_NODE", "SLURM_GPUS_ON_NODE",
                     "SLURM_JOB_NUM_NODES"):
            env = {name: f"a[$(touch {mark})]"}
            out = run([*shells[shell], str(launch), "touch", str(ran)], env, tmp_path, clean_path)
            assert out.returncode == 1 and not ran.exists(), out
            assert_refused(out, name, mark)
        good = run([*shells[shell], str(launch), "touch", str(ran)], {"SLURM_JOB_ID": "42", "USER": "sitestack-hostile-rt"},
                   tmp_path, clean_path)
        assert good.returncode == 0 and ran.exists(), good
        ran.unlink()
    shutil.rmtree("/tmp/sitestack-hostile-rt-miopen-42", ignore_errors=True)


# -- host lists: the one parser, in the helper (no scontrol) and in Python --------------------------------------

HOST_LISTS = {
    "n[0-99999999]": "over 100000 hosts",
    "n[0-99999,0-99999]": "over 100000 hosts",
    "n[1-60000],m[1-60000]": "over 100000 hosts",
    "nid[005-001]": "runs backwards",
    "a\\nb": "not allowed in a host name",
    "a\x01b": "not allowed in a host name",
    "a\rb": "not allowed in a host name",
    "a;touch {mark}": "not allowed in a host name",
    "$(touch {mark})": "not allowed in a host name",
    "n[1-3]`touch {mark}`": "not allowed in a host name",
    "n[1-12345678901]": "over 9 digits",
    "n[" + "1" * 5000 + "]": "over 9 digits",
    "a" * 300: "over 255 characters",
    # a name starts with a letter or digit (RFC 1123, 2.1): never an option of what is given MASTER_ADDR, no path
    "-rf": "starts with '-'",
    "--first": "starts with '-'",
    "--help": "starts with '-'",
    "nid1,-n[1-2]": "starts with '-'",
    ".": "starts with '.'",
    "..": "starts with '.'",
    "nid1,..": "starts with '.'",
}


@pytest.mark.parametrize("shell", SHELLS)
def test_the_helper_refuses_hostile_host_lists_without_scontrol(shell: str, shells, helpers, tmp_path: Path, clean_path: str):
    mark = tmp_path / MARK
    for text, error in HOST_LISTS.items():
        env = {"SLURM_JOB_NODELIST": text.replace("{mark}", str(mark)), "SLURM_JOB_ID": "7"}
        out = run([*shells[shell], "-c", SHOW, "sh", str(helpers["lumi"])], env, tmp_path, clean_path)
        assert_refused(out, "SLURM_JOB_NODELIST", mark, stdout="1|unset|unset")
        assert error in out.stderr, out
    # a real newline separates items, as Slurm reads it: it never reaches the output
    out = run([*shells[shell], "-c", SHOW, "sh", str(helpers["local"])], {"SLURM_JOB_NODELIST": "a\nb"}, tmp_path, clean_path)
    assert out.stdout.split("|")[:2] == ["0", "a,b"], out


@pytest.mark.parametrize("text, error", list(HOST_LISTS.items()))
def test_the_parser_refuses_the_same_lists_at_once(text: str, error: str, tmp_path: Path, clean_path: str):
    start = time.monotonic()
    with pytest.raises(hostlist.HostlistError, match=error) as caught:
        hostlist.expand(text.replace("{mark}", str(tmp_path / MARK)))
    assert time.monotonic() - start < 2 and "\n" not in str(caught.value) and len(str(caught.value)) < 300
    out = subprocess.run([sys.executable, "-I", hostlist.__file__, "--name", "SLURM_JOB_NODELIST", "--sep", ",", "--",
                          text], capture_output=True, text=True, timeout=20)
    assert out.returncode == 2 and out.stdout == "" and not (tmp_path / MARK).exists()
    assert out.stderr.count("\n") == 1 and "SLURM_JOB_NODELIST: cannot parse host list" in out.stderr, out


def test_a_list_is_never_taken_for_an_option():
    """Options come first, a list after ``--``; a word that starts with ``-`` before it is an unknown option
    (never hosts), and ``--help`` is the usage."""
    def parser(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-I", hostlist.__file__, *argv], capture_output=True, text=True, timeout=20)

    for argv in (["-rf"], ["--name", "X", "-rf"], ["--sep"], ["--bogus", "n1"]):
        out = parser(*argv)
        assert out.returncode == 2 and out.stdout == "" and out.stderr.count("\n") == 1, (argv, out)
        assert "usage: hostlist.py" in out.stderr and "Traceback" not in out.stderr, (argv, out)
    helped = parser("--help")
    assert (helped.returncode, helped.stderr) == (0, "") and helped.stdout.startswith("usage: hostlist.py"), helped
    assert parser("--first", "--sep", "-", "--", "n[1-2]").stdout == "n1\n"
    assert parser("--sep", "-", "--name", "--first", "n[1-2]").stdout == "n1-n2\n"  # an option's value is its value


def test_a_reader_that_goes_away_ends_the_parser_quietly():
    """``hostlist.py 'n[0-99999]' | head -c 10``: no BrokenPipeError traceback (signal module's note on SIGPIPE)."""
    for argv in (["n[0-99999]"], ["--sep", ",", "--", "n[0-99999]"]):
        proc = subprocess.Popen([sys.executable, "-I", hostlist.__file__, *argv], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        assert proc.stdout is not None and proc.stderr is not None
        assert len(proc.stdout.read(10)) == 10
        proc.stdout.close()
        assert proc.wait(timeout=20) in (0, 1) and proc.stderr.read() == b"", argv
        proc.stderr.close()
    piped = subprocess.run(["bash", "-c", 'python3 -I "$1" "n[0-99999]" | head -c 10 >/dev/null; echo "${PIPESTATUS[0]}"',
                            "bash", hostlist.__file__], capture_output=True, text=True, timeout=20,
                           env={"PATH": os.path.dirname(sys.executable) + ":/usr/bin:/bin"})
    assert piped.stderr == "" and piped.stdout in ("0\n", "1\n"), piped


def test_get_master_names_the_variable_it_read(tmp_path: Path, clean_path: str):
    for name, (text, mode) in scripts("lumi", pb.load("lumi").facts).items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
        (tmp_path / name).chmod(mode)
    out = subprocess.run([sys.executable, "-E", "-s", str(tmp_path / "get-master")], capture_output=True, text=True,
                         env={"SLURM_NODELIST": "nid[005-001]"}, timeout=20)
    assert out.returncode == 2 and out.stderr.startswith("get-master: SLURM_NODELIST: cannot parse"), out


# -- per-job scratch: the MIOpen cache --------------------------------------------------------------------------

def planted(path: Path, kind: str, target: Path) -> None:
    """What another user (uid 65534) left at ``path``: a directory open to all, or a symbolic link."""
    if kind == "open-dir":
        path.mkdir(mode=0o777)
        path.chmod(0o777)
        os.chown(path, 65534, 65534)
    else:
        path.symlink_to(target)


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="planting another user's directory needs root (chown)")


@needs_root
@pytest.mark.parametrize("kind", ["open-dir", "symlink"])
@pytest.mark.parametrize("shell", SHELLS)
def test_a_planted_miopen_cache_is_refused_by_name(kind: str, shell: str, shells, helpers, tmp_path: Path, clean_path: str):
    user = f"sitestack-hostile-rt{os.getpid()}"
    target = tmp_path / "elsewhere"
    target.mkdir()
    for site in ("frontier", "lumi"):
        cache = Path(f"/tmp/{user}-miopen-31")
        planted(cache, kind, target)
        try:
            env = {"USER": user, "SLURM_JOB_ID": "31", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}
            out = run([*shells[shell], "-c", SHOW, "sh", str(helpers[site])], env, tmp_path, clean_path)
            assert_refused(out, str(cache), tmp_path / MARK, stdout="1|unset|unset")
            assert list(target.iterdir()) == []
            if kind == "open-dir":
                st = cache.lstat()
                assert (st.st_uid, stat.S_IMODE(st.st_mode), list(cache.iterdir())) == (65534, 0o777, [])
            else:
                assert cache.is_symlink()
        finally:
            cache.unlink() if cache.is_symlink() else shutil.rmtree(cache)


@pytest.mark.parametrize("shell", SHELLS)
def test_the_miopen_cache_is_private_under_any_umask(shell: str, shells, helpers, tmp_path: Path, clean_path: str):
    """Made 0700 and the user's (umask 000 too); an earlier version's 0755 directory of the user's is made 0700."""
    user = f"sitestack-hostile-rt{os.getpid()}"
    cache = Path(f"/tmp/{user}-miopen-32")
    try:
        for umask, before in (("000", None), ("022", 0o755)):
            if before:
                cache.mkdir(mode=before)
                cache.chmod(before)
            out = run([*shells[shell], "-c", f'umask {umask}; . "$1" && printf %s "$MIOPEN_USER_DB_PATH"', "sh",
                       str(helpers["frontier"])], {"USER": user, "SLURM_JOB_ID": "32"}, tmp_path, clean_path)
            st = cache.lstat()
            assert out.stdout == str(cache) and stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700, out
            assert st.st_uid == os.geteuid()
            shutil.rmtree(cache)
    finally:
        shutil.rmtree(cache, ignore_errors=True)


@needs_root
@pytest.mark.parametrize("kind", ["open-dir", "symlink"])
def test_the_job_scripts_make_and_remove_only_a_private_cache(kind: str, tmp_path: Path, clean_path: str):
    """The validation job's per-node scripts: a planted cache is refused by name and never removed."""
    context = runtime_checks.job_context()
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "keep").write_text("another user's")
    cache = tmp_path / "cache"
    planted(cache, kind, target)
    made = run(["sh", "-c", str(context["miopen_private"]), "sitestack", str(cache)], {}, tmp_path, clean_path)
    assert_refused(made, str(cache), tmp_path / MARK)
    assert made.returncode == 1
    run(["sh", "-c", str(context["miopen_remove"]), "sitestack", str(cache)], {}, tmp_path, clean_path)
    assert cache.is_symlink() or cache.is_dir()
    assert (target / "keep").read_text() == "another user's"
    own = tmp_path / "own"
    assert run(["sh", "-c", str(context["miopen_private"]), "sitestack", str(own)], {}, tmp_path, clean_path).returncode == 0
    assert stat.S_IMODE(own.stat().st_mode) == 0o700
    run(["sh", "-c", str(context["miopen_remove"]), "sitestack", str(own)], {}, tmp_path, clean_path)
    assert not own.exists()


def parents(root: Path) -> dict[str, tuple[Path, bool]]:
    """Directories to make a private directory in: name -> (directory, whether it may be used). Another
    user's (uid 65534) open to all, a link to it where the scratch parent would be, theirs with the sticky
    bit (its owner can still rename what is in it), this user's open to all without the sticky bit, a
    link of theirs to this user's own; this user's own, and a link of this user's to it, may be used."""
    made: dict[str, tuple[Path, bool]] = {}
    for name, mode, owner in (("theirs-open", 0o777, 65534), ("theirs-sticky", 0o1777, 65534), ("mine-open", 0o777, None),
                              ("mine", 0o755, None)):
        path = root / name
        path.mkdir()
        path.chmod(mode)
        if owner is not None:
            os.chown(path, owner, owner)
        made[name] = (path, name == "mine")
    (root / "link-to-theirs").symlink_to(root / "theirs-open")
    (root / "their-link").symlink_to(root / "mine")
    os.chown(root / "their-link", 65534, 65534, follow_symlinks=False)
    (root / "my-link").symlink_to(root / "mine")
    made |= {"link-to-theirs": (root / "link-to-theirs", False), "their-link": (root / "their-link", False),
             "my-link": (root / "my-link", True)}
    return made


@needs_root
@pytest.mark.parametrize("shell", SHELLS)
def test_a_private_dir_is_made_only_where_no_one_else_can_replace_it(shell: str, shells, tmp_path: Path, clean_path: str):
    """The directory a private one is made in, links resolved, is this user's or root's and open to no one
    else unless sticky (/tmp); a link to it is this user's or root's. Otherwise one line names the path."""
    check = runtime_checks.functions("private_dir") + '\n_sitestack_private_dir prog "$1"'
    for name, (parent, usable) in parents(tmp_path).items():
        target = parent / "cache"
        out = run([*shells[shell], "-c", check, "sh", str(target)], {}, tmp_path, clean_path)
        if usable:
            assert (out.returncode, out.stderr) == (0, "") and stat.S_IMODE(target.stat().st_mode) == 0o700, (name, out)
            target.rmdir()
        else:
            assert out.returncode == 1 and not os.path.lexists(target), (name, out)
            assert_refused(out, f"prog: refusing {target}: the directory it is in, {parent} (", tmp_path / MARK)
    sticky = run([*shells[shell], "-c", check, "sh", f"/tmp/sitestack-hostile-rt{os.getpid()}-{shell}"], {}, tmp_path,
                 clean_path)
    assert (sticky.returncode, sticky.stderr) == (0, ""), sticky  # /tmp: root's, sticky
    os.rmdir(f"/tmp/sitestack-hostile-rt{os.getpid()}-{shell}")


@needs_root
@pytest.mark.parametrize("kind", ["link-to-theirs", "theirs-sticky", "mine-open"])
def test_the_stage_helper_refuses_a_scratch_parent_another_user_controls(kind: str, tmp_path: Path, clean_path: str):
    """Frontier's /mnt/bb/$USER is made with mkdir -p: where it is a link to another user's directory open to all
    (or another user can otherwise rename what is in it), the copy is refused by name and nothing is sent there."""
    script, scratch, fake = stage_script(tmp_path)
    others = tmp_path / "others"
    others.mkdir()
    parent, _usable = parents(others)[kind]
    scratch.symlink_to(parent)
    env = {"SLURM_JOB_ID": "36", "SLURM_JOB_NUM_NODES": "1", "PATH": f"{fake}:{clean_path}"}
    out = run(["bash", "-c", '. "$1"; printf "%s|%s" "$?" "${SITESTACK_STAGED_ENV-unset}"', "sh", str(script)], env,
              tmp_path, clean_path)
    dest = scratch / "sitestack-env-36"
    assert out.stdout == "1|unset" and f"refusing {dest}: the directory it is in, {scratch} (" in out.stderr, out
    assert "sbcast" not in (tmp_path / "launched").read_text() and not os.path.lexists(dest), out
    assert list(Path(os.path.realpath(parent)).iterdir()) == []


# -- LUMI's run script, the stage helper, the validation job ------------------------------------------------------

@pytest.fixture(scope="module")
def runscripts(tmp_path_factory) -> Path:
    """LUMI's run scripts as the container step installs them, with a python that only says it ran."""
    root = tmp_path_factory.mktemp("runscripts")
    for name, (text, mode) in scripts("lumi", pb.load("lumi").facts).items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
        (root / name).chmod(mode)
    return root


def test_the_run_script_refuses_hostile_values(runscripts: Path, tmp_path: Path, clean_path: str):
    mark, fake = tmp_path / MARK, tmp_path / "bin"
    fake.mkdir()
    (fake / "python").write_text(f'#!/bin/sh\ntouch {tmp_path}/python-ran\n')
    (fake / "python").chmod(0o755)
    (fake / "get-master").symlink_to(runscripts / "get-master")
    base = {"SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_JOB_ID": "33", "SLURM_NTASKS": "2",
            "SLURM_TASKS_PER_NODE": "2", "SLURM_JOB_NODELIST": "nid[1-2]", "WITH_CONDA": "source /dev/null",
            "USER": "sitestack-hostile-rt"}
    cases = [(name, value) for name in ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_JOB_ID", "SLURM_NTASKS",
                                       "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE") for value in HOSTILE]
    cases += [("SLURM_JOB_NODELIST", "nid[005-001]"), ("SLURM_JOB_NODELIST", "a;touch {mark}"),
              ("SLURM_JOB_NODELIST", "-rf"), ("SLURM_JOB_NODELIST", "--all"), ("SLURM_JOB_NODELIST", "--name"),
              ("SLURM_JOB_NODELIST", ".."),
              ("WITH_CONDA", "touch {mark}"), ("WITH_CONDA", "source /x/*")]
    for name, value in cases:
        env = {**base, name: value.replace("{mark}", str(mark)), "PATH": f"{fake}:{clean_path}"}
        out = subprocess.run([str(runscripts / "conda-python-distributed"), "-c", "x"], capture_output=True, text=True,
                             env=env, cwd=tmp_path, timeout=20)
        assert out.returncode != 0 and not (tmp_path / "python-ran").exists(), (name, value, out)
        assert_refused(out, name, mark)
    assert not Path("/tmp/sitestack-hostile-rt-miopen-33").exists()


def stage_script(tmp_path: Path) -> tuple[Path, Path, Path]:
    """Frontier's stage helper with node-local scratch under ``tmp_path``, and srun (runs the command
    here) and sbcast (records that it ran) on PATH: (script, scratch, bin)."""
    ctx = RunContext.resolve(pb.load("frontier"), home="/h", user="u", account=None, prefix=str(tmp_path),
                             options=RunOptions(), actions=ACTIONS)
    pack = tmp_path / "pack.tar.gz"
    pack.write_bytes(b"")
    scratch = tmp_path / "nvme"
    own = StackPack(module="pytorch/2.2.2-rocm5.7", pack=str(pack), generations=str(tmp_path / "gens"),
                    generation_var="__SITESTACK_GEN", own=True)
    inputs = LaunchInputs(site="frontier", facts=ctx.facts, bin=str(tmp_path), env={}, scratch=str(scratch),
                          packs=(own,))
    script = tmp_path / "sitestack-stage-env"
    script.write_text(render_stage(inputs))
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "srun").write_text('#!/bin/sh\nwhile [ $# -gt 0 ]; do case $1 in --*) shift ;; *) break ;; esac; done\n'
                               f'echo srun >>{tmp_path}/launched\nexec "$@"\n')
    (fake / "sbcast").write_text(f'#!/bin/sh\necho sbcast >>{tmp_path}/launched\nexit 1\n')
    for name in ("srun", "sbcast"):
        (fake / name).chmod(0o755)
    return script, scratch, fake


@pytest.mark.parametrize("shell", SHELLS)
def test_the_stage_helper_refuses_hostile_values_before_any_srun(shell: str, shells, tmp_path: Path, clean_path: str):
    script, _scratch, fake = stage_script(tmp_path)
    mark = tmp_path / MARK
    cases = [(name, value) for name in ("SLURM_JOB_ID", "SLURM_JOB_NUM_NODES") for value in HOSTILE]
    cases += [("__SITESTACK_GEN", "/p/.gen $(touch {mark})"), ("__SITESTACK_GEN", "/p/a;b")]
    for name, value in cases:
        env = {"SLURM_JOB_ID": "34", name: value.replace("{mark}", str(mark)), "PATH": f"{fake}:{clean_path}"}
        out = run([*shells[shell], "-c", '. "$1"; printf "%s|%s" "$?" "${SITESTACK_STAGED_ENV-unset}"', "sh", str(script)],
                  env, tmp_path, clean_path)
        assert_refused(out, name, mark, stdout="1|unset")
        assert not (tmp_path / "launched").exists()


@needs_root
@pytest.mark.parametrize("kind", ["open-dir", "symlink"])
def test_the_stage_helper_refuses_a_planted_copy_and_writes_nothing_there(kind: str, tmp_path: Path, clean_path: str):
    script, scratch, fake = stage_script(tmp_path)
    scratch.mkdir()
    target = tmp_path / "elsewhere"
    target.mkdir()
    dest = scratch / "sitestack-env-35"
    planted(dest, kind, target)
    env = {"SLURM_JOB_ID": "35", "SLURM_JOB_NUM_NODES": "1", "PATH": f"{fake}:{clean_path}"}
    out = run(["bash", "-c", '. "$1"; printf "%s|%s" "$?" "${SITESTACK_STAGED_ENV-unset}"', "sh", str(script)], env,
              tmp_path, clean_path)
    assert out.stdout == "1|unset" and str(dest) in out.stderr and "sbcast" not in (tmp_path / "launched").read_text()
    assert list(target.iterdir()) == [] and (dest.is_symlink() or list(dest.iterdir()) == [])
    # the copy this job makes itself is private, and the tarball goes inside it
    (dest.unlink() if dest.is_symlink() else dest.rmdir())
    out = run(["bash", "-c", 'umask 000; . "$1"', "sh", str(script)], env, tmp_path, clean_path)
    assert f"sbcast of {tmp_path}/pack.tar.gz to {dest}/.sitestack-pack.tar.gz failed" in out.stderr, out
    assert not dest.exists()  # removed again after the failed sbcast


@pytest.fixture(scope="module")
def validation_jobs(tmp_path_factory) -> dict[str, Path]:
    """The srun (or mpiexec) batch script of local, frontier and dawn's validation jobs."""
    from sitestack.installs.site_stack import job_inputs
    from tests.test_validation_jobs import context
    root = tmp_path_factory.mktemp("jobs")
    out = {}
    for site in ("local", "frontier", "dawn"):
        ctx = context(site)
        files = jobs.job_files(job_inputs(ctx, f"{ctx.values['prefix']}/validation", None))
        name, text = next((n, t) for n, (t, _) in files.items() if n.endswith(".sbatch"))
        out[site] = root / f"{site}-{Path(name).name}"
        out[site].write_text(text)
    return out


@pytest.mark.parametrize("site", ["local", "frontier", "dawn"])
def test_the_validation_job_refuses_hostile_values_before_anything_runs(site: str, validation_jobs, tmp_path: Path, clean_path: str):
    mark = tmp_path / MARK
    for name in ("SLURM_JOB_ID", "SLURM_JOB_NUM_NODES", "SLURM_NTASKS_PER_NODE", "SLURM_CPUS_ON_NODE",
                 "SLURM_GPUS_ON_NODE", "SITESTACK_RANKS_PER_NODE", "SITESTACK_TIME_LIMIT"):
        for value in HOSTILE:
            out = run(["bash", str(validation_jobs[site])], {name: value.replace("{mark}", str(mark))}, tmp_path, clean_path)
            assert out.returncode == 1, out
            assert_refused(out, name, mark)
            assert sorted(p.name for p in tmp_path.iterdir()) == [], "the job made something before it refused"


# -- the check program (Python) --------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "PMI_RANK", "OMPI_COMM_WORLD_RANK"])
@pytest.mark.parametrize("value", ["a[1]", "-1", "+1", "1_0", "\u0661", "1e3", "99999999999"])
def test_the_check_program_refuses_a_bad_rank(name: str, value: str):
    env = {"SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_NTASKS": "1", name: value}
    if name.startswith(("PMI", "OMPI")):
        env |= {"PMI_SIZE": "1", "MPI_LOCALRANKID": "0", "OMPI_COMM_WORLD_SIZE": "1"}
    with pytest.raises(envvalues.EnvError, match=name):
        ranks.discover_rank(env)


@pytest.mark.parametrize("name, value", [("SITESTACK_TIME_LIMIT", "nan"), ("SITESTACK_TIME_LIMIT", "-5"),
                                         ("SITESTACK_DEADLINE", "inf"), ("SITESTACK_INIT_TIMEOUT", "1e999"),
                                         ("SITESTACK_EXPECT_WORLD_SIZE", "0x2"), ("SLURM_PROCID", "a[$(id)]")])
def test_the_check_program_says_which_variable_and_writes_nothing(name: str, value: str, tmp_path: Path):
    out_dir = tmp_path / "out"
    install_programs(tmp_path / "job")  # the job's program as installed
    program = tmp_path / "job" / "ddp_check.py"
    env = {"PATH": os.environ["PATH"], "SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_NTASKS": "1", name: value}
    rank = [sys.executable, str(program), "--out", str(out_dir), "--no-watchdog"]
    guard = [sys.executable, str(program), "--guard", "--out", str(out_dir), "--", "true"]
    # the guard reads only the time limit and the deadline
    for argv in [rank] + ([guard] if name in ("SITESTACK_TIME_LIMIT", "SITESTACK_DEADLINE") else []):
        out = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
        assert out.returncode == 2 and out.stderr.count("\n") == 1 and name in out.stderr, out
        assert "Traceback" not in out.stderr and not out_dir.exists(), out
