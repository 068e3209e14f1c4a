"""The on-site package's toolkit (sitestack/onsite/fileio.py, visible.py): one atomic writer, one bounded
reader, one sanitiser, used by every module of the package that is not a single-file program (an AST
scan holds it so); real files, FIFOs, links and processes."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sitestack.onsite import SINGLE_FILE, fileio, visible
from tests.onsite_dir import install_programs

ONSITE = Path(fileio.__file__).parent


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# -- the writer ---------------------------------------------------------------------------------------

WRITER = """
import sys
sys.path.insert(0, sys.argv[1])
from onsite import fileio
path, tag = sys.argv[2], sys.argv[3]
for i in range(300):
    fileio.write_json(path, {"writer": tag, "i": i, "pad": [tag * 50] * 400})
"""


def test_a_reader_never_sees_a_partial_file_while_two_processes_rewrite_it(tmp_path: Path) -> None:
    """Two writers (a rank and its watchdog both rewrite the rank's record) and a reader: every read
    is whole JSON, and no temporary file is left."""
    job = install_programs(tmp_path / "job", ("ddp_report.py",))  # the report imports fileio
    path = tmp_path / "rank-0.json"
    fileio.write_json(str(path), {"writer": "first"})
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(job), str(path), tag]) for tag in "ab"]
    reads = 0
    while any(w.poll() is None for w in writers):
        data = json.loads(path.read_text())  # a torn or truncated file raises here
        assert data["writer"] in ("first", "a", "b")
        reads += 1
    assert [w.wait() for w in writers] == [0, 0] and reads > 10
    assert json.loads(path.read_text())["i"] == 299
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job", "rank-0.json"]


def test_a_write_that_fails_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "summary.md"
    fileio.write_atomic(str(path), "old\n")
    os.chmod(path, 0o644)
    with pytest.raises(TypeError):
        fileio.write_atomic(str(path), 42)  # type: ignore[arg-type]
    with pytest.raises(OSError):
        fileio.write_atomic(str(tmp_path / "missing" / "summary.md"), "x")
    assert path.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["summary.md"]
    fileio.write_atomic(str(path), b"new\n", sync=False)
    assert path.read_bytes() == b"new\n" and oct(path.stat().st_mode & 0o777) == oct(0o666 & ~_umask())


def test_a_mode_is_the_files_whatever_the_umask_and_exclusive_keeps_the_first(tmp_path: Path) -> None:
    path = tmp_path / "index.jsonl"
    old = os.umask(0o077)
    try:
        fileio.write_atomic(str(path), "one\n", mode=0o664)
    finally:
        os.umask(old)
    assert oct(path.stat().st_mode & 0o777) == oct(0o664)
    run = tmp_path / "run.json"
    assert fileio.write_atomic(str(run), "first\n", mode=0o644, exclusive=True) is True
    assert fileio.write_atomic(str(run), "second\n", mode=0o644, exclusive=True) is False
    assert run.read_text() == "first\n" and sorted(p.name for p in tmp_path.iterdir()) == ["index.jsonl", "run.json"]


def test_a_link_planted_at_the_temporary_name_is_never_followed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    monkeypatch.setattr(fileio, "_token", lambda: "7")
    (tmp_path / f".out.json.{os.getpid()}.7.tmp").symlink_to(victim)
    with pytest.raises(FileExistsError):
        fileio.write_json(str(tmp_path / "out.json"), {"a": 1})
    assert victim.read_text() == "precious\n" and not (tmp_path / "out.json").exists()


# -- the reader ---------------------------------------------------------------------------------------

def test_reads_are_bounded_and_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "log"
    path.write_bytes(b"0123456789")
    assert fileio.read_bytes(str(path), 10) == b"0123456789"
    with pytest.raises(fileio.ReadError, match=rf"^{path}: larger than 9 bytes$"):
        fileio.read_bytes(str(path), 9)
    assert fileio.read_bytes(str(path), 4, keep="head") == b"0123"
    assert fileio.read_bytes(str(path), 4, keep="tail") == b"6789"
    with pytest.raises(ValueError, match="keep must be one of"):
        fileio.read_bytes(str(path), 4, keep="middle")
    with pytest.raises(fileio.ReadError, match=rf"^{tmp_path}/absent: cannot be read \(No such file or directory\)$"):
        fileio.read_text(str(tmp_path / "absent"), 10)
    with pytest.raises(fileio.ReadError, match="not a regular file"):
        fileio.read_text(str(tmp_path), 10)
    os.mkfifo(tmp_path / "fifo")   # no writer: an open that waited would hang here
    with pytest.raises(fileio.ReadError, match=rf"^{tmp_path}/fifo: not a regular file$"):
        fileio.read_text(str(tmp_path / "fifo"), 10)
    (tmp_path / "link").symlink_to(path)
    assert fileio.read_text(str(tmp_path / "link"), 10) == "0123456789"
    with pytest.raises(fileio.ReadError, match="cannot be read"):
        fileio.read_text(str(tmp_path / "link"), 10, follow=False)
    (tmp_path / "bytes").write_bytes(b"a\xffb")
    assert fileio.read_text(str(tmp_path / "bytes"), 10) == "a\ufffdb"


def test_a_proc_file_is_read_whole_though_its_size_says_zero() -> None:
    assert os.stat("/proc/self/status").st_size == 0
    text = fileio.read_text("/proc/self/status", 1 << 20, keep="head")
    assert text.startswith("Name:") and f"Pid:\t{os.getpid()}\n" in text


@pytest.mark.parametrize("content, reason", [
    ("{\"a\": ", r"not JSON \(Expecting value: line 1 column 7"),
    ("[1, 2]", r"not a JSON object \(a JSON list\)"),
    ("[" * 100000 + "]" * 100000, r"not JSON this program reads \(nested more than 32 deep\)"),
    (b"{\"a\": \"\xff\"}", r"not JSON \(not UTF-8 at byte 7\)"),
    ("{\"a\": 1}" + " " * 100, "larger than 64 bytes"),
])
def test_read_json_names_the_file_and_why(tmp_path: Path, content: str | bytes, reason: str) -> None:
    path = tmp_path / "check-config.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(fileio.ReadError, match=rf"^{path}: {reason}") as caught:
        fileio.read_json(str(path), 64 if "larger" in reason else 1 << 20)
    assert caught.value.path == str(path) and str(caught.value).startswith(f"{path}: ")
    path.write_text("{\"history_dir\": \"/p/history\"}")
    assert fileio.read_json(str(path), 64) == {"history_dir": "/p/history"}


# -- the sanitiser ------------------------------------------------------------------------------------

def test_short_line_is_one_bounded_line_of_the_allowed_characters() -> None:
    assert visible.short_line(None, 10) is None and visible.short_line(" \n\t ", 10) is None
    assert visible.short_line("a\tb\n\x1b]0;title\x07 c", 200) == "a b ?]0;title? c"
    assert visible.short_line("caf\u00e9 \u202eevil", 200) == "caf? ?evil"
    assert visible.short_line("x" * 50, 8) == "x" * 8 and visible.short_line("ab   cd", 3) == "ab"
    assert visible.short_line("1.15 (rc1); rm", 200, visible.NOT_VERSION) == "1.15 (rc1)? rm"
    assert visible.short_line(42, 10) == "42" and visible.one_line(" a \n b\t") == "a b"


# -- one of each in the package ---------------------------------------------------------------------

def _calls(tree: ast.AST) -> list[tuple[str, int]]:
    """``module.function`` (or ``function``) of every call in ``tree``, with its line."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
                out.append((f"{func.value.id}.{func.attr}", node.lineno))
            elif isinstance(func, ast.Name):
                mode = node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "mode"), None)
                reading = not (isinstance(mode, ast.Constant) and isinstance(mode.value, str) and set(mode.value) & set("wax"))
                out.append((f"{func.id}{'' if func.id != 'open' or not reading else ':read'}", node.lineno))
    return out


