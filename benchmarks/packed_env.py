"""Packed environments (`invoke pack-env`): what packing saves on the file system, and what it costs
at start-up, with the image and mount options before and after, side by side.

Packs `torch==2.13.0` (CPU) for the local site (no container: the wrappers mount the image), then reports
(a) the number of files of the environment unpacked (what a venv puts on a parallel file system)
    against the number of files in the packed prefix (the reason the feature exists:
    https://docs.lumi-supercomputer.eu/software/installing/container-wrapper/);
(b) `python -c "import torch"` from the same environment: unpacked in a plain directory, and packed,
    for each way of packing and mounting it: the old image (gzip, 128K blocks) with the high-level
    squashfuse (what pack-env did before), the same image with squashfuse_ll, the new image (lz4, 128K
    blocks) through the wrapper (squashfuse_ll), with the high-level squashfuse and its cache options
    (the wrapper's fallback), and with the kernel's squashfs (`mount -o loop`, root only: the floor,
    which a site's users cannot reach). For each: the first start after the mount (FUSE's caches cold,
    the image file in the page cache) and the median of later starts: wall time, the CPU time of the
    Python process, and the CPU time of the FUSE daemon (what a shared node pays besides).
All with a warm page cache on this machine's local disk. Needs squashfs-tools, squashfuse (with
squashfuse_ll) and FUSE; says so and exits 0 where they are missing.
"""

from __future__ import annotations

import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import ROOT, loadavg, target, write

from sitestack.installs.squashfs_env import COMPRESSION, MKSQUASHFS_OPTIONS, MOUNTERS

REPEAT = 5
IMPORT = ["-c", "import torch"]
#: The image pack-env made before: mksquashfs's defaults (gzip, 128K blocks).
OLD_OPTIONS = MKSQUASHFS_OPTIONS
TICK = os.sysconf("SC_CLK_TCK")


def count(path: Path) -> int:
    """Files and directories under ``path``, not counting what is mounted below it (the image)."""
    total = 0
    for top, dirs, files in os.walk(path):
        dirs[:] = [d for d in dirs if not os.path.ismount(os.path.join(top, d))]
        total += len(dirs) + len(files)
    return total


def daemon_cpu(pid: int | None) -> float:
    """User + system CPU seconds of process ``pid`` so far (0 for none)."""
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def start(argv: list[str], daemon: int | None) -> tuple[float, float, float]:
    """(wall, CPU of the process, CPU of the FUSE daemon) of one run of ``argv``."""
    before, d0 = resource.getrusage(resource.RUSAGE_CHILDREN), daemon_cpu(daemon)
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, stderr=subprocess.DEVNULL)  # torch warns that numpy is absent
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, daemon_cpu(daemon) - d0


def summary_of(first: tuple[float, float, float], later: list[tuple[float, float, float]]) -> dict[str, Any]:
    """The first start and the medians of the later ones."""
    med = [statistics.median(x[i] for x in later) for i in range(3)]
    return {"first_wall_s": round(first[0], 3), "first_daemon_cpu_s": round(first[2], 3),
            "wall_s": round(med[0], 3), "cpu_s": round(med[1], 3), "daemon_cpu_s": round(med[2], 3),
            "total_cpu_s": round(med[1] + med[2], 3), "runs": len(later)}


def daemon_of(image: Path, point: Path) -> int | None:
    """The pid of the FUSE daemon serving ``image`` at ``point`` (started by a wrapper)."""
    for entry in Path("/proc").iterdir():
        try:
            words = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if entry.name.isdigit() and {os.fsencode(str(image)), os.fsencode(str(point))} <= set(words) \
                and b"squashfuse" in words[0]:
            return int(entry.name)
    return None


def mount(image: Path, point: Path, mounter: tuple[str, ...] | None) -> subprocess.Popen[bytes] | None | bool:
    """``image`` mounted at ``point`` by ``mounter`` in the foreground (its process), or by the kernel's
    squashfs for None (True; False where it cannot: it needs root)."""
    point.mkdir(parents=True)
    if mounter is None:
        return subprocess.run(["mount", "-t", "squashfs", "-o", "loop,ro", str(image), str(point)],
                              capture_output=True).returncode == 0
    daemon = subprocess.Popen([*mounter, "-f", str(image), str(point)])
    for _ in range(200):
        if os.path.ismount(point):
            break
        time.sleep(0.05)
    return daemon


def interleaved(ways: dict[str, tuple[list[str], int | None]]) -> dict[str, Any]:
    """Each way's first start, then :data:`REPEAT` rounds of one start of every way (so that a load
    that changes meanwhile falls on all of them alike)."""
    firsts = {name: start(argv, pid) for name, (argv, pid) in ways.items()}
    later: dict[str, list[tuple[float, float, float]]] = {name: [] for name in ways}
    for _ in range(REPEAT):
        for name, (argv, pid) in ways.items():
            later[name].append(start(argv, pid))
    return {name: summary_of(firsts[name], later[name]) for name in ways}


def pack(root: Path) -> tuple[Path, float]:
    """``invoke pack-env`` of torch into ``root``: (the environment's dest, seconds it took)."""
    req = root / "requirements.txt"
    req.write_text("torch==2.13.0\n")
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "invoke", "pack-env", "--site", "local", "--name", "torch",
                          "--requirements", str(req), "--prefix", str(root / "prefix")], cwd=ROOT, capture_output=True,
                         text=True, env={**os.environ, "SITESTACK_LOG_DIR": str(root / "logs")})
    if out.returncode != 0:
        raise SystemExit(out.stdout + out.stderr)
    return root / "prefix" / "envs" / "torch", time.perf_counter() - t0


