"""Files the command line names, and the caches and logs sitestack makes, against hostile targets.

One rule for a file the user names (``--json FILE``, ``job-template --output FILE``;
sitestack/core/user_file.py, docs/cli.md "Files you name"): a regular file or a new one, written
whole; ``-`` is stdout; a device, a FIFO, a socket, a directory or a symlink is refused before
anything runs, and a write that fails (disk full, read-only file system) is one message. Each
case asserts exit 1, one ``error:`` line naming the option, no traceback, the target as it was
and no temporary file left.

Caches and logs are private under any umask (README, sitestack/core/private.py): a first run
under umask 000 with a fresh HOME leaves nothing world-writable there, ``~/.cache`` included.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sitestack.core.errors import InputError
from tests.conftest import REPO
from tests.test_hostile import Case, assert_refused_cleanly, repo_before, run_case

__all__ = ["repo_before"]   # the module fixture, shared with tests/test_hostile.py

#: The commands that write a file the user names: (id, arguments before the file, the option): a
#: playbook run's document, a data task's, the job script.
WRITERS = [
    ("provision-json", ("provision", "--site", "local", "--check", "--json"), "--json"),
    ("show-site-json", ("show-site", "--site", "local", "--json"), "--json"),
    ("job-template-output", ("job-template", "--site", "local", "--output"), "--output"),
]


@dataclass(frozen=True)
class Target:
    """A hostile target: ``make(dir)`` makes it in an empty directory and returns its path; the
    message names what it is."""

    id: str
    make: Callable[[Path], Path]
    what: str


def _outside(directory: Path) -> Path:
    """A file outside the target's directory, which a link points at and which must stay as it is."""
    kept = directory.parent / "outside.txt"
    kept.write_text("the outside file\n")
    return kept


def _link_out(directory: Path) -> Path:
    link = directory / "out.json"
    link.symlink_to(_outside(directory))
    return link


def _dangling(directory: Path) -> Path:
    link = directory / "out.json"
    link.symlink_to(directory / "nowhere" / "x.json")
    return link


def _fifo(directory: Path) -> Path:
    os.mkfifo(directory / "pipe")
    return directory / "pipe"


def _dir(directory: Path) -> Path:
    (directory / "sub").mkdir()
    return directory / "sub"


def _socket(directory: Path) -> Path:
    path = directory / "s.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))   # the node stays after close
    server.close()
    return path


TARGETS = [
    Target("dev-full", lambda d: Path("/dev/full"), "a character device"),
    Target("dev-null", lambda d: Path("/dev/null"), "a character device"),
    Target("dev-stdout", lambda d: Path("/dev/stdout"), "a symbolic link"),   # '-' is stdout
    Target("fifo", _fifo, "a FIFO"),
    Target("directory", _dir, "a directory"),
    Target("symlink-to-outside", _link_out, "a symbolic link"),
    Target("dangling-symlink", _dangling, "a symbolic link"),
    Target("socket", _socket, "a socket"),
]


def snapshot(path: Path) -> tuple[object, ...]:
    """What a target is, without following it: its type, its link text, its bytes (regular files)."""
    info = os.lstat(path)
    text = os.readlink(path) if stat.S_ISLNK(info.st_mode) else None
    data = path.read_bytes() if stat.S_ISREG(info.st_mode) else None
    return (stat.S_IFMT(info.st_mode), info.st_ino, info.st_rdev, text, data)


@pytest.fixture
def target_dir() -> Iterator[Path]:
    """A short directory for the targets (a socket's path must fit in 108 bytes)."""
    where = Path(tempfile.mkdtemp(prefix="ss-t-"))
    (where / "t").mkdir()
    yield where / "t"
    shutil.rmtree(where, ignore_errors=True)


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.id)
@pytest.mark.parametrize("writer", WRITERS, ids=lambda w: w[0])
def test_a_named_file_that_is_not_a_regular_file_is_refused(writer: tuple[str, tuple[str, ...], str], target: Target,
                                                            target_dir: Path, tmp_path: Path, repo_before: str):
    _, args, option = writer
    path = target.make(target_dir)
    before, listing = snapshot(path), sorted(os.listdir(target_dir))
    outside = target_dir.parent / "outside.txt"
    case = Case(f"{writer[0]}-{target.id}", where=f"^error: {option}: ", args=(*args, str(path)), expect=target.what)
    result, paths = run_case(case, tmp_path)   # a FIFO must not block: run_case has a 120 s limit, this one much less
    assert_refused_cleanly(case, result, paths, repo_before)
    assert str(path) in result.stderr and "- for stdout" in result.stderr
    assert snapshot(path) == before and sorted(os.listdir(target_dir)) == listing   # untouched, no temporary file
    if outside.exists():
        assert outside.read_text() == "the outside file\n"


