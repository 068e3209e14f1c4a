"""Every option of every task is declared once: its help is the doc in its field's metadata
(sitestack/model/options.py, sitestack/cli/flags.py, the packages' ``package:`` arguments), and the
task's signature and help are made from those fields (sitestack/engine/task_glue.py ``options_task``)."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
from invoke.context import Context

from sitestack.engine.task_glue import DECLARED, option_fields, options_task
from sitestack.model.options import RunOptions, ValidateOptions, option
from tasks import ns

CLI = Path(__file__).resolve().parent.parent / "sitestack" / "cli"
#: Each task's help as declared, read before Invoke parses any task (which consumes it).
HELP = {name: dict(ns[name].help) for name in ns.task_names}


@pytest.mark.parametrize("name", sorted(ns.task_names))
def test_every_option_help_is_its_fields_doc(name):
    task = ns[name]
    fields = DECLARED.get(f"{task.body.__module__}.{task.body.__name__}")
    assert fields is not None, f"{name} is not made by options_task: its options are not declared as fields"
    flags = {arg.names[0] for arg in task.get_arguments()}
    assert flags == {flag.replace("_", "-") for flag in fields}, name
    for flag, f in fields.items():
        assert f.metadata.get("doc"), f"{name} --{flag}: no doc in its field's metadata"
        assert HELP[name][flag.replace("_", "-")] == f.metadata["doc"], (name, flag)


def test_no_help_is_spelled_in_the_cli_package():
    """No ``help=`` argument and no dict literal of help texts in sitestack/cli/: help lives in metadata."""
    found = []
    for path in sorted(CLI.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and any(k.arg == "help" for k in node.keywords):
                found.append(f"{path.name}:{node.lineno}: help=")
            if isinstance(node, ast.Dict) and any(isinstance(v, ast.Constant) and isinstance(v.value, str)
                                                  and len(v.value.split()) > 3 for v in node.values):
                found.append(f"{path.name}:{node.lineno}: a dict of texts")
    assert not found, found


def test_a_field_without_a_doc_is_no_option_and_naming_it_is_refused():
    @dataclasses.dataclass(frozen=True)
    class Undocumented:
        quiet: bool = option(False)
        loud: bool = option(False, "say more")

    assert set(option_fields([Undocumented])) == {"loud"}
    with pytest.raises(TypeError, match="no option quiet"):
        options_task((Undocumented, "quiet loud"))


def test_a_later_field_of_a_flag_gives_a_task_its_own_help():
    @dataclasses.dataclass(frozen=True)
    class Mine:
        hosts: str | None = option(None, "one host, mine", flag="host")

    fields = option_fields([(RunOptions, "hosts check"), Mine])
    assert fields["host"].metadata["doc"] == "one host, mine" and fields["check"].name == "check"

    @options_task((RunOptions, "hosts check"), Mine)
    def probe(c: Context, o: object) -> None:
        """A task made for this test."""
        seen.append(o)

    seen: list[object] = []
    assert probe.help["host"] == "one host, mine" and "host" not in probe.iterable
    probe(Context(), host="h1", check=True)
    assert vars(seen[0]) == {"hosts": "h1", "check": True}
    assert RunOptions.from_task(vars(seen[0])).hosts == ("h1",)


def test_one_validation_path_whoever_builds_the_options():
    """The CLI's path (from_task) and a direct construction refuse the same value with the same message."""
    with pytest.raises(Exception, match="--forks: must be between 1 and 1024, not 0") as direct:
        RunOptions(forks=0)
    with pytest.raises(Exception, match="--forks: must be between 1 and 1024, not 0") as parsed:
        RunOptions.from_task({"forks": "0"})
    assert str(direct.value) == str(parsed.value)
    with pytest.raises(Exception, match="sitestack.forks: 'lots' is not a whole number"):
        RunOptions.from_task({}, {"forks": "lots"}.get)
    with pytest.raises(Exception, match="--fail-on-change: works with --check only"):
        RunOptions(fail_on_change=True)
    with pytest.raises(Exception, match="--scheduler: must be auto, slurm or none"):
        ValidateOptions(scheduler="pbs")
    with pytest.raises(Exception, match="--account: 'a/b' is not an account name"):
        ValidateOptions.from_task({"account": "a/b"})
