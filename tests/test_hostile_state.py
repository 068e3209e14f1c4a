"""The state sitestack reads back is input too: records, indexes, stamps, results, generations.

Each case is a file sitestack wrote once and someone else changed (a careless co-administrator, a
hostile member of a group-writable install): a FIFO, a link to a device, a number JSON has not
(NaN, Infinity, 1e999), nesting deeper than any record, a time far in the past or future, paths
outside the tree the record belongs to. Each is refused or read as missing with one line naming the
file, never waited on, never followed out of its tree; a generation a process uses is never removed,
however the prefix was spelled. The real functions on real files, with a few real processes.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from invoke.exceptions import Exit

from sitestack.actions import ACTIONS
from sitestack.core.bounded import read_json as bounded_json
from sitestack.core.errors import InputError, SitestackError
from sitestack.core.host import LocalHost, local_host
from sitestack.engine import playbook as pb
from sitestack.engine.settings import SitestackConfig
from sitestack.installs import generations as gens
from sitestack.installs.record_paths import removable
from sitestack.model.options import normal_prefix
from sitestack.onsite import fileio, history_store
from sitestack.onsite.result_schema import parse_result
from tests.conftest import REPO
from tests.contexts import offline_context


@contextlib.contextmanager
def within(seconds: int) -> Iterator[None]:
    """The block ends within ``seconds`` (a read that waits on a FIFO fails the test, not the suite)."""
    def late(*_: object) -> None:
        raise TimeoutError(f"still waiting after {seconds} s")
    old = signal.signal(signal.SIGALRM, late)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


# -- one parser for every record: finite numbers, bounded depth ------------------------------------------------
@pytest.mark.parametrize("text, why", [
    ('{"retired": NaN}', "NaN is not a JSON number"),
    ('{"a": -Infinity}', "-Infinity is not a JSON number"),
    ('{"a": 1e999}', "1e999 is not a finite number"),
    ('{"a": ' + "[" * 100 + "]" * 100 + "}", "nested more than"),
    ('{"a": ' + "[" * 200000 + "]" * 200000 + "}", "nested more than"),
])
def test_a_record_with_a_number_json_has_not_or_deep_nesting_is_refused_naming_the_file(tmp_path, text, why):
    path = tmp_path / "result.json"
    path.write_text(text)
    with pytest.raises(fileio.ReadError, match=why) as caught:
        fileio.read_json(str(path), 1 << 22)
    assert str(path) in str(caught.value)
    with pytest.raises(InputError, match=why):   # the controller's bounded reader, the same rule
        bounded_json(local_host(), str(path), 1 << 22, "not a result")
    result, reason = parse_result(text)
    assert result is None and why in reason


def test_a_record_that_is_a_fifo_or_a_link_to_dev_zero_is_refused_at_once(tmp_path):
    (tmp_path / "zero.json").symlink_to("/dev/zero")
    with within(5):
        for path in (fifo(tmp_path / "fifo.json"), tmp_path / "zero.json"):
            with pytest.raises(fileio.ReadError, match="not a regular file"):
                fileio.read_json(str(path), 1 << 20)


def test_a_bad_state_record_reads_as_missing_with_one_line_or_is_refused_where_it_matters(tmp_path, capsys):
    host = LocalHost()
    (tmp_path / "zero.json").symlink_to("/dev/zero")
    (tmp_path / "nan.json").write_text('{"digest": NaN}')
    with within(5):
        for name in ("fifo.json", "zero.json", "nan.json"):
            path = str(fifo(tmp_path / name) if name == "fifo.json" else tmp_path / name)
            assert host.read_json(path) is None
            with pytest.raises(SitestackError, match="not a record sitestack wrote"):
                host.read_json(path, strict=True)
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 3 and all("read as missing" in line for line in lines), lines
    assert all(any(name in line for line in lines) for name in ("fifo.json", "zero.json", "nan.json"))


# -- generations: the record, its times, and what is in use ------------------------------------------------------
def generations(tmp_path: Path, record: str | None) -> tuple[str, Path]:
    """``tmp/real/env`` -> its current generation A, with a retired B beside it; ``record`` as the record's
    text (None: B retired an hour ago). The path as given through ``tmp/link`` (a link to ``real``)."""
    real = tmp_path / "real"
    (real / ".env.gen-A").mkdir(parents=True)
    (real / ".env.gen-B").mkdir()
    (real / "env").symlink_to(".env.gen-A")
    (tmp_path / "link").symlink_to("real")
    if record is None:
        record = json.dumps({"format": 1, "generations": [
            {"name": ".env.gen-B", "created": time.time() - 7200, "retired": time.time() - 3600},
            {"name": ".env.gen-A", "created": time.time() - 3600, "retired": None}]})
    (real / ".env.generations.json").write_text(record)
    return str(tmp_path / "link" / "env"), real / ".env.gen-B"


@pytest.mark.parametrize("retired", ["-1e308", "\"1000\"", '"yesterday"', "true"])
def test_a_retired_time_that_is_no_time_keeps_the_generation_its_full_grace(tmp_path, retired):
    record = ('{"format": 1, "generations": [{"name": ".env.gen-B", "created": 1, "retired": ' + retired + '}, '
              '{"name": ".env.gen-A", "created": 2}]}')
    path, retired_gen = generations(tmp_path, record)
    (verdict,) = gens.verdicts(LocalHost(), gens.read_history(LocalHost(), path), (600, "a test's grace"), users={})
    assert not verdict.removed and "kept for" in verdict.why, verdict
    assert retired_gen.is_dir()


def test_a_generations_record_that_is_a_fifo_is_refused_not_waited_on(tmp_path):
    path, _ = generations(tmp_path, "{}")
    record = tmp_path / "real" / ".env.generations.json"
    record.unlink()
    fifo(record)
    with within(5), pytest.raises(SitestackError, match=r"\.env\.generations\.json.*not a regular file"):
        gens.read_history(LocalHost(), path)


@pytest.fixture
def user_in(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A process whose working directory is the retired generation, started through its resolved path,
    whose command line carries the text the probe once used to recognise itself."""
    path, retired = generations(tmp_path, None)
    proc = subprocess.Popen(["bash", "-c", 'exec -a "sleep # sitestack: in-use probe" sleep 60'], cwd=retired)
    try:
        yield path, retired
    finally:
        proc.kill()
        proc.wait()


