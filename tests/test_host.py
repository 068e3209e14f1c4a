"""Host: probes, mutations, atomic writes and locks, locally and over a real sshd."""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

import pytest

from sitestack.actions import ACTIONS
from sitestack.core.errors import CommandFailed, LockHeld, MutationRefused, SitestackError
from sitestack.core.files import atomic_write
from sitestack.core.host import LocalHost, shell_line, ssh_host
from tests import sshd
from tests.fakehost import read_only_view

AWKWARD = "a b'c\"d $HOME `x` ;|&"


def test_shell_line_quotes_every_argument():
    assert shell_line(["echo", "a b"], {"X": "1 2"}, "/tmp/d e") == "cd '/tmp/d e' && env 'X=1 2' echo 'a b'"


def test_probe_passes_arguments_verbatim_and_never_raises():
    host = LocalHost()
    assert host.probe(["printf", "%s", AWKWARD]).stdout == AWKWARD
    missing = host.probe(["no-such-command-anywhere"])
    assert missing.rc == 127 and not missing.ok


def test_run_raises_with_the_tail_of_its_log(tmp_path: Path):
    host = LocalHost()
    log = tmp_path / "logs" / "x.log"
    with pytest.raises(CommandFailed) as info:
        host.run(["sh", "-c", "echo first; echo last >&2; exit 3"], log=log)
    assert info.value.rc == 3 and "last" in str(info.value) and str(log) in str(info.value)
    assert "first" in log.read_text() and "last" in log.read_text()


def test_read_only_host_refuses_mutations(tmp_path: Path):
    view = read_only_view(LocalHost())
    target = tmp_path / "f"
    for attempt in (lambda: view.run(["touch", str(target)]), lambda: view.write_text(str(target), "x"),
                    lambda: view.lock(str(tmp_path / "lock")).__enter__()):
        with pytest.raises(MutationRefused):
            attempt()
    assert list(tmp_path.iterdir()) == []
    assert view.probe(["true"]).ok  # probes still run for real


def test_atomic_write_replaces_whole_files_and_leaves_no_temp(tmp_path: Path):
    target = tmp_path / "d" / "f.txt"
    LocalHost().write_text(str(target), "one\n", 0o640)
    LocalHost().write_text(str(target), "two\n", 0o644)
    assert target.read_text() == "two\n" and oct(target.stat().st_mode & 0o777) == "0o644"
    assert os.listdir(target.parent) == ["f.txt"]


def test_atomic_write_failure_keeps_the_old_file(tmp_path: Path):
    target = tmp_path / "f"
    target.write_text("old")

    with pytest.raises(TypeError):  # the write itself fails after the temp file exists
        atomic_write(target, object(), 0o644)  # type: ignore[arg-type]
    assert target.read_text() == "old" and os.listdir(tmp_path) == ["f"]


def _hold_lock(path: str, ready, release) -> None:
    with LocalHost().lock(path):
        ready.set()
        release.wait(10)


def test_lock_excludes_another_process_and_is_freed_when_it_dies(tmp_path: Path):
    path = str(tmp_path / "prefix" / ".sitestack" / "lock")
    ready, release = multiprocessing.Event(), multiprocessing.Event()
    holder = multiprocessing.Process(target=_hold_lock, args=(path, ready, release))
    holder.start()
    assert ready.wait(10)
    with pytest.raises(LockHeld, match=r"is locked by pid \d+"), LocalHost().lock(path, wait=0.3):
        pass
    holder.kill()  # SIGKILL: the kernel drops the flock with the process
    holder.join()
    start = time.monotonic()
    with LocalHost().lock(path, wait=5):
        pass
    assert time.monotonic() - start < 2


# -- over SSH, against a real sshd on loopback ----------------------------------------------

needs_sshd = pytest.mark.skipif(not sshd.available(), reason="needs root and openssh-server")


@pytest.fixture
def server(tmp_path: Path, monkeypatch):
    srv = sshd.start_sshd(tmp_path / "srv", "testhost")
    monkeypatch.setenv("SITESTACK_SSH_CONFIG", str(tmp_path / "ssh_config"))
    yield srv
    srv.stop()


@needs_sshd
def test_ssh_host_probes_runs_and_writes_atomically(server, tmp_path: Path):
    host = ssh_host("testhost")
    assert host.probe(["printf", "%s", AWKWARD]).stdout == AWKWARD
    assert host.user() == "root"
    target = str(tmp_path / "remote" / "file.txt")
    host.write_text(target, "hello\n", 0o600)
    assert host.read_text(target) == "hello\n"
    assert oct(os.stat(target).st_mode & 0o777) == "0o600"
    assert os.listdir(tmp_path / "remote") == ["file.txt"]
    with pytest.raises(CommandFailed):
        host.run(["false"])
    with host.lock(str(tmp_path / "remote" / "lock")), pytest.raises(LockHeld, match="remove .*lock.d"), \
            ssh_host("testhost").lock(str(tmp_path / "remote" / "lock"), wait=0):
        pass
    assert not (tmp_path / "remote" / "lock.d").exists()
    view = read_only_view(host)
    with pytest.raises(MutationRefused):
        view.write_text(target, "x")
    # a file's text is its bytes, the same locally and over SSH: a CRLF file is not read as the LF one
    Path(target).write_bytes(b"a\r\nb\rc\n\xff")
    assert host.read_text(target) == LocalHost().read_text(target) == "a\r\nb\rc\n\ufffd"


