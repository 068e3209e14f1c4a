"""The controller reads the site's history through the shipped program (``history.py list --json``):
what it reads is what the program lists for the same directory, and a program that prints something
else (not JSON, more than the cap, the wrong types, a failure) is one message naming it, never a
traceback. The output of a program on a host is read bounded (:func:`sitestack.core.bounded.output_bounded`)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sitestack.core.bounded import STDERR_MAX, output_bounded
from sitestack.core.errors import SitestackError
from sitestack.core.host import local_host
from sitestack.engine import site_history
from sitestack.onsite import history, history_store
from tests.conftest import run_invoke
from tests.onsite_dir import install_programs


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """history.py as a job directory holds it (its launcher and ``onsite/``), nothing of sitestack on the path."""
    return install_programs(tmp_path_factory.mktemp("job"), ("history.py",)) / "history.py"


def record(n: int, **extra: Any) -> dict[str, Any]:
    result = {"site": "local", "job_id": str(n), "started": 1764000000.0 + 60 * n, "verdict": "passed",
              "bandwidth": {"rows": [{"bytes": 4194304, "busbw_gbs": 1.0 + n}]},
              "toolchain": {"modules": [f"mpich/4.0.{n}"]}}
    return {**history.record_from_result(result, "validation", f"/r/{n}"), **extra}


def mixed_history(tmp_path: Path) -> Path:
    """A history of every kind of entry: good, torn and foreign index lines, runs only in runs/, a run
    file too large, one of another run, a FIFO, a symbolic link and a FIFO for the index."""
    directory = tmp_path / "history"
    runs = directory / "runs"
    runs.mkdir(parents=True)
    for n in (1, 2):
        history.append(str(directory), record(n))
    with open(directory / "index.jsonl", "a") as index:
        index.write('{"torn": \n[1]\n' + json.dumps(record(3, cause="a\x1b]0;x\x07b")) + "\n")
    (runs / f"{record(4)['id']}.json").write_text(json.dumps(record(4)))          # the index lacks it
    (runs / f"{record(5)['id']}.json").write_text(" " * (history.RECORD_MAX + 1))  # too large
    (runs / f"{record(6)['id']}.json").write_text(json.dumps(record(7)))          # another run's record
    os.mkfifo(runs / f"{record(8)['id']}.json")
    (tmp_path / "elsewhere.json").write_text(json.dumps(record(9)))
    (runs / f"{record(9)['id']}.json").symlink_to(tmp_path / "elsewhere.json")
    return directory


def listed(program: Path, directory: Path) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-E", "-s", "-S", str(program), "list", "--json", "--dir", str(directory)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    document: dict[str, Any] = json.loads(out.stdout)
    return document


def test_the_controller_reads_what_the_program_lists(tmp_path: Path, program: Path) -> None:
    directory = mixed_history(tmp_path)
    document = listed(program, directory)
    assert document["schema"] == history.LISTING and document["history_dir"] == str(directory)
    assert [r["job_id"] for r in document["runs"]] == ["1", "2", "3", "4"]
    runs = str(directory / "runs")
    assert document["warnings"] == [
        f"history: skipped: {runs}/{record(8)['id']}.json is not a regular file",
        f"history: skipped: {runs}/{record(9)['id']}.json is a symbolic link, not a regular file",
        f"history: 6 index lines or run files in {directory} skipped (torn, not history records, or not regular "
        "files)"]
    assert site_history.read_on(local_host(), str(program), str(directory)) == (document["runs"], document["warnings"])
    # the shipped reader in this process agrees too: one implementation
    assert history.scan(str(directory)) == (document["runs"], 6)
    os.unlink(directory / "index.jsonl")
    os.mkfifo(directory / "index.jsonl")
    records, warnings = site_history.read_on(local_host(), str(program), str(directory))
    assert (records, warnings) == (listed(program, directory)["runs"], listed(program, directory)["warnings"])
    assert [r["job_id"] for r in records] == ["1", "2", "4"]
    assert warnings[0] == f"history: skipped: {directory}/index.jsonl is not a regular file"


def test_only_the_newest_runs_the_index_lacks_are_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    for n in range(6):
        (runs / f"{record(n)['id']}.json").write_text(json.dumps(record(n)))
    monkeypatch.setattr(history_store, "RUNS_MAX", 4)
    assert [r["job_id"] for r in history.read(str(tmp_path))] == ["2", "3", "4", "5"]
    assert history.rebuild(str(tmp_path)) == 6   # the index rebuilt from every run


def test_a_missing_program_reads_nothing_or_says_to_install_the_job(tmp_path: Path) -> None:
    missing = str(tmp_path / "validation" / "history.py")
    assert site_history.read_on(local_host(), missing, str(tmp_path / "history")) == ([], [])
    (tmp_path / "history").mkdir()
    with pytest.raises(SitestackError, match=r"history\.py is missing: install the validation job"):
        site_history.read_on(local_host(), missing, str(tmp_path / "history"))


#: Programs that print something else than a listing, and what the message says of each.
HOSTILE = {
    "not JSON": ("print('runs: 3')", "not JSON"),
    "a list": ("print('[]')", "not a listing of schema sitestack-history-list/1"),
    "runs an object": ("print(json.dumps({'schema': LISTING, 'runs': {}, 'warnings': []}))", "`runs` a list of records"),
    "a warning a number": ("print(json.dumps({'schema': LISTING, 'runs': [], 'warnings': [7]}))", "`warnings` a list"),
    "a run no record": ("print(json.dumps({'schema': LISTING, 'runs': [{'id': 1}], 'warnings': []}))",
                        r"runs\[0\]: not a history record"),
    "nested deeply": ("print('[' * 40000 + ']' * 40000)", "not JSON"),
    "endless": ("import sys\nwhile True: sys.stdout.write('x' * 65536)", "printed more than 100000 bytes"),
    "a failure": ("import sys\nsys.stderr.write('x' * 100000 + '\\nboom \\x1b]0;t\\x07\\n'); sys.exit(1)",
                  r"history\.py list: boom \\x1b\]0;t\\x07$"),
}


def hostile_program(directory: Path, body: str) -> Path:
    path = directory / "history.py"
    directory.mkdir(parents=True, exist_ok=True)
    path.write_text(f"import json\nLISTING = {history.LISTING!r}\n{body}\n")
    return path


@pytest.mark.parametrize("name", HOSTILE)
def test_a_program_printing_anything_else_is_one_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         name: str) -> None:
    body, said = HOSTILE[name]
    monkeypatch.setattr(site_history, "LIST_MAX", 100000)
    program = hostile_program(tmp_path / "validation", body)
    with pytest.raises(SitestackError) as caught:
        site_history.read_on(local_host(), str(program), str(tmp_path / "history"))
    message = str(caught.value)
    assert message.startswith(f"[localhost] {program} list: ") and len(message) < 1000 and message.isprintable()
    assert re.search(said, message), message


def test_invoke_history_with_a_hostile_program_exits_1_with_one_line(tmp_path: Path) -> None:
    prefix = tmp_path / "prefix"
    (prefix / "history").mkdir(parents=True)
    for body in (HOSTILE["not JSON"][0], HOSTILE["a run no record"][0]):
        hostile_program(prefix / "validation", body)
        out = run_invoke("history", "--site", "local", "--prefix", str(prefix), "--json", "-", timeout=300)
        assert out.returncode == 1 and "Traceback" not in out.stderr and out.stdout == "", out.stderr
        assert len(out.stderr.strip().splitlines()) == 1 and f"{prefix}/validation/history.py list: " in out.stderr


def test_output_bounded_cuts_both_streams_and_keeps_the_status() -> None:
    host = local_host()
    out = output_bounded(host, [sys.executable, "-c", "import sys; print('a' * 9); sys.stderr.write('e' * 9000 + "
                                "'\\nlast'); sys.exit(3)"], 10)
    assert (out.rc, out.stdout) == (3, "a" * 9 + "\n")
    assert out.stderr.endswith("e\nlast") and len(out.stderr) <= STDERR_MAX
    # more than the cap: one byte more comes back (the program may die of the closed pipe: its status is no answer)
    assert output_bounded(host, ["sh", "-c", "yes a"], 10).stdout == "a\n" * 5 + "a"
    unterminated = output_bounded(host, ["sh", "-c", "printf 'x\\nexit 0' >&2; exit 4"], 100)
    assert (unterminated.rc, unterminated.stderr) == (4, "x\nexit 0")
    printed = output_bounded(host, ["sh", "-c", "echo out; echo 'exit 0' >&2; exit 4"], 100)
    assert (printed.rc, printed.stdout, printed.stderr) == (4, "out\n", "exit 0")


def test_invoke_history_over_ssh_shows_the_programs_listing(tmp_path: Path, program: Path) -> None:
    from tests import sshd

    if not sshd.available():
        pytest.skip("needs root and openssh-server")
    prefix = tmp_path / "prefix"
    install_programs(prefix / "validation", ("history.py",))
    directory = mixed_history(prefix)
    expected = listed(program, directory)
    server = sshd.start_sshd(tmp_path / "srv", "login1")
    try:
        env = {"SITESTACK_SSH_CONFIG": str(tmp_path / "ssh_config")}
        out = run_invoke("history", "--site", "local", "--host", "login1", "--prefix", str(prefix), "--json", "-",
                         env=env, timeout=300)
        assert out.returncode == 0, out.stderr
        assert [{k: v for k, v in r.items() if k != "changes"} for r in json.loads(out.stdout)["runs"]] == expected["runs"]
        assert out.stderr.splitlines() == [f"warning: {w}" for w in expected["warnings"]]
        hostile_program(prefix / "validation", HOSTILE["not JSON"][0])
        out = run_invoke("history", "--site", "local", "--host", "login1", "--prefix", str(prefix), env=env, timeout=300)
        assert out.returncode == 1 and "Traceback" not in out.stderr
        assert out.stderr.strip().splitlines() == [f"error: [login1] {prefix}/validation/history.py list: not JSON "
                                                   "(Expecting value: line 1 column 1 (char 0)); install the validation "
                                                   "job again (`invoke install-validation-job`)"]
    finally:
        server.stop()
