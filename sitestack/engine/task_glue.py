"""Glue between ``tasks.py`` and the library: option parsing helpers and error handling.

Expected failures (:class:`~sitestack.core.errors.SitestackError`) become one line on stderr and
exit code 1; ``--debug`` shows the traceback instead.

Imported by every task module when Invoke loads ``tasks.py``: the library behind these helpers is
imported inside them, so listing tasks or starting one costs only what that task runs.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from invoke.context import Context
from invoke.exceptions import Exit
from invoke.tasks import Task

from sitestack.core import envvars
from sitestack.core.errors import InputError, SitestackError
from sitestack.core.redact import redact
from sitestack.engine.settings import SETTING_ENV, SETTINGS
from sitestack.onsite import visible

if TYPE_CHECKING:
    from sitestack.core.report import HostRun, Reporter
    from sitestack.model.context import RunOptions

__all__ = ["SETTINGS", "SETTING_ENV"]   # the ``sitestack:`` section (sitestack/engine/settings.py)


#: What asks for a task's help after its name (``invoke nccl-log --help``).
HELP_FLAGS = ("--help", "-h")


class SitestackTask(Task[Any]):
    """sitestack's tasks: long options only (``auto_shortflags=False``), except ``-v`` for
    ``--verbose``, as ansible-playbook and spack have it.

    ``TASK --help`` shows the task's help for a task with a positional argument too: Invoke's
    parser gives a positional argument the next word before it looks for core flags, so
    ``invoke nccl-log --help`` would read a log file named ``--help``. Such a call prints the help
    ``invoke --help TASK`` prints and runs nothing (exit 0)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.help_texts: dict[str, str] = dict(self.help)  # Invoke's get_arguments consumes self.help

    def get_arguments(self, ignore_unknown_help: bool | None = None) -> list[Any]:
        self.help = dict(self.help_texts)
        return list(super().get_arguments(ignore_unknown_help))

    def arg_opts(self, name: str, default: str, taken_names: set[str]) -> dict[str, Any]:
        opts: dict[str, Any] = super().arg_opts(name, default, taken_names)
        if name == "verbose" and "v" not in taken_names:
            opts["names"] = [*opts["names"], "v"]
        return opts

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the task, once its options and the SITESTACK_* variables are checked: a bad one is
        one ``error:`` line naming it (exit 1), before anything runs."""
        if any(kwargs.get(name) in HELP_FLAGS for name in self.positional):
            print_task_help(self)
            return None
        try:
            check_given(self, kwargs)
            envvars.check_all()
        except InputError as exc:
            if kwargs.get("debug"):
                import traceback

                traceback.print_exc()
            raise Exit(f"error: {exc}", code=1) from None
        return super().__call__(*args, **kwargs)


def check_given(task: Task[Any], kwargs: dict[str, Any]) -> None:
    """An option given an empty or all-blank value is refused, naming it: it would otherwise mean the
    option's default (``--limit ''``: every host; ``--rocm ''``: the site's ROCm), not what was asked."""
    for name, value in kwargs.items():
        values = value if isinstance(value, list) else [value]
        if name not in task.positional and any(isinstance(v, str) and not v.strip() for v in values) \
                and value != _default(task, name):
            raise InputError(f"--{name.replace('_', '-')}", f"{value!r} is empty: give a value, or leave the option out")


def _default(task: Task[Any], name: str) -> Any:
    import inspect

    parameter = inspect.signature(task.body).parameters.get(name)
    return None if parameter is None else parameter.default


def print_task_help(task: Task[Any]) -> None:
    """Print ``task``'s help as Invoke's ``Program.print_task_help`` does (usage, docstring, options)."""
    import inspect
    import sys

    from invoke.parser.context import ParserContext
    from invoke.program import Program

    binary = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "invoke"
    program = Program(binary="invoke" if binary in ("__main__.py", "-c") else binary)
    name = task.name.replace("_", "-")
    tuples = ParserContext(name=name, args=task.get_arguments()).help_tuples()
    print(f"Usage: {program.binary} [--core-opts] {name} {'[--options] ' if tuples else ''}[other tasks here ...]")
    print("\nDocstring:")
    for line in (inspect.getdoc(task) or "none").splitlines():
        print(program.leading_indent + line if line.strip() else "")
    print("\nOptions:")
    program.print_columns(tuples)


def setting(c: Context, key: str, value: Any = None) -> Any:
    """An option's value: the command line's (``value``), else its SITESTACK_* variable, else
    ``sitestack.<key>`` of Invoke's configuration, else None. A configured value must be a
    one-line string or a number; anything else is an error naming the setting."""
    if value is not None:
        return value
    env = SETTING_ENV.get(key)
    if env and envvars.get(env) is not None:
        return envvars.get(env)
    section = c.config.get("sitestack") or {}
    configured = section.get(key) if hasattr(section, "get") else None
    if configured is None or configured == "":
        return None
    if isinstance(configured, bool) or not isinstance(configured, (str, int)):
        raise InputError(f"sitestack.{key} (invoke configuration)", f"{configured!r} is not a string")
    return str(configured)


def run_options(c: Context, **fields: Any) -> RunOptions:
    """The :class:`RunOptions` of a task: ``fields`` from its options, with the configured defaults
    (account, prefix, sources_dir, mirror, log_dir, forks) where an option was not given.
    ``fail_on_change`` (not a run option) is only checked: it needs ``check``."""
    from sitestack.model.context import RunOptions

    if fields.pop("fail_on_change", False) and not fields.get("check"):
        # it judges a plan; after an applying run there is nothing left that would change
        raise InputError("--fail-on-change", "works with --check only (exit 2 when anything would change): add --check")
    for key in ("prefix", "sources_dir", "mirror"):  # every task: provision's recipe installs use them too
        fields[key] = setting(c, key, fields.get(key))
    fields["account"] = account_option(setting(c, "account", fields.get("account")))
    log_dir = setting(c, "log_dir")
    if log_dir is not None:
        fields.setdefault("log_root", Path(log_dir))
    given = fields.pop("forks", None)
    forks = setting(c, "forks", given)
    if forks is not None:
        fields["forks"] = int_option("--forks" if given is not None else "sitestack.forks", forks, low=1, high=1024)
    given = fields.pop("parallel_steps", None)
    steps = setting(c, "parallel_steps", given)
    if steps is not None:
        fields["parallel_steps"] = int_option("--parallel-steps" if given is not None else "sitestack.parallel_steps",
                                              steps, low=1, high=1024)
    return RunOptions(**fields)


def reporter(diff: bool = False, debug: bool = False, json_target: str | None = None) -> Reporter:
    """The run's reporter; ``--json -`` keeps the human lines off stdout (they still go to the logs)."""
    from sitestack.core.report import Reporter
    from sitestack.engine import results

    results.check_target(json_target)
    return Reporter(show_diff=diff, debug=debug, quiet=json_target == "-")