@needs_sshd
def test_unknown_host_key_is_refused_unless_accepted(tmp_path: Path, monkeypatch):
    srv = sshd.start_sshd(tmp_path / "srv", "stranger", known=False)
    monkeypatch.setenv("SITESTACK_SSH_CONFIG", str(tmp_path / "ssh_config"))
    try:
        with pytest.raises(SitestackError, match="not in known_hosts: refusing to connect"):
            ssh_host("stranger")
        assert ssh_host("stranger", accept_unknown_hosts=True).probe(["true"]).ok
        with pytest.raises(SitestackError, match="not in known_hosts"):  # accepted for that connection only
            ssh_host("stranger")
        with open(tmp_path / "known_hosts", "a") as handle:  # known_hosts is read again once it changes
            handle.write(srv.host_key_line + "\n")
        assert ssh_host("stranger").probe(["true"]).ok
        (tmp_path / "known_hosts").write_text(srv.host_key_line.replace("[127.0.0.1]", "elsewhere") + "\n")
        with pytest.raises(SitestackError, match="not in known_hosts"):
            ssh_host("stranger")
    finally:
        srv.stop()


def test_ssh_config_is_read_again_once_it_changes(tmp_path: Path):
    from sitestack.core.sshfiles import ssh_config

    path = tmp_path / "ssh_config"
    path.write_text("Host a\n  Port 2201\n")
    first = ssh_config([str(path)]).lookup("a")
    first["port"] = "9"  # a caller's copy: the next lookup is not changed by it
    assert ssh_config([str(path)]).lookup("a")["port"] == "2201"
    path.write_text("Host a\n  Port 2202\nHost b\n  Port 2203\n")
    assert ssh_config([str(path)]).lookup("a")["port"] == "2202"
    assert ssh_config([str(path)]).lookup("b")["port"] == "2203"


def test_secrets_stay_out_of_logs_and_errors(tmp_path: Path):
    from sitestack.core.redact import redact

    assert redact("env PIP_INDEX_TOKEN=abc123 pip install x") == "env PIP_INDEX_TOKEN=*** pip install x"
    assert redact("--index-url https://bob:s3cret@pypi.example.org/simple") == "--index-url https://***@pypi.example.org/simple"
    assert redact("HOROVOD_GPU=ROCM PATH=/usr/bin") == "HOROVOD_GPU=ROCM PATH=/usr/bin"
    log = tmp_path / "step.log"
    with pytest.raises(CommandFailed) as info:
        LocalHost().run(["sh", "-c", "echo using https://bob:s3cret@example.org; exit 1"],
                        env={"API_TOKEN": "tok-999"}, log=log)
    text = log.read_text()
    assert "s3cret" not in text and "tok-999" not in text and "https://***@example.org" in text
    assert "s3cret" not in str(info.value)


class RecordingHost(LocalHost):
    """The real Host.run path, as a non-root user, with commands recorded instead of run."""

    def __init__(self):
        super().__init__("rec")
        self.lines: list[str] = []

    def _ids(self):
        return "/home/alice", "alice"

    def _exec(self, line, **kwargs):
        self.lines.append(line)
        return type("R", (), {"return_code": 0, "stdout": "", "stderr": ""})()


def test_sudo_only_for_steps_marked_become(tmp_path: Path):
    from sitestack.engine import playbook as pb
    from sitestack.model.site import StepSpec

    site = pb.load("local")
    host = RecordingHost()
    ctx = pb.context_for(site, host, pb.Options(prefix="/x"), None)   # steps write below the prefix only
    plain = ACTIONS["directory"].from_spec(StepSpec(name="d", action="directory", args={"paths": ["{prefix}"]}), ctx)
    become = ACTIONS["directory"].from_spec(
        StepSpec(name="d", action="directory", args={"paths": ["{prefix}"]}, become=True), ctx)
    plain.apply(host)
    assert host.lines == ["mkdir -p -- /x", "chmod 0755 -- /x"]
    host.lines.clear()
    become.apply(host)
    assert host.lines == ["sudo -n -- env mkdir -p -- /x", "sudo -n -- env chmod 0755 -- /x"]
    host.lines.clear()
    host.run(["apt-get", "install", "-y", "lmod"], env={"DEBIAN_FRONTEND": "noninteractive"}, sudo=True)
    assert host.lines == ["sudo -n -- env DEBIAN_FRONTEND=noninteractive apt-get install -y lmod"]
