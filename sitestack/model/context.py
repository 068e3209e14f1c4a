"""What a step knows about its run: the typed run options, the site, its facts for one host.

:class:`RunOptions` is the one options object of a run: the CLI builds it (``tasks.py``
through :mod:`sitestack.engine`), the engine passes it down unchanged, and every step reads
its typed fields. Settings that may also come from the environment (the build cache, the
progress interval, the log directory) take their defaults from it here, in one place, so
they are honoured under every task.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sitestack.model.site import Facts, Site


def _env_str(name: str) -> str | None:
    return os.environ.get(name) or None


def _env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    try:
        return float(value) if value else default
    except ValueError:
        return default


@dataclass(frozen=True)
class RunOptions:
    """How to run a playbook, or one step of it (the options of ``invoke provision`` and the build tasks)."""

    check: bool = False
    diff: bool = False
    tags: tuple[str, ...] = ()
    skip_tags: tuple[str, ...] = ()
    hosts: tuple[str, ...] = ()
    prefix: str | None = None
    account: str | None = None
    accept_new_host_keys: bool = False
    #: where run logs go: <log_root>/<site>/<time>/<host>/ ($SITESTACK_LOG_DIR, else ~/.cache/sitestack/logs)
    log_root: Path | None = field(default_factory=lambda: Path(p) if (p := _env_str("SITESTACK_LOG_DIR")) else None)
    lock_wait: float = 600.0  # seconds to wait for the prefix lock of a provision run
    install_lock_wait: float = 6 * 3600.0  # seconds to wait for one install's lock (builds take long)
    # -- builds ------------------------------------------------------------------------------
    source: str | None = None  # a source tarball to use instead of downloading (--source)
    sources_dir: str | None = None  # recipes from this directory instead of sources/
    mirror: str | None = None  # a controller directory of source tarballs
    jobs: int | None = None  # parallel build jobs
    #: the build cache on each host ($SITESTACK_BUILD_CACHE, else ~/.cache/sitestack/builds there)
    build_cache: str | None = field(default_factory=lambda: _env_str("SITESTACK_BUILD_CACHE"))
    #: seconds between progress lines of a long build ($SITESTACK_PROGRESS_INTERVAL, default 30)
    progress_interval: float = field(default_factory=lambda: _env_float("SITESTACK_PROGRESS_INTERVAL", 30.0))
    #: where progress lines go (the engine points it at the reporter, and so at provision.log)
    progress: Callable[[str], None] | None = None
    # -- package choices given on the command line -------------------------------------------
    python: str | None = None  # the interpreter that builds / runs the checks
    gpu_operations: str | None = None  # Horovod: NCCL, MPI or none
    rocm: str | None = None  # the RCCL plugin: the ROCm version
    rocm_home: str | None = None
    plugin_version: str | None = None
    tests: bool = False  # the RCCL plugin: build its tests too
    rccl_home: str | None = None
    libfabric: str | None = None
    hwloc: str | None = None
    mpi_home: str | None = None


@dataclass(frozen=True)
class RunContext:
    """What a step knows about the run: the site, its facts resolved for this host, options."""

    site: Site
    facts: Facts
    resolved: Mapping[str, Any]  # the facts as plain data, placeholders filled
    values: Mapping[str, str]  # placeholder values for this host
    check: bool = False
    log_dir: Path | None = None
    options: RunOptions = field(default_factory=RunOptions)
    actions: Mapping[str, Any] = field(default_factory=dict)  # the action table (sitestack.actions.ACTIONS)

    @classmethod
    def resolve(cls, site: Site, *, home: str, user: str, account: str | None, prefix: str | None,
                **fields: Any) -> RunContext:
        """The context of ``site`` on a host with this ``home`` and ``user`` (facts resolved by
        :meth:`Site.resolve`); ``fields`` are the other fields (check, log_dir, options, actions)."""
        resolved = site.resolve(home=home, user=user, account=account, prefix=prefix)
        return cls(site=site, facts=resolved.facts, resolved=resolved.data, values=resolved.values, **fields)

    def note(self, text: str) -> None:
        """A progress line: to the run's reporter (and its log), else stdout."""
        if self.options.progress is not None:
            self.options.progress(text)
        else:
            print(text, flush=True)
