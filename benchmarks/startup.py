"""Job start-up on a slow shared file system: N concurrent ranks importing torch.

The shared file system is `slowfs` (benchmarks/slowfs/): a FUSE passthrough whose metadata
operations (lookup/getattr, open, readdir, readlink, access, statfs) wait for one metadata-server
slot and hold it for the latency, as a Lustre MDS shared by a machine's jobs (its header gives the
figures and sources); file data is not slowed and stays in the page cache.

For N = 1, 8 and 32 concurrent ranks and two latencies (0.2 ms and 1 ms, one slot), every rank runs
`sitestack/onsite/import_probe.py` (the validation job's start-up probe: `import torch`, and for
N = 8 a short gloo DDP start) with the Python of
(a) `unpacked`: the stack env (a venv with torch 2.13.0 CPU) on the slow file system;
(b) `packed`: the env packed by `invoke pack-env --site local` (squashfs image) on the slow file
    system, run through its wrapper, which mounts the image with squashfuse once per node: one call
    of the wrapper mounts it before the ranks start, reported as the way's staging time and counted
    in its time until all imported;
(c) `staged`: the same env packed for staging (the stage-archive step's tar and fix-up,
    `sitestack.installs.staging`), copied from the slow file system to local disk, unpacked and
    fixed up as `sitestack-stage-env` does on each node (sbcast replaced by a copy: one node here).
    The staging time is reported and counted in the way's time until all imported;
(d) the site's container image: left out, the local site uses none.
Reported per way, N and latency: time from just before the N processes are started until every rank
has imported torch (and joined the DDP group), metadata operations per rank and bytes read through
the slow file system (slowfs's counters), the ranks' CPU time and the load. The envs are built once
(latency 0, the data directory bind-mounted at the mount point: their paths are absolute) and kept
in the bench directory, so a second run only measures.

Needs a C compiler, libfuse3-dev (pkg-config fuse3), fusermount3, /dev/fuse, squashfs-tools,
squashfuse and mount privileges (root); says "skipped: needs ..." and exits 0 where one is missing.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import BENCH_DIR, ROOT, loadavg, target, write

from sitestack.installs import staging
from sitestack.installs.venv_stack import Stack
from sitestack.onsite import import_probe

RANKS = (1, 8, 32)
DDP_RANKS = (8,)
LATENCIES_US = (200, 1000)
SLOTS = 1
WORK = BENCH_DIR / "startup"
DATA, MNT = WORK / "data", WORK / "mnt"   # slowfs mirrors DATA at MNT
SOURCE = ROOT / "benchmarks" / "slowfs" / "slowfs.c"
PROBE = ROOT / "sitestack" / "validation" / "import_probe.py"
PACKED = MNT / "packed" / "envs" / "torch"
PACK_TAR = MNT / "packs" / "torch.tar.gz"
WAYS = ("unpacked", "packed", "staged")


def missing_tools() -> list[str]:
    need = ["cc", "pkg-config", "fusermount3", "squashfuse", "mksquashfs", "unsquashfs", "tar", "mount"]
    out = [t for t in need if not shutil.which(t)]
    if shutil.which("pkg-config") and subprocess.run(["pkg-config", "--exists", "fuse3"]).returncode != 0:
        out.append("libfuse3-dev")
    if not os.path.exists("/dev/fuse"):
        out.append("/dev/fuse")
    if os.geteuid() != 0:
        out.append("root (bind and FUSE mounts)")
    return out


def build_slowfs() -> Path:
    """slowfs compiled into the bench directory (again when its source is newer)."""
    binary = WORK / "slowfs"
    if not binary.exists() or binary.stat().st_mtime < SOURCE.stat().st_mtime:
        flags = subprocess.run(["pkg-config", "--cflags", "--libs", "fuse3"], capture_output=True, text=True,
                               check=True).stdout.split()
        subprocess.run(["cc", "-O2", "-Wall", "-o", str(binary), str(SOURCE), *flags], check=True)
    return binary


def unmount(path: Path) -> None:
    subprocess.run(["fusermount3", "-u", "-z", str(path)], capture_output=True)
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


class SlowFS:
    """slowfs mounted at MNT (in the foreground, so this process holds its pid) with ``latency_us``."""

    def __init__(self, binary: Path, latency_us: int) -> None:
        self.stats = WORK / f"stats-{os.getpid()}.json"
        self.proc = subprocess.Popen([str(binary), str(DATA), str(MNT), "-f", "-o",
                                      f"ro,latency_us={latency_us},slots={SLOTS},stats={self.stats}"])
        deadline = time.monotonic() + 10
        while not os.path.ismount(MNT):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"slowfs did not mount at {MNT}")
            time.sleep(0.02)

    def counters(self) -> dict[str, Any]:
        """slowfs's counters now (it writes them on SIGUSR1)."""
        self.stats.unlink(missing_ok=True)
        self.proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while not self.stats.exists():
            if time.monotonic() > deadline:
                raise RuntimeError("slowfs wrote no counters")
            time.sleep(0.01)
        data: dict[str, Any] = json.loads(self.stats.read_text())
        return data

    def close(self) -> None:
        unmount(PACKED.resolve() / "root")   # the wrapper's squashfuse mount lies inside
        subprocess.run(["fusermount3", "-u", str(MNT)], capture_output=True)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.stats.unlink(missing_ok=True)