def finish(command: str, runs: Sequence[HostRun], report: Reporter, *, check: bool, fail_on_change: bool,
           json_target: str | None) -> None:
    """Write the ``--json`` document and exit with the run's code (0 ok, 1 failed, 2 would change)."""
    from sitestack.engine import results
    from sitestack.engine.playbook import exit_code

    code = exit_code(runs, check=check, fail_on_change=fail_on_change)
    results.write(json_target, results.run_document(command, report.site or "", runs, code=code, check=check,
                                                    log_dir=report.log_dir))
    if code:
        raise Exit(code=code)


def split_list(value: str | None, option: str = "") -> tuple[str, ...]:
    """``"a,b, c"`` -> ``("a", "b", "c")``; None (not given) -> ``()``. An empty or blank value (``''``,
    ``'  '``) or an empty item (``",,,"``, ``"a,,b"``) is an error naming ``option``: it would otherwise
    select nothing, or everything (``--limit ''``: every host)."""
    if value is None:
        return ()
    if not value.strip():
        raise InputError(option or "option", f"{value!r} is empty (a comma-separated list of names)")
    items = tuple(v.strip() for v in value.split(","))
    if not all(items):
        raise InputError(option or "option", f"{value!r} has an empty item (a comma-separated list of names)")
    return items


def recipe_source(value: str) -> tuple[str, str]:
    """``--source NAME=PATH`` -> (NAME, PATH); anything else is an error naming the option."""
    name, sep, path = value.partition("=")
    if not sep or not name.strip() or not path.strip():
        raise InputError("--source", f"{value!r} must be NAME=PATH: a recipe name and its source tarball or directory "
                         "(e.g. aws-ofi-rccl=/srv/src/aws-ofi-rccl-17d41cb.tar.gz)")
    return name.strip(), path.strip()


def int_option(option: str, value: object, *, low: int, high: int) -> int:
    """An integer option within [low, high]; ``--jobs abc`` is an error naming the option."""
    text = str(value)
    if not re.fullmatch(r"-?[0-9]+", text):   # int() would take ' 3 ', '1_0' and other scripts' digits
        raise InputError(option, f"{value!r} is not a whole number")
    number = int(text)
    if not low <= number <= high:
        raise InputError(option, f"must be between {low} and {high}, not {number}")
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


def account_option(value: str | None) -> str | None:
    """--account, else $SITESTACK_ACCOUNT; checked as every run option is (:class:`RunOptions`)."""
    from sitestack.model.context import RunOptions

    account = value if value is not None else envvars.get("SITESTACK_ACCOUNT")
    RunOptions(account=account)
    return account


def playbook_path(value: str | None) -> Path | None:
    return Path(value) if value else None


@contextlib.contextmanager
def errors_to_exit(debug: bool = False) -> Iterator[None]:
    """Turn a SitestackError into ``Exit(code=1)`` with its message (no traceback)."""
    try:
        yield
    except SitestackError as exc:
        if debug:
            import traceback

            traceback.print_exc()
        # the message may quote a command's output or a file: shown, never acted on by the terminal,
        # and without a secret
        raise Exit(f"error: {visible.printable(redact(str(exc)))}", code=1) from None
    except KeyboardInterrupt:
        raise Exit("interrupted", code=130) from None

