"""How long a healthy run of this stack takes here, from the site's history (docs/history.md), and
whether a time limit leaves it enough: a limit shorter than that is refused at submit (``invoke
validate``), one shorter than :data:`MARGIN` times it warned of, and a run that reaches a limit
shorter than half a healthy run is named "time limit too short", not a hang (faults.describe_fault)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

#: The variable the guard passes to the ranks (and ``invoke validate`` to the job): the seconds a
#: healthy run took, so a watchdog at the deadline can tell a short limit from a hang.
HEALTHY_VAR = "SITESTACK_HEALTHY_S"
#: The newest passed runs whose durations are looked at.
RECENT = 10
#: A limit below this many times the healthy duration is too short: runs vary, and a loaded node
#: takes longer (half as long again covers the spread of healthy runs the history has shown).
MARGIN = 1.5
#: Without a history: the shortest limit the job itself derives from a --time (validation/jobs.py).
FLOOR = 60


def healthy_seconds(records: Sequence[Mapping[str, Any]]) -> float | None:
    """The median duration of the newest :data:`RECENT` passed validation runs (``ended - started``),
    or None when the history has none."""
    spans = [float(r["ended"]) - float(r["started"]) for r in records
             if r.get("kind") == "validation" and r.get("verdict") == "passed"
             and isinstance(r.get("ended"), (int, float)) and isinstance(r.get("started"), (int, float))
             and float(r["ended"]) > float(r["started"])]
    return round(statistics.median(spans[-RECENT:]), 1) if spans else None


def too_short(limit: float, healthy: float | None, margin: float = MARGIN) -> str | None:
    """Why ``limit`` seconds is too short for a healthy run (less than ``margin`` times it), or None
    (long enough, or nothing known). ``margin`` 1: below the healthy run itself (refused at submit)."""
    if healthy is None or limit >= healthy * margin:
        return None
    times = f"{margin:g}x " if margin != 1 else ""
    return (f"time limit too short: {limit:.0f}s is less than {times}the {healthy:.0f}s a healthy run of this "
            "stack took here (the site's history, median of its newest passed runs)")


def healthy_from_env(env: Mapping[str, str]) -> float | None:
    """:data:`HEALTHY_VAR` as a number of seconds, or None (unset, or not a positive finite number)."""
    try:
        value = float(env.get(HEALTHY_VAR, ""))
    except ValueError:
        return None
    return value if 0 < value < float("inf") else None