def test_a_generation_a_process_uses_is_kept_however_the_prefix_is_spelled(user_in):
    path, retired = user_in
    parent = os.path.dirname(path)   # through the link
    spellings = [f"{p}/{retired.name}" for p in (parent, parent.replace("/link", "//real"),
                                                  parent.replace("/link", "/./real"))]
    users = gens.in_use(LocalHost(), spellings)
    assert sorted(users) == sorted(spellings) and all(len(u) == 1 for u in users.values()), users
    found = gens.collect(LocalHost(), gens.read_history(LocalHost(), path), (0, "no scheduler"))
    assert [v.removed for v in found] == [False] and "in use by" in found[0].why, found
    assert retired.is_dir()


def test_normal_prefix_spells_a_prefix_one_way():
    assert normal_prefix("//opt/./sw//stacks/") == "/opt/sw/stacks"
    assert normal_prefix("/opt/sw/x/../stacks") == "/opt/sw/stacks"
    site = pb.load("local")
    assert offline_context(site, prefix="//tmp/./p/").values["prefix"] == "/tmp/p"


# -- module files: what a record names is confined to the tree and to what the tool wrote ------------------------
def modulefiles_step(tmp: Path):
    """The local site's one modulefiles step, installing Tcl module files under ``tmp/modules``; the stack's
    manifest made (the step refuses to run without)."""
    data = yaml.safe_load((REPO / "playbooks" / "local.yml").read_text())
    data["facts"]["modules"] = {**data["facts"]["modules"], "format": "tcl", "install_root": str(tmp / "modules")}
    data["steps"] = [{"name": "modules", "action": "modulefiles", "args": {"name": "pytorch/2.2.2-cpu", "recipes": []}}]
    book = tmp / "book" / "local.yml"
    book.parent.mkdir()
    book.write_text(yaml.safe_dump(data, sort_keys=False))
    ctx = offline_context(pb.load(path=book), prefix=str(tmp / "prefix"))
    step = ACTIONS["modulefiles"].from_spec(ctx.site.steps[0], ctx)
    Path(step.stack.manifest).parent.mkdir(parents=True, exist_ok=True)
    Path(step.stack.manifest).write_text("{}\n")
    return step


