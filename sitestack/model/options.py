"""The options of a run, each declared once: its help, command-line flag, parsing and check live in
its field's metadata.

:class:`Options` is the base of the run's option objects (:class:`RunOptions` here;
:class:`~sitestack.engine.validate.ValidateOptions`). A task builds one from its keyword arguments
with :meth:`Options.from_task`; whoever builds one, it is checked by one path,
:meth:`Options.__post_init__`. A field whose metadata has a ``doc`` is a command-line option:
``invoke --help TASK`` shows that doc (:func:`sitestack.engine.task_glue.options_task` makes a task's
options from such fields). The metadata keys:

- ``doc``: the help text; ``flag``: the option's name where it is not the field's (``hosts``: ``--host``);
- ``repeatable``: the option may be given more than once (a list);
- ``parse``: ``(shown, raw) -> value`` for the text the command line gives (``shown``: the option as an
  error names it); ``setting``: the key of ``sitestack:`` configuration that gives the value when the
  option is not given (sitestack/engine/settings.py);
- ``check``: ``(shown, value) -> None``, raising :class:`InputError` naming the option;
- ``shown``: how an error names a field that is no flag (``SITESTACK_LOG_DIR``).

A control character in any text the command line gives is refused before the task runs
(:class:`~sitestack.engine.task_glue.SitestackTask`); the fields' checks are what is left.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Mapping
from dataclasses import Field, dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from sitestack.core import envvars
from sitestack.core.errors import InputError
from sitestack.core.quoting import control_problem

#: A recipe's name (the stem of its file in sources/).
RECIPE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
#: --host: [user@]host[:port], the forms ssh and Fabric accept.
HOST_OPTION = re.compile(r"(?:(?P<user>[A-Za-z0-9._][A-Za-z0-9._-]*)@)?(?P<host>[A-Za-z0-9][A-Za-z0-9._-]*)"
                         r"(?::(?P<port>[0-9]+))?")
#: --account: a project or account name (letters, digits, . _ -), never a path.
ACCOUNT = envvars.ACCOUNT
Checker = Callable[[str, Any], None]
OptionsT = TypeVar("OptionsT", bound="Options")


def option(default: Any = None, doc: str | None = None, *, factory: Callable[[], Any] | None = None, **meta: Any) -> Any:
    """A field of an options class: ``doc`` makes it a command-line option; ``meta``: the module's keys."""
    metadata = {"doc": doc, **meta} if doc else meta
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def flag_of(f: Field[Any]) -> str:
    """The option's name as the task's keyword argument (``--`` and dashes on the command line)."""
    return str(f.metadata.get("flag", f.name))


def shown(f: Field[Any]) -> str:
    """How an error names the field: ``--flag``, or its ``shown``."""
    return str(f.metadata.get("shown") or "--" + flag_of(f).replace("_", "-"))


# -- checks and parsers (the ``check`` and ``parse`` of fields) ------------------------------------

def check_path_option(option: str, value: str | None) -> None:
    """An absolute, one-line path, or None; an :class:`InputError` naming ``option`` otherwise."""
    if value is not None:
        envvars.check_path(option, str(value))


def check_prefix(option: str, value: str | None) -> None:
    """An install prefix: a path option that is not a system directory."""
    check_path_option(option, value)
    problem = envvars.taken_dir_problem(value) if value is not None else None
    if problem:
        raise InputError(option, f"{value!r} {problem.replace('a directory of sitestack', 'an install prefix of sitestack')}")


def normal_prefix(path: str) -> str:
    """``path`` spelled one way: no ``//``, ``/./``, ``..`` or trailing ``/`` (``posixpath.normpath``, and one
    leading ``/`` where POSIX lets it keep two). Links are left: where they lead is the host's to say, and
    whatever compares a prefix with what a host reports resolves both there (``readlink -f``)."""
    normal = posixpath.normpath(path) if path else path
    return "/" + normal.lstrip("/") if normal.startswith("//") else normal


