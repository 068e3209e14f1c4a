"""Regression alarms: a new run compared with the site's recent healthy runs of the same stack and layout.

Pure functions of history records (:mod:`sitestack.onsite.history`). The healthy runs are the last
``window`` validation runs that passed, with the same stack digest (the stack's generation) and the
same layout (nodes, world size, launcher, backend, device), started before the new run, less those
that were themselves a regression (a recorded WARN or FAIL). For each metric -- busbw at the
reference size and the slowest rank's compute rate as the compute check judged it (on a CPU, on the
rank's own CPU time: another process on the machine does not lower it, a quota or a stop does;
higher is better), the start-up time (lower is better) -- the new value is compared with the healthy
runs' own spread, so noise they show is no alarm:

- spread = the largest of: half the healthy values' range, 3 x 1.4826 x their median absolute
  deviation (three standard deviations of a normal sample, estimated robustly: one wild run does not
  widen it much), and ``floor`` x the median (runs closer than a few percent agree by chance);
- WARN when the new value is worse than the median by more than the spread;
- FAIL when, beyond the spread, it is also worse than the *worst* healthy run by ``fail`` (a
  fraction: -0.3 is 30%) or more: a value the healthy runs reached themselves, or nearly, is noise of
  this machine, not a regression (healthy busbw 0.68-0.72 GB/s and one run at 0.3 beside a busy
  process: median 0.7, spread 0.21, WARN below 0.49, FAIL below 0.21);
- busbw and start-up (timed by the clock) of a run whose ranks waited for a CPU ``CONTENDED`` (0.1) s
  per second or more while they were timed (``cpu_waited``): a FAIL is a WARN, said so (gloo on a CPU: the allreduce
  is CPU work, and a process beside the run lowered busbw 4-10x on 2 cores and nearly doubled the
  start-up; what the stack reaches shows in an idle run, and the bandwidth check's own floor still
  catches a broken one);
- unknown, said so, with fewer than ``min_runs`` healthy runs that measured the metric.

Each WARN or FAIL names the metric, the values, and what changed in the recorded toolchain since
the last healthy run (``nothing in the recorded toolchain changed`` otherwise).

Whatever the status, a run whose host changed since the last passing run of its stack and layout
says what changed and what that did to busbw (:func:`since_last_pass`: ``changed since the last
passing run ID: libfabric 1.15.2.0 -> 1.20.1; busbw -38% vs the last passing run``): the job's
recorded toolchain and the fingerprint of the host it was submitted from (``invoke validate
--if-changed``, docs/validation.md).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sitestack.model.validation_facts import Regression
from sitestack.onsite.fingerprint import KEYS as FINGERPRINT_KEYS
from sitestack.onsite.history import normalise, toolchain_changes

#: The metrics compared: key in the record's ``metrics``, name, unit, whether higher is better.
METRICS = (("busbw_gbs", "busbw", "GB/s", True), ("compute_judged_min_gflops", "compute (slowest rank)", "GFLOPS", True),
           ("startup_s", "start-up", "s", False))
LAYOUT_KEYS = ("nodes", "world_size", "launcher", "backend", "device")
#: Seconds per second the ranks waited for a CPU while busbw was timed from which a drop is put down to
#: other processes (a WARN, said so), not to the stack: the compute check calls 0.3 a shared CPU.
CONTENDED = 0.1
#: The metrics timed by the clock, which a contended machine lowers (the compute rate compared is on CPU time).
BY_THE_CLOCK = ("busbw_gbs", "startup_s")
#: The order of the statuses, worst last.
ORDER = ("unknown", "ok", "warn", "fail")


@dataclass(frozen=True)
class Finding:
    """One metric's comparison."""

    metric: str
    status: str  # ok | warn | fail | unknown
    value: float | None = None
    median: float | None = None
    spread: float | None = None
    runs: int = 0
    note: str = ""  # why a drop beyond the spread is a WARN, not a FAIL

    @property
    def change(self) -> float | None:
        """The new value against the median, as a fraction (negative: lower)."""
        if self.value is None or not self.median:
            return None
        return self.value / self.median - 1