#: Names refused before anything runs: (id, the name in the target's directory, a fragment of the message).
BAD_NAMES = [("trailing-slash", lambda d: f"{d}/newdir/", "names a directory"),
             ("unknown-user", lambda d: "~sitestack-no-such-user/out.json", "no such user"),
             ("too-long-for-its-temporary", lambda d: f"{d}/{'a' * 245}.json", "File name too long")]


@pytest.mark.parametrize("bad", BAD_NAMES, ids=lambda b: b[0])
@pytest.mark.parametrize("writer", WRITERS, ids=lambda w: w[0])
def test_a_name_that_cannot_be_a_regular_file_is_refused_before_anything_runs(
        writer: tuple[str, tuple[str, ...], str], bad: tuple[str, Callable[[Path], str], str], target_dir: Path,
        tmp_path: Path, repo_before: str):
    _, args, option = writer
    case = Case(f"{writer[0]}-{bad[0]}", where=f"^error: {option}: ", args=(*args, bad[1](target_dir)), expect=bad[2])
    result, paths = run_case(case, tmp_path)
    assert_refused_cleanly(case, result, paths, repo_before)
    assert os.listdir(target_dir) == []


def test_a_replaced_file_never_keeps_a_set_user_id_bit(tmp_path: Path):
    """An existing target keeps its permission bits, not set-user-ID, set-group-ID or sticky: the
    document sitestack writes is never made a set-user-ID file (root's, when it runs as root)."""
    target = tmp_path / "out.json"
    target.write_text("{}")
    target.chmod(0o6755)
    result = run("show-site", "--site", "local", "--json", str(target), home=tmp_path)
    assert result.returncode == 0, result.stderr
    assert stat.S_IMODE(target.stat().st_mode) == 0o755 and json.loads(target.read_text())["command"] == "show-site"


def test_a_fifo_target_does_not_hang(target_dir: Path):
    """The FIFO is refused at once, not opened: with no reader an open would block forever."""
    fifo = _fifo(target_dir)
    for args in (("job-template", "--site", "local", "--output"), ("sites", "--json")):
        result = subprocess.run([sys.executable, "-m", "invoke", *args, str(fifo)], cwd=REPO, capture_output=True,
                                text=True, timeout=20)
        assert result.returncode == 1 and "FIFO" in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


@contextlib.contextmanager
def mounted(where: Path, options: str) -> Iterator[Path]:
    """A small tmpfs at ``where`` (root only; skipped where mounting is not permitted)."""
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def fill(directory: Path) -> None:
    """Fill the file system of ``directory`` to the last byte."""
    fd = os.open(directory / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        with contextlib.suppress(OSError):
            while os.write(fd, b"x" * 512):
                pass
    finally:
        os.close(fd)


def run(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=60, env={**os.environ, "HOME": str(home)})


@pytest.mark.parametrize("writer", [*WRITERS[1:], ("sites-json", ("sites", "--json"), "--json")], ids=lambda w: w[0])
def test_a_full_disk_is_one_message_and_keeps_the_old_file(writer: tuple[str, tuple[str, ...], str], tmp_path: Path):
    _, args, option = writer
    home = tmp_path / "home"
    home.mkdir()
    with mounted(tmp_path / "full", "size=16k,mode=0755") as full:
        old = full / "old.out"
        old.write_text("the old document\n")
        fill(full)
        listing = sorted(os.listdir(full))
        for target in (full / "new.out", old):
            result = run(*args, str(target), home=home)
            assert result.returncode == 1, result.stdout + result.stderr
            assert "Traceback" not in result.stdout + result.stderr
            assert result.stderr.strip() == f"error: {option}: cannot write {target}: No space left on device"
            assert sorted(os.listdir(full)) == listing   # no new file, no temporary file
        assert old.read_text() == "the old document\n"


@pytest.mark.parametrize("writer", WRITERS, ids=lambda w: w[0])
def test_a_read_only_file_system_is_refused_before_anything_runs(writer: tuple[str, tuple[str, ...], str],
                                                                 tmp_path: Path, repo_before: str):
    _, args, option = writer
    with mounted(tmp_path / "ro", "size=16k,ro") as ro:
        case = Case(f"{writer[0]}-ro", where=f"^error: {option}: ", args=(*args, str(ro / "out")),
                    expect="Read-only file system")
        result, paths = run_case(case, tmp_path)
        assert_refused_cleanly(case, result, paths, repo_before)
        assert os.listdir(ro) == []


def test_a_regular_file_is_replaced_whole_keeping_its_mode_and_dash_is_stdout(tmp_path: Path):
    home = tmp_path / "home"
    home.mkdir()
    kept = tmp_path / "kept.json"
    kept.write_text("old")
    os.chmod(kept, 0o640)
    inode = kept.stat().st_ino
    assert run("sites", "--json", str(kept), home=home).returncode == 0
    assert stat.S_IMODE(kept.stat().st_mode) == 0o640 and kept.stat().st_ino != inode
    assert '"command": "sites"' in kept.read_text()
    new = tmp_path / "new.json"
    assert run("sites", "--json", str(new), home=home).returncode == 0
    assert stat.S_IMODE(new.stat().st_mode) == 0o600   # private, as the run's logs are
    job = tmp_path / "job.sh"
    assert run("job-template", "--site", "local", "--output", str(job), home=home).returncode == 0
    assert stat.S_IMODE(job.stat().st_mode) == 0o755   # a new script: 0755 less the umask (022 here)
    printed = run("job-template", "--site", "local", "--output", "-", home=home)
    assert printed.returncode == 0 and printed.stdout == job.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home", "job.sh", "kept.json", "new.json"]


def test_a_target_swapped_for_a_link_after_the_check_is_refused_at_write_time(tmp_path: Path):
    """The second check, at write time, does not follow links either (a race between the option
    check and the end of a long run)."""
    from sitestack.core import user_file

    outside = tmp_path / "outside"
    outside.write_text("kept\n")
    target = tmp_path / "out.json"
    target.write_text("{}")
    assert user_file.check("--json", str(target)) == target
    target.unlink()
    target.symlink_to(outside)
    with pytest.raises(InputError, match=r"^--json: .*out.json is a symbolic link"):
        user_file._replace("--json", target, b"new", 0o644)
    assert target.is_symlink() and outside.read_text() == "kept\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json", "outside"]


