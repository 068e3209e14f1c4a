"""The hosts steps run on: :class:`Host` (the seam, in :mod:`sitestack.core.hostbase`),
:class:`LocalHost` (this machine) here, and the SSH host (:mod:`sitestack.core.ssh`).

Every name callers use is importable from here: ``Host``, ``Completed``, ``shell_line``,
``LocalHost``, ``local_host``, ``SshHost``, ``ssh_host``.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from invoke.context import Context

from sitestack.core.errors import SitestackError
from sitestack.core.files import atomic_write
from sitestack.core.hostbase import UMASK, VOLATILE_ENV, Completed, Host, shell_line, with_umask
from sitestack.core.lock import OWNER_MAX, InvalidOwner
from sitestack.core.private import private_dir as private_dir  # where callers have found it
from sitestack.core.ssh import SshHost, ssh_host

__all__ = ["Completed", "Host", "LocalHost", "SshHost", "local_host", "private_dir", "shell_line",
           "site_environ", "ssh_host"]


class LocalHost(Host):
    """This machine: commands through :mod:`subprocess`, files through the OS directly."""

    caches_probes = True
    #: Steps may run in threads at once here: each command is a process of its own, and no state of
    #: this object changes but caches any thread fills with the same answer.
    concurrent_steps = True

    def __init__(self, name: str = "localhost", *, read_only: bool = False) -> None:
        super().__init__(name, Context(), read_only=read_only)

    def stop_commands(self) -> None:
        """Stop every command still running here (Ctrl-C reaches only the main thread, and each
        command runs in its own process group: those other threads wait on would run on)."""
        with _RUNNING_LOCK:
            for proc in list(_RUNNING):
                _kill_group(proc, signal.SIGTERM)

    def _exec(self, line: str, **kwargs: Any) -> Any:
        """Run one shell line here with :mod:`subprocess` (Invoke's runner polls its pipes every 10 ms:
        a no-op provision of the local site spent a third of its time in those sleeps). The same
        shell as Invoke's Context (``/bin/bash``), the same result: ``return_code``, ``stdout``,
        ``stderr``; a timeout gives return code 124 after the whole process group is killed."""
        return run_local(with_umask(line, self.umask), out=kwargs.get("out_stream"), timeout=kwargs.get("timeout"),
                         secrets=kwargs.get("secrets"))

    def _probe_secrets(self, line: str, secrets: Mapping[str, str] | None) -> tuple[str, dict[str, Any]]:
        """Here ``secrets`` go into the command's environment directly: on no command line, in no file."""
        return line, ({"secrets": dict(secrets)} if secrets else {})

    @contextlib.contextmanager
    def _run_secrets(self, line: str, secrets: Mapping[str, str] | None) -> Iterator[tuple[str, dict[str, Any]]]:
        yield self._probe_secrets(line, secrets)

    def file_signature(self, paths: Sequence[str]) -> dict[str, Any]:
        """:meth:`Host.file_signature` from this process: its environment is the one commands get here."""
        env = "\n".join(sorted(f"{k}={v}" for k, v in site_environ().items() if k not in VOLATILE_ENV))
        files: list[list[int]] = []
        for path in paths:
            try:
                st = os.stat(path)
            except OSError:
                files.append([])
                continue
            files.append([st.st_ino, st.st_size, int(st.st_mtime), int(st.st_ctime)])
        return {"env": hashlib.sha256(env.encode()).hexdigest(), "cpus": str(len(os.sched_getaffinity(0))),
                "files": files}

    def _ids(self) -> tuple[str, str]:
        import pwd
        entry = pwd.getpwuid(os.getuid())
        return os.environ.get("HOME") or entry.pw_dir, entry.pw_name

    def exists(self, path: str) -> bool:
        return os.path.lexists(path)

    def read_tail(self, path: str, limit: int = 65536, *, follow: bool = True) -> str | None:
        try:
            # a FIFO opens at once, and is refused; a symbolic link, unless followed, fails with ELOOP
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | (0 if follow else os.O_NOFOLLOW))
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP and not follow:
                raise SitestackError(f"[{self.name}] {path} is a symbolic link, not a regular file") from None
            raise SitestackError(f"[{self.name}] cannot read {path}: {exc}") from None
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):   # before fdopen, which refuses a directory with its own error
            os.close(fd)
            raise SitestackError(f"[{self.name}] {path} is not a regular file")
        with os.fdopen(fd, "rb") as handle:
            handle.seek(max(0, info.st_size - limit))
            return handle.read(limit).decode("utf-8", errors="replace")

    def write_text(self, path: str, text: str, mode: int = 0o644) -> None:
        self._refuse_if_read_only(f"write {path}")
        self.changed()
        atomic_write(Path(path), text.encode("utf-8"), mode)

    def put_file(self, local: Path, remote: str, mode: int = 0o644) -> None:
        self._refuse_if_read_only(f"copy {local} to {remote}")
        self.changed()
        atomic_write(Path(remote), Path(local).read_bytes(), mode)

    def lock_mkdir(self, path: str) -> bool:
        try:
            os.mkdir(path)
        except FileExistsError:
            return False
        except OSError as exc:
            raise SitestackError(f"[{self.name}] cannot create lock {path}: {exc.strerror}") from None
        return True

    def lock_acquire(self, path: str, owner: str) -> bool:
        self._lock_parent(path)
        if not self.lock_mkdir(path):
            return False
        # A plain write (no fsync): the owner file only tells waiters who holds the lock, and a reader
        # that finds it empty says so.
        try:
            Path(path, "owner").write_text(owner, encoding="utf-8")
        except OSError as exc:
            raise SitestackError(f"[{self.name}] cannot write the owner of lock {path}: {exc.strerror}") from None
        return True

    def _lock_parent(self, path: str) -> None:
        parent = os.path.dirname(path)
        try:
            if os.path.isfile(parent):  # a lock file of an older sitestack (flock): now a directory
                os.remove(parent)
            os.makedirs(parent, exist_ok=True)
        except OSError as exc:
            raise SitestackError(f"[{self.name}] cannot create lock {path}: {exc.strerror}") from None

    def lock_remove(self, path: str) -> None:
        shutil.rmtree(path, ignore_errors=True)

    def lock_owner(self, path: str) -> str | None:
        # lstat, then an open that follows no symlink and does not wait (a FIFO's open would), and
        # fstat on what was opened: only a regular file is read, at most OWNER_MAX + 1 bytes of it
        try:
            if not stat.S_ISREG(os.lstat(path).st_mode):
                raise InvalidOwner("is a symlink" if os.path.islink(path) else "is not a regular file")
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise SitestackError(f"[{self.name}] cannot read {path}: {exc.strerror}") from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise InvalidOwner("is not a regular file")
            data = os.read(fd, OWNER_MAX + 1)
        finally:
            os.close(fd)
        if len(data) > OWNER_MAX:
            raise InvalidOwner(f"is larger than {OWNER_MAX} bytes")
        return data.decode("utf-8", errors="replace")

    def lock_older(self, path: str, seconds: int) -> bool:
        try:
            return time.time() - os.lstat(path).st_mtime > seconds
        except OSError:
            return False