def same_kind(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two records are of the same stack (digest) and layout."""
    layout_a, layout_b = a.get("layout") or {}, b.get("layout") or {}
    return ((a.get("stack") or {}).get("digest") == (b.get("stack") or {}).get("digest")
            and all(layout_a.get(k) == layout_b.get(k) for k in LAYOUT_KEYS))


def healthy_runs(new: Mapping[str, Any], history: Sequence[Mapping[str, Any]], window: int) -> list[Mapping[str, Any]]:
    """The last ``window`` passed validation runs of ``new``'s stack and layout that started before it (oldest
    first), less those that were themselves a regression (their recorded ``regression.status`` warn or
    fail): a lasting drop must not become the baseline it is judged against once it fills half the window.
    ``history`` is read as :func:`sitestack.onsite.history.normalise` makes it (a record it refuses is
    left out)."""
    started = _start(new)
    records: list[Mapping[str, Any]] = [r for r in (normalise(h) for h in history) if r is not None]
    runs = [r for r in records if r["kind"] == "validation" and r["verdict"] == "passed"
            and (r["regression"] or {}).get("status") not in ("warn", "fail")
            and r["id"] != new.get("id") and r["started"] < started and same_kind(r, new)]
    return runs[-window:]


def _start(record: Mapping[str, Any]) -> float:
    started = record.get("started")
    return float(started) if isinstance(started, int | float) and not isinstance(started, bool) else 0.0


def spread(values: Sequence[float], floor: float) -> float:
    """How far from the median a value may fall by chance (see the module's docstring)."""
    median = statistics.median(values)
    half_range = (max(values) - min(values)) / 2
    mad = statistics.median(abs(v - median) for v in values)
    return max(half_range, 3 * 1.4826 * mad, floor * abs(median))


def contended(key: str, metrics: Mapping[str, Any]) -> str:
    """Why the run's ``key`` measured other processes rather than the stack ("" when it did not): a
    metric timed by the clock (busbw, start-up) in a run whose ranks waited for a CPU :data:`CONTENDED`
    s per second or more while they were timed (``cpu_waited``: the compute check's windows and the
    bandwidth sweep; start-up is not timed so, and the machine's load while the run was timed stands for
    it). Gloo on a CPU: the allreduce is CPU work, and busbw fell 4-10x beside one busy process on 2
    cores; start-up, torch's import, doubled."""
    waited = metrics.get("cpu_waited")
    if key not in BY_THE_CLOCK or not isinstance(waited, (int, float)) or waited < CONTENDED:
        return ""
    return f"the ranks waited for a CPU {waited:.2f} s per second while timed (other processes): not a FAIL"


def judge_metric(key: str, higher: bool, value: Any, runs: Sequence[Mapping[str, Any]], policy: Regression,
                 metrics: Mapping[str, Any] | None = None) -> Finding:
    """One metric of the new run (its ``metrics``) against the healthy runs' values of it."""
    values = [float(v) for v in ((r.get("metrics") or {}).get(key) for r in runs) if isinstance(v, (int, float))]
    if not isinstance(value, (int, float)) or len(values) < policy.min_runs:
        return Finding(key, "unknown", float(value) if isinstance(value, (int, float)) else None, runs=len(values))
    median, width = statistics.median(values), spread(values, policy.floor)
    worse = (median - value) if higher else (value - median)
    status = "ok"
    if worse > width:
        worst = min(values) if higher else max(values)  # the worst a healthy run reached
        beyond = (worst - value) / worst if higher else (value - worst) / worst if worst else 0.0
        status = "fail" if beyond >= -policy.fail else "warn"
    note = contended(key, metrics or {}) if status == "fail" else ""
    return Finding(key, "warn" if note else status, float(value), median, width, len(values), note)


def judge(new: Mapping[str, Any], history: Sequence[Mapping[str, Any]], policy: Regression | None = None) -> dict[str, Any]:
    """The new run's regression report: ``{"status": ok|warn|fail|unknown, "lines": [...], "metrics": {...}}``
    (the record's ``regression``)."""
    policy = policy or Regression()
    runs = healthy_runs(new, history, policy.window)
    metrics = new.get("metrics") or {}
    findings = [judge_metric(key, higher, metrics.get(key), runs, policy, metrics) for key, _, _, higher in METRICS]
    judged = [f for f in findings if f.status != "unknown"]
    status = max((f.status for f in judged), key=ORDER.index, default="unknown")
    lines = [line_of(f) for f in findings if f.status in ("warn", "fail")]
    if not judged:
        lines.append(f"regression: unknown: {len(runs)} healthy run{'s' if len(runs) != 1 else ''} of this stack "
                     f"and layout in the history, {policy.min_runs} needed to compare with")
    elif status == "ok":
        lines.append(f"regression: none: {', '.join(ok_text(f) for f in findings)} (the last {len(runs)} healthy runs)")
    changed = since_last_pass(new, history)
    if status in ("warn", "fail") and runs:
        last = runs[-1]
        changes = host_changes(last, new)
        since = f"regression: since the last healthy run {last.get('id')}"
        lines.append(f"{since}: " + ("; ".join(changes) if changes else "nothing in the recorded toolchain changed"))
        changed = changed if changed and last["id"] not in changed else None  # that run's changes are named already
    if changed:
        lines.insert(len(lines) - 1 if status in ("warn", "fail") and runs else len(lines), changed)
    return {"status": status, "lines": lines,
            "metrics": {f.metric: {"status": f.status, "value": f.value, "median": f.median, "spread": f.spread,
                                   "runs": f.runs} for f in findings}}


def host_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """What changed between two records' hosts: the job's recorded toolchain, then the submitting host's
    fingerprint (each phrase once; one said only of the submitting host is marked so)."""
    changes = toolchain_changes(old.get("toolchain"), new.get("toolchain"))
    if old.get("fingerprint") and new.get("fingerprint"):
        changes += [f"{c} (submitting host)" for c in toolchain_changes(old["fingerprint"], new["fingerprint"],
                                                                       FINGERPRINT_KEYS) if c not in changes]
    return changes


def since_last_pass(new: Mapping[str, Any], history: Sequence[Mapping[str, Any]]) -> str | None:
    """``changed since the last passing run ID: libfabric 1.15.2.0 -> 1.20.1; busbw -38% vs the last passing
    run``: what changed since the last passed validation of ``new``'s stack and layout and how busbw moved
    (where both measured it); None without such a run, or when nothing changed."""
    records = [r for r in (normalise(h) for h in history) if r is not None]
    runs = [r for r in records if r["kind"] == "validation" and r["verdict"] == "passed" and r["id"] != new.get("id")
            and r["started"] < _start(new) and same_kind(r, new)]
    if not runs:
        return None
    last = runs[-1]
    changes = host_changes(last, new)
    if not changes:
        return None
    before, after = (last.get("metrics") or {}).get("busbw_gbs"), (new.get("metrics") or {}).get("busbw_gbs")
    if isinstance(before, (int, float)) and isinstance(after, (int, float)) and before > 0:
        changes.append(f"busbw {after / before - 1:+.0%} vs the last passing run")
    return f"changed since the last passing run {last['id']}: " + "; ".join(changes)


def _name(key: str) -> tuple[str, str]:
    return next((name, unit) for k, name, unit, _ in METRICS if k == key)


def line_of(f: Finding) -> str:
    """``regression WARN: busbw 0.41 GB/s: 38% below the median 0.66 GB/s of 5 healthy runs (spread 0.04)``."""
    name, unit = _name(f.metric)
    change = f.change or 0.0
    direction = "below" if change < 0 else "above"
    return (f"regression {f.status.upper()}: {name} {f.value:.3g} {unit}: {abs(change):.0%} {direction} the median {f.median:.3g} "
            f"{unit} of {f.runs} healthy runs (spread {f.spread:.2g} {unit}){'; ' + f.note if f.note else ''}")


def ok_text(f: Finding) -> str:
    """A metric within the spread, or unknown, in a few words (``busbw 0.71 GB/s (median 0.69)``)."""
    name, unit = _name(f.metric)
    if f.status == "unknown":
        return f"{name} unknown ({f.runs} healthy runs measured it)"
    return f"{name} {f.value:.3g} {unit} (median {f.median:.3g})"