def test_the_module_record_removes_only_files_the_tool_wrote_inside_its_tree(tmp_path):
    host, step = local_host(), modulefiles_step(tmp_path)
    step.apply(host)
    root = tmp_path / "modules"
    outside = tmp_path / "precious.txt"
    outside.write_text("keep me\n")
    secret = root / "pytorch" / "secret"
    secret.write_text("password=hunter2\n")
    secret.chmod(0o600)
    (root / "pytorch" / "away").symlink_to(outside)
    old = root / "pytorch" / "2.0.0-cpu"           # one the tool wrote, for a stack since renamed
    old.write_text((root / "pytorch" / "2.2.2-cpu").read_text())
    record = json.loads(Path(step.record).read_text())
    record["files"] += [str(outside), f"{root}/../precious.txt", str(secret), f"{root}/pytorch/away", str(old),
                        f"{root}/.sitestack/pytorch--2.2.2-cpu.json", 7]
    Path(step.record).write_text(json.dumps(record))
    diff = step.diff(host) or ""
    assert "hunter2" not in diff and "keep me" not in diff and str(old) in diff
    step.apply(host)
    assert outside.read_text() == "keep me\n" and secret.read_text() == "password=hunter2\n"
    assert (root / "pytorch" / "away").is_symlink() and not old.exists()
    assert Path(step.record).is_file()


def test_removable_says_why_each_path_is_left_alone(tmp_path):
    root = tmp_path / "modules"
    (root / "a").mkdir(parents=True)
    (root / "a" / "plain").write_text("no header\n")
    (root / "a" / "ours").write_text("#%Module1.0\n## Generated by sitestack from x\n")
    (root / "a" / "out").symlink_to(tmp_path)
    fifo(root / "a" / "fifo")
    paths = [f"{root}/a/plain", f"{root}/a/ours", f"{root}/a/out", f"{root}/a/fifo", f"{root}/a/gone", "/etc/passwd",
             f"{root}/a/../../x", f"{root}//a/ours"]
    with within(5):
        ok, refused = removable(LocalHost(), str(root), paths)
    assert ok == [f"{root}/a/ours"]
    assert len(refused) == 6 and all(r.split(":")[0].strip("'") in paths for r in refused), refused


def test_a_module_record_that_is_a_fifo_is_refused_not_waited_on(tmp_path):
    host, step = local_host(), modulefiles_step(tmp_path)
    Path(step.record).parent.mkdir(parents=True)
    fifo(Path(step.record))
    with within(5), pytest.raises(SitestackError, match="not a regular file"):
        step.apply(host)


# -- history, the Invoke configuration, NCCL logs -----------------------------------------------------------------
def test_a_history_index_that_is_a_fifo_is_refused_not_waited_on(tmp_path):
    (tmp_path / "runs").mkdir(mode=0o755)
    fifo(tmp_path / history_store.INDEX)
    record = {"schema": history_store.SCHEMA, "id": "20260101T000000Z-validation-1", "kind": "validation",
              "started": 1767225600.0}
    with within(5), pytest.raises(history_store.HistoryError, match="index.jsonl: not a regular file"):
        history_store.append(str(tmp_path), record)


def test_an_invoke_configuration_file_that_is_a_fifo_or_a_device_is_one_message(tmp_path):
    (tmp_path / "zero.yaml").symlink_to("/dev/zero")
    with within(5):
        for path in (fifo(tmp_path / "fifo.yaml"), tmp_path / "zero.yaml", fifo(tmp_path / "no-suffix")):
            config = SitestackConfig(runtime_path=str(path))
            with pytest.raises(Exit) as caught:
                config.load_runtime()
            assert str(path) in str(caught.value) and "Traceback" not in str(caught.value)


