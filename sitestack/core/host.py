"""The hosts steps run on: :class:`Host` (the seam, in :mod:`sitestack.core.hostbase`),
:class:`LocalHost` (this machine) here, and the SSH host (:mod:`sitestack.core.ssh`).

Every name callers use is importable from here: ``Host``, ``Completed``, ``shell_line``,
``LocalHost``, ``local_host``, ``atomic_write``, ``SshHost``, ``ssh_host``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

from invoke.context import Context

from sitestack.core.errors import SitestackError
from sitestack.core.hostbase import UMASK, Completed, Host, shell_line
from sitestack.core.ssh import SshHost, ssh_host

__all__ = ["Completed", "Host", "LocalHost", "SshHost", "atomic_write", "local_host", "private_dir", "shell_line",
           "ssh_host"]


class LocalHost(Host):
    """This machine: commands through an Invoke Context, files through the OS directly."""

    def __init__(self, name: str = "localhost", *, read_only: bool = False) -> None:
        super().__init__(name, Context(), read_only=read_only)

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

    def lock_mkdir(self, path: str) -> bool:
        try:
            os.mkdir(path)
        except FileExistsError:
            return False
        except OSError as exc:
            raise SitestackError(f"[{self.name}] cannot create lock {path}: {exc.strerror}") from None
        return True

    def lock_parent(self, path: str) -> None:
        parent = os.path.dirname(path)
        try:
            if os.path.isfile(parent):  # a lock file of an older sitestack (flock): now a directory
                os.remove(parent)
            os.makedirs(parent, exist_ok=True)
        except OSError as exc:
            raise SitestackError(f"[{self.name}] cannot create lock {path}: {exc.strerror}") from None

    def lock_write(self, path: str, text: str) -> None:
        atomic_write(Path(path), text.encode("utf-8"))

    def lock_remove(self, path: str) -> None:
        shutil.rmtree(path, ignore_errors=True)


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


def local_host(name: str = "localhost", *, read_only: bool = False) -> LocalHost:
    """This machine. Files this process makes itself get the same modes as those commands make:
    the process umask becomes :data:`~sitestack.core.hostbase.UMASK`."""
    os.umask(int(UMASK, 8))
    return LocalHost(name, read_only=read_only)


def private_dir(path: Path) -> Path:
    """``path`` made (with its parents) and readable by this user only: caches and logs hold
    build output, environment dumps and tarballs that are the user's, not the site's."""
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o700)
    return path
