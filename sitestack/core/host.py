"""The one execution seam: :class:`Host`, over an Invoke Context (local) or a Fabric
Connection (SSH; a Connection is a Context).

- ``probe(argv)`` always runs, is quiet and never raises: it returns a :class:`Completed`.
- ``run(argv)`` mutates: refused on a read-only host (check mode), raises
  :class:`~sitestack.errors.CommandFailed` on a non-zero exit, and streams its output to a
  log file when given one.
- ``read_text`` / ``write_text`` / ``put_file``: ``write_text`` is atomic (a temporary file
  beside the target, then a rename), locally and remotely.

Commands are argv lists; they are quoted into a shell line in exactly one place,
:func:`shell_line`.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
import shlex
import socket
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import invoke

from sitestack.core.errors import CommandFailed, ConnectionLost, LockHeld, MutationRefused, SitestackError
from sitestack.core.redact import redact


@dataclass(frozen=True)
class Completed:
    """The outcome of a command: exit code and captured output."""

    rc: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.rc == 0


def shell_line(argv: Sequence[str], env: Mapping[str, str] | None = None, cwd: str | None = None) -> str:
    """The single place where an argv list becomes a shell command line."""
    if not argv:
        raise ValueError("empty argv")
    line = shlex.join(list(argv))
    if env:
        line = shlex.join(["env", *(f"{k}={v}" for k, v in env.items())]) + " " + line
    if cwd:
        line = f"cd {shlex.quote(cwd)} && {line}"
    return line


class Host:
    """A machine steps run on. Use :func:`local_host` or :func:`ssh_host` to make one."""

    def __init__(self, name: str, context: invoke.Context, *, read_only: bool = False) -> None:
        self.name = name
        self.context = context
        self.read_only = read_only
        self._identity: tuple[str, str] | None = None

    # -- commands ------------------------------------------------------------------------
    def probe(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
              cwd: str | None = None, timeout: float | None = 60) -> Completed:
        """Run a read-only command and return its outcome, whatever its exit code.

        A command that cannot start has rc 127. Raises only :class:`ConnectionLost` when the
        host cannot be reached at all (no answer is better than a wrong one).
        """
        try:
            result = self._exec(shell_line(argv, env, cwd), hide=True, warn=True, in_stream=False, timeout=timeout)
        except invoke.exceptions.CommandTimedOut as exc:
            return Completed(124, exc.result.stdout, exc.result.stderr + f"\ntimed out after {timeout}s")
        except (invoke.exceptions.UnexpectedExit, OSError) as exc:  # pragma: no cover - warn=True
            return Completed(127, "", str(exc))
        return Completed(result.return_code, result.stdout, result.stderr)

    def run(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | None = None,
            log: Path | None = None, sudo: bool = False, timeout: float | None = None) -> Completed:
        """Run a mutating command; raise CommandFailed on a non-zero exit.

        With ``log``, output is appended to that controller-side file as it arrives and the
        error shows its last lines. ``sudo`` prefixes ``sudo -n`` unless already root.
        """
        self._refuse_if_read_only(f"run {shlex.join(list(argv))}")
        if sudo and self.user() != "root":
            # sudo drops the caller's environment: pass it through env(1) behind sudo.
            argv = ["sudo", "-n", "--", "env", *(f"{k}={v}" for k, v in (env or {}).items()), *argv]
            env = None
        line = shell_line(argv, env, cwd)
        with contextlib.ExitStack() as stack:
            buffer = io.StringIO()
            handle = None
            if log is not None:
                log.parent.mkdir(parents=True, exist_ok=True)
                handle = stack.enter_context(open(log, "a", encoding="utf-8"))
                handle.write(f"$ {redact(line)}\n")
                handle.flush()
            tee = _Tee(buffer, handle)
            stack.callback(tee.close)
            try:
                result = self._exec(line, hide=True, warn=True, in_stream=False, out_stream=tee,
                                    err_stream=tee, timeout=timeout)
                rc = result.return_code
            except invoke.exceptions.CommandTimedOut:
                rc = 124
        if rc != 0:
            raise CommandFailed(list(argv), rc, buffer.getvalue(), str(log) if log else None)
        return Completed(rc, buffer.getvalue(), "")

    def _exec(self, line: str, **kwargs):
        """Run one shell line through the Context (the only place commands leave the Host)."""
        return self.context.run(line, **kwargs)

    # -- identity ------------------------------------------------------------------------
    def user(self) -> str:
        return self._ids()[1]

    def home(self) -> str:
        return self._ids()[0]

    def _ids(self) -> tuple[str, str]:
        if self._identity is None:
            out = self.probe(["sh", "-c", 'printf "%s\\n%s\\n" "$HOME" "$(id -un)"'])
            if not out.ok:
                raise SitestackError(f"[{self.name}] cannot read $HOME and user: {out.stderr.strip()}")
            home, user = out.stdout.splitlines()[:2]
            self._identity = (home, user)
        return self._identity

    # -- files -----------------------------------------------------------------------------
    def exists(self, path: str) -> bool:
        return self.probe(["test", "-e", path]).ok

    def read_text(self, path: str) -> str | None:
        """The text of ``path``, or None when it does not exist."""
        out = self.probe(["cat", "--", path])
        return out.stdout if out.ok else None

    def write_text(self, path: str, text: str, mode: int = 0o644) -> None:
        """Write ``text`` to ``path`` atomically (temp file beside it, then rename)."""
        raise NotImplementedError

    def put_file(self, local: Path, remote: str, mode: int = 0o644) -> None:
        """Copy a controller file to the host, atomically."""
        raise NotImplementedError

    # -- locking ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def lock(self, path: str, *, wait: float = 0) -> Iterator[None]:
        """Hold an exclusive lock named by ``path`` (a file on the host) while the block runs."""
        raise NotImplementedError
        yield  # pragma: no cover

    def close(self) -> None:
        """Release the connection (nothing to do locally)."""

    def _refuse_if_read_only(self, what: str) -> None:
        if self.read_only:
            raise MutationRefused(f"[{self.name}] check mode: refusing to {what}")

    def read_only_view(self) -> Host:
        """A view of this host that probes but refuses every mutation (for check mode)."""
        view = object.__new__(type(self))
        view.__dict__.update(self.__dict__)
        view.read_only = True
        return view


class _Tee(io.TextIOBase):
    """Copies command output to a buffer (for errors) and to a log file, line by line,
    redacting secrets on the way to the log."""

    def __init__(self, buffer: io.StringIO, log: IO[str] | None) -> None:
        self.buffer, self.log, self.pending = buffer, log, ""

    def write(self, text: str) -> int:
        self.buffer.write(text)
        if self.log is not None:
            self.pending += text
            *lines, self.pending = self.pending.split("\n")
            if lines:
                self.log.write("".join(redact(line) + "\n" for line in lines))
                self.log.flush()
        return len(text)

    def close(self) -> None:
        if self.log is not None and self.pending:
            self.log.write(redact(self.pending) + "\n")
            self.log.flush()
            self.pending = ""


class LocalHost(Host):
    """This machine: commands through an Invoke Context, files through the OS directly."""

    def __init__(self, name: str = "localhost", *, read_only: bool = False) -> None:
        super().__init__(name, invoke.Context(), read_only=read_only)

    def _ids(self) -> tuple[str, str]:
        import pwd
        entry = pwd.getpwuid(os.getuid())
        return os.environ.get("HOME") or entry.pw_dir, entry.pw_name

    def exists(self, path: str) -> bool:
        return os.path.lexists(path)

    def read_text(self, path: str) -> str | None:
        try:
            return Path(path).read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise SitestackError(f"[{self.name}] cannot read {path}: {exc}") from None

    def write_text(self, path: str, text: str, mode: int = 0o644) -> None:
        self._refuse_if_read_only(f"write {path}")
        atomic_write(Path(path), text.encode("utf-8"), mode)

    def put_file(self, local: Path, remote: str, mode: int = 0o644) -> None:
        self._refuse_if_read_only(f"copy {local} to {remote}")
        atomic_write(Path(remote), Path(local).read_bytes(), mode)

    @contextlib.contextmanager
    def lock(self, path: str, *, wait: float = 0) -> Iterator[None]:
        self._refuse_if_read_only(f"lock {path}")
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise SitestackError(f"[{self.name}] cannot create lock {path}: {exc.strerror}") from None
        try:
            deadline = time.monotonic() + wait
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        owner = Path(path).read_text(errors="replace").strip() or "another process"
                        raise LockHeld(f"[{self.name}] {path} is locked by {owner}") from None
                    time.sleep(0.2)
            os.ftruncate(fd, 0)
            os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
            yield
        finally:
            os.close(fd)  # closing releases the flock; a killed process releases it too


def atomic_write(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the new one, never a part."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


class SshHost(Host):
    """A remote machine over SSH (Fabric). The remote shell is non-login."""

    def __init__(self, name: str, connection, *, read_only: bool = False) -> None:
        super().__init__(name, connection, read_only=read_only)

    def close(self) -> None:
        self.context.close()

    def _exec(self, line: str, **kwargs):
        import paramiko

        try:
            result = self.context.run(line, **kwargs)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise ConnectionLost(f"[{self.name}] connection lost: {exc or type(exc).__name__}") from None
        if result.return_code == -1:  # paramiko: the channel closed without an exit status
            raise ConnectionLost(f"[{self.name}] connection lost while running: {redact(line)[:200]}")
        return result

    def write_text(self, path: str, text: str, mode: int = 0o644) -> None:
        self._refuse_if_read_only(f"write {path}")
        self._put_bytes(text.encode("utf-8"), path, mode)

    def put_file(self, local: Path, remote: str, mode: int = 0o644) -> None:
        self._refuse_if_read_only(f"copy {local} to {remote}")
        self._put_bytes(Path(local).read_bytes(), remote, mode)

    def _put_bytes(self, data: bytes, path: str, mode: int) -> None:
        sftp = self.context.sftp()
        parent = os.path.dirname(path)
        self.run(["mkdir", "-p", parent])
        tmp = f"{parent}/.{os.path.basename(path)}.{os.getpid()}.tmp"
        try:
            with sftp.open(tmp, "wb") as handle:
                handle.write(data)
            sftp.chmod(tmp, mode)
            sftp.posix_rename(tmp, path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                sftp.remove(tmp)
            raise SitestackError(f"[{self.name}] cannot write {path}: {exc}") from None

    @contextlib.contextmanager
    def lock(self, path: str, *, wait: float = 0) -> Iterator[None]:
        # mkdir is atomic on every POSIX file system, NFS and Lustre included; the owner file
        # says who holds it, so a stale lock can be told apart and removed by hand.
        self._refuse_if_read_only(f"lock {path}")
        owner = f"pid {os.getpid()} on {socket.gethostname()}"
        lock_dir = path + ".d"
        deadline = time.monotonic() + wait
        self.run(["mkdir", "-p", os.path.dirname(path)])
        while not self.probe(["mkdir", lock_dir]).ok:
            held = (self.read_text(f"{lock_dir}/owner") or "").strip()
            if _stale(held):
                # Left by a run of this controller that died (killed, or its connection
                # dropped before it could clean up): nobody holds it any more.
                self.probe(["rm", "-rf", "--", lock_dir])
                continue
            if time.monotonic() >= deadline:
                raise LockHeld(f"[{self.name}] {path} is locked by {held or 'another run'} "
                               f"(remove {lock_dir} if that run is gone)")
            time.sleep(0.5)
        try:
            self.write_text(f"{lock_dir}/owner", owner + "\n")
            yield
        finally:
            with contextlib.suppress(SitestackError):  # a dropped connection leaves a stale lock
                self.probe(["rm", "-rf", "--", lock_dir])


def _verify_host_keys(connection, accept_unknown_hosts: bool) -> None:
    import paramiko

    client = connection.client
    client.load_system_host_keys()
    for known in str(connection.ssh_config.get("userknownhostsfile", "")).split():
        known = os.path.expanduser(known)
        if os.path.exists(known):
            client.load_host_keys(known)
    client.set_missing_host_key_policy(paramiko.AutoAddPolicy() if accept_unknown_hosts else paramiko.RejectPolicy())


def _stale(owner: str) -> bool:
    """Whether a remote lock's owner line names a process of this controller that is gone."""
    parts = owner.split()
    if len(parts) != 4 or parts[0] != "pid" or parts[2] != "on" or parts[3] != socket.gethostname():
        return False
    try:
        os.kill(int(parts[1]), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, ValueError):
        return False
    return False


