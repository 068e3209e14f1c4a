"""Helpers shared by the benchmark scripts: timing, the machine's load, targets and results.

Each script measures, prints a table and calls :func:`write` with its figures and its *targets*
(:func:`target`): ``invoke benchmark`` prints every script's targets together at the end, with the
load of the machine before and after (timings on a shared machine mean little without it).
"""

from __future__ import annotations

import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
sys.path.insert(0, str(ROOT))

#: Long-lived benchmark state (a provisioned prefix, the Ansible venv): kept between runs.
BENCH_DIR = Path(os.environ.get("SITESTACK_BENCH_DIR") or Path.home() / ".cache" / "sitestack" / "bench")


def timed(fn: Callable[[], object], repeat: int) -> list[float]:
    """Wall times of ``repeat`` calls of ``fn``."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def timed_process(argv: Sequence[str], repeat: int, *, cwd: Path = ROOT, env: dict[str, str] | None = None,
                  check: bool = True) -> tuple[list[float], list[float]]:
    """(wall times, CPU times) of ``repeat`` runs of the command ``argv`` (CPU: user + system of it and
    its children, which a loaded machine inflates less than wall time)."""
    walls, cpus = [], []
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        done = subprocess.run(list(argv), cwd=cwd, env=env, capture_output=True, text=True)
        walls.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return walls, cpus


def summary(times: list[float]) -> dict[str, float]:
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times), "runs": len(times)}


def loadavg() -> str:
    """The 1, 5 and 15 minute load averages (``/proc/loadavg``)."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def target(name: str, value: float, limit: float, unit: str = "s", *, at_least: bool = False) -> dict[str, Any]:
    """A goal: ``value`` at most ``limit`` (``at_least``: at least)."""
    met = value >= limit if at_least else value <= limit
    return {"name": name, "value": value, "limit": limit, "unit": unit, "at_least": at_least, "met": met}


def show_target(t: dict[str, Any]) -> str:
    op = ">=" if t["at_least"] else "<="
    return (f"{t['name']:<48} {t['value']:10.3f} {t['unit']:<2} (target {op} {t['limit']:g} {t['unit']}: "
            f"{'met' if t['met'] else 'MISSED'})")


def write(name: str, data: dict[str, Any], targets: Sequence[dict[str, Any]] = (), load_before: str = "") -> Path:
    RESULTS.mkdir(exist_ok=True)
    data = {"benchmark": name, "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                           "platform": platform.platform()},
            "load": {"before": load_before, "after": loadavg()}, "targets": list(targets), **data}
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    for t in targets:
        print("  " + show_target(t))
    print(f"  load average before {load_before or '?'}, after {data['load']['after']}")
    return path


def sitestack_env(**extra: str) -> dict[str, str]:
    """The environment of a sitestack CLI run from the checkout, as a user's shell gives it: without
    ``PYTHONDONTWRITEBYTECODE`` (a harness may set it; every run would compile sitestack's modules
    again, about 0.1 s of a no-op, which no user pays after the first run)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPATH": str(ROOT), **extra}
