"""The one lock (sitestack.core.lock): mkdir and an owner file, the same for local and SSH hosts."""

from __future__ import annotations

import multiprocessing
import os
import re
import socket
import time
from pathlib import Path

import invoke
import pytest

from sitestack.core import lock
from sitestack.core.errors import LockHeld
from sitestack.core.host import Host, LocalHost
from tests.fakehost import read_only_view


def shell_host() -> Host:
    """A host whose lock goes through shell commands (mkdir, printf, rm), as it does over SSH."""
    return Host("sshlike", invoke.Context())


def _hold(path: str, ready, release) -> None:
    with LocalHost().lock(path):
        ready.set()
        release.wait(10)


@pytest.mark.parametrize("first,second", [(LocalHost, shell_host), (shell_host, LocalHost)])
def test_local_and_ssh_style_holders_exclude_each_other(tmp_path: Path, first, second):
    path = str(tmp_path / "prefix" / "lock")
    with first().lock(path):
        owner = (tmp_path / "prefix" / "lock" / "lock.d" / "owner").read_text()
        assert owner.startswith(f"pid {os.getpid()} on {socket.gethostname()} (process start ")
        held = pytest.raises(LockHeld, match=rf"is locked by pid {os.getpid()} on .*remove .*lock\.d")
        with held, second().lock(path, wait=0.3):
            pass
    assert not (tmp_path / "prefix" / "lock" / "lock.d").exists()
    with second().lock(path, wait=0):
        pass


def test_stale_lock_of_a_dead_process_is_taken_over(tmp_path: Path):
    path = str(tmp_path / "lock")
    ready, release = multiprocessing.Event(), multiprocessing.Event()
    holder = multiprocessing.Process(target=_hold, args=(path, ready, release))
    holder.start()
    assert ready.wait(10)
    holder.kill()          # SIGKILL: no clean-up, the lock directory stays
    holder.join()
    assert (tmp_path / "lock" / "lock.d").is_dir()
    for host in (shell_host(), LocalHost()):
        start = time.monotonic()
        with host.lock(path, wait=0):
            assert (tmp_path / "lock" / "lock.d" / "owner").read_text().startswith(f"pid {os.getpid()} ")
        assert time.monotonic() - start < 2


def test_reused_pid_is_stale_and_other_machines_never_are():
    me, host = os.getpid(), socket.gethostname()
    started = lock.process_start(me)
    assert not lock.is_stale(f"pid {me} on {host} (process start {started}, locked at x)")
    assert lock.is_stale(f"pid {me} on {host} (process start 1{started}, locked at x)")   # same pid, other process
    assert not lock.is_stale(f"pid 999999 on not-{host} (process start 1, locked at x)")  # can't tell: keep it
    assert not lock.is_stale("something else")


def test_lock_of_another_machine_is_not_taken_over(tmp_path: Path):
    (tmp_path / "lock" / "lock.d").mkdir(parents=True)
    (tmp_path / "lock" / "lock.d" / "owner").write_text("pid 1 on elsewhere (process start 5, locked at t)\n")
    held = pytest.raises(LockHeld, match=r"locked by pid 1 on elsewhere .*remove .*lock\.d if that run is gone")
    with held, LocalHost().lock(str(tmp_path / "lock"), wait=0):
        pass


def test_waiting_is_reported_once_with_the_holder(tmp_path: Path):
    path = str(tmp_path / "lock")
    ready, release = multiprocessing.Event(), multiprocessing.Event()
    holder = multiprocessing.Process(target=_hold, args=(path, ready, release))
    holder.start()
    assert ready.wait(10)
    notes: list[str] = []
    try:
        with pytest.raises(LockHeld), LocalHost().lock(path, wait=0.5, report=notes.append):
            pass
        assert len(notes) == 1
        assert f"is locked by pid {holder.pid} on {socket.gethostname()}" in notes[0]
        assert "waiting up to" in notes[0]
        release.set()
        holder.join(10)
        with LocalHost().lock(path, wait=5, report=notes.append):
            pass
    finally:
        holder.kill()
        holder.join()