def check_account(option: str, value: str | None) -> None:
    if value is not None and (not ACCOUNT.fullmatch(value) or ".." in value):
        raise InputError(option, f"{value!r} is not an account name (letters, digits, '.', '_' and '-')")


def check_count(option: str, value: float | None, low: float, high: float) -> None:
    """A number within [low, high], or None."""
    if value is not None and not (low <= value <= high):
        raise InputError(option, f"must be between {low:g} and {high:g}, not {value:g}")


def within(low: float, high: float) -> Checker:
    """The ``check`` of a number option within [low, high]."""
    return lambda option, value: check_count(option, value, low, high)


def check_host_option(value: str, option: str = "--host") -> None:
    """``[user@]host[:port]`` with a port in 1..65535."""
    match = HOST_OPTION.fullmatch(value or "")
    if match is None:
        raise InputError(option, f"{value!r} is not a host ([user@]host[:port]: letters, digits, '.', '_' and '-')")
    if match["port"] is not None and not 1 <= int(match["port"]) <= 65535:
        raise InputError(option, f"{value!r}: port {match['port']} is not in 1..65535")


def check_hosts(option: str, value: Any) -> None:
    for host in value if isinstance(value, tuple) else () if value is None else (value,):
        check_host_option(host, option)


def check_tags(option: str, tags: Any) -> None:
    for tag in tags if isinstance(tags, tuple) else () if tags is None else (tags,):
        if not tag or "," in tag or control_problem(tag):
            raise InputError(option, f"{tag!r} is not a tag")


def check_recipe_sources(option: str, pairs: tuple[tuple[str, str], ...]) -> None:
    for name, path in pairs:
        problem = control_problem(name) or control_problem(path)
        if problem or not RECIPE_NAME.fullmatch(name):
            raise InputError(option, problem or f"{name!r} is not a recipe name (NAME=PATH, e.g. "
                             "aws-ofi-rccl=/path/aws-ofi-rccl-17d41cb.tar.gz)")


def whole(option: str, value: object) -> int:
    """A whole number; ``--jobs abc`` is an error naming the option (its range is the field's ``check``)."""
    text = str(value)
    if not re.fullmatch(r"-?[0-9]+", text):   # int() would take ' 3 ', '1_0' and other scripts' digits
        raise InputError(option, f"{value!r} is not a whole number")
    return int(text)


def int_option(option: str, value: object, *, low: int, high: int) -> int:
    """A whole number within [low, high], for an option that is no field of an options class."""
    number = whole(option, value)
    check_count(option, number, low, high)
    return number


def size_option(option: str, value: str) -> int:
    """``500M``, ``20G``, ``1T`` or a number of bytes (powers of 1024, as du -h counts)."""
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    text = value.strip().upper().removesuffix("B").removesuffix("I")
    number, unit = (text[:-1], text[-1]) if text and text[-1] in units else (text, "")
    # plain ASCII decimals only: float() also takes "nan", "1e3", "1_0" and other scripts' digits
    if not envvars.DECIMAL.fullmatch(number):
        raise InputError(option, f"{value!r} is not a size (e.g. 500M, 20G, or bytes)")
    size = float(number)
    if not 0 <= size < 1 << 60:
        raise InputError(option, f"{value!r} is not a size (e.g. 500M, 20G, or bytes)")
    return int(size * units[unit])




def split_list(option: str, value: str) -> tuple[str, ...]:
    """``"a,b, c"`` -> ``("a", "b", "c")``. An empty or blank value (``''``, ``'  '``) or an empty item
    (``",,,"``, ``"a,,b"``) is an error naming ``option``: it would otherwise select nothing, or
    everything (``--limit ''``: every host)."""
    if not value.strip():
        raise InputError(option or "option", f"{value!r} is empty (a comma-separated list of names)")
    items = tuple(v.strip() for v in value.split(","))
    if not all(items):
        raise InputError(option or "option", f"{value!r} has an empty item (a comma-separated list of names)")
    return items


