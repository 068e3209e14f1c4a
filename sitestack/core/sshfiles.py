"""The SSH client's files, each read once while it is unchanged: the SSH config
(:func:`ssh_config`) and known_hosts (:func:`host_keys`), through paramiko's public API. A run
connects to every host from many threads, each with its own Fabric Connection; parsing these per
host was a good part of a no-op's CPU per host (paramiko's known_hosts load checks each line
against all before it)."""

from __future__ import annotations

import copy
import functools
import io
import os
import re
import threading
from collections.abc import Callable
from typing import Any

from sitestack.core.files import signature


def host_keys(hostname: str, paths: list[str]) -> dict[str, Any]:
    """The keys (key type -> ``paramiko.PKey``) that the readable known_hosts ``paths`` hold for
    ``hostname`` (``host``, or ``[host]:port`` off port 22, as paramiko's SSHClient looks a host
    up), through paramiko's public ``HostKeys.lookup`` (hashed names included). Where two files
    hold a key of the same type, the first file's wins, as in one ``HostKeys`` loaded from each
    in turn. Each file is parsed once while it is unchanged (its inode, size, mtime and ctime):
    paramiko's load checks every line against all the lines before it, and a run connects to
    every host."""
    found: dict[str, Any] = {}
    for path in paths:
        template = cached(("known_hosts", path), [path], functools.partial(_load_host_keys, path))
        if template is None:
            continue
        entry = template.lookup(hostname)
        for keytype in entry or ():
            found.setdefault(keytype, entry[keytype])
    return found


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
    return signature(path) or ()


#: ssh_config(5) keywords whose answer a lookup may give differently each time: ``Match`` (``exec``,
#: ``localuser``...) and ``CanonicalizeHostname`` (DNS); a keyword may be followed by ``=`` or blanks.
_VOLATILE = re.compile(r"^[ \t]*(match|canonicalizehostname)(?=[ \t=])", re.IGNORECASE | re.MULTILINE)


def ssh_config(paths: list[str]) -> Any:
    """One ``paramiko.SSHConfig`` of the existing ``paths``, parsed in order into one object as
    Fabric's ``Config`` does (the runtime file alone, or the user's then the system's), cached while
    the files are unchanged: lookups only read it."""
    import paramiko

    def load() -> Any:
        config: Any = paramiko.SSHConfig()
        volatile = False
        for path in paths:
            if os.path.isfile(path):
                with open(path) as handle:
                    text = handle.read()
                config.parse(io.StringIO(text))
                volatile = volatile or bool(_VOLATILE.search(text))
        # A lookup walks every block and asks getpass.getuser() for each (a run looks each host up
        # twice): answers are kept unless a block's answer may change (Match exec, DNS canonicalization).
        if not volatile:
            answers: dict[str, Any] = {}
            lookup = config.lookup
            config.lookup = lambda host: copy.deepcopy(answers[host] if host in answers else
                                                       answers.setdefault(host, lookup(host)))
        return config

    return cached(("ssh_config", *paths), paths, load)
