"""Caches and logs are the user's alone, whatever the umask: one way to make their directories and files.

Build logs, environment dumps, parsed playbooks and tarballs kept on the controller
(``~/.cache/sitestack``, ``$SITESTACK_LOG_DIR``, ``$SITESTACK_SOURCE_CACHE``) are private
(README: "caches and logs stay private"): directories 0700, files 0600, from the first
directory sitestack makes, ``~/.cache`` included when it is sitestack that makes it.

``Path.mkdir(parents=True)`` is not enough: the parents it makes get ``0777 & ~umask``, which is
0777 under umask 000, and the mode given to ``mkdir(2)`` is masked by the umask too. So each
missing directory is made on its own with mode 0700 and then chmod'ed to 0700, which the umask
does not touch (mkdir(2), chmod(2): https://man7.org/linux/man-pages/man2/mkdir.2.html).
Directories that already exist and are not sitestack's own (a ``$SITESTACK_LOG_DIR`` the user
made) keep their mode. Installed trees are not made here: they follow the site's install modes
(``core/hostbase.py: UMASK``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TextIO

#: The mode of a cache or log directory, and of a cache or log file.
DIR_MODE = 0o700
FILE_MODE = 0o600


def make_private(path: str | os.PathLike[str]) -> Path:
    """``path`` as a directory: every component that is missing is made 0700 (the umask cannot
    widen it); components that exist are left as they are. Raises OSError as mkdir does."""
    path = Path(path)
    missing: list[Path] = []
    here = path
    while not here.is_dir():
        missing.append(here)
        if here.parent == here:
            break
        here = here.parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, DIR_MODE)
        except FileExistsError:   # another run made it first: it is theirs to have made private
            if not directory.is_dir():
                raise
            continue
        os.chmod(directory, DIR_MODE)
    return path


def private_dir(path: str | os.PathLike[str]) -> Path:
    """``path`` made as :func:`make_private` does, and itself 0700 even where it existed: for a
    directory that is sitestack's own (``~/.cache/sitestack``, a run's log directory)."""
    path = make_private(path)
    os.chmod(path, DIR_MODE)
    return path


def open_private(path: str | os.PathLike[str]) -> TextIO:
    """``path`` opened to append text (a log), made 0600 and in a directory made private where
    missing; never through a symlink (``O_NOFOLLOW``: a link planted in a shared log directory
    does not redirect the writes)."""
    path = Path(path)
    make_private(path.parent)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
    try:
        if os.fstat(fd).st_uid == os.geteuid():
            os.fchmod(fd, FILE_MODE)
        return open(fd, "a", encoding="utf-8", closefd=True)
    except BaseException:
        os.close(fd)
        raise


__all__ = ["DIR_MODE", "FILE_MODE", "make_private", "open_private", "private_dir"]
