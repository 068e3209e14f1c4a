"""Two file helpers every cache and writer uses: a file's signature and an atomic write.

- :func:`signature`: inode, size, mtime and ctime (ns) of a file, following symlinks, or None when
  it is missing. Derived data (parsed YAML, rendered text, probe answers) is kept only while the
  signature of every file it was made from is the same (docs/design.md, "Derived data is cached").
- :func:`atomic_write` (and :func:`atomic_stream` for data written piece by piece): readers see
  the old file or the new one, never a part of one. The data
  goes to a temporary file in the target's own directory (a rename is atomic only within one
  file system), is flushed and fsynced, gets its mode, and is renamed over the target.

These are for paths sitestack chooses (caches, installs through ``Host.write_text``). A file
the *user* names on the command line (``--json FILE``, ``--output FILE``) follows the stricter
rule of :mod:`sitestack.core.user_file` instead (regular files only, one message on failure).
What the target path names here (it is looked up following symlinks):

- nothing, a regular file, or a symlink to one: replaced atomically by a new regular file
  (a symlink itself is replaced, as ``mv`` does on a remote host);
- a stream (character or block device, FIFO, socket): written in place, never replaced, so the
  device stays and the reader gets the bytes;
- a directory: refused (:class:`IsADirectoryError`).
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

Signature = tuple[int, int, int, int]


def signature(path: str | os.PathLike[str]) -> Signature | None:
    """(inode, size, mtime_ns, ctime_ns) of ``path`` (symlinks followed); None when it cannot be read."""
    try:
        return signature_of(os.stat(path))
    except OSError:
        return None


def signature_of(st: os.stat_result) -> Signature:
    """The signature of a file already stat'ed (a caller that checked its type keeps one ``stat``)."""
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def atomic_write(path: str | os.PathLike[str], data: bytes, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` so that a reader sees the old file or the new one, never a part
    (the rule for streams, symlinks and directories is in the module docstring)."""
    path = Path(path)
    with contextlib.suppress(FileNotFoundError):
        kind = os.stat(path).st_mode
        if stat.S_ISDIR(kind):
            raise IsADirectoryError(f"{path} is a directory, not a file to write")
        if not stat.S_ISREG(kind):
            with open(path, "wb") as stream:
                stream.write(data)
            return
    with atomic_stream(path, mode) as handle:
        handle.write(data)


@contextlib.contextmanager
def atomic_stream(path: str | os.PathLike[str], mode: int = 0o644) -> Iterator[BinaryIO]:
    """A file object whose bytes replace ``path`` atomically when the block ends: for data written
    piece by piece (a download). An exception in the block (a checksum that does not match) leaves
    ``path`` as it was and removes the temporary file. ``path`` is a regular file or nothing."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _sync_directory(path.parent)


def _sync_directory(directory: Path) -> None:
    """The rename made durable, where the file system allows (fsync(2) of the directory)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

__all__ = ["Signature", "atomic_stream", "atomic_write", "signature", "signature_of"]
