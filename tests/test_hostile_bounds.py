"""Hostile input, linear time and bounded memory: NCCL log lines built to make a regular expression
backtrack, logs larger than memory, endless or binary ``--step`` answers, lock owner files that are
FIFOs, devices or huge, a leftover ``lock.d.break``; and terminal escape sequences in what is printed.

Each case runs in a subprocess with a timeout well under a minute (a hang fails, it does not stall
the suite) and, for the large inputs, a 512 MiB address-space limit (memory that grew with the input
fails). Nothing here asserts a speed: only that the run ends, within bounds, with the right outcome.
"""

from __future__ import annotations

import io
import json
import os
import re
import resource
import shutil
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sitestack.core.errors import SitestackError
from sitestack.core.report import Reporter
from sitestack.engine.task_glue import errors_to_exit
from tests.conftest import REPO
from tests.onsite_dir import install_programs
from tests.test_hostile import Case, assert_refused_cleanly, git_status
from tests.test_result_schema import built

PLAIN_PYTHON = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
#: Well under the minute a hang is counted at: a quadratic pattern on these inputs takes minutes.
TIMEOUT = 20
MEMORY = 512 << 20


@pytest.fixture(scope="module")
def repo_before() -> str:
    return git_status()


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The NCCL log reader as the validation job installs it (jobs.PROGRAMS), in a directory of its
    own: nccl_log.py and the on-site package it runs from."""
    return install_programs(tmp_path_factory.mktemp("job"), ("nccl_log.py",))


def nccl_log(job: Path, *args: str, memory: bool = False) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PLAIN_PYTHON, "-E", "-s", str(job / "nccl_log.py"), *args], capture_output=True, text=True,
                          timeout=TIMEOUT, cwd="/", preexec_fn=_limit_memory if memory else None)


N = 200_000
HEAD = "node-a:11:12 [0] NCCL INFO "
#: Lines that made a pattern of the reader backtrack (each long run is of the characters a pattern
#: repeats, where a match is tried from each of them, or split between two quantifiers).
PATHOLOGICAL = {
    "gt": ">" * N,                                              # _HEAD: a host run after '>'
    "host-chars": "a" * N,
    "colons": "a:1:" * (N // 4),
    "heads": "a:1:1 [0] " * (N // 10),                         # many heads, no NCCL
    "head-spaces": "a:1:1 [0]" + " " * N + "x",
    "func": "a:1:1 [0] " + "f" * N + ":1 NCCX",
    "version": "NCCL version" + " " * N + "x",                 # _VERSION: two \s* around an optional ':'
    "network": HEAD + "Using network a" + " " * N + "b",      # _NETWORK: lazy name before \s*$
    "loaded": HEAD + "NET/Plugin: Loaded net plugin a" + " " * N + "b",
    "env": HEAD + "NCCL_NET set by environment to a" + " " * N + "b",
    "ofi": HEAD + "NET/OFI " * (N // 8),                        # _INIT_FAILED: .* from each NET/OFI
    "plugin-load": HEAD + "Plugin load (libnccl-net" * (N // 24),
    "plugin-so": HEAD + "NET/Plugin:libnccl-net" * (N // 22),
    "bare": "[0]" + " " * N + "NCCX",
    "bare-words": "a:1 " * (N // 4) + "NCCL",
    "channel": "Channel 0 : 0 -> " + "1" * N + "x",             # _STRIPPED: \d+\S*
    "comm-digits": HEAD + "comm 0x1 rank 1 nRanks " + "1" * N,  # int() of a huge number
    "escapes": "\x1b]" * (N // 2),
}


@pytest.mark.parametrize("name", sorted(PATHOLOGICAL))
def test_pathological_lines_are_read_in_linear_time_by_the_shipped_reader(job: Path, tmp_path: Path, name: str):
    log = tmp_path / "nccl.log"
    log.write_text(PATHOLOGICAL[name] + "\n" + PATHOLOGICAL[name][:N // 20] + "\n")
    out = nccl_log(job, str(log))
    assert out.returncode in (0, 1), out.stderr
    assert "Traceback" not in out.stderr and re.search(r"^(PASS|WARN|FAIL): ", out.stdout, re.M), out.stdout + out.stderr
    assert "1 line longer than 16 KiB read only to that length" in out.stdout or len(PATHOLOGICAL[name]) <= 16 * 1024


def test_the_jobs_check_and_invoke_nccl_log_read_a_200k_line_of_gt(tmp_path: Path):
    """The same line through the validation job's net-plugin check (its own import of the reader)
    and through ``invoke nccl-log`` (the controller's), each long past a minute before."""
    log = tmp_path / "nccl" / "0.log"
    log.parent.mkdir()
    log.write_text(">" * N + "\n" + "x" * 20_000 + ">" * 20_000 + "\n")
    check = textwrap.dedent(f"""
        from sitestack.onsite.ddpcheck import netplugin
        from sitestack.onsite import nccl_log
        status, summary, _ = netplugin.judge_net_plugin(nccl_log.read_files([{str(log)!r}]), hosts=2, plugin=None,
                                                        provider=None)
        print(status, summary)
        """)
    out = subprocess.run([sys.executable, "-c", check], cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT)
    assert out.returncode == 0 and out.stdout.startswith("failed no NCCL_DEBUG=INFO lines found"), out.stdout + out.stderr
    assert "2 lines longer than 16 KiB" in out.stdout
    cli = subprocess.run([sys.executable, "-m", "invoke", "nccl-log", str(log)], cwd=REPO, capture_output=True, text=True,
                         timeout=40, env={**os.environ, "HOME": str(tmp_path)})
    assert cli.returncode == 0 and "WARN: no NCCL_DEBUG=INFO lines found" in cli.stdout, cli.stdout + cli.stderr


def test_the_bounds_are_documented_as_they_are():
    from sitestack.onsite.nccl_lines import LINE_MAX, MESSAGES_MAX

    text = " ".join((REPO / "docs" / "validation.md").read_text().split())
    assert f"each line up to {LINE_MAX // 1024} KiB" in text and f"at most {MESSAGES_MAX:,} NCCL".replace(",", " ") in text


def test_a_file_larger_than_the_memory_limit_without_a_newline_is_read_in_bounded_memory(job: Path, tmp_path: Path):
    """A log with no line end, half again as large as the address space the reader may use: read to
    its end, its one line cut. (Larger adds nothing but time: a sparse file's holes still cost the
    kernel a page each, some 3 s per GiB on a loaded 2-core node.)"""
    sparse = tmp_path / "huge.log"
    with open(sparse, "wb") as handle:
        handle.truncate(MEMORY + MEMORY // 2)  # NULs, no newline, no disk
    out = nccl_log(job, str(sparse), memory=True)
    assert out.returncode == 0, out.stderr
    assert "1 line longer than 16 KiB read only to that length" in out.stdout and "\x00" not in out.stdout


def test_more_messages_than_the_bound_are_read_in_bounded_memory(job: Path, tmp_path: Path):
    """A log of more NCCL messages than MESSAGES_MAX: the first are judged, the rest not read, and
    the verdict says so; under 512 MiB of address space."""
    line = "node-{:02d}:{}:{} [0] NCCL INFO Channel 00/0 : {}[0] -> {}[0] [send] via NET/IB/0\n"
    with open(tmp_path / "many.log", "w") as handle:
        handle.writelines(line.format(i % 16, 100 + i % 128, 200 + i % 128, i % 128, (i + 1) % 128) for i in range(260_000))
    out = nccl_log(job, str(tmp_path / "many.log"), memory=True)
    assert out.returncode == 0, out.stderr
    assert "only the first 250000 were read" in out.stdout and "PASS: 16 hosts used IB" in out.stdout


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "directory"])
def test_a_log_that_is_not_a_regular_file_is_refused_without_waiting(job: Path, tmp_path: Path, kind: str):
    path = tmp_path / "nccl.log"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path = Path("/dev/zero")
    else:
        path.mkdir()
    out = nccl_log(job, str(path))
    assert out.returncode == 2 and out.stderr == f"error: {path}: not a regular file\n", out.stderr


