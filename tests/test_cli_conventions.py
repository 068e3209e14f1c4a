"""The operator conventions of the CLI (Ansible's and Spack's), through the real `invoke`: choosing
hosts and steps, --json, verbosity and the log directory, the `sitestack:` configuration, what is
installed (installed / uninstall / gc), rebuild controls, output polish (shell completion:
tests/test_cli_completion.py; --help and --json of every task: tests/test_cli_help_json.py).

Fast: playbook runs use `--tags layout` of the local site into a scratch prefix; the install
tests build the small autotools project of tests/recipe_projects.py (seconds)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO, run_invoke
from tests.recipe_projects import hello_recipe, make_hello

LAYOUT_STEPS = ("prefix-layout", "site-facts")


def provision(tmp_path: Path, *extra: str, env: dict[str, str] | None = None,
              stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    argv = ["provision", "--site", "local", "--tags", "layout", "--prefix", str(tmp_path / "prefix"), *extra]
    full = {**os.environ, "SITESTACK_LOG_DIR": str(tmp_path / "logs"), **(env or {})}
    if stdin is None:
        return run_invoke(*argv, env=full, timeout=300)
    import sys
    return subprocess.run([sys.executable, "-m", "invoke", *argv], cwd=REPO, env=full, text=True,
                          capture_output=True, timeout=300, input=stdin)


def statuses(out: str) -> dict[str, str]:
    return {m[1]: m[0] for m in re.findall(r"^\[localhost\] (\w+) +([^\s:]+)", out, re.M)}


def bad(out: subprocess.CompletedProcess[str], option: str) -> str:
    """One clean message naming the option, exit 1, no traceback."""
    assert out.returncode == 1, out.stdout + out.stderr
    assert "Traceback" not in out.stderr + out.stdout
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {option}"), out.stderr
    return lines[0]


# -- 1. choosing steps and hosts -------------------------------------------------------------------

def test_list_steps_and_tags_run_nothing(tmp_path):
    out = provision(tmp_path, "--list-steps", "--start-at", "site-facts")
    assert out.returncode == 0, out.stderr
    rows = out.stdout.splitlines()
    assert rows[0].split() == ["step", "action", "tags", "this", "run"]
    table = {r.split()[0]: r.split() for r in rows[1:]}
    assert table["prefix-layout"][1:3] == ["directory", "layout"] and "before --start-at" in rows[4]
    assert table["site-facts"][-1] == "run" and table["mpi4py"][-2:] == ["skip", "(tags)"]
    assert [r.split()[0] for r in rows[1:]][:3] == ["system-packages", "site-tools", "site-modules"]  # playbook order
    tags = run_invoke("provision", "--site", "local", "--list-tags")
    assert tags.returncode == 0 and "layout      prefix-layout, site-facts" in tags.stdout
    assert not (tmp_path / "prefix").exists() and not (tmp_path / "logs").exists()


def test_start_at_skips_the_steps_before(tmp_path):
    out = provision(tmp_path, "--start-at", "site-facts")
    assert out.returncode == 0, out.stderr
    assert statuses(out.stdout)["prefix-layout"] == "skipped" and "before --start-at site-facts" in out.stdout
    assert statuses(out.stdout)["site-facts"] == "changed"


def test_step_reads_answers_and_never_hangs_without_them(tmp_path):
    out = provision(tmp_path, "--step", stdin="n\ny\n")
    assert out.returncode == 0, out.stderr
    assert statuses(out.stdout)["prefix-layout"] == "skipped" and statuses(out.stdout)["site-facts"] == "changed"
    assert "Perform step prefix-layout on localhost? (N)o/(y)es/(c)ontinue" in out.stderr
    out = provision(tmp_path, "--step", stdin="c\n")  # continue: no more questions
    assert out.stderr.count("Perform step") == 1 and statuses(out.stdout)["prefix-layout"] == "changed"
    message = bad(provision(tmp_path / "none", "--step", stdin=""), "--step")
    assert "no answers on stdin" in message and not (tmp_path / "none").exists()


def test_step_asks_on_a_terminal(tmp_path):
    import pty
    import sys
    controller, terminal = pty.openpty()  # a real terminal on stdin, as a user at a shell has
    argv = [sys.executable, "-m", "invoke", "provision", "--site", "local", "--tags", "layout", "--prefix",
            str(tmp_path / "prefix"), "--step"]
    proc = subprocess.Popen(argv, cwd=REPO, stdin=terminal, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "SITESTACK_LOG_DIR": str(tmp_path / "logs")})
    os.close(terminal)
    os.write(controller, b"maybe\ny\nn\n")  # a wrong answer is asked again
    out, err = proc.communicate(timeout=120)
    os.close(controller)
    assert proc.returncode == 0, out + err
    assert "--step: answer y, n or c, not 'maybe'" in err and err.count("Perform step") == 3
    assert statuses(out)["prefix-layout"] == "changed" and statuses(out)["site-facts"] == "skipped"


def test_limit_selects_among_the_playbooks_hosts_and_a_typo_connects_nowhere(tmp_path):
    assert statuses(provision(tmp_path, "--limit", "local*").stdout)["site-facts"] == "changed"
    message = bad(provision(tmp_path / "typo", "--limit", "locahost"), "--limit")
    assert "(localhost)" in message and "--host" in message and not (tmp_path / "typo").exists()


@pytest.mark.parametrize(("option", "value"), [("--forks", "0"), ("--forks", "many"), ("--limit", "a,,b"),
                                               ("--start-at", "no-such-step"), ("--rebuild", "nope"),
                                               ("--json", "/no/such/dir/out.json")])
def test_bad_values_of_the_new_options(tmp_path, option, value):
    bad(provision(tmp_path, option, value), option)
    assert not (tmp_path / "prefix").exists()


@pytest.mark.parametrize("task", [("provision", "--site", "local", "--tags", "layout"), ("install-venv", "--site", "local"),
                                  ("build-mpi4py", "--site", "local")])
def test_fail_on_change_without_check_is_refused_before_anything_runs(tmp_path, task):
    """It judges a plan (exit 2 when anything would change): an applying run has none left."""
    out = run_invoke(*task, "--prefix", str(tmp_path / "prefix"), "--fail-on-change",
                     env={"SITESTACK_LOG_DIR": str(tmp_path / "logs")}, timeout=300)
    assert "works with --check only" in bad(out, "--fail-on-change")
    assert not (tmp_path / "prefix").exists() and not (tmp_path / "logs").exists()


# -- 2. machine-readable results -------------------------------------------------------------------

def check_document(doc: dict, command: str) -> None:
    """The schema of docs/cli.md."""
    assert doc["schema_version"] == 1 and doc["command"] == command
    assert set(doc) >= {"site", "check", "log_dir", "hosts", "recap", "exit_code"}
    for host in doc["hosts"]:
        assert set(host) >= {"host", "status", "error", "elapsed", "counts", "steps"}
        assert host["status"] in ("ok", "changed", "failed") and isinstance(host["elapsed"], float)
        for step in host["steps"]:
            assert set(step) == {"step", "handler", "status", "message", "elapsed", "diff", "probed"}
            assert step["status"] in ("ok", "changed", "failed", "skipped")
            assert isinstance(step["diff"], bool) and isinstance(step["probed"], bool)
        assert doc["recap"][host["host"]] == host["counts"]


def test_json_to_a_file_and_to_stdout(tmp_path):
    out = provision(tmp_path, "--json", str(tmp_path / "run.json"))
    assert out.returncode == 0 and "RECAP" in out.stdout
    doc = json.loads((tmp_path / "run.json").read_text())
    check_document(doc, "provision")
    steps = {s["step"]: s for s in doc["hosts"][0]["steps"]}
    assert steps["site-facts"]["status"] == "changed" and steps["mpi4py"]["status"] == "skipped"
    assert doc["exit_code"] == 0 and doc["log_dir"].startswith(str(tmp_path / "logs"))
    out = provision(tmp_path, "--json", "-", "--check", "--fail-on-change")
    doc = json.loads(out.stdout)  # nothing but the document on stdout
    check_document(doc, "provision")
    assert out.returncode == 0 and doc["exit_code"] == 0 and doc["check"] is True
    assert doc["hosts"][0]["counts"]["ok"] == 2


@pytest.mark.parametrize("task", [("validate", "--site", "local"), ("build-mpi4py", "--site", "local", "--check"),
                                  ("install-venv", "--site", "local", "--check"), ("installed", "--site", "local")])
def test_json_target_is_checked_before_anything_runs(tmp_path, task):
    bad(run_invoke(*task, "--json", str(tmp_path / "missing" / "out.json")), "--json")


def test_validate_json_says_why_there_is_no_verdict(tmp_path):
    out = run_invoke("validate", "--site", "local", "--prefix", str(tmp_path / "empty"), "--scheduler", "none",
                     "--json", str(tmp_path / "v.json"))
    doc = json.loads((tmp_path / "v.json").read_text())
    assert out.returncode == 1 and doc["exit_code"] == 1 and doc["schema_version"] == 1
    assert doc["command"] == "validate" and doc["verdict"] is None and "not installed" in doc["error"]


# -- 3. verbosity and the log directory --------------------------------------------------------------

def test_log_directory_is_printed_at_the_start_and_in_the_recap(tmp_path):
    out = provision(tmp_path)
    logs = re.findall(r"^logs: (.*)$", out.stdout, re.M)
    assert len(logs) == 2 and logs[0] == logs[1] and Path(logs[0], "localhost", "provision.log").is_file()


def test_verbose_streams_command_output(tmp_path):
    from sitestack.core.host import local_host
    host, seen = local_host(), []
    host.echo = seen.append
    host.run(["sh", "-c", "echo one; echo two; printf three"], log=tmp_path / "x.log")
    assert seen == ["one", "two", "three"] and (tmp_path / "x.log").read_text().endswith("one\ntwo\nthree\n")
    seen.clear()
    host.run(["sh", "-c", "echo out; echo err >&2"])  # both streams, no log file: still echoed
    assert sorted(seen) == ["err", "out"]


# -- 4. the sitestack: configuration -------------------------------------------------------------------

def test_configuration_file_and_invoke_environment_give_defaults(tmp_path):
    config = tmp_path / "sitestack.yaml"
    config.write_text(f"sitestack:\n  prefix: {tmp_path / 'from-config'}\n  forks: 2\n")
    out = run_invoke("-f", str(config), "provision", "--site", "local", "--tags", "layout",
                     env={"SITESTACK_LOG_DIR": str(tmp_path / "logs")})
    assert out.returncode == 0 and (tmp_path / "from-config" / "share" / "sitestack" / "site.json").is_file()
    out = run_invoke("-f", str(config), "provision", "--site", "local", "--tags", "layout", "--prefix",
                     str(tmp_path / "cli"), env={"SITESTACK_LOG_DIR": str(tmp_path / "logs")})
    assert out.returncode == 0 and (tmp_path / "cli").is_dir()  # the command line wins
    env = {"INVOKE_SITESTACK_LOG_DIR": str(tmp_path / "envlogs"), "SITESTACK_LOG_DIR": ""}
    out = run_invoke("provision", "--site", "local", "--tags", "layout", "--prefix", str(tmp_path / "e"), env=env)
    assert out.returncode == 0 and (tmp_path / "envlogs" / "local").is_dir()
    config.write_text("sitestack:\n  forks: lots\n")
    out = run_invoke("-f", str(config), "provision", "--site", "local", "--tags", "layout")
    bad(out, f"{config}: sitestack.forks")   # the file the value came from, and the key


# -- 5/6. what is installed; rebuild controls -----------------------------------------------------------

@pytest.mark.integration
def test_installed_rebuild_no_cache_uninstall_gc(tmp_path):
    sources = tmp_path / "sources"
    sources.mkdir()
    (sources / "hello.yml").write_text(hello_recipe({"1.0": make_hello(tmp_path, "1.0")}))
    prefix = tmp_path / "prefix"
    env = {"SITESTACK_BUILD_CACHE": str(tmp_path / "cache"), "SITESTACK_SOURCE_CACHE": str(tmp_path / "src"),
           "SITESTACK_LOG_DIR": str(tmp_path / "logs")}

    def build(*extra: str) -> subprocess.CompletedProcess[str]:
        out = run_invoke("build-recipe", "hello", "--site", "local", "--sources-dir", str(sources), "--prefix",
                         str(prefix), *extra, env=env, timeout=600)
        assert out.returncode == 0, out.stdout + out.stderr
        return out

    def stamp() -> dict:
        return json.loads((prefix / "hello" / "1.0" / ".sitestack" / "install.json").read_text())

    build()
    first = stamp()["installed"]["at"]
    assert statuses(build().stdout)["hello@1.0"] == "ok"
    out = build("--rebuild", "-v")  # built again from source, not from the cache; its output on the console
    assert statuses(out.stdout)["hello@1.0"] == "changed" and stamp()["artefact"]["from_cache"] is False
    assert "[localhost] | " in out.stdout
    subprocess.run(["rm", "-rf", str(prefix / "hello")], check=True)
    build("--no-cache")
    assert stamp()["artefact"]["from_cache"] is False and first

    listing = run_invoke("installed", "--site", "local", "--prefix", str(prefix), "--json", "-", env=env)
    doc = json.loads(listing.stdout)
    assert [(i["name"], i["version"]) for i in doc["installs"]] == [("hello", "1.0")]
    assert doc["installs"][0]["source"].startswith("sha256:") and doc["installs"][0]["installed_at"]
    human = run_invoke("installed", "--site", "local", "--prefix", str(prefix), env=env).stdout
    assert "1 recipe install(s)" in human and re.search(r"^  hello +1\.0 ", human, re.M)

    bad(run_invoke("uninstall", "nothere", "--site", "local", "--prefix", str(prefix), env=env), "NAME")
    out = run_invoke("uninstall", "hello@1.0", "--site", "local", "--prefix", str(prefix), env=env)
    assert out.returncode == 0 and not (prefix / "hello" / "1.0").exists()
    assert not [p for p in (prefix / "hello").iterdir() if ".tree-" in p.name]

    bad(run_invoke("gc", "--max-size", "lots"), "--max-size")
    dry = run_invoke("gc", "--max-size", "0", "--dry-run", env=env)
    assert dry.returncode == 0 and "would remove" in dry.stdout and any((tmp_path / "cache" / "hello").iterdir())
    out = run_invoke("gc", "--max-size", "0", env=env)
    assert out.returncode == 0 and not any((tmp_path / "cache" / "hello").iterdir())


# -- 7. output polish ---------------------------------------------------------------------------------

def test_an_unprobed_step_is_not_counted_as_changed():
    import io

    from sitestack.core.report import HostRun, Reporter
    from sitestack.core.step import Result
    run = HostRun("h", [Result("a", "changed", probed=False), Result("b", "changed"), Result("c", "ok")])
    assert run.counts() == {"ok": 1, "changed": 1, "failed": 0, "skipped": 0, "unprobed": 1}
    stream = io.StringIO()
    Reporter(stream).recap([run])
    assert stream.getvalue().splitlines()[-1].split()[:6] == ["h", "1", "1", "0", "0", "1"]


def test_actions_help_is_whole_sentences_with_one_default():
    out = run_invoke("actions").stdout
    for line in out.splitlines():
        assert line.count("(default") <= 1, line
    assert "(default" in out


def test_recipes_columns_do_not_collide():
    rows = [r for r in run_invoke("recipes").stdout.splitlines() if r.strip()]
    assert rows
    for row in rows:
        assert re.match(r"^\S+ +\S+ +", row) and "  " in row, row