def recipe_source(option: str, value: str) -> tuple[str, str]:
    """``--source NAME=PATH`` -> (NAME, PATH); anything else is an error naming the option."""
    name, sep, path = value.partition("=")
    if not sep or not name.strip() or not path.strip():
        raise InputError(option, f"{value!r} must be NAME=PATH: a recipe name and its source tarball or directory "
                         "(e.g. aws-ofi-rccl=/srv/src/aws-ofi-rccl-17d41cb.tar.gz)")
    return name.strip(), path.strip()


def as_tuple(option: str, value: Any) -> tuple[str, ...]:
    """A repeatable option's list (or a one-value option's text) as a tuple."""
    return tuple(value) if isinstance(value, list) else (value,)


# -- the base ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Options:
    """What every run's options have: where the site's install is, whose account, how to connect."""

    prefix: str | None = option(None, "install prefix (overrides the site's facts.prefix)", check=check_prefix,
                                setting="prefix")
    account: str | None = option(None, "project/account for {account} in the site facts (default: $SITESTACK_ACCOUNT)",
                                 check=check_account, setting="account")
    accept_new_host_keys: bool = option(False, "accept SSH host keys not yet in known_hosts (default: refuse)")
    python: str | None = option(None, "the Python that runs the checks (default: facts.python.executable; the job's "
                                "$SITESTACK_PYTHON overrides)")

    def __post_init__(self) -> None:
        """Refuse bad options before anything runs, naming the option (one message, exit 1)."""
        for f in fields(self):
            check: Checker | None = f.metadata.get("check")
            if check is not None:
                check(shown(f), getattr(self, f.name))
        problem = self.problem()
        if problem is not None:
            raise InputError(*problem)

    def problem(self) -> tuple[str, str] | None:
        """A rule between fields, as (the option it names, why); None: none is broken."""
        return None

    @classmethod
    def from_task(cls: type[OptionsT], given: Mapping[str, Any], configured: Callable[[str], Any] = lambda key: None,
                  **fixed: Any) -> OptionsT:
        """The options of a task: ``given`` by field name (a task's keyword arguments; None: not given),
        each parsed by its field's ``parse``; a field not given takes its configured value
        (``configured(setting)``: the command line's, else the SITESTACK_* variable's, else Invoke's
        configuration) where it has a ``setting``; ``fixed``: values the task sets itself."""
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name in fixed or not f.init:
                continue
            raw, name = given.get(f.name), shown(f)
            if raw is None and f.metadata.get("setting"):
                raw, name = configured(f.metadata["setting"]), f"sitestack.{f.metadata['setting']}"
            if raw is None:
                continue
            parse = f.metadata.get("parse")
            values[f.name] = parse(name, raw) if parse else raw
        return cls(**values, **fixed)


def _env_str(name: str) -> str | None:
    value = envvars.get(name)
    return None if value is None else str(value)


def _env_float(name: str, default: float) -> float:
    value = envvars.get(name)
    return default if value is None else float(value)


def _path(option: str, value: Any) -> Path:
    return Path(value)