# -- escape sequences ------------------------------------------------------------------------------------

ESCAPES = ["\x1b]0;owned title\x07", "\x1b]8;;https://evil.example/\x1b\\click\x1b]8;;\x1b\\", "\x1bPq#0;2;0;0;0\x1b\\",
           "\x1b[2J\x1b[H", "\x1b[?1049h", "\x9b31m", "\x9d0;c1 title\x9c", "\x07", "back\x08\x08\x08", "\x1bc"]
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def escape_log(tmp_path: Path) -> Path:
    log = tmp_path / "escapes.log"
    lines = [f"node-{i}{e}:1{i}:2 [0] NCCL INFO NET/OFI Selected Provider is cxi{e}" for i, e in enumerate(ESCAPES)]
    lines += [f"node-a:1:2 [0] NCCL WARN NET/OFI Couldn't open AV {e} \r overwritten" for e in ESCAPES]
    log.write_text("\n".join(lines) + "\n")
    return log


def test_escape_sequences_in_a_log_never_reach_the_terminal(job: Path, tmp_path: Path):
    log = escape_log(tmp_path)
    out = nccl_log(job, str(log), "--expect-transport", "ofi", "--expect-provider", "cxi")
    assert out.returncode == 1 and "wrong provider on node-5\\x9b31m: cxi\\x9b31m" in out.stdout, out.stdout + out.stderr
    assert not RAW.search(out.stdout + out.stderr), repr(out.stdout)  # shown as escapes, never sent
    cli = subprocess.run([sys.executable, "-m", "invoke", "nccl-log", str(log), "--nodes", "multi"], cwd=REPO,
                         capture_output=True, text=True, timeout=40, env={**os.environ, "HOME": str(tmp_path)})
    assert cli.returncode == 0 and "node-5\\x9b31m" in cli.stdout, cli.stdout + cli.stderr
    assert not RAW.search(cli.stdout + cli.stderr), repr(cli.stdout)


