"""Helpers shared by the benchmark scripts: timing and writing results."""

from __future__ import annotations

import json
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
sys.path.insert(0, str(ROOT))


def timed(fn, repeat: int) -> list[float]:
    """Wall times of ``repeat`` calls of ``fn``."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def summary(times: list[float]) -> dict[str, float]:
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times), "runs": len(times)}


def write(name: str, data: dict) -> Path:
    RESULTS.mkdir(exist_ok=True)
    data = {"benchmark": name, "machine": {"cpus": __import__("os").cpu_count(), "python": platform.python_version(),
                                           "platform": platform.platform()}, **data}
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path
