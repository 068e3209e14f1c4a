"""Files as extend-venv-activate reads and writes them: a read takes at most a cap of bytes
(:func:`read_bytes`, :func:`read_text`), a write replaces the file atomically and only when its bytes
change (:func:`write_if_changed`).

The contract of the on-site package's shared file helpers, kept here on its own because this command
runs with whatever ``python3`` a user's shell finds, Python 3.6 included (no ``from __future__ import
annotations``, which 3.6 refuses).
"""

import os
import tempfile

from . import Refused

#: The most bytes read of one file: an activate script is a few KiB, pyvenv.cfg and the settings less.
LIMIT = 1 << 20


def read_bytes(path: str, limit: int = LIMIT) -> bytes:
    """The content of ``path``, at most ``limit`` bytes (Refused, naming the file, when it has more).
    OSError (FileNotFoundError among them) propagates."""
    with open(path, "rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise Refused(f"{path}: over {limit} bytes")
    return data


def read_text(path: str, errors: str = "strict") -> str:
    """:func:`read_bytes` as UTF-8 text, newlines as they are; Refused when it is not UTF-8 (with
    ``errors="replace"``, a byte that is not UTF-8 is U+FFFD instead)."""
    try:
        return read_bytes(path).decode("utf-8", errors)
    except UnicodeDecodeError:
        raise Refused(f"{path}: not UTF-8 text") from None


def write_if_changed(path: str, text: str, like: "str | None" = None) -> bool:
    """Write ``text`` to ``path`` atomically (a temporary file beside it, then rename: a reader sees the
    old file or the new one, and a file hard-linked elsewhere keeps its bytes there) unless it already
    holds it; the mode is ``like``'s where that exists, else 0644. True when written."""
    data = text.encode("utf-8")
    try:
        if read_bytes(path, len(data)) == data:
            return False
    except (FileNotFoundError, Refused):
        pass
    mode = os.stat(like).st_mode & 0o7777 if like and os.path.exists(like) else 0o644
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix="." + os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return True