def test_the_reporter_and_the_error_line_show_escapes_instead_of_sending_them():
    stream = io.StringIO()
    reporter = Reporter(stream=stream)
    reporter.host_error("h1", "command failed:\n" + "".join(ESCAPES))
    reporter.output("h1", "".join(ESCAPES))
    assert not RAW.search(stream.getvalue()) and "\\x1b]0;owned title\\x07" in stream.getvalue()
    with pytest.raises(BaseException) as raised, errors_to_exit():
        raise SitestackError("tail:\n" + "".join(ESCAPES))
    assert not RAW.search(str(raised.value)) and "\\x9b31m" in str(raised.value)


# -- --step answers ---------------------------------------------------------------------------------------

def step_run(tmp_path: Path, stdin: object) -> tuple[subprocess.CompletedProcess[str], dict[str, Path]]:
    """``provision --site local --tags layout --step`` into a scratch prefix, its answers on ``stdin``."""
    paths = {n: tmp_path / n for n in ("home", "cwd", "prefix")}
    paths["home"].mkdir()
    paths["cwd"].mkdir()
    paths["mark"] = tmp_path / "no-marker"
    env = {k: v for k, v in os.environ.items() if k not in ("SITESTACK_LOG_DIR", "SITESTACK_ACCOUNT")}
    argv = [sys.executable, "-m", "invoke", "--search-root", str(REPO), "provision", "--site", "local", "--tags", "layout",
            "--prefix", str(paths["prefix"]), "--step"]
    kwargs: dict[str, object] = {"input": stdin} if isinstance(stdin, str) else {"stdin": stdin}
    result = subprocess.run(argv, cwd=paths["cwd"], env={**env, "HOME": str(paths["home"])}, text=True,
                            capture_output=True, timeout=50, **kwargs)  # type: ignore[call-overload]
    return result, paths


@pytest.mark.parametrize(("answers", "expect"), [
    ("maybe\n", "answer 1 on stdin is 'maybe'"),
    ("y\nperhaps\n", "answer 2 on stdin is 'perhaps'"),
    ("", "no answers on stdin"),
    ("y" * 5000 + "\n", "answer 1 on stdin is longer than 1024 bytes"),
])
def test_a_wrong_or_missing_step_answer_is_refused_before_anything_runs(tmp_path: Path, answers: str, expect: str,
                                                                        repo_before: str):
    result, paths = step_run(tmp_path, answers)
    assert_refused_cleanly(Case("step", "--step", expect=expect), result, paths, repo_before)


def test_step_answers_from_dev_zero_are_refused_in_bounded_memory(tmp_path: Path, repo_before: str):
    with open("/dev/zero", "rb") as zero:
        result, paths = step_run(tmp_path, zero)
    assert_refused_cleanly(Case("step", "--step", expect="no whole answer line in the first 64 KiB"), result, paths,
                           repo_before)


def test_step_answers_from_yes_run_every_step_and_end(tmp_path: Path):
    yes = subprocess.Popen(["yes"], stdout=subprocess.PIPE)
    try:
        result, paths = step_run(tmp_path, yes.stdout)
    finally:
        yes.kill()
        yes.wait()
    assert result.returncode == 0, result.stderr
    assert re.search(r"^\[localhost\] changed +prefix-layout", result.stdout, re.M), result.stdout
    assert re.search(r"^\[localhost\] changed +site-facts", result.stdout, re.M) and paths["prefix"].is_dir()


# -- the lock's owner files --------------------------------------------------------------------------------

