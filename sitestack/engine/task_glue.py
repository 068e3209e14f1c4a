"""Glue between ``tasks.py`` and the library: option parsing helpers and error handling.

Expected failures (:class:`~sitestack.core.errors.SitestackError`) become one line on stderr and
exit code 1; ``--debug`` shows the traceback instead.

Imported by every task module when Invoke loads ``tasks.py``: the library behind these helpers is
imported inside them, so listing tasks or starting one costs only what that task runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, TypeVar

from invoke.context import Context
from invoke.exceptions import Exit
from invoke.tasks import Task, task

from sitestack.core import envvars
from sitestack.core.errors import InputError, SitestackError
from sitestack.core.quoting import control_problem
from sitestack.core.redact import redact
from sitestack.engine.settings import SETTING_ENV, SETTINGS
from sitestack.model.options import Options, flag_of
from sitestack.onsite import visible

if TYPE_CHECKING:
    from sitestack.core.report import HostRun, Reporter
    from sitestack.model.options import RunOptions, ValidateOptions

OptionsT = TypeVar("OptionsT", bound=Options)

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
    option's default (``--limit ''``: every host; ``--rocm ''``: the site's ROCm), not what was asked.
    So is a control character in any option's text: every value is one line, whatever reads it."""
    for name, value in kwargs.items():
        texts = [v for v in (value if isinstance(value, list) else [value]) if isinstance(v, str)]
        if name in task.positional:
            continue
        if any(not v.strip() for v in texts) and value != _default(task, name):
            raise InputError(f"--{name.replace('_', '-')}", f"{value!r} is empty: give a value, or leave the option out")
        problem = next(filter(None, map(control_problem, texts)), None)
        if problem:
            raise InputError(f"--{name.replace('_', '-')}", problem)


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


Source = type | tuple[type, str]
#: Each task function's options (``module.name`` -> flag -> the field that declares it).
DECLARED: dict[str, dict[str, dataclasses.Field[Any]]] = {}


def option_fields(sources: Sequence[Source]) -> dict[str, dataclasses.Field[Any]]:
    """The options ``sources`` declare, by flag: a class gives each of its fields that has a ``doc``
    (sitestack/model/options.py), ``(class, "name ...")`` those fields only; a later field of a flag
    replaces an earlier one (a task's own help for a shared option)."""
    chosen: dict[str, dataclasses.Field[Any]] = {}
    for source in sources:
        cls, names = source if isinstance(source, tuple) else (source, None)
        found = {f.name: f for f in dataclasses.fields(cls) if f.metadata.get("doc")}
        wanted = names.split() if names is not None else list(found)
        missing = [name for name in wanted if name not in found]
        if missing:
            raise TypeError(f"{cls.__name__} has no option {', '.join(missing)} (a field with a doc)")
        chosen.update((flag_of(found[name]), found[name]) for name in wanted)
    return chosen


