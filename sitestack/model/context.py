"""What a step knows about its run: the typed run options, the site, its facts for one host.

:class:`RunOptions` is the one options object of a run: the CLI builds it (``tasks.py``
through :mod:`sitestack.engine`), the engine passes it down unchanged, and every step reads
its typed fields. Settings that may also come from the environment (the build cache, the
progress interval, the log directory) take their defaults from it here, in one place, so
they are honoured under every task.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sitestack.core import envvars
from sitestack.core.errors import InputError
from sitestack.core.quoting import control_problem
from sitestack.model.site import Facts, Site

#: A recipe's name (the stem of its file in sources/).
RECIPE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def _env_str(name: str) -> str | None:
    value = envvars.get(name)
    return None if value is None else str(value)


def _env_float(name: str, default: float) -> float:
    value = envvars.get(name)
    return default if value is None else float(value)


#: --host: [user@]host[:port], the forms ssh and Fabric accept.
HOST_OPTION = re.compile(r"(?:(?P<user>[A-Za-z0-9._][A-Za-z0-9._-]*)@)?(?P<host>[A-Za-z0-9][A-Za-z0-9._-]*)"
                         r"(?::(?P<port>[0-9]+))?")
#: --account: a project or account name (letters, digits, . _ -), never a path.
ACCOUNT = envvars.ACCOUNT


def check_path_option(option: str, value: str | None) -> None:
    """An absolute, one-line path, or None; an :class:`InputError` naming ``option`` otherwise."""
    if value is not None:
        envvars.check_path(option, value)


def check_prefix(option: str, value: str | None) -> None:
    """An install prefix: a path option that is not a system directory."""
    check_path_option(option, value)
    problem = envvars.taken_dir_problem(value) if value is not None else None
    if problem:
        raise InputError(option, f"{value!r} {problem.replace('a directory of sitestack', 'an install prefix of sitestack')}")


def check_count(option: str, value: float | None, low: float, high: float) -> None:
    """A number within [low, high], or None."""
    if value is not None and not (low <= value <= high):
        raise InputError(option, f"must be between {low:g} and {high:g}, not {value:g}")


def check_host_option(value: str) -> None:
    """``[user@]host[:port]`` with a port in 1..65535."""
    match = HOST_OPTION.fullmatch(value or "")
    if match is None:
        raise InputError("--host", f"{value!r} is not a host ([user@]host[:port]: letters, digits, '.', '_' and '-')")
    if match["port"] is not None and not 1 <= int(match["port"]) <= 65535:
        raise InputError("--host", f"{value!r}: port {match['port']} is not in 1..65535")


def check_tags(option: str, tags: tuple[str, ...]) -> None:
    for tag in tags:
        if not tag or "," in tag or control_problem(tag):
            raise InputError(option, f"{tag!r} is not a tag")


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
    # -- choosing hosts and steps (like ansible-playbook --limit / --forks / --start-at-task / --step) --
    limit: tuple[str, ...] = ()  # among the playbook's hosts: names or shell patterns (fnmatch)
    forks: int = 16  # hosts run in parallel at most
    #: independent steps run at once on a host at most (None: the host's cores; 1: one after the other)
    parallel_steps: int | None = None
    start_at: str | None = None  # skip the steps before this one
    confirm_steps: bool = False  # --step: ask before each step
    verbose: bool = False  # stream commands' output to the console too
    #: where run logs go: <log_root>/<site>/<time>/<host>/ ($SITESTACK_LOG_DIR, else ~/.cache/sitestack/logs)
    log_root: Path | None = field(default_factory=lambda: Path(p) if (p := _env_str("SITESTACK_LOG_DIR")) else None)
    lock_wait: float = 600.0  # seconds to wait for the prefix lock of a provision run
    install_lock_wait: float = 6 * 3600.0  # seconds to wait for one install's lock (builds take long)
    # -- builds ------------------------------------------------------------------------------
    source: str | None = None  # a source tarball to use instead of downloading (--source)
    #: provision --source NAME=PATH: the source of recipe NAME for every step that installs it
    recipe_sources: tuple[tuple[str, str], ...] = ()
    sources_dir: str | None = None  # recipes from this directory instead of sources/
    mirror: str | None = None  # a controller directory of source tarballs
    jobs: int | None = None  # parallel build jobs
    rebuild: tuple[str, ...] = ()  # recipes to build again from source though installed (--rebuild)
    no_cache: bool = False  # build from source instead of using the build cache (--no-cache)
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
    cuda: str | None = None  # the NCCL plugin: the CUDA version
    cuda_home: str | None = None
    nccl: str | None = None  # the NCCL plugin: the NCCL version its API versions are checked against
    plugin_version: str | None = None
    tests: bool = False  # the RCCL plugin: build its tests too
    rccl_home: str | None = None
    libfabric: str | None = None
    hwloc: str | None = None
    mpi_home: str | None = None

    def __post_init__(self) -> None:
        """Refuse bad options before anything runs, naming the option (one message, exit 1)."""
        check_prefix("--prefix", self.prefix)
        check_path_option("SITESTACK_LOG_DIR", str(self.log_root) if self.log_root else None)
        check_path_option("SITESTACK_BUILD_CACHE", self.build_cache)
        if self.account is not None and (not ACCOUNT.fullmatch(self.account) or ".." in self.account):
            raise InputError("--account", f"{self.account!r} is not an account name (letters, digits, "
                             "'.', '_' and '-')")
        for host in self.hosts:
            check_host_option(host)
        check_tags("--tags", self.tags)
        check_tags("--skip-tags", self.skip_tags)
        check_tags("--limit", self.limit)
        check_tags("--rebuild", self.rebuild)
        check_count("--forks", self.forks, 1, 1024)
        check_count("--parallel-steps", self.parallel_steps, 1, 1024)
        if self.start_at is not None:
            check_tags("--start-at", (self.start_at,))
        check_count("--jobs", self.jobs, 1, 4096)
        check_count("lock wait", self.lock_wait, 0, 7 * 24 * 3600)
        for option, value in (("--python", self.python), ("--source", self.source), ("--mirror", self.mirror),
                              ("--sources-dir", self.sources_dir), ("--rocm", self.rocm),
                              ("--rocm-home", self.rocm_home), ("--rccl-home", self.rccl_home),
                              ("--cuda", self.cuda), ("--cuda-home", self.cuda_home), ("--nccl", self.nccl),
                              ("--libfabric", self.libfabric), ("--mpi-home", self.mpi_home),
                              ("--version", self.plugin_version), ("--gpu-operations", self.gpu_operations)):
            problem = control_problem(value) if value is not None else None
            if problem:
                raise InputError(option, problem)
        for name, path in self.recipe_sources:
            problem = control_problem(name) or control_problem(path)
            if problem or not RECIPE_NAME.fullmatch(name):
                raise InputError("--source", problem or f"{name!r} is not a recipe name (NAME=PATH, e.g. "
                                 "aws-ofi-rccl=/path/aws-ofi-rccl-17d41cb.tar.gz)")


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

    def for_stack(self, key: str | None) -> RunContext:
        """The context of a step of the playbook's stack ``key`` (a step's ``stack:``): that stack's facts
        resolved for the same host, prefix and options; this one for the playbook's own (None)."""
        if key == self.site.stack:
            return self
        memo: dict[str | None, RunContext] = self.__dict__.setdefault("_stacks", {})
        if key not in memo:
            account = self.values.get("account")
            memo[key] = RunContext.resolve(self.site.for_stack(key), home=self.values["home"], user=self.values["user"],
                                           account=None if account in (None, "{account}") else account,
                                           prefix=self.values["prefix"], check=self.check, log_dir=self.log_dir,
                                           options=self.options, actions=self.actions)
        return memo[key]

    def for_step(self, spec: Any) -> RunContext:
        """The context a playbook step runs with (its ``stack:``, else the playbook's facts)."""
        return self.for_stack(getattr(spec, "stack", None))

    def note(self, text: str) -> None:
        """A progress line: to the run's reporter (and its log), else stdout."""
        if self.options.progress is not None:
            self.options.progress(text)
        else:
            print(text, flush=True)