LOCK_SCRIPT = """
import sys, time
from sitestack.core.errors import LockHeld
from sitestack.core.host import Host, LocalHost
import invoke
host = LocalHost() if sys.argv[2] == "local" else Host("sshlike", invoke.Context())
start = time.monotonic()
try:
    with host.lock(sys.argv[1], wait=float(sys.argv[3])):
        print("taken", round(time.monotonic() - start, 1))
except LockHeld as exc:
    print("held:", exc)
"""


def dead_owner() -> str:
    """The owner line of a process of this machine that is gone."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    return f"pid {gone.pid} on {socket.gethostname()} (process start 1, locked at 2026-01-01T00:00:00Z)\n"


def take(path: Path, how: str, wait: float = 0) -> str:
    out = subprocess.run([sys.executable, "-c", LOCK_SCRIPT, str(path), how, str(wait)], cwd=REPO, capture_output=True,
                         text=True, timeout=TIMEOUT)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    return out.stdout.strip()


@pytest.mark.parametrize("how", ["local", "shell"])
@pytest.mark.parametrize(("kind", "why"), [("fifo", "is not a regular file"), ("dev-zero", "is a symlink"),
                                           ("huge", "is larger than 4096 bytes"), ("directory", "is not a regular file")])
def test_an_owner_file_sitestack_did_not_write_refuses_the_lock_at_once(tmp_path: Path, how: str, kind: str, why: str):
    owner = tmp_path / "lock" / "lock.d" / "owner"
    owner.parent.mkdir(parents=True)
    if kind == "fifo":
        os.mkfifo(owner)
    elif kind == "dev-zero":
        owner.symlink_to("/dev/zero")
    elif kind == "huge":
        owner.write_text(dead_owner() + "x" * (1 << 20))
    else:
        owner.mkdir()
    said = take(tmp_path / "lock", how, wait=30)  # refused at once, not after the wait
    assert said == (f"held: [{'localhost' if how == 'local' else 'sshlike'}] {tmp_path / 'lock'} is locked, but its owner "
                    f"file {owner} {why}: sitestack did not write it; remove {owner.parent} if no run holds the lock"), said
    assert owner.parent.is_dir()  # never taken over


@pytest.mark.parametrize("how", ["local", "shell"])
@pytest.mark.parametrize("leftover", ["dead-maker", "old-without-owner"])
def test_a_dead_owner_beside_a_leftover_break_is_taken_over(tmp_path: Path, how: str, leftover: str):
    lock_dir = tmp_path / "lock" / "lock.d"
    lock_dir.mkdir(parents=True)
    (lock_dir / "owner").write_text(dead_owner())
    breaker = tmp_path / "lock" / "lock.d.break"
    breaker.mkdir()
    if leftover == "dead-maker":
        (breaker / "owner").write_text(dead_owner())
    else:  # an older sitestack's, made without an owner file, two minutes ago
        os.utime(breaker, (os.path.getmtime(breaker) - 120,) * 2)
    assert take(tmp_path / "lock", how).startswith("taken"), "a leftover lock.d.break kept a dead owner's lock"
    assert not breaker.exists() and not lock_dir.exists()


def test_a_fresh_break_without_an_owner_is_not_removed(tmp_path: Path):
    """A lock.d.break made a moment ago may be a live waiter's: the lock is not taken over through it."""
    lock_dir = tmp_path / "lock" / "lock.d"
    lock_dir.mkdir(parents=True)
    (lock_dir / "owner").write_text(dead_owner())
    (tmp_path / "lock" / "lock.d.break").mkdir()
    assert take(tmp_path / "lock", "local").startswith("held: ")
    assert (tmp_path / "lock" / "lock.d.break").is_dir() and lock_dir.is_dir()


@pytest.mark.parametrize("how", ["local", "shell"])
def test_a_lock_left_without_an_owner_file_is_taken_over_once_old(tmp_path: Path, how: str):
    """A run killed between the lock's mkdir and its owner file (or stopped by a full disk) leaves a
    lock.d with no owner: a minute later it is taken over; a moment later it is still waited for."""
    lock_dir = tmp_path / "lock" / "lock.d"
    lock_dir.mkdir(parents=True)
    assert take(tmp_path / "lock", how).startswith("held: ")
    assert lock_dir.is_dir()
    os.utime(lock_dir, (os.path.getmtime(lock_dir) - 120,) * 2)
    assert take(tmp_path / "lock", how).startswith("taken"), "an ownerless leftover lock was never taken over"