#: A process whose file locks (flock, lockf, fcntl) all fail with ENOSYS, as on a Lustre client mounted
#: without -o flock, takes the lock named argv[1] three times and logs its critical sections to argv[2].
_NO_FLOCK_HOLDER = """
import errno, fcntl, os, sys, time
def absent(*args, **kwargs):
    raise OSError(errno.ENOSYS, "Function not implemented")
fcntl.flock = fcntl.lockf = fcntl.fcntl = absent
from sitestack.core.host import LocalHost
for _ in range(3):
    with LocalHost().lock(sys.argv[1], wait=60):
        with open(sys.argv[2], "a") as log:
            log.write(f"enter {os.getpid()}\\n")
        time.sleep(0.1)
        with open(sys.argv[2], "a") as log:
            log.write(f"leave {os.getpid()}\\n")
"""


def test_works_where_flock_is_absent(tmp_path: Path):
    """Where every file lock fails (ENOSYS), the mkdir lock still excludes: two processes contending
    for it never overlap, and both get it."""
    import subprocess
    import sys

    from tests.conftest import REPO

    path, log = str(tmp_path / "lustre" / "prefix.lock"), tmp_path / "sections"
    procs = [subprocess.Popen([sys.executable, "-c", _NO_FLOCK_HOLDER, path, str(log)], cwd=REPO,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errors
    lines = log.read_text().splitlines()
    assert len(lines) == 12
    for enter, leave in zip(lines[::2], lines[1::2]):   # each section is left before the next one starts
        assert enter.split() == ["enter", leave.split()[1]] and leave.startswith("leave "), lines
    assert not (tmp_path / "lustre" / "prefix.lock" / "lock.d").exists()


@pytest.mark.parametrize("make", [LocalHost, shell_host])
def test_a_lock_file_of_an_older_sitestack_is_replaced_by_the_lock_directory(tmp_path: Path, make):
    (tmp_path / "prefix.lock").write_text("")   # where an flock-based sitestack kept its lock file
    with make().lock(str(tmp_path / "prefix.lock")):
        assert (tmp_path / "prefix.lock" / "lock.d" / "owner").is_file()
    assert (tmp_path / "prefix.lock").is_dir()


def test_read_only_host_takes_no_lock(tmp_path: Path):
    from sitestack.core.errors import MutationRefused
    with pytest.raises(MutationRefused), read_only_view(LocalHost()).lock(str(tmp_path / "lock")):
        pass
    assert list(tmp_path.iterdir()) == []


def test_a_provision_waiting_for_the_prefix_lock_says_who_holds_it(tmp_path: Path):
    """Another run holds the prefix: this run says who holds it and that it waits, then goes on."""
    import subprocess
    import sys

    from tests.conftest import REPO

    prefix = tmp_path / "prefix"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from sitestack.core.host import LocalHost\n"
        f"with LocalHost().lock({str(prefix / '.sitestack' / 'provision.lock')!r}):\n"
        "    print('held', flush=True); time.sleep(3)\n")], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        run = subprocess.run([sys.executable, "-m", "invoke", "provision", "--site", "local", "--tags", "layout",
                              "--prefix", str(prefix)], cwd=REPO, capture_output=True, text=True, timeout=120,
                             env={**os.environ, "SITESTACK_LOG_DIR": str(tmp_path / "logs")})
    finally:
        holder.wait(timeout=30)
    assert run.returncode == 0, run.stdout + run.stderr
    assert re.search(rf"\[localhost\] .*provision\.lock is locked by pid {holder.pid} on .*: waiting up to \d+s",
                     run.stdout), run.stdout
    log = next((tmp_path / "logs").rglob("provision.log")).read_text()
    assert "waiting up to" in log  # the note reaches the host's log too