def test_the_package_has_one_atomic_writer_and_one_bounded_reader() -> None:
    """Outside fileio.py and the single-file programs (which cannot import it), no module of the
    package renames or links a file into place, parses JSON from a file object, or opens a file to
    read it with ``open()``: each writes with :func:`fileio.write_atomic` and reads with
    :func:`fileio.read_bytes`. (A stream opened with ``os.open``, as the NCCL log reader's, is read
    piece by piece and is no whole-file read.)"""
    renames = {"os.replace", "os.rename", "os.renames", "os.link", "shutil.move"}
    wrong, writers, readers = [], set(), set()
    for path in sorted(ONSITE.rglob("*.py")):
        module = path.relative_to(ONSITE).with_suffix("").as_posix()
        for name, line in _calls(ast.parse(path.read_text(encoding="utf-8"))):
            where = f"onsite/{module}.py:{line}: {name}"
            if name in renames:
                writers.add(module)
            if name in ("json.load", "open:read"):
                readers.add(module)
            if module not in SINGLE_FILE and module != "fileio" and (name in renames or name in ("json.load", "open:read")):
                wrong.append(where)
    assert not wrong, "write with fileio.write_atomic, read with fileio.read_bytes/read_text/read_json:\n" + "\n".join(wrong)
    assert "fileio" in writers   # the scan sees the one writer it allows
    assert writers - {"fileio"} <= set(SINGLE_FILE) and readers - {"fileio"} <= set(SINGLE_FILE)