@dataclass(frozen=True)
class RunOptions(Options):
    """How to run a playbook, or one step of it (the options of ``invoke provision`` and the build tasks).

    Choosing hosts and steps is ansible-playbook's ``--limit`` / ``--forks`` / ``--start-at-task`` /
    ``--step``; a package's own choices (the RCCL plugin's ROCm, Horovod's GPU operations) are its
    step's ``package:`` arguments, not run options."""

    check: bool = option(False, "change nothing; report what would change and why")
    diff: bool = option(False, "show diffs (files, plans, module files) where a step has them")
    fail_on_change: bool = option(False, "with --check: exit 2 when anything would change")
    hosts: tuple[str, ...] = option((), "run on this host (repeatable; an ssh-config alias or host name); default: "
                                    "the playbook's hosts", flag="host", repeatable=True, parse=as_tuple,
                                    check=check_hosts)
    tags: tuple[str, ...] = option((), "run only steps with one of these tags (comma-separated; step names work too)",
                                   parse=split_list, check=check_tags)
    skip_tags: tuple[str, ...] = option((), "skip steps with one of these tags (comma-separated)", parse=split_list,
                                        check=check_tags)
    limit: tuple[str, ...] = option((), "only the playbook's hosts matching these names or patterns (comma-separated, "
                                    "e.g. 'login*')", parse=split_list, check=check_tags)
    forks: int = option(16, "run at most N hosts at once (default: sitestack.forks, else 16)", parse=whole,
                        check=within(1, 1024), setting="forks")
    parallel_steps: int | None = option(None, (
        "run at most N independent steps (e.g. source builds) at once on a host, applying (default: "
        "sitestack.parallel_steps, else the host's usable cores; 1: one after the other)"), parse=whole,
        check=within(1, 1024), setting="parallel_steps")
    start_at: str | None = option(None, "skip the steps before this one (a step name, as the step listing shows it)",
                                  check=check_tags)
    confirm_steps: bool = option(False, "ask before each step: (N)o/(y)es/(c)ontinue (answers from the terminal, or "
                                 "y/n/c lines on stdin, at most 64 KiB; another answer is refused)", flag="step")
    verbose: bool = option(False, "stream the output of build commands to the console too (it always goes to the log)")
    log_root: Path | None = option(doc=None, factory=lambda: Path(p) if (p := _env_str("SITESTACK_LOG_DIR")) else None,
                                   setting="log_dir", parse=_path, shown="SITESTACK_LOG_DIR", check=check_path_option)
    lock_wait: float = option(600.0, check=within(0, 7 * 24 * 3600), shown="lock wait")  # the prefix lock of a run
    install_lock_wait: float = 6 * 3600.0  # seconds to wait for one install's lock (builds take long)
    # -- builds ------------------------------------------------------------------------------
    source: str | None = option(None, "use this source tarball instead of downloading (its sha256 must match the "
                                "recipe)")
    recipe_sources: tuple[tuple[str, str], ...] = option((), (
        "NAME=PATH: the source tarball (or directory) of recipe NAME for its steps, instead of downloading "
        "(repeatable; the sha256 must match the recipe, where it has one)"), flag="source", repeatable=True,
        parse=lambda option, value: tuple(recipe_source(option, v) for v in value), check=check_recipe_sources)
    sources_dir: str | None = option(None, "read recipes from this directory (patches from patches/ beside it) "
                                     "instead of sources/", setting="sources_dir")
    mirror: str | None = option(None, "a directory of source tarballs to use before downloading (air-gapped sites)",
                                setting="mirror")
    jobs: int | None = option(None, "parallel build jobs (default: facts.build_jobs, else the host's cores)",
                              parse=whole, check=within(1, 4096))
    rebuild: tuple[str, ...] = option((), "build these recipes again from source though installed (comma-separated "
                                      "recipe names)", parse=split_list, check=check_tags)
    no_cache: bool = option(False, "build from source instead of using the build cache (the new build replaces the "
                            "cached one)")
    promote: bool = option(True, "after the steps, validate each stack that awaits its module directory's default, "
                           "and each new generation of a default stack, and make it the default on PASS "
                           "(--no-promote: leave it hidden or pending; docs/operating.md)")
    force_promote: bool = option(False, "make the stack the default (or switch in its pending generation) without "
                                 "a passing validation run of that generation (recorded in its generation record and the promotion log)",
                                 flag="force")
    #: the build cache on each host ($SITESTACK_BUILD_CACHE, else ~/.cache/sitestack/builds there)
    build_cache: str | None = option(factory=lambda: _env_str("SITESTACK_BUILD_CACHE"), shown="SITESTACK_BUILD_CACHE",
                                     check=check_path_option)
    #: seconds between progress lines of a long build ($SITESTACK_PROGRESS_INTERVAL, default 30)
    progress_interval: float = field(default_factory=lambda: _env_float("SITESTACK_PROGRESS_INTERVAL", 30.0))
    #: where progress lines go (the engine points it at the reporter, and so at provision.log)
    progress: Callable[[str], None] | None = None

    def problem(self) -> tuple[str, str] | None:
        if self.fail_on_change and not self.check:   # it judges a plan; an applying run leaves none
            return "--fail-on-change", "works with --check only (exit 2 when anything would change): add --check"
        return None