# -- caches and logs are private under any umask -------------------------------------------------------

def world_writable(root: Path) -> list[str]:
    return [f"{stat.filemode(p.lstat().st_mode)} {p}" for p in [root, *root.rglob("*")]
            if not p.is_symlink() and p.lstat().st_mode & stat.S_IWOTH]


def test_a_first_run_under_umask_000_leaves_nothing_world_writable(tmp_path: Path):
    """A fresh HOME, umask 000: a run that makes logs, then runs that fill the parse, render and probe
    caches; and a log directory of one's own that does not exist yet."""
    home, prefix, logs = tmp_path / "home", tmp_path / "prefix", tmp_path / "mine" / "logs"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("SITESTACK_LOG_DIR", "SITESTACK_ACCOUNT")}
    runs = [{}, {}, {"SITESTACK_LOG_DIR": str(logs)}]
    argvs = [("provision", "--site", "local", "--tags", "layout", "--prefix", str(prefix)),
             ("provision", "--site", "local", "--check", "--prefix", str(prefix)),
             ("provision", "--site", "local", "--tags", "layout", "--prefix", str(prefix))]
    for extra, argv in zip(runs, argvs):
        result = subprocess.run(["bash", "-c", 'umask 000; exec "$@"', "bash", sys.executable, "-m", "invoke", *argv],
                                cwd=REPO, capture_output=True, text=True, timeout=120,
                                env={**env, "HOME": str(home), **extra})
        assert result.returncode == 0, result.stdout + result.stderr
    cache = home / ".cache"
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    assert {p.name for p in (cache / "sitestack").iterdir()} >= {"logs", "parsed", "renders"}
    assert world_writable(home) == []
    assert world_writable(tmp_path / "mine") == [] and any(logs.rglob("provision.log"))
    assert all(stat.S_IMODE(p.stat().st_mode) & 0o077 == 0 for p in [*home.rglob("*"), *logs.parent.rglob("*")])


def test_source_cache_entries_and_logs_are_private_under_umask_000(tmp_path: Path):
    """The source cache (a download) and the logs a command or a build's progress appends to."""
    from sitestack.core.private import make_private, open_private
    from sitestack.installs import sources
    from sitestack.installs.progress import Progress

    tarball = tmp_path / "src.tar.gz"
    tarball.write_bytes(b"not really a tarball")
    old = os.umask(0)
    try:
        dest = tmp_path / "cache" / "ab" / "deadbeef" / "src.tar.gz"
        sources._download(tarball.as_uri(), dest, None, "src 1", 10)
        sources._store(tarball, tmp_path / "cache2" / "cd" / "src.tar.gz")
        with open_private(tmp_path / "logs" / "a" / "run.log") as handle:
            handle.write("line\n")
        Progress(tmp_path / "logs2" / "b" / "build.log", "x", None).phase("fetch")
        make_private(tmp_path / "made" / "deep")
    finally:
        os.umask(old)
    for top in ("cache", "cache2", "logs", "logs2", "made"):
        for p in [tmp_path / top, *(tmp_path / top).rglob("*")]:
            assert stat.S_IMODE(p.stat().st_mode) == (0o700 if p.is_dir() else 0o600), p
    link = tmp_path / "logs" / "a" / "link.log"
    link.symlink_to(tmp_path / "elsewhere.log")
    with pytest.raises(OSError):
        open_private(link)   # a planted link in a log directory does not redirect the writes
    assert not (tmp_path / "elsewhere.log").exists()