def own_venv() -> str | None:
    """The virtual environment this Python runs from (its real path), or None outside one
    (https://docs.python.org/3/library/venv.html#how-venvs-work: ``sys.prefix`` differs from
    ``sys.base_prefix`` exactly there)."""
    return os.path.realpath(sys.prefix) if sys.prefix != sys.base_prefix else None


@functools.lru_cache(maxsize=64)
def _outside(value: str, venv: str) -> str:
    """The entries of a ``PATH``-like ``value`` not inside ``venv`` (kept: every local command asks)."""
    return os.pathsep.join(d for d in value.split(os.pathsep) if not (d and _inside(d, venv)))


def _inside(path: str, root: str) -> bool:
    real = os.path.realpath(path)
    return real == root or real.startswith(root.rstrip("/") + "/")


def site_environ(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment every command on this machine runs with: ``environ`` (this process's) less
    sitestack's own virtual environment (:func:`own_venv`): its directories taken out of ``PATH`` and
    ``PYTHONPATH``, ``VIRTUAL_ENV`` and ``PYTHONHOME`` dropped where they point into it.

    Why: the site's tools are the site's (its modules, its ``PATH``). Run from an activated ``.venv``
    (as the README has it), ``python3`` on ``PATH`` was sitestack's own interpreter: the steps saw
    another toolchain than from a plain shell, said "site toolchain changed: python3" and rebuilt,
    or would have built the site's packages against the tool's environment. Activation only puts the
    venv's ``bin`` first on ``PATH`` and sets ``VIRTUAL_ENV``
    (https://docs.python.org/3/library/venv.html#how-venvs-work), so taking those out here, the one
    place local commands start (:func:`run_local`; :meth:`LocalHost.file_signature` reads the same
    environment), makes the venv invisible to every step and probe. Remote hosts never see it."""
    env = dict(os.environ if environ is None else environ)
    venv = own_venv()
    if venv is None:
        return env
    for key in ("PATH", "PYTHONPATH"):
        if key in env:
            env[key] = _outside(env[key], venv)
    for key in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"):
        if key in env and not _outside(env[key], venv):
            del env[key]   # nothing left, or it pointed into the venv
    return env


#: The shell local command lines run in (Invoke's default on POSIX, as over SSH).
SHELL = "/bin/bash"


@dataclass(frozen=True)
class LocalResult:
    """What :func:`run_local` returns: the fields of an Invoke Result the Host reads."""

    return_code: int
    stdout: str
    stderr: str


#: Each command in a process group of its own (killed whole on a timeout). ``process_group=0`` (Python
#: 3.11) keeps subprocess's vfork; ``start_new_session`` makes it fork, 2-4x slower from a large process.
_OWN_GROUP: dict[str, Any] = {"process_group": 0} if sys.version_info >= (3, 11) else {"start_new_session": True}


#: The commands :func:`run_local` is running (any thread), for :meth:`LocalHost.stop_commands`.
_RUNNING: set[subprocess.Popen[bytes]] = set()
_RUNNING_LOCK = threading.Lock()


def run_local(line: str, *, out: IO[str] | None = None, timeout: float | None = None,
              secrets: Mapping[str, str] | None = None) -> LocalResult:
    """Run ``line`` with :data:`SHELL`, standard input closed. Without ``out``, stdout and stderr are
    captured apart; with ``out``, both go to it as they arrive (and into ``stdout``). ``secrets`` are
    added to its environment (never to its command line)."""
    try:
        proc = subprocess.Popen([SHELL, "-c", line], env={**site_environ(), **(secrets or {})}, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT if out is not None else subprocess.PIPE,
                                **_OWN_GROUP)
    except OSError as exc:
        return LocalResult(127, "", str(exc))
    with _RUNNING_LOCK:
        _RUNNING.add(proc)
    try:
        return _finish(proc, out, timeout)
    except BaseException:
        # Ctrl-C (or any error here): the command runs in its own process group, so the terminal's SIGINT
        # does not reach it; stop it and what it started, as Invoke's runner does.
        _kill_group(proc, signal.SIGTERM)
        raise
    finally:
        with _RUNNING_LOCK:
            _RUNNING.discard(proc)


def _finish(proc: subprocess.Popen[bytes], out: IO[str] | None, timeout: float | None) -> LocalResult:
    if out is None:
        try:
            raw_out, raw_err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raw_out, raw_err = proc.communicate()
            return LocalResult(124, _text(raw_out), _text(raw_err) + f"\ntimed out after {timeout}s")
        return LocalResult(proc.returncode, _text(raw_out), _text(raw_err))
    # Streamed: a reader thread copies lines to ``out`` while this thread enforces the timeout.
    chunks: list[str] = []
    assert proc.stdout is not None
    stream, sink = proc.stdout, out

    def pump() -> None:
        for raw in iter(stream.readline, b""):
            text = _text(raw)
            chunks.append(text)
            sink.write(text)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        proc.wait(timeout=timeout)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        proc.wait()
        rc = 124
    reader.join()
    stream.close()
    return LocalResult(rc, "".join(chunks), "")


def _text(raw: bytes | None) -> str:
    return (raw or b"").decode("utf-8", errors="replace")


def _kill_group(proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
    """Signal the command and what it started (its own process group), so no child keeps the pipes open."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def local_host(name: str = "localhost", *, read_only: bool = False) -> LocalHost:
    """This machine. Files this process makes itself get the same modes as those commands make:
    the process umask becomes :data:`~sitestack.core.hostbase.UMASK`."""
    os.umask(int(UMASK, 8))
    return LocalHost(name, read_only=read_only)
