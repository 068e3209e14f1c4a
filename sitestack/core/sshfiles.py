"""The SSH client's files, each read once while it is unchanged: the SSH config
(:func:`ssh_config`) and known_hosts (:func:`known_hosts`). A run connects to every host from
many threads, each with its own Fabric Connection; parsing these per host was a good part of a
no-op's CPU per host (paramiko's known_hosts load checks each line against all before it)."""

from __future__ import annotations

import contextlib
import copy
import functools
import os
import threading
from collections.abc import Callable
from typing import Any


def known_hosts(paths: list[str]) -> Any:
    """A fresh ``paramiko.HostKeys`` with the keys of the readable ``paths`` (later files' keys
    win, as repeated ``HostKeys.load``). Each file is parsed once while it is unchanged (its
    inode, size, mtime and ctime): paramiko's load checks every line against all the lines before it,
    and a run connects to every host. The copy is the connection's own: the
    ``--accept-new-host-keys`` policy adds to it."""
    import paramiko
    from paramiko.hostkeys import HostKeyEntry

    keys: Any = paramiko.HostKeys()
    for path in paths:
        template = cached(("known_hosts", path), [path], functools.partial(_load_host_keys, path))
        if template is None:
            continue
        entries = getattr(template, "_entries", None)  # paramiko's own list (paramiko 2.x-3.x)
        if entries is None:  # another paramiko: parse the file for this connection, as it would
            keys.load(path)
            continue
        for entry in entries:
            keys._entries.append(HostKeyEntry(list(entry.hostnames), entry.key))
    return keys


def _load_host_keys(path: str) -> Any:
    import paramiko

    keys: Any = paramiko.HostKeys()
    try:
        keys.load(path)
    except OSError:  # as load_system_host_keys: an unreadable file has no keys
        return None
    return keys


_CACHE: dict[tuple[str, ...], tuple[tuple[Any, ...], Any]] = {}
_CACHE_LOCK = threading.Lock()


def cached(key: tuple[str, ...], files: list[str], load: Callable[[], Any]) -> Any:
    """``load()``, kept while each of ``files`` is unchanged (inode, size, mtime, ctime; missing counts).
    A run connects to every host from many threads: the SSH config and known_hosts are read once."""
    stamp = tuple(_stat_key(path) for path in files)
    with _CACHE_LOCK:
        hit = _CACHE.get(key)
        if hit is not None and hit[0] == stamp:
            return hit[1]
        value = load()
        _CACHE[key] = (stamp, value)
        return value


def _stat_key(path: str) -> tuple[int, ...]:
    with contextlib.suppress(OSError):
        st = os.stat(path)
        return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    return ()


def ssh_config(paths: list[str]) -> Any:
    """One ``paramiko.SSHConfig`` of the existing ``paths``, parsed in order into one object as
    Fabric's ``Config`` does (the runtime file alone, or the user's then the system's), cached while
    the files are unchanged: lookups only read it."""
    import paramiko

    def load() -> Any:
        config: Any = paramiko.SSHConfig()
        for path in paths:
            if os.path.isfile(path):
                with open(path) as handle:
                    config.parse(handle)
        # A lookup walks every block and asks getpass.getuser() for each (a run looks each host up
        # twice): answers are kept unless a block's answer may change (Match exec, DNS canonicalization).
        blocks = getattr(config, "_config", None)  # paramiko's parsed blocks; unknown layout: no memo
        if blocks is not None and not any("matches" in block or "canonicalizehostname" in block["config"]
                                          for block in blocks):
            answers: dict[str, Any] = {}
            lookup = config.lookup
            config.lookup = lambda host: copy.deepcopy(answers[host] if host in answers else
                                                       answers.setdefault(host, lookup(host)))
        return config

    return cached(("ssh_config", *paths), paths, load)
