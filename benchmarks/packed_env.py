"""Packed environments (`invoke pack-env`): what packing saves on the file system, and what it costs
at start-up.

Packs `torch==2.13.0` (CPU) for the local site (no container: the wrappers mount the image with
squashfuse), then reports
(a) the number of files of the environment unpacked (what a venv puts on a parallel file system)
    against the number of files in the packed prefix (the reason the feature exists:
    https://docs.lumi-supercomputer.eu/software/installing/container-wrapper/);
(b) the wall time of `python -c "import torch"` through the wrapper (image mounted) and with the
    same environment unpacked into a plain directory, both with a warm page cache (this machine's
    local disk; on Lustre the unpacked start-up pays a metadata round trip per file).
Needs squashfs-tools and squashfuse (and FUSE); says so and exits 0 where they are missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import ROOT, loadavg, summary, target, timed, write

REPEAT = 5
IMPORT = ["-c", "import torch"]


def count(path: Path) -> int:
    """Files and directories under ``path``, not counting what is mounted below it (the image)."""
    total = 0
    for top, dirs, files in os.walk(path):
        dirs[:] = [d for d in dirs if not os.path.ismount(os.path.join(top, d))]
        total += len(dirs) + len(files)
    return total


def main() -> int:
    missing = [t for t in ("mksquashfs", "unsquashfs", "squashfuse", "fusermount3") if not shutil.which(t)]
    if missing or not os.path.exists("/dev/fuse"):
        print(f"skipped: needs {', '.join(missing) or '/dev/fuse'}")
        return 0
    load_before = loadavg()
    with tempfile.TemporaryDirectory(prefix="bench-packed-") as tmp:
        root = Path(tmp)
        req = root / "requirements.txt"
        req.write_text("torch==2.13.0\n")
        prefix = root / "prefix"
        out = subprocess.run([sys.executable, "-m", "invoke", "pack-env", "--site", "local", "--name", "torch",
                              "--requirements", str(req), "--prefix", str(prefix)], cwd=ROOT, capture_output=True,
                             text=True, env={**os.environ, "SITESTACK_LOG_DIR": str(root / "logs")})
        if out.returncode != 0:
            print(out.stdout + out.stderr)
            return 1
        dest = prefix / "envs" / "torch"
        unpacked = root / "unpacked"
        subprocess.run(["unsquashfs", "-q", "-n", "-d", str(unpacked), str(dest / "env.sqfs")], check=True,
                       stdout=subprocess.DEVNULL)
        try:
            wrapped = [str(dest / "bin" / "python"), *IMPORT]
            plain = [str(unpacked / "bin" / "python"), *IMPORT]
            quiet = {"check": True, "stderr": subprocess.DEVNULL}  # torch warns that numpy is absent
            subprocess.run(wrapped, **quiet)   # mounts the image (once per node) and warms the cache
            subprocess.run(plain, **quiet)
            packed_times = timed(lambda: subprocess.run(wrapped, **quiet), REPEAT)
            plain_times = timed(lambda: subprocess.run(plain, **quiet), REPEAT)
        finally:
            mount = (dest / "root").resolve()
            subprocess.run(["fusermount3", "-u", "-z", str(mount)], capture_output=True)
        data = {
            "files_unpacked": count(unpacked),
            "files_in_packed_prefix": count(prefix),
            "image_bytes": (dest / "env.sqfs").stat().st_size,
            "import_torch_packed": summary(packed_times),
            "import_torch_unpacked": summary(plain_times),
            "note": "warm page cache, local disk; the packed run includes the wrapper's bash and mountpoint check",
        }
    path = write("packed_env", data, [target("files in the packed prefix", data["files_in_packed_prefix"], 60, "")],
                 load_before)
    print(f"files: {data['files_unpacked']} unpacked -> {data['files_in_packed_prefix']} in the packed prefix "
          f"(image {data['image_bytes'] / 1e6:.0f} MB)")
    print(f"import torch: packed {data['import_torch_packed']['median_s']:.2f}s, "
          f"unpacked {data['import_torch_unpacked']['median_s']:.2f}s (median of {REPEAT})")
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
