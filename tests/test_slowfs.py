"""slowfs (benchmarks/slowfs/slowfs.c), the benchmarks' slow shared file system: built with the C
compiler and libfuse3, mounted for real over a backing directory; what is read through it is the
backing directory's, and its counters (per kind, bytes read) follow what was done. No timings."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parent.parent / "benchmarks" / "slowfs" / "slowfs.c"


def _missing() -> str | None:
    for tool in ("cc", "pkg-config", "fusermount3"):
        if not shutil.which(tool):
            return tool
    if subprocess.run(["pkg-config", "--exists", "fuse3"]).returncode != 0:
        return "libfuse3-dev"
    return None if os.path.exists("/dev/fuse") else "/dev/fuse"


pytestmark = pytest.mark.skipif(_missing() is not None, reason=f"slowfs needs {_missing()}")


class Mounted:
    def __init__(self, tmp: Path, *options: str) -> None:
        binary = tmp / "slowfs"
        flags = subprocess.run(["pkg-config", "--cflags", "--libs", "fuse3"], capture_output=True, text=True,
                               check=True).stdout.split()
        subprocess.run(["cc", "-O2", "-Wall", "-Werror", "-o", str(binary), str(SOURCE), *flags], check=True)
        self.back, self.mnt, self.stats = tmp / "back", tmp / "mnt", tmp / "stats.json"
        self.back.mkdir()
        self.mnt.mkdir()
        (self.back / "data.bin").write_bytes(bytes(range(256)) * 4096)   # 1 MiB
        (self.back / "dir").mkdir()
        (self.back / "dir" / "a.py").write_text("x = 1\n")
        (self.back / "link").symlink_to("data.bin")
        self.proc = subprocess.Popen([str(binary), str(self.back), str(self.mnt), "-f", "-o",
                                      ",".join(["ro", f"stats={self.stats}", *options])], stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while not os.path.ismount(self.mnt):
            assert self.proc.poll() is None and time.monotonic() < deadline, "slowfs did not mount"
            time.sleep(0.02)

    def counters(self) -> dict:
        self.stats.unlink(missing_ok=True)
        self.proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 20
        while not self.stats.exists():
            assert time.monotonic() < deadline, "no counters after SIGUSR1"
            time.sleep(0.01)
        return json.loads(self.stats.read_text())

    def unmount(self) -> int:
        subprocess.run(["fusermount3", "-u", str(self.mnt)], capture_output=True)
        return self.proc.wait(timeout=20)


@pytest.fixture
def slowfs(tmp_path: Path) -> Iterator[Mounted]:
    fs = Mounted(tmp_path, "latency_us=200")
    try:
        yield fs
    finally:
        if fs.proc.poll() is None:
            fs.unmount()


def other_process(code: str, *args: str) -> str:
    """``code`` run by a new Python process (a client of its own for slowfs's per-process cache)."""
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True).stdout


def test_reads_through_and_counts(slowfs: Mounted) -> None:
    before = slowfs.counters()
    assert before["latency_us"] == 200 and before["slots"] == 1
    assert (slowfs.mnt / "data.bin").read_bytes() == (slowfs.back / "data.bin").read_bytes()
    assert (slowfs.mnt / "link").resolve().name == "data.bin"
    assert sorted(p.name for p in (slowfs.mnt / "dir").iterdir()) == ["a.py"]
    after = slowfs.counters()
    delta = {k: after["ops"][k] - before["ops"][k] for k in after["ops"]}
    assert delta["open"] >= 1 and delta["opendir"] >= 1 and delta["readdir"] >= 1 and delta["readlink"] >= 1
    assert delta["getattr"] >= 3
    assert after["bytes_read"] - before["bytes_read"] >= 1 << 20
    assert after["metadata_ops"] - before["metadata_ops"] == sum(
        v for k, v in delta.items() if k not in ("read", "getattr_cached"))
    # the data stays in the page cache: reading it again reads nothing more through slowfs
    (slowfs.mnt / "data.bin").read_bytes()
    assert slowfs.counters()["bytes_read"] == after["bytes_read"]


def test_each_process_looks_a_path_up_once(slowfs: Mounted) -> None:
    """A process's repeated lookups come from its own 'client cache'; a new process asks the server again."""
    path = str(slowfs.mnt / "dir" / "a.py")
    stat_many = "import os, sys\nfor _ in range(50): os.stat(sys.argv[1])"
    before = slowfs.counters()
    other_process(stat_many, path)
    first = slowfs.counters()
    charged = first["ops"]["getattr"] - before["ops"]["getattr"]
    assert 1 <= charged < 10   # the path's components, once
    assert first["ops"]["getattr_cached"] - before["ops"]["getattr_cached"] >= 49
    other_process(stat_many, path)
    second = slowfs.counters()
    assert second["ops"]["getattr"] - first["ops"]["getattr"] == charged


def test_read_only_and_stats_at_unmount(slowfs: Mounted) -> None:
    with pytest.raises(OSError):
        (slowfs.mnt / "new").write_text("no")
    with pytest.raises(OSError), open(slowfs.mnt / "data.bin", "r+b"):
        pass
    (slowfs.mnt / "dir" / "a.py").read_text()
    slowfs.stats.unlink(missing_ok=True)
    assert slowfs.unmount() == 0
    final = json.loads(slowfs.stats.read_text())   # written at unmount
    assert final["ops"]["open"] >= 1 and final["bytes_read"] >= 6


def test_bad_options_are_refused(tmp_path: Path) -> None:
    fs = Mounted(tmp_path, "latency_us=0")
    fs.unmount()
    binary = tmp_path / "slowfs"
    for option in ("slots=0", "latency_us=-1", "stats=relative.json"):
        out = subprocess.run([str(binary), str(fs.back), str(fs.mnt), "-f", "-o", option], capture_output=True,
                             text=True, timeout=20)
        assert out.returncode == 1 and "slowfs:" in out.stderr, option
        assert not os.path.ismount(fs.mnt)
