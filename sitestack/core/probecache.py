"""Probe answers kept between runs, vouched for by the files they read (a stamp cache of probes).

Some probes start interpreters or source a module system to learn what files already say: the
toolchain probe runs every tool's ``--version`` with the site's modules loaded, the torch probe
starts the build interpreter. Their answer only changes when those files change, so
:func:`cached_probe` keeps a successful answer on the controller (``~/.cache/sitestack/probes``,
private; :func:`~sitestack.core.paths.derived_cache`) together with a *signature* of the files it depends on, and returns it again only while
the host says the same signature:

- the files the answer names (``vouchers(out)``: the tools' paths, the directories of ``$PATH``,
  the interpreter and its ``sys.path``, ...), plus the system's package databases (an upgrade of
  any package changes them), each as inode, size, mtime and ctime (``stat -L``: a re-pointed
  symlink is another inode);
- the environment the probe ran in (a digest of it, and the CPUs this process may use), so a probe
  inside a Slurm allocation or with another ``$PATH`` is another entry;
- the exact shell line, the host and its user (the cache key).

Locally the signature is read with ``os.stat`` (no process); over SSH with one ``stat`` command,
which replaces the probe's module-system start and interpreter start. Like git's index, an answer
is not kept when a file it depends on changed within the last :data:`RACY` seconds (it may have
changed while the probe ran). ``SITESTACK_PROBE_CACHE=off`` turns the cache off; entries older
than :data:`MAX_AGE` are probed again whatever their signature.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sitestack.core import envvars
from sitestack.core.files import atomic_write
from sitestack.core.hostbase import Completed, Host, shell_line, with_umask
from sitestack.core.paths import derived_cache
from sitestack.core.private import private_dir
from sitestack.onsite.fileio import ReadError, read_json

#: Package databases whose change means some installed program may have changed (Debian, RPM).
PACKAGE_DBS = ("/var/lib/dpkg/status", "/var/lib/rpm/rpmdb.sqlite", "/var/lib/rpm/Packages")
#: An answer is probed again after this long, whatever its signature (seconds).
MAX_AGE = 24 * 3600.0
#: An entry larger than this is no entry (probed again): probes print lines, not megabytes.
MAX_ENTRY_BYTES = 16 << 20
#: A file changed this recently (seconds) may have changed while the probe ran: not kept.
RACY = 2.0


def enabled() -> bool:
    return envvars.switched_on("SITESTACK_PROBE_CACHE")


def cached_probe(host: Host, argv: Sequence[str], vouchers: Callable[[Completed], Sequence[str] | None], *,
                 timeout: float | None = 60) -> Completed:
    """``host.probe(argv)``, or its earlier answer while the files ``vouchers`` named still match.

    ``vouchers(out)`` gets a successful answer and returns the paths it depends on (absolute), or
    None when the answer must not be kept. A failed probe is never kept.
    """
    directory = derived_cache("probes")
    if not (enabled() and host.caches_probes) or directory is None:
        return host.probe(argv, timeout=timeout)
    line = with_umask(shell_line(argv), host.umask)
    key = hashlib.sha256(json.dumps([host.cache_identity(), line]).encode()).hexdigest()
    path = directory / f"{key[:40]}.json"
    entry = _load(path)
    if (entry is not None and time.time() - entry["at"] < MAX_AGE
            and host.file_signature(entry["vouch"]) == entry["signature"]):
        return Completed(int(entry["rc"]), str(entry["stdout"]), str(entry["stderr"]))
    started = time.time()
    out = host.probe(argv, timeout=timeout)
    files = vouchers(out) if out.ok else None
    if files is None or not all(os.path.isabs(f) for f in files):
        return out
    vouch = sorted({*files, *PACKAGE_DBS})
    signature = host.file_signature(vouch)
    if _racy(signature, started):
        return out
    record = {"at": started, "vouch": vouch, "signature": signature, "rc": out.rc, "stdout": out.stdout,
              "stderr": out.stderr}
    try:
        private_dir(path.parent)
        atomic_write(path, json.dumps(record).encode("utf-8"), 0o600)
    except OSError:
        pass  # a cache that cannot be written is no cache: the answer stands
    return out


def _racy(signature: dict[str, Any], started: float) -> bool:
    """Whether a vouched file changed so recently that the probe may have read it half-changed."""
    for item in signature.get("files", []):
        if len(item) == 4 and max(int(item[2]), int(item[3])) >= int(started - RACY):
            return True
    return False


def _load(path: Path) -> dict[str, Any] | None:
    """The cached answer in ``path``; None for one that is missing, too large, not JSON or incomplete (it
    is probed again: a cache entry is never trusted over a probe)."""
    try:
        data = read_json(str(path), MAX_ENTRY_BYTES)
    except ReadError:
        return None
    typed = (isinstance(data.get("rc"), int) and not isinstance(data.get("rc"), bool)
             and isinstance(data.get("stdout"), str) and isinstance(data.get("stderr"), str)
             and isinstance(data.get("signature"), dict) and isinstance(data.get("at"), (int, float))
             and isinstance(data.get("vouch"), list) and all(isinstance(v, str) and os.path.isabs(v) for v in data["vouch"]))
    return data if typed else None


def path_dirs(value: str) -> list[str]:
    """The absolute directories of a ``$PATH``-like value (vouchers: a new tool in one changes its mtime)."""
    return [d for d in dict.fromkeys(value.split(":")) if d.startswith("/")]
