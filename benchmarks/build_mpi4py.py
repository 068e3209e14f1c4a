"""mpi4py from its sdist on the `local` site: cold build, no-op re-run, install from the build cache.

    python benchmarks/build_mpi4py.py [--runs N]

Everything goes to a fresh temporary directory (source cache, build cache, prefixes, logs), so
the cold build really starts from nothing (the sdist is downloaded). The no-op re-run and the
cached install (into fresh prefixes) are repeated ``--runs`` times; the table shows medians.
Then builds the same sdist the naive way, ``MPICC=mpicc pip install --no-deps --no-cache-dir
--target DIR mpi4py-4.1.2.tar.gz`` with the same interpreter. Targets: the no-op re-run and the
cached install each under 5% of the cold build; the cold build (which also downloads, verifies,
stamps and runs two checks) no slower than the naive pip build: compared by CPU time (user + system
of all processes), which a shared machine's changing load distorts far less than wall time (one
run of each, minutes apart).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, loadavg, summary, target, write

TARGET = 0.05


def children_cpu() -> float:
    """User + system CPU seconds of the finished child processes (and theirs) so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def invoke(*args: str, env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "invoke", *args], cwd=ROOT, env={**os.environ, **env}, text=True,
                         capture_output=True)
    took = time.perf_counter() - start
    if out.returncode != 0:
        sys.exit(f"invoke {' '.join(args)} failed:\n{out.stdout[-4000:]}\n{out.stderr[-2000:]}")
    return took, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="repeats of the no-op and cached-install runs")
    opts = parser.parse_args()
    load_before = os.getloadavg()
    load_text = loadavg()
    with tempfile.TemporaryDirectory(prefix="sitestack-bench-mpi4py-") as tmp:
        root = Path(tmp)
        env = {"SITESTACK_BUILD_CACHE": str(root / "build-cache"), "SITESTACK_SOURCE_CACHE": str(root / "sources"),
               "SITESTACK_LOG_DIR": str(root / "logs"), "SITESTACK_PROGRESS_INTERVAL": "0"}
        first = ["build-mpi4py", "--site", "local", "--prefix", str(root / "p0")]
        cpu_before = children_cpu()
        cold, out = invoke(*first, env=env)
        cold_cpu = children_cpu() - cpu_before
        assert "changed  mpi4py@4.1.2" in out.stdout, out.stdout
        stamp = json.loads((root / "p0" / "mpi4py" / "4.1.2" / ".sitestack" / "install.json").read_text())
        sdist = next((root / "sources").rglob("mpi4py-4.1.2.tar.gz"))
        cpu_before = children_cpu()
        start = time.perf_counter()
        subprocess.run(["python3", "-m", "pip",  # the local site's facts.python.executable, as the build uses
                        "install", "--no-deps", "--no-cache-dir", "--target", str(root / "naive"), str(sdist)],
                       env={**os.environ, "MPICC": "mpicc"}, check=True, capture_output=True)
        naive = time.perf_counter() - start
        naive_cpu = children_cpu() - cpu_before
        noop = []
        for _ in range(opts.runs):
            took, out = invoke(*first, env=env)
            assert "ok       mpi4py@4.1.2" in out.stdout, out.stdout
            noop.append(took)
        cached = []
        for i in range(opts.runs):
            took, out = invoke("build-mpi4py", "--site", "local", "--prefix", str(root / f"p{i + 1}"), env=env)
            record = json.loads((root / f"p{i + 1}" / "mpi4py" / "4.1.2" / ".sitestack" / "install.json").read_text())
            assert record["artefact"]["from_cache"], "expected an install from the build cache"
            cached.append(took)
    rows = [("cold build (download, wheel, install, checks)", {"median_s": cold, "min_s": cold, "max_s": cold, "runs": 1}),
            ("naive pip install of the same sdist", {"median_s": naive, "min_s": naive, "max_s": naive, "runs": 1}),
            ("no-op re-run (stamp + probes)", summary(noop)),
            ("install from the build cache (new prefix)", summary(cached))]
    print(f"{'mpi4py 4.1.2 on local (MPICH)':<48} {'median':>9} {'min':>9} {'max':>9} {'of cold':>8}")
    for name, s in rows:
        print(f"{name:<48} {s['median_s']:>8.2f}s {s['min_s']:>8.2f}s {s['max_s']:>8.2f}s {s['median_s'] / cold:>7.1%}")
    verdict = {k: rows[i][1]["median_s"] / cold < TARGET for i, k in ((2, "noop_under_5pct"), (3, "cached_under_5pct"))}
    print(f"target: no-op and cached install each under {TARGET:.0%} of the cold build: "
          f"{'met' if all(verdict.values()) else 'NOT met'}")
    path = write("build_mpi4py", {
        "what": "invoke build-mpi4py --site local: whole CLI processes, wall time",
        "cold_build_s": cold, "noop": summary(noop), "cached_install": summary(cached),
        "noop_fraction": rows[2][1]["median_s"] / cold, "cached_fraction": rows[3][1]["median_s"] / cold,
        "naive_pip_s": naive, "cold_over_naive": cold / naive, "cold_cpu_s": cold_cpu, "naive_cpu_s": naive_cpu,
        "cold_over_naive_cpu": cold_cpu / naive_cpu,
        "target_fraction": TARGET, "targets_met": verdict,
        "tool_seconds_cold": stamp["installed"]["seconds"],
        "load_average_before": load_before, "load_average_after": os.getloadavg(),
    }, [target("cold build / naive pip build, CPU time", cold_cpu / naive_cpu, 1.0, "x"),
        target("cold build / naive pip build, wall (one each)", cold / naive, 1.0, "x"),
        target("no-op re-run / cold build", rows[2][1]["median_s"] / cold, TARGET, "x"),
        target("install from the cache / cold build", rows[3][1]["median_s"] / cold, TARGET, "x")], load_text)
    print(f"results: {path}")


if __name__ == "__main__":
    main()