def test_an_nccl_line_with_a_billion_ranks_costs_no_billion_integers():
    """In a child limited to 512 MiB of address space: a set of 10**9 ranks needs tens of GiB."""
    code = ("import resource; resource.setrlimit(resource.RLIMIT_AS, (1 << 29, 1 << 29))\n"
            "from sitestack.onsite import nccl_log as nl\n"
            "line = 'gpu-node:4101:4151 [0] NCCL INFO comm 0x7f0910001cf0 rank 0 nranks 999999999 cudaDev 0 busId 1b000 "
            "- Init COMPLETE'\n"
            "print(nl.read(line + '\\n', nl.Expectation()).status)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-2000:]


def test_each_stack_is_kept_by_its_own_max_job_time(tmp_path):
    """The `tools` stack's overlay allows jobs of 2 days, the playbook's 10 minutes: the tools stack's
    retired generations are kept 2 days, and a path no stack makes the longest of them."""
    from sitestack.engine.lifecycle import graces
    from tests.test_stacks import MAIN, TOOLS, playbook

    stacks = {"tools": {"facts": {"torch": {"extras": ["six"]}, "scheduler": {"max_job_time": "2-00:00:00"}}}}
    ctx = offline_context(pb.load(path=playbook(tmp_path, stacks=stacks)), prefix=str(tmp_path / "prefix"))
    grace = graces(LocalHost(), ctx)
    prefix = ctx.values["prefix"]
    assert grace(f"{prefix}/{MAIN}")[0] == 600 and grace(f"{prefix}/{TOOLS}")[0] == 2 * 86400
    assert grace(f"{prefix}/mpi4py/4.0.0")[0] == 2 * 86400


def test_stack_settings_nested_deeper_than_any_record_are_one_message(tmp_path):
    from sitestack.onsite.activate import Refused
    from sitestack.onsite.activate.stack_settings import read_settings

    path = tmp_path / "settings.json"
    path.write_text('{"module": ' + "[" * 30000 + "]" * 30000 + "}")   # within the 64 KiB cap
    with pytest.raises(Refused, match="nested more than"):
        read_settings(str(path))


def test_a_file_sitestack_reads_back_that_is_a_fifo_or_a_device_is_refused_at_once(tmp_path):
    """Host.read_text, which every step uses on what it wrote (stamps, markers, targets it diffs)."""
    (tmp_path / "zero").symlink_to("/dev/zero")
    with within(5):
        for path in (fifo(tmp_path / ".sitestack-ready"), tmp_path / "zero", tmp_path):
            with pytest.raises(SitestackError, match="not a regular file"):
                LocalHost().read_text(str(path))
    assert LocalHost().read_text(str(tmp_path / "missing")) is None


@pytest.mark.parametrize("record", [
    b'{"prefixes": "/old"}', b'{"prefixes": []}', b'{"prefixes": ["relative/old"]}', b'{"prefixes": [1]}',
    b'[1, 2]', b'{"prefixes": ["/old"]', b' ' * (2 << 20),
])
def test_a_pack_record_of_the_wrong_shape_stops_the_unpack_with_one_line(tmp_path: Path, record: bytes):
    """The fix-up of an unpacked env rewrites files by its record's prefixes: a record it did not write stops
    it (exit 1, one line naming the record) before any file is rewritten."""
    from sitestack.onsite import venv_unpack

    root = tmp_path / "env"
    (root / "bin").mkdir(parents=True)
    script = root / "bin" / "tool"
    script.write_text("#!/old/bin/python\n")
    (root / venv_unpack.RECORD).write_bytes(record)
    done = subprocess.run([sys.executable, venv_unpack.__file__, str(root)], capture_output=True, text=True)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith(f"sitestack-unpack: {root / venv_unpack.RECORD}: ") and done.stderr.count("\n") == 1
    assert script.read_text() == "#!/old/bin/python\n"
    (root / venv_unpack.RECORD).write_bytes(b'{"prefixes": ["/old"]}')
    fixed = subprocess.run([sys.executable, venv_unpack.__file__, str(root)], capture_output=True, text=True)
    assert fixed.returncode == 0 and script.read_text() == f"#!{root}/bin/python\n"