def test_an_nccl_warning_after_a_long_progress_bar_is_still_read(job: Path, tmp_path: Path):
    """Carriage returns end lines too: a progress bar's updates (no newline) longer than the line
    bound do not hide the NCCL warning printed after them."""
    log = tmp_path / "train.log"
    bar = "".join(f"\r{i:>6}/100000 [{'#' * (i % 50):<50}]" for i in range(2000))
    log.write_text(OFI_LINES + bar + "\rnode-b:7:8 [0] NCCL WARN NET/OFI Couldn't open AV\n")
    out = nccl_log(job, str(log), "--nodes", "multi")
    assert out.returncode == 0 and "the network warned: \"NET/OFI Couldn't open AV\"" in out.stdout, out.stdout + out.stderr


OFI_LINES = "".join(f"node-{h}:7:8 [0] NCCL INFO NET/OFI Selected Provider is cxi\nnode-{h}:7:8 [0] NCCL INFO Using network "
                    "AWS Libfabric\n" for h in "ab")


def test_a_data_task_shows_escape_sequences_in_its_lines_and_never_sends_them(capsys: pytest.CaptureFixture[str]):
    """``installed``, ``gc`` and the other data tasks list names read from the prefix or the cache:
    a name holding a terminal sequence is shown escaped, and the JSON keeps it as it is."""
    from sitestack.engine import results
    name = "torch\x1b]0;owned\x07\x1b[2J\x9b1m"
    results.emit(None, "installed", {"names": [name]}, [f"  {name}"])
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "\x9b" not in out, repr(out)
    assert "torch" in out and "\\x1b" in out


def test_a_huge_job_log_is_read_by_its_tail(tmp_path: Path):
    """``invoke validate`` looks for the job's last words in the end of its log only: a log of any
    size is read in bounded memory."""
    from sitestack.core.host import LocalHost
    log = tmp_path / "job.log"
    with open(log, "wb") as handle:
        handle.truncate(4 << 30)   # sparse: 4 GiB of NULs, then the last line
        handle.seek(0, 2)
        handle.write(b"\nlast line\n")
    tail = LocalHost().read_tail(str(log), 4096)
    assert tail is not None and tail.endswith("last line\n") and len(tail) == 4096


#: ``validate --collect`` of a job whose result.json is not one: each is one message, no traceback.
BAD_RESULTS = {"not-json": "not json", "a-list": "[]", "artefacts-a-string": '{"artefacts": "x"}',
               "checks-a-string": '{"verdict": "passed", "checks": "x"}',
               "check-without-summary": '{"checks": [{"name": "a", "status": "ok"}]}', "a-huge-number": "1e999999",
               # a whole result of another schema version, and one with a field of another type
               "schema-1": json.dumps({**built(), "schema": 1}), "world-size-a-string": json.dumps({**built(), "world_size": "2"})}


@pytest.mark.parametrize("kind", [*BAD_RESULTS, "fifo", "dev-zero", "log-fifo"])
def test_validate_collect_reads_only_a_result_of_the_job(tmp_path: Path, kind: str):
    results = tmp_path / "results"
    out = results / "sitestack-validation-987654321"
    out.mkdir(parents=True)
    result, log = out / "result.json", results / "sitestack-validation-987654321.log"
    if kind == "log-fifo":
        os.mkfifo(log)
        result.write_text('{"verdict": "passed", "checks": []}')
    else:
        log.write_text("sitestack validation: PASSED, exit code 0\n")
    if kind == "fifo":
        os.mkfifo(result)
    elif kind == "dev-zero":
        result.symlink_to("/dev/zero")
    elif kind in BAD_RESULTS:
        result.write_text(BAD_RESULTS[kind])
    home = tmp_path / "home"
    home.mkdir()
    out_ = subprocess.run([sys.executable, "-m", "invoke", "--search-root", str(REPO), "validate", "--site", "local",
                           "--prefix", str(tmp_path / "prefix"), "--collect", "987654321", "--results", str(results)],
                          cwd=tmp_path, env={**os.environ, "HOME": str(home)}, capture_output=True, text=True,
                          timeout=TIMEOUT)
    message = out_.stderr.strip()
    assert out_.returncode == 1 and "Traceback" not in out_.stdout + out_.stderr, out_.stdout + out_.stderr
    assert message.startswith("error: ") and len(message.splitlines()) == 1, message
    named = log if kind == "log-fifo" else result
    assert str(named) in message and ("not a regular file" in message or "not a result" in message), message
    said = {"schema-1": "schema 1, not 2", "world-size-a-string": "`world_size` is a JSON str, not int"}
    assert said.get(kind, "") in message, message
