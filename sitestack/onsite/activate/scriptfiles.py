"""Files as extend-venv-activate reads and writes them, through the package's one reader and writer
(:mod:`..fileio`): a read takes at most a cap of bytes (:func:`read_bytes`, :func:`read_text`), a
write replaces the file atomically and only when its bytes change (:func:`write_if_changed`).

What this adds is the command's own contract: a file that is not there is ``FileNotFoundError`` (the
callers tell "not installed" from "broken"), any other failure is :class:`Refused` naming the file.
Python 3.6 too (no ``from __future__ import annotations``: this command runs with whatever ``python3``
a user's shell finds).
"""

import errno
import os

from ..fileio import ReadError, write_atomic
from ..fileio import read_bytes as _read_bytes
from . import Refused

#: The most bytes read of one file: an activate script is a few KiB, pyvenv.cfg and the settings less.
LIMIT = 1 << 20


def read_bytes(path: str, limit: int = LIMIT) -> bytes:
    """The content of ``path``, at most ``limit`` bytes; FileNotFoundError where there is nothing at
    ``path``, Refused (naming the file) where it has more or cannot be read."""
    try:
        return _read_bytes(path, limit)
    except ReadError as exc:
        if not os.path.lexists(path):
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path) from None
        raise Refused(str(exc)) from None


def read_text(path: str, errors: str = "strict") -> str:
    """:func:`read_bytes` as UTF-8 text, newlines as they are; Refused when it is not UTF-8 (with
    ``errors="replace"``, a byte that is not UTF-8 is U+FFFD instead)."""
    try:
        return read_bytes(path).decode("utf-8", errors)
    except UnicodeDecodeError:
        raise Refused(f"{path}: not UTF-8 text") from None


def write_if_changed(path: str, text: str, like: "str | None" = None) -> bool:
    """Write ``text`` to ``path`` atomically (:func:`..fileio.write_atomic`: a reader sees the old file or
    the new one, and a file hard-linked elsewhere keeps its bytes there) unless it already holds it; the
    mode is ``like``'s where that exists, else 0644. True when written."""
    data = text.encode("utf-8")
    try:
        if read_bytes(path, len(data)) == data:
            return False
    except (FileNotFoundError, Refused):
        pass
    mode = os.stat(like).st_mode & 0o7777 if like and os.path.exists(like) else 0o644
    return write_atomic(path, data, mode=mode)
