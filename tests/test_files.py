"""The one file signature and the one atomic write (sitestack/core/files.py)."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from sitestack.core.files import atomic_write, signature


def test_a_reader_never_sees_a_partial_file(tmp_path: Path):
    target = tmp_path / "data"
    versions = [bytes([65 + i]) * (1 << 20) for i in range(4)]   # 1 MiB each: a plain write would be seen half-done
    atomic_write(target, versions[0])
    seen: set[bytes] = set()
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            seen.add(target.read_bytes())

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i in range(40):
            atomic_write(target, versions[i % len(versions)])
    finally:
        done.set()
        reader.join()
    assert seen <= set(versions) and seen
    assert [p.name for p in tmp_path.iterdir()] == ["data"]   # no temporary file left behind


def test_the_mode_is_set_and_a_failed_write_keeps_the_old_file(tmp_path: Path):
    target = tmp_path / "f"
    atomic_write(target, b"old", 0o600)
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    with pytest.raises(TypeError):
        atomic_write(target, object(), 0o644)  # type: ignore[arg-type]
    assert target.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["f"]


def test_a_fifo_is_written_in_place_never_replaced(tmp_path: Path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    atomic_write(fifo, b"through the pipe\n")
    reader.join(timeout=10)
    assert got == [b"through the pipe\n"] and stat.S_ISFIFO(fifo.stat().st_mode)


def test_a_device_is_written_not_replaced(tmp_path: Path):
    link = tmp_path / "out"
    link.symlink_to("/dev/null")   # as /dev/stdout is a link to the process's output
    atomic_write(link, b"discarded")
    assert link.is_symlink() and stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_a_symlink_to_a_file_is_replaced_by_the_file_and_a_directory_is_refused(tmp_path: Path):
    real = tmp_path / "real"
    real.write_bytes(b"kept")
    link = tmp_path / "link"
    link.symlink_to(real)
    atomic_write(link, b"new")
    assert not link.is_symlink() and link.read_bytes() == b"new" and real.read_bytes() == b"kept"
    with pytest.raises(IsADirectoryError):
        atomic_write(tmp_path, b"x")


def test_signature_changes_with_the_file_and_is_none_when_missing(tmp_path: Path):
    path = tmp_path / "f"
    assert signature(path) is None
    atomic_write(path, b"one")
    first = signature(path)
    assert first is not None and first == signature(path)
    atomic_write(path, b"two")   # same size, new inode
    assert signature(path) != first


def test_an_edit_in_place_of_the_same_size_is_a_new_signature_and_a_new_parse(tmp_path: Path, monkeypatch):
    """An editor that rewrites a file in place keeps its inode and, for ``a: 1`` -> ``a: 2``, its size:
    the signature must still change (mtime/ctime), or a cached parse would be served stale."""
    import os

    from sitestack.core.yamlfile import load_yaml

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("HOME", str(tmp_path))
    path = tmp_path / "site.yml"
    path.write_text("a: 1\n")
    before, info = signature(path), os.stat(path)
    assert load_yaml(path)["a"] == 1
    with open(path, "r+") as handle:   # same inode, same size
        handle.write("a: 2\n")
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns + 1_000_000))   # a clock tick later, whatever the clock
    after = signature(path)
    assert before is not None and after is not None and before[:2] == after[:2] and after != before
    assert load_yaml(path)["a"] == 2


def test_a_stream_that_fails_its_check_leaves_the_old_file_and_no_temporary(tmp_path: Path):
    """atomic_stream: a download whose checksum does not match raises inside the block; the cached
    file stays as it was and nothing half-written is left beside it."""
    from sitestack.core.files import atomic_stream

    path = tmp_path / "pkg-1.0.tar.gz"
    path.write_bytes(b"old")
    with pytest.raises(ValueError), atomic_stream(path) as out:
        out.write(b"new, partly")
        raise ValueError("sha256 mismatch")
    assert path.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == [path.name]
    with atomic_stream(path, 0o600) as out:
        out.write(b"new")
    assert path.read_bytes() == b"new" and (path.stat().st_mode & 0o777) == 0o600