def local_host(name: str = "localhost", *, read_only: bool = False) -> LocalHost:
    return LocalHost(name, read_only=read_only)


def ssh_host(name: str, address: str | None = None, *, user: str | None = None, port: int | None = None,
             read_only: bool = False, accept_unknown_hosts: bool = False, connect_timeout: float = 15) -> SshHost:
    """Connect to ``address`` (an ssh-config alias or host name) with the user's SSH config.

    The SSH config is ``~/.ssh/config``, or the file named by ``$SITESTACK_SSH_CONFIG``.
    Host keys are checked against ``~/.ssh/known_hosts`` and the config's
    ``UserKnownHostsFile``; an unknown host key is refused unless ``accept_unknown_hosts``
    (Fabric alone would accept any key: it sets paramiko's AutoAddPolicy).
    """
    import fabric
    import paramiko

    config_path = os.environ.get("SITESTACK_SSH_CONFIG")
    config = fabric.Config(runtime_ssh_path=config_path) if config_path else None
    target = address or name
    connection = fabric.Connection(target, user=user, port=port, connect_timeout=int(connect_timeout), config=config)
    # The target and every ProxyJump gateway Fabric made from the config check host keys alike.
    hop = connection
    while isinstance(hop, fabric.Connection):
        _verify_host_keys(hop, accept_unknown_hosts)
        hop = hop.gateway
    try:
        connection.open()
    except paramiko.SSHException as exc:
        if "not found in known_hosts" in str(exc):
            raise SitestackError(
                f"[{name}] host key of {target} is not in known_hosts: refusing to connect "
                "(check the key and add it to known_hosts, or pass --accept-new-host-keys)") from None
        raise SitestackError(f"[{name}] SSH to {target} failed: {exc}") from None
    except OSError as exc:
        raise SitestackError(f"[{name}] cannot connect to {target}: {exc}") from None
    return SshHost(name, connection, read_only=read_only)