def options_task(*sources: Source) -> Callable[[Callable[[Context, Any], None]], Task[Any]]:
    """A task whose options are fields of option classes, each declared once with its help, flag and
    whether it repeats or is positional in its metadata (:func:`option_fields`). Invoke reads the
    options from the signature made here and the help from the fields' docs; the task's function gets
    their values as one namespace by field name (``o.site``, ``o.hosts``), to pass straight on
    (:func:`options_of`)."""
    by_flag = option_fields(sources)

    def make(body: Callable[[Context, Any], None]) -> Task[Any]:
        positional = [flag for flag, f in by_flag.items() if f.metadata.get("positional")]
        params = [inspect.Parameter("c", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        for flag, f in sorted(by_flag.items(), key=lambda item: item[0] not in positional):
            default = f.default if isinstance(f.default, (bool, str)) else None
            params.append(inspect.Parameter(flag, inspect.Parameter.KEYWORD_ONLY, default=inspect.Parameter.empty
                                            if f.metadata.get("required") else default))

        def run(c: Context, **given: Any) -> None:
            body(c, SimpleNamespace(**{by_flag[flag].name: value for flag, value in given.items()}))

        run.__name__, run.__qualname__, run.__doc__ = body.__name__, body.__qualname__, body.__doc__
        run.__module__ = body.__module__
        DECLARED[f"{body.__module__}.{body.__name__}"] = by_flag
        run.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        made: Task[Any] = task(klass=SitestackTask, auto_shortflags=False, positional=positional,
                               iterable=[flag for flag, f in by_flag.items() if f.metadata.get("repeatable")],
                               help={flag.replace("_", "-"): f.metadata["doc"] for flag, f in by_flag.items()})(run)
        return made
    return make


def options_of(cls: type[OptionsT], c: Context, given: Any, **fixed: Any) -> OptionsT:
    """``cls`` (:class:`RunOptions`, ValidateOptions) from a task's options, with the configured
    defaults (:func:`setting`) of those not given; ``fixed``: values the task sets itself."""
    return cls.from_task(vars(given), lambda key: setting(c, key), **fixed)


def run_task(c: Context, o: Any, command: str, run: Callable[[RunOptions, Reporter], Sequence[HostRun]],
             **fixed: Any) -> None:
    """A task that runs steps: its :class:`RunOptions`, ``run(options, reporter)``, then :func:`finish`."""
    from sitestack.model.options import RunOptions

    with errors_to_exit(o.debug):
        options = options_of(RunOptions, c, o, **fixed)
        report = reporter(options.diff, o.debug, o.json)
        finish(command, run(options, report), report, options, o.json)


def emit_data(o: Any, command: str, make: Callable[[], tuple[dict[str, Any], Iterable[str]]]) -> None:
    """A task that prints data: ``--json`` checked, then ``make()``'s document and human lines printed
    as ``--json`` asks (docs/cli.md; a task without ``--json`` prints the lines)."""
    from sitestack.engine import results

    target = getattr(o, "json", None)
    with errors_to_exit(getattr(o, "debug", False)):
        results.check_target(target)
        document, lines = make()
        results.emit(target, command, document, lines)


def job_task(c: Context, o: Any, run: Callable[[Any, ValidateOptions, Reporter], Any],
             document: Callable[[str, Any, str | None], dict[str, Any]]) -> None:
    """A task that runs a job on the site (validate, tune): its :class:`ValidateOptions`, then
    ``run(site, options, reporter)``'s outcome as ``document(site name, outcome, error)`` in ``--json``
    (a failure too: the document says what ended it), and exit with the outcome's code."""
    from sitestack.engine import playbook as pb
    from sitestack.engine import results
    from sitestack.model.options import ValidateOptions

    with errors_to_exit(o.debug):
        loaded = pb.load(o.site, playbook_path(o.playbook))
        options = options_of(ValidateOptions, c, o)
        report = reporter(debug=o.debug, json_target=o.json)
        try:
            outcome = run(loaded, options, report)
        except SitestackError as exc:
            results.write(o.json, document(loaded.name, None, str(exc)))
            raise
        results.write(o.json, document(loaded.name, outcome, None))
    if outcome.code:
        raise Exit(code=outcome.code)


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


def reporter(diff: bool = False, debug: bool = False, json_target: str | None = None) -> Reporter:
    """The run's reporter; ``--json -`` keeps the human lines off stdout (they still go to the logs)."""
    from sitestack.core.report import Reporter
    from sitestack.engine import results

    results.check_target(json_target)
    return Reporter(show_diff=diff, debug=debug, quiet=json_target == "-")


def finish(command: str, runs: Sequence[HostRun], report: Reporter, options: RunOptions,
           json_target: str | None) -> None:
    """Write the ``--json`` document and exit with the run's code (0 ok, 1 failed, 2 would change)."""
    from sitestack.engine import results
    from sitestack.engine.playbook import exit_code

    code = exit_code(runs, check=options.check, fail_on_change=options.fail_on_change)
    results.write(json_target, results.run_document(command, report.site or "", runs, code=code,
                                                    check=options.check, log_dir=report.log_dir))
    if code:
        raise Exit(code=code)


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

