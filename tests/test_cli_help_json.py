"""Every task of the namespace answers ``--help`` (after its name and as ``invoke --help TASK``), and
every task that prints data takes ``--json FILE`` / ``--json -`` in one form (docs/cli.md)."""

from __future__ import annotations

import json
import re

import pytest

from tasks import ns
from tests.conftest import REPO, run_invoke

TASKS = sorted(ns.task_names)
#: The tasks that print data, with the arguments that make them print some, and keys their
#: document must have besides schema_version and command.
DATA_TASKS = {
    "sites": ((), {"sites"}),
    "recipes": ((), {"recipes"}),
    "actions": ((), {"actions"}),
    "show-site": (("--site", "local"), {"site", "playbook", "hosts", "facts"}),
    "checksum": (("pyproject.toml",), {"target", "filename", "size", "sha256"}),
    "installed": (("--site", "local", "--prefix", "/nonexistent/sitestack-prefix"), {"site", "host", "prefix", "installs"}),
    "gc": (("--max-size", "1T", "--dry-run"), {"dry_run", "removed", "bytes"}),
    "history": (("--site", "local", "--prefix", "/nonexistent/sitestack-prefix"), {"site", "history_dir", "runs"}),
    "nccl-log": ((str(REPO / "tests" / "data" / "nccl-logs" / "nccl-1357-ibext-sharp.log"),), {"site", "status", "hosts"}),
}


def options_of(name: str) -> list[str]:
    """The task's long options, as Invoke derives them from its signature."""
    return sorted("--" + arg.names[0] for arg in ns[name].get_arguments())


@pytest.mark.parametrize("name", TASKS)
def test_every_task_shows_its_help(name):
    for argv in ((name, "--help"), ("--help", name), (name, "-h")):
        out = run_invoke(*argv)
        assert out.returncode == 0, (argv, out.stdout + out.stderr)
        assert out.stdout.startswith("Usage: ") and f" {name} " in out.stdout.splitlines()[0], (argv, out.stdout)
        assert "Docstring:" in out.stdout and not out.stderr, (argv, out.stderr)
        shown = {o.replace("[no-]", "") for o in re.findall(r"^ +(?:-[a-z], )?(--(?:\[no-\])?[a-z-]+)", out.stdout, re.M)}
        assert shown == set(options_of(name)), (argv, shown)
        assert "[--options]" in out.stdout or not options_of(name)
        text = " ".join(out.stdout.split())   # Invoke wraps long help texts
        missing = [o for o, h in help_texts(name).items() if " ".join(h.split()[:4]) not in text]
        assert not missing, (argv, f"options shown without their help text: {missing}")


#: Each task's option help texts as declared, read before Invoke parses any task (which consumes them).
DECLARED_HELP = {name: dict(ns[name].help) for name in ns.task_names}


def help_texts(name: str) -> dict[str, str]:
    """Each option's help text as the task declares it."""
    return {option: text for option, text in DECLARED_HELP[name].items() if text}


def test_every_task_that_takes_json_is_a_data_task_or_a_run():
    """The --json tasks are the data tasks below and the playbook runs (tests/test_cli_conventions.py),
    and docs/cli.md names each."""
    with_json = {name for name in TASKS if "--json" in options_of(name)}
    assert set(DATA_TASKS) <= with_json
    page = (REPO / "docs" / "cli.md").read_text()
    assert not [name for name in with_json if f"`{name}`" not in page]


@pytest.mark.parametrize("name", sorted(DATA_TASKS))
def test_data_tasks_print_one_document_with_json_dash(name, tmp_path):
    args, keys = DATA_TASKS[name]
    out = run_invoke(name, *args, "--json", "-", env={"SITESTACK_LOG_DIR": str(tmp_path / "logs")})
    assert out.returncode in (0, 1) and "Traceback" not in out.stderr, out.stderr
    doc = json.loads(out.stdout)  # nothing but the document on stdout
    assert doc["schema_version"] == 1 and doc["command"] == name and set(doc) >= keys, doc.keys()
    to_file = run_invoke(name, *args, "--json", str(tmp_path / "out.json"))
    assert json.loads((tmp_path / "out.json").read_text())["command"] == name
    assert to_file.stdout.strip()  # with a FILE, the human lines still go to stdout
    bad = run_invoke(name, *args, "--json", str(tmp_path / "missing" / "out.json"))
    assert bad.returncode == 1 and bad.stderr.startswith("error: --json") and not bad.stdout


def test_data_documents_hold_the_listings():
    sites = json.loads(run_invoke("sites", "--json", "-").stdout)["sites"]
    assert {"name": "local", "description": sites[[s["name"] for s in sites].index("local")]["description"]} in sites
    assert sorted(p.stem for p in (REPO / "playbooks").glob("*.yml")) == sorted(s["name"] for s in sites)
    recipes = {r["name"]: r for r in json.loads(run_invoke("recipes", "--json", "-").stdout)["recipes"]}
    assert recipes["mpi4py"]["build"] == "pip" and recipes["mpi4py"]["default_version"] in recipes["mpi4py"]["versions"]
    actions = {a["name"]: a for a in json.loads(run_invoke("actions", "--json", "-").stdout)["actions"]}
    assert "recipe-install" in actions and any(arg["name"] == "recipe" for arg in actions["recipe-install"]["args"])
    site = json.loads(run_invoke("show-site", "--site", "local", "--json", "-").stdout)
    assert site["site"] == "local" and site["hosts"] == ["localhost"] and "prefix" in site["facts"]


def test_json_to_a_stream_is_refused_and_dash_is_stdout(tmp_path):
    """``--json /dev/stdout`` (a link) and a FIFO are refused before anything runs, the FIFO left a
    FIFO (docs/cli.md, "Files you name"); ``--json -`` is how the document goes to stdout. As root,
    renaming over ``/dev/stdout`` or a device would replace the node itself."""
    import os
    import stat

    out = run_invoke("sites", "--json", "/dev/stdout", timeout=120)
    assert out.returncode == 1 and out.stdout == "", out.stdout
    assert out.stderr.strip() == "error: --json: /dev/stdout is a symbolic link: name a regular file (or - for stdout)"
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    out = run_invoke("sites", "--json", str(fifo), timeout=60)
    assert out.returncode == 1 and "--json" in out.stderr and "FIFO" in out.stderr, out.stderr
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    out = run_invoke("sites", "--json", "-", timeout=120)
    assert out.returncode == 0 and json.loads(out.stdout)["command"] == "sites", out.stderr


def test_benchmark_json_is_checked_before_any_benchmark_runs(tmp_path):
    """``benchmark --json`` takes the one form; a bad target is refused before minutes of timings."""
    out = run_invoke("benchmark", "--name", "provision_noop", "--json", str(tmp_path / "no" / "such.json"), timeout=120)
    assert out.returncode == 1 and "--json" in out.stderr and "== provision_noop" not in out.stdout, out.stdout + out.stderr