def build_envs() -> dict[str, Any]:
    """The packed env (pack-env), the same env unpacked (the image's contents) and its stage pack, all
    at their MNT paths: DATA is bind-mounted there while they are made. Kept only while current:
    pack-env runs every time (a no-op while its stamp matches; it re-packs when the image's format or
    options change), and the unpacked copy and the stage pack are made again whenever the image's
    record or the stage pack's code changed. Returns the image's record (what is measured)."""
    DATA.mkdir(parents=True, exist_ok=True)
    MNT.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "--bind", str(DATA), str(MNT)], check=True)
    try:
        (MNT / "requirements.txt").write_text("torch==2.13.0\n")
        subprocess.run([sys.executable, "-m", "invoke", "pack-env", "--site", "local", "--name", "torch",
                        "--requirements", str(MNT / "requirements.txt"), "--prefix", str(MNT / "packed")],
                       cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        record: dict[str, Any] = json.loads((PACKED / "packed.json").read_text())
        key = hashlib.sha256(json.dumps(record, sort_keys=True).encode())
        for code in (Path(staging.__file__), ROOT / "sitestack" / "onsite" / "venv_unpack.py"):
            key.update(code.read_bytes())
        done = DATA / "done"
        if not done.exists() or done.read_text() != key.hexdigest():
            done.unlink(missing_ok=True)
            venv = MNT / "venv"
            shutil.rmtree(venv, ignore_errors=True)
            subprocess.run(["unsquashfs", "-q", "-n", "-d", str(venv), str(PACKED / "env.sqfs")], check=True,
                           stdout=subprocess.DEVNULL)
            make_stage_pack(venv)
            done.write_text(key.hexdigest())
    finally:
        subprocess.run(["umount", str(MNT)], check=True)
    return record


def make_stage_pack(venv: Path) -> None:
    """The stage-archive step's venv pack of ``venv`` (its tar command, fix-up program and record)."""
    version = next((venv / "lib").glob("python3.*")).name[len("python"):]
    stack = Stack(site="local", name="torch", path=str(venv), source="venv", python_version=version,
                  requirements=("torch==2.13.0",), extras=(), checks=(), index_url=None,
                  system_site_packages=False, compile=False)
    pack = staging.StageArchive(stack, str(MNT))
    PACK_TAR.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=WORK) as extra:
        shutil.copy(ROOT / "sitestack" / "onsite" / "venv_unpack.py", Path(extra) / staging.UNPACK_PROGRAM)
        (Path(extra) / staging.PACK_RECORD).write_text(pack.record(str(venv)))
        subprocess.run(pack.tar_argv(str(venv), extra, str(PACK_TAR)), check=True)


def stage(dest: Path) -> float:
    """What sitestack-stage-env does on a node (sbcast: a copy here): the pack copied to local disk,
    unpacked, fixed up and checked. Its wall time."""
    shutil.rmtree(dest, ignore_errors=True)
    start = time.perf_counter()
    dest.mkdir(parents=True)
    tarball = dest / ".sitestack-pack.tar.gz"
    shutil.copyfile(PACK_TAR, tarball)
    subprocess.run(["tar", "-xzf", str(tarball), "-C", str(dest)], check=True)
    tarball.unlink()
    subprocess.run([str(dest / "bin" / "python"), str(dest / staging.UNPACK_PROGRAM)], check=True,
                   stdout=subprocess.DEVNULL)
    subprocess.run([str(dest / "bin" / "python"), "-c", "import sys; sys.exit(0)"], check=True)
    return time.perf_counter() - start