# -- validation jobs ------------------------------------------------------------------------------

def _results_dir(option: str, value: str | None) -> None:
    if value is not None and not (value.startswith("/") or value == "~" or value.startswith("~/")):
        raise InputError(option, f"{value!r} must be an absolute path (or start with ~/)")


def _scheduler(option: str, value: str) -> None:
    if value not in ("auto", "slurm", "none"):
        raise InputError(option, f"must be auto, slurm or none, not {value!r}")


def _job_id(option: str, value: str | None) -> None:
    if value is not None and not value.isdigit():
        raise InputError(option, f"{value!r} is not a Slurm job id")


def _host(option: str, value: str | None) -> None:
    if value is not None:
        check_host_option(value, option)


def _seconds(option: str, value: object) -> float:
    return float(whole(option, value))


#: --stack: a key of the playbook's ``stacks:`` (docs/playbooks.md "Several stacks").
STACK_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def _stack_key(option: str, value: str | None) -> None:
    if value is not None and not STACK_KEY.fullmatch(value):
        raise InputError(option, f"{value!r} is not a stack's name (a key of the playbook's stacks:, e.g. rocm7)")


@dataclass(frozen=True)
class ValidateOptions(Options):
    """The options of ``invoke validate`` (and of ``tune`` and ``history``, which take some of them)."""

    nodes: int = option(0, "nodes to run on (default: 1)", parse=whole, check=within(0, 100000))
    ranks_per_node: int = option(0, "ranks per node (default: the site's validation.ranks_per_node)", parse=whole,
                                 check=within(0, 1024))
    launcher: str | None = option(None, "which installed batch script: srun, mpiexec, torchrun or horovodrun "
                                  "(default: the site's first)")
    scheduler: str = option("auto", "auto (Slurm when it answers on the host), slurm, or none (torchrun, mpiexec or "
                            "horovodrun on the host, one node)", check=_scheduler)
    wait: bool = option(True, "wait for the job and print its verdict (--no-wait: submit and return)")
    collect: str | None = option(None, "read the verdict of this earlier Slurm job id instead of submitting",
                                 check=_job_id)
    results: str | None = option(None, "directory for the job's log and results (default: "
                                 "~/sitestack-validation/<site>)", check=_results_dir)
    timeout: float = option(3600.0, "seconds to wait for the job (default: 3600)", parse=_seconds,
                            check=within(1, 7 * 24 * 3600))
    poll: float = 2.0
    host: str | None = option(None, "run on this host over SSH (a playbook host, an ssh-config alias or a host "
                              "name); default: here", check=_host)
    calibrate: bool = option(False, "measure the site's compute and bandwidth references with this run (judged rank "
                             "against rank only) and keep them with its history when it passes (docs/validation.md)")
    if_changed: bool = option(False, "run only when the host's fingerprint (kernel, driver, libfabric, network stack, "
                              "Slurm, modules, glibc) differs from the last passing run of this stack generation "
                              "(for cron or a systemd timer; docs/validation.md)")
    stack: str | None = option(None, "run the job of this stack of the playbook's stacks: (its install-validation-job "
                               "step's; default: the playbook's own stack)", check=_stack_key)
    all_stacks: bool = option(False, "run the job of every stack in turn, the playbook's own first; one verdict line "
                              "per stack, exit 1 when any failed")

    def problem(self) -> tuple[str, str] | None:
        if self.all_stacks and self.stack is not None:
            return "--all-stacks", "runs every stack's job: drop --stack, or drop --all-stacks to run that one"
        if self.all_stacks and self.collect is not None:
            return "--all-stacks", "submits one job per stack; --collect reads one job: use it with --stack"
        if self.all_stacks and self.calibrate:
            return "--all-stacks", "a calibration is the site's, measured with one stack: use --calibrate with --stack"
        return None
