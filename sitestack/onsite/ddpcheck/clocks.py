"""At the barrier that follows init_process_group: each rank's wall clock against rank 0's (skew), and
how long after the first rank each started (a late start), both named as warnings by rank and host.

No deadline compares wall clocks across hosts: each rank's watchdog counts on its own monotonic
clock (:func:`.rank_progress.monotonic_deadline`), and here, where the skew is measured, the job's
shared deadline ($SITESTACK_DEADLINE, on the clock of the host that ran the batch script, where
rank 0 runs) is moved onto this rank's monotonic clock, so a rank whose clock is a minute ahead
neither ends early nor calls a healthy run a hang."""

from __future__ import annotations

import time
from typing import Any

from .checks import PROCESS_GROUP
from .state import Run
from .verdicts import PASSED

#: Seconds of clock difference named as skew: NTP keeps a cluster's clocks within milliseconds; the
#: measurement itself (the spread of the ranks leaving one barrier) is well under a second.
SKEW_NAMED = 2.0
#: Seconds after the first rank that a rank may start before its start is named as late: the launcher
#: starts every rank within a second or two, a loaded node's Python start-up within a few more.
LATE_NAMED = 10.0


def clocks_at_barrier(run: Run) -> None:
    """Measure every rank's clock and start at one barrier; correct this rank's deadline; rank 0 names
    the skewed and the late ranks in the process-group check (a warning: the run goes on)."""
    if run.info.world_size < 2:
        return
    run.barrier()
    mine = {"rank": run.info.rank, "host": run.host, "wall": time.time(), "age": time.monotonic() - run.started_mono}
    rows = run.all_gather(mine)
    skew = mine["wall"] - rows[0]["wall"]
    if run.shared_deadline is not None:
        # the shared deadline is on rank 0's clock: on this rank's, it is ``skew`` later
        run.deadline = time.monotonic() + (run.shared_deadline + skew - time.time())
        if run.progress is not None:
            run.progress.data["deadline_mono"] = run.deadline  # the watchdog, on this host, counts to it
            run.progress.save()
    warnings = skewed(rows) + late(rows)
    check = run.checks[PROCESS_GROUP.name]
    check.details["clocks"] = [{"rank": r["rank"], "host": r["host"], "skew_s": round(r["wall"] - rows[0]["wall"], 3),
                                "started_after_s": round(max(x["age"] for x in rows) - r["age"], 3)} for r in rows]
    if warnings and check.status == PASSED:
        check.summary = f"warning: {'; '.join(warnings)}; {check.summary}"


def skewed(rows: list[dict[str, Any]]) -> list[str]:
    """The ranks whose wall clock differs from rank 0's by :data:`SKEW_NAMED` or more, in words."""
    base = rows[0]
    out = []
    for r in rows[1:]:
        skew = r["wall"] - base["wall"]
        if abs(skew) >= SKEW_NAMED:
            out.append(f"clock skew: rank {r['rank']} on {r['host']}'s clock is {abs(skew):.1f}s "
                       f"{'ahead of' if skew > 0 else 'behind'} rank {base['rank']}'s on {base['host']} (NTP/chrony not "
                       "in step there: timestamps in its logs and files are off; the job's deadlines do not use it)")
    return out


def late(rows: list[dict[str, Any]]) -> list[str]:
    """The ranks that started :data:`LATE_NAMED` seconds or more after the first, with their delay."""
    first = max(r["age"] for r in rows)  # the longest-running rank started first
    return [f"late start: rank {r['rank']} on {r['host']} started {first - r['age']:.1f}s after the first rank "
            "(a slow node, a site hook or a launcher that starts ranks in turn: the others waited for it)"
            for r in rows if first - r["age"] >= LATE_NAMED]