def run_ranks(python: Path, n: int, ddp: bool, out: Path, port: int) -> dict[str, Any]:
    """N ranks of import_probe.py started at once; the aggregate, with the ranks' CPU time and the load."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    load = loadavg()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.time()
    procs = [subprocess.Popen([str(python), str(PROBE), "--out", str(out), "--rank", str(r), "--world-size", str(n),
                               "--master-addr", "127.0.0.1", "--master-port", str(port), *(["--ddp"] if ddp else [])],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for r in range(n)]
    for p in procs:
        p.wait()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    summary = import_probe.aggregate(str(out), t0, n)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return {**summary, "cpu_s": round(cpu, 2), "cpu_floor_s": round(cpu / (os.cpu_count() or 1), 2),
            "load_before": load, "load_after": loadavg()}


def measure(binary: Path, way: str, n: int, latency_us: int, staged: dict[int, tuple[Path, float, int]]) -> dict[str, Any]:
    """One way, N ranks, one latency, on a fresh slowfs mount."""
    fs = SlowFS(binary, latency_us)
    try:
        stage_s, stage_ops = 0.0, 0
        if way == "staged":
            if latency_us not in staged:   # staged once per latency (a job stages once per node)
                start = fs.counters()["metadata_ops"]
                dest = WORK / "local" / f"env-{latency_us}"
                staged[latency_us] = (dest, stage(dest), fs.counters()["metadata_ops"] - start)
            dest, stage_s, stage_ops = staged[latency_us]
            python = dest / "bin" / "python"
        elif way == "packed":
            # The image is mounted once per node before the ranks start, as on a site where the first
            # job on the node mounted it; that first call's time and operations are counted as staging's.
            # (Ranks that all find it unmounted at once can wait for ever: squashfuse, started by the
            # wrapper with the lock's descriptor 9 open, keeps the lock after the wrapper exec's.)
            start, began = fs.counters()["metadata_ops"], time.perf_counter()
            subprocess.run([str(PACKED / "bin" / "python"), "-c", "pass"], check=True)
            stage_s, stage_ops = time.perf_counter() - began, fs.counters()["metadata_ops"] - start
            python = PACKED / "bin" / "python"
        else:
            python = MNT / "venv" / "bin" / "python"
        start = fs.counters()
        result = run_ranks(python, n, n in DDP_RANKS, WORK / "ranks", 29400 + n)
        end = fs.counters()
    finally:
        fs.close()
    ops = end["metadata_ops"] - start["metadata_ops"]
    if result["all_imported_s"] is not None:
        result["all_imported_s"] += stage_s
    if result["all_ddp_ready_s"] is not None:
        result["all_ddp_ready_s"] += stage_s
    return {"way": way, "ranks": n, "latency_ms": latency_us / 1000, "stage_s": stage_s or None,
            "stage_metadata_ops": stage_ops or None, "metadata_ops_per_rank": round(ops / n),
            "ops_by_kind": {k: end["ops"][k] - start["ops"][k] for k in end["ops"]},
            "bytes_read_slowfs": end["bytes_read"] - start["bytes_read"], **result}


def table(rows: list[dict[str, Any]]) -> None:
    print(f"{'way':<9} {'N':>3} {'lat ms':>6} {'all imported s':>14} {'DDP ready s':>11} {'stage/mount s':>13} "
          f"{'md ops/rank':>11} {'MB read':>8} {'CPU s':>6} load")
    for r in rows:
        def f(v: Any) -> str:
            return "-" if v is None else f"{v:.2f}"
        print(f"{r['way']:<9} {r['ranks']:>3} {r['latency_ms']:>6} {f(r['all_imported_s']):>14} "
              f"{f(r['all_ddp_ready_s']):>11} {f(r['stage_s']):>13} {r['metadata_ops_per_rank']:>11} "
              f"{r['bytes_read_slowfs'] / 1e6:>8.1f} {r['cpu_s']:>6} {r['load_before']}")


def main() -> int:
    missing = missing_tools()
    if missing:
        print(f"skipped: needs {', '.join(missing)}")
        return 0
    began = time.perf_counter()
    load_before = loadavg()
    WORK.mkdir(parents=True, exist_ok=True)
    unmount(PACKED / "root")
    unmount(MNT)   # left by an interrupted run
    binary = build_slowfs()
    image = build_envs()["inputs"]
    built = time.perf_counter() - began
    rows: list[dict[str, Any]] = []
    staged: dict[int, tuple[Path, float, int]] = {}
    for latency_us in LATENCIES_US:
        for way in WAYS:
            for n in RANKS:
                rows.append(measure(binary, way, n, latency_us, staged))
                table(rows[-1:])
    shutil.rmtree(WORK / "local", ignore_errors=True)
    table(rows)

    def at(way: str) -> float:
        return next(r["all_imported_s"] for r in rows if r["way"] == way and r["ranks"] == 32
                    and r["latency_ms"] == 1.0) or float("nan")
    targets = [target(f"32 ranks, 1 ms: unpacked / {w}", at("unpacked") / at(w), 5, "x", at_least=True)
               for w in ("packed", "staged")]
    data = {"slowfs": {"slots": SLOTS, "latencies_ms": [x / 1000 for x in LATENCIES_US]}, "rows": rows,
            "container": "left out: the local site uses no container image",
            "packed_image": {k: image.get(k) for k in ("format", "mksquashfs", "mount")},
            "build_s": round(built, 1), "total_s": round(time.perf_counter() - began, 1)}
    path = write("startup", data, targets, load_before)
    print(f"built/checked envs in {built:.0f} s; whole benchmark {data['total_s']:.0f} s; results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