def mksquashfs(source: Path, image: Path, options: tuple[str, ...]) -> float:
    """Seconds ``mksquashfs`` takes to pack ``source`` into ``image``."""
    t0 = time.perf_counter()
    subprocess.run(["mksquashfs", str(source), str(image), *options], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def measure(root: Path, dest: Path) -> dict[str, Any]:
    """Every way's start-up figures (see the module's docstring)."""
    new_image, point = (dest / "env.sqfs").resolve(), (dest / "root").resolve()
    unpacked, old_image = root / "unpacked", root / "old.sqfs"
    subprocess.run(["unsquashfs", "-q", "-n", "-d", str(unpacked), str(new_image)], check=True,
                   stdout=subprocess.DEVNULL)
    built = {"old": round(mksquashfs(unpacked, old_image, OLD_OPTIONS), 1)}
    low, high = MOUNTERS
    # a venv runs from wherever it is mounted (bin/python finds pyvenv.cfg beside it), so every way
    # gets a mount point of its own and all are measured together
    plan = {"before: gzip + squashfuse": (old_image, ("squashfuse",)), "gzip + squashfuse_ll": (old_image, low),
            "lz4 + squashfuse (fallback options)": (new_image, high), "lz4 + kernel squashfs (floor)": (new_image, None)}
    ways: dict[str, tuple[list[str], int | None]] = {"unpacked": ([str(unpacked / "bin" / "python"), *IMPORT], None)}
    mounted: list[tuple[Path, Any]] = []
    try:
        for number, (name, (image, mounter)) in enumerate(plan.items()):
            at = root / "mnt" / str(number)
            how = mount(image, at, mounter)
            if how is False:
                continue
            mounted.append((at, how))
            ways[name] = ([str(at / "bin" / "python"), *IMPORT], how.pid if isinstance(how, subprocess.Popen) else None)
        wrapped = [str(dest / "bin" / "python"), *IMPORT]
        first = start(wrapped, None)   # the wrapper mounts the image: all the daemon's CPU so far is this start's
        daemon = daemon_of(new_image, point)
        first_daemon = daemon_cpu(daemon)
        mounted.append((point, None))
        ways["after: lz4 + squashfuse_ll, wrapper"] = (wrapped, daemon)
        figures = interleaved(ways)
        after = figures["after: lz4 + squashfuse_ll, wrapper"]
        after.update(first_wall_s=round(first[0], 3), first_daemon_cpu_s=round(first_daemon, 3))
    finally:
        for at, how in reversed(mounted):
            subprocess.run(["umount", str(at)] if how is True else ["fusermount3", "-u", "-z", str(at)],
                           capture_output=True)
            if isinstance(how, subprocess.Popen):
                how.wait()
    if daemon is None:
        raise SystemExit(f"no FUSE daemon found serving {new_image}")
    return {"ways": figures,
            "image_bytes": {"old (gzip)": old_image.stat().st_size, "new (lz4)": new_image.stat().st_size},
            "mksquashfs_s": built, "files_unpacked": count(unpacked)}


def targets_of(data: dict[str, Any]) -> list[dict[str, Any]]:
    ways = data["ways"]
    plain, after, before = ways["unpacked"], ways["after: lz4 + squashfuse_ll, wrapper"], ways["before: gzip + squashfuse"]
    return [target("files in the packed prefix", data["files_in_packed_prefix"], 60, ""),
            # with the page cache warm a packed start reads the same pages as an unpacked one; what is
            # left is FUSE's first lookup of each file and the wrapper's bash (a few ms)
            target("packed/unpacked import CPU (process + daemon)", after["total_cpu_s"] / plain["total_cpu_s"], 1.1, "x"),
            target("packed/unpacked import wall", after["wall_s"] / plain["wall_s"], 1.25, "x"),
            target("first start's daemon CPU, after/before", after["first_daemon_cpu_s"] / before["first_daemon_cpu_s"],
                   0.5, "x")]


def main() -> int:
    missing = [t for t in ("mksquashfs", "unsquashfs", "squashfuse", "squashfuse_ll", "fusermount3") if not shutil.which(t)]
    if missing or not os.path.exists("/dev/fuse"):
        print(f"skipped: needs {', '.join(missing) or '/dev/fuse'}")
        return 0
    load_before = loadavg()
    with tempfile.TemporaryDirectory(prefix="bench-packed-") as tmp:
        dest, pack_s = pack(Path(tmp))
        data = measure(Path(tmp), dest)
        data["files_in_packed_prefix"] = count(Path(tmp) / "prefix")
        data["mksquashfs_s"]["pack-env in all"] = round(pack_s, 1)
        data["options"] = {"before": list(OLD_OPTIONS), "after": list(MKSQUASHFS_OPTIONS + COMPRESSION["squashfuse"])}
        data["note"] = ("warm page cache, local disk; first: the first start after the mount; the others: "
                        f"medians of {REPEAT}; daemon: the FUSE daemon's CPU")
    path = write("packed_env", data, targets_of(data), load_before)
    print(f"files: {data['files_unpacked']} unpacked -> {data['files_in_packed_prefix']} in the packed prefix; "
          f"image bytes {data['image_bytes']}; pack seconds {data['mksquashfs_s']}")
    print(f"{'import torch':<40} {'first':>7} {'1st dmn':>7} {'wall':>7} {'cpu':>7} {'daemon':>7}")
    for name, w in data["ways"].items():
        print(f"{name:<40} {w['first_wall_s']:7.2f} {w.get('first_daemon_cpu_s', 0):7.2f} {w['wall_s']:7.2f} "
              f"{w['cpu_s']:7.2f} {w['daemon_cpu_s']:7.2f}")
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
