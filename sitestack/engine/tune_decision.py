"""The tuning decision: a sweep job's ``sweep.json`` in, the ``tuning.json`` document out.

Pure functions of their arguments (no host, no clock): :func:`check_sweep` refuses a document that is
not a sweep, :func:`decide` summarises every point and chooses. The rule (docs/tuning.md):

- the metrics are the allreduce busbw at each message size (higher is better) and the DDP step time
  (lower is better), each a list of samples, one per repeat;
- the default is measured first and last; its samples are pooled, so a drift during the sweep widens
  the default's range instead of passing for a candidate's gain;
- for a point and a metric the *gain* is ``median(point) / median(default) - 1``, inverted for the step
  time, so a positive gain is always better;
- the point *beats* the default on a metric when the gain is at least ``min_gain`` and the samples do
  not overlap (the point's worst sample is better than the default's best); it is *worse* when the
  same holds the other way; anything else is noise;
- a candidate qualifies when it beats the default on at least one metric and is worse on none; per
  variable the qualifying candidate with the largest geometric-mean gain over all metrics is chosen;
  without one the variable stays unset;
- a point that hung, crashed or failed (or was skipped: the job had no time left for it) is recorded
  and dropped, never chosen.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from sitestack.core.errors import InputError
from sitestack.installs.tuned import TUNING_SCHEMA
from sitestack.onsite.ddpcheck.tuneplan import PlanError, check_plan
from sitestack.onsite.report_plot import human_bytes

SWEEP_SCHEMA = "sitestack-sweep/1"
STATUSES = ("ok", "hung", "crashed", "failed", "skipped")
#: The most samples one metric of one point may hold (repeats are at most 100: facts.tuning).
MAX_SAMPLES = 1000
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_SIZE = re.compile(r"[1-9][0-9]{0,11}")  # ASCII digits: str.isdigit() also takes "²", which int() refuses


# -- checking the sweep document ------------------------------------------------------------------------

def _samples(value: Any, where: str, key: str) -> list[float]:
    if not isinstance(value, list) or len(value) > MAX_SAMPLES:
        raise InputError(where, f"a list of at most {MAX_SAMPLES} numbers", key)
    for item in value:
        if isinstance(item, bool) or not isinstance(item, (int, float)) or not math.isfinite(item) or item < 0:
            raise InputError(where, f"{item!r} is not a measurement (a finite number >= 0)", key)
    return [float(v) for v in value]


def _check_point(point: Any, where: str, key: str) -> dict[str, Any]:
    if not isinstance(point, dict):
        raise InputError(where, "not an object", key)
    for field in ("id", "label", "status"):
        if not isinstance(point.get(field), str):
            raise InputError(where, "missing or not a string", f"{key}.{field}")
    if not _ID.fullmatch(point["id"]):
        raise InputError(where, f"{point['id']!r} is not a point id", f"{key}.id")
    if point["status"] not in STATUSES:
        raise InputError(where, f"{point['status']!r} is not one of {', '.join(STATUSES)}", f"{key}.status")
    settings = point.get("settings")
    if not isinstance(settings, dict) or not all(isinstance(k, str) and _NAME.fullmatch(k) and isinstance(v, str)
                                                 for k, v in settings.items()):
        raise InputError(where, "not an object of environment variable names to strings", f"{key}.settings")
    busbw = point.get("busbw_gbs") or {}
    if not isinstance(busbw, dict) or not all(isinstance(k, str) and _SIZE.fullmatch(k) for k in busbw):
        raise InputError(where, "not an object keyed by message sizes in bytes", f"{key}.busbw_gbs")
    checked = {size: _samples(v, where, f"{key}.busbw_gbs.{size}") for size, v in busbw.items()}
    cause = point.get("cause")
    return {**point, "cause": cause if isinstance(cause, str) else None, "busbw_gbs": checked,
            "step_ms": _samples(point.get("step_ms") or [], where, f"{key}.step_ms")}


def check_sweep(doc: Any, where: str) -> dict[str, Any]:
    """``doc`` (a parsed ``sweep.json``; ``where`` names the file) checked: the schema, the points and
    their samples, exactly one default point (no settings). A copy with checked values is returned;
    an :class:`InputError` naming ``where`` and the key otherwise."""
    if not isinstance(doc, dict):
        raise InputError(where, "not a JSON object")
    if doc.get("schema") != SWEEP_SCHEMA:
        raise InputError(where, f"{doc.get('schema')!r} is not {SWEEP_SCHEMA!r}", "schema")
    points = doc.get("points")
    if not isinstance(points, list) or not points:
        raise InputError(where, "no points", "points")
    checked = [_check_point(p, where, f"points[{i}]") for i, p in enumerate(points)]
    ids = [p["id"] for p in checked]
    if len(set(ids)) != len(ids):
        raise InputError(where, "a point id is repeated", "points")
    defaults = [p for p in checked if not p["settings"]]
    if len(defaults) not in (1, 2):
        raise InputError(where, f"{len(defaults)} points have no settings; the default is measured once or twice "
                                "(first and last)", "points")
    plan = doc.get("plan")
    if not isinstance(plan, dict):
        raise InputError(where, "missing or not an object", "plan")
    gain = plan.get("min_gain")
    if isinstance(gain, bool) or not isinstance(gain, (int, float)) or not 0 <= gain <= 1:
        raise InputError(where, f"{gain!r} is not a fraction between 0 and 1", "plan.min_gain")
    for key in ("job_id", "site", "launcher"):
        if doc.get(key) is not None and not isinstance(doc.get(key), str):
            raise InputError(where, "not a string", key)
    return {**doc, "points": checked}


def check_declared(sweep: Mapping[str, Any], where: str) -> None:
    """Every point of a checked ``sweep`` (``where`` names its file) sets only what the plan it ran (its
    ``plan``, checked as the job checks a plan: :func:`~sitestack.onsite.ddpcheck.tuneplan.check_plan`)
    declares: a variable of its ``variables``, to a value one of its points gives it (one printable line).
    What a sweep says was measured is published only where the plan asked for it: a value with a newline,
    or a variable the module was never meant to set, never reaches tuning.json or the history. An
    :class:`InputError` naming the file and the key otherwise."""
    try:
        plan = check_plan(sweep.get("plan"), f"{where}: plan")
    except PlanError as exc:
        raise InputError(where, f"not the plan of a sweep ({exc})", "plan") from None
    candidates: dict[str, set[str]] = {name: set() for name in plan["variables"]}
    for point in plan["points"]:
        for name, value in point["settings"].items():
            candidates[name].add(value)
    for i, point in enumerate(sweep["points"]):
        for name, value in point["settings"].items():
            key = f"points[{i}].settings.{name}"
            if name not in candidates:
                raise InputError(where, "not a variable of the plan the sweep ran (plan.variables)", key)
            if value not in candidates[name]:
                raise InputError(where, f"{value!r} is not a candidate value of {name} in the plan the sweep ran", key)


# -- one point against the default ----------------------------------------------------------------------

def summary(samples: Sequence[float]) -> dict[str, float]:
    """median, min, max and spread ((max - min) / median; 0 where the median is 0) of ``samples``."""
    median = statistics.median(samples)
    low, high = min(samples), max(samples)
    return {"median": median, "min": low, "max": high, "spread": (high - low) / median if median else 0.0}


def metrics(point: Mapping[str, Any]) -> dict[str, tuple[list[float], bool]]:
    """The point's metrics with samples: ``busbw_gbs/<size>`` (higher is better) and ``step_ms`` (lower)."""
    out: dict[str, tuple[list[float], bool]] = {}
    for size in sorted(point.get("busbw_gbs") or {}, key=int):
        if point["busbw_gbs"][size]:
            out[f"busbw_gbs/{size}"] = (point["busbw_gbs"][size], True)
    if point.get("step_ms"):
        out["step_ms"] = (point["step_ms"], False)
    return out


def judge(samples: Sequence[float], base: Sequence[float], higher: bool, min_gain: float) -> tuple[str, float] | None:
    """(verdict, gain) of ``samples`` against the default's ``base``: ``beats``, ``worse`` or ``noise``
    by the module's rule; None where the ratio has no meaning (a median of 0)."""
    mine, theirs = statistics.median(samples), statistics.median(base)
    if mine <= 0 or theirs <= 0:
        return None
    ratio = mine / theirs if higher else theirs / mine    # > 1: better
    if higher:
        apart_better, apart_worse = min(samples) > max(base), max(samples) < min(base)
    else:
        apart_better, apart_worse = max(samples) < min(base), min(samples) > max(base)
    if ratio - 1 >= min_gain and apart_better:
        return "beats", ratio - 1
    if 1 / ratio - 1 >= min_gain and apart_worse:
        return "worse", ratio - 1
    return "noise", ratio - 1


def compare(point: Mapping[str, Any], default: Mapping[str, Any], min_gain: float) -> dict[str, Any]:
    """Per metric both points measured: ``verdicts`` and ``gains``; the point's overall ``verdict``
    (``beats``: better on one metric and worse on none; ``worse``: worse on one, a median of 0 counting
    as worse; ``incomplete``: a metric the default measured is missing; else ``noise``) and
    ``score`` (the geometric-mean gain over the metrics)."""
    base, mine = metrics(default), metrics(point)
    verdicts: dict[str, str] = {}
    gains: dict[str, float] = {}
    for name, (samples, higher) in mine.items():
        if name not in base:
            continue
        judged = judge(samples, base[name][0], higher, min_gain)
        # a median of 0 (nothing moved) has no ratio: it cannot count as a gain, so it counts as worse
        if judged is None:
            verdicts[name] = "worse"
        else:
            verdicts[name], gains[name] = judged
    values = list(verdicts.values())
    # a metric the default measured and the point did not: the point is judged on less, and chosen never
    missing = [name for name in base if name not in mine]
    verdict = ("incomplete" if missing else "worse" if "worse" in values else "beats" if "beats" in values
               else "noise")
    score = math.exp(sum(math.log1p(g) for g in gains.values()) / len(gains)) - 1 if gains else 0.0
    return {"verdicts": verdicts, "gains": gains, "verdict": verdict, "score": score}


def nested(flat: Mapping[str, Any]) -> dict[str, Any]:
    """``{"busbw_gbs/65536": x, "step_ms": y}`` as tuning.json has it: ``{"busbw_gbs": {"65536": x}, "step_ms": y}``."""
    out: dict[str, Any] = {}
    for name, value in flat.items():
        metric, _, size = name.partition("/")
        if size:
            out.setdefault(metric, {})[size] = value
        else:
            out[metric] = value
    return out


# -- the decision -------------------------------------------------------------------------------------------

def metric_words(name: str) -> str:
    """``busbw_gbs/4194304`` -> ``"allreduce busbw at 4 MiB"``; ``step_ms`` -> ``"DDP step"``."""
    metric, _, size = name.partition("/")
    return f"allreduce busbw at {human_bytes(int(size))}" if metric == "busbw_gbs" else "DDP step"


def evidence(point: Mapping[str, Any], default: Mapping[str, Any], judged: Mapping[str, Any], job: str,
             day: str) -> str:
    """One line: the metric the point gained most on, its median against the default's, the change and
    the spread it is beyond; the job and the day."""
    beaten = [n for n, v in judged["verdicts"].items() if v == "beats"]
    name = max(beaten, key=lambda n: judged["gains"][n])
    mine, theirs = metrics(point)[name][0], metrics(default)[name][0]
    a, b = statistics.median(mine), statistics.median(theirs)
    unit = "GB/s" if name.startswith("busbw") else "ms"
    spread = max(summary(mine)["spread"], summary(theirs)["spread"])
    return (f"{metric_words(name)} {a:.3g} {unit} vs {b:.3g} {unit} unset ({a / b - 1:+.0%}, beyond a spread of "
            f"{spread:.0%}); job {job}, {day}")


def _point_record(point: Mapping[str, Any], judged: Mapping[str, Any] | None, verdict: str) -> dict[str, Any]:
    record = {key: point.get(key) for key in ("id", "label", "settings", "status", "cause", "exit_code", "seconds",
                                              "result")}
    record["summary"] = nested({name: summary(samples) for name, (samples, _) in metrics(point).items()})
    record["verdict"] = verdict
    record["verdicts"] = nested(judged["verdicts"]) if judged else {}
    record["gain"] = nested(judged["gains"]) if judged else {}
    return record


def baseline(defaults: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    """The default every candidate is judged against: the samples of every default point that measured
    (the sweep measures it first and last), pooled, so a drift between the two widens its range; the
    first default point as it is when none measured."""
    measured = [p for p in defaults if p["status"] == "ok" and metrics(p)]
    if len(measured) < 2:
        return measured[0] if measured else defaults[0]
    sizes = {size for p in measured for size in p["busbw_gbs"]}
    return {**measured[0], "busbw_gbs": {s: [v for p in measured for v in p["busbw_gbs"].get(s, [])] for s in sizes},
            "step_ms": [v for p in measured for v in p["step_ms"]]}


def decide(sweep: Mapping[str, Any], *, date: str, results: str | None = None) -> dict[str, Any]:
    """The ``tuning.json`` document of a checked sweep (:func:`check_sweep`): each point summarised and
    judged against the default, the chosen value of each variable with its evidence, the dropped points.
    ``date`` is the decision's UTC time (``2026-11-25T10:00:00Z``), ``results`` the sweep's directory."""
    min_gain = float(sweep["plan"]["min_gain"])
    job = str(sweep.get("job_id") or "?")
    day = date[:10]
    default = baseline([p for p in sweep["points"] if not p["settings"]])
    usable = default["status"] == "ok" and bool(metrics(default))
    records, dropped = [], []
    best: dict[str, tuple[float, Mapping[str, Any], dict[str, Any]]] = {}
    for point in sweep["points"]:
        if point["status"] != "ok":
            dropped.append({"id": point["id"], "label": point["label"], "status": point["status"],
                            "cause": point["cause"]})
            records.append(_point_record(point, None, "dropped"))
            continue
        if not point["settings"]:
            records.append(_point_record(point, None, "default"))
            continue
        judged = compare(point, default, min_gain) if usable else None
        records.append(_point_record(point, judged, judged["verdict"] if judged else "noise"))
        if judged and judged["verdict"] == "beats" and len(point["settings"]) == 1:
            (name,) = point["settings"]
            if name not in best or judged["score"] > best[name][0]:
                best[name] = (judged["score"], point, judged)
    plan = sweep["plan"]
    order = [str(v) for v in plan.get("variables") or []] if isinstance(plan.get("variables"), list) else []
    names = sorted(best, key=lambda n: (order.index(n) if n in order else len(order), n))
    problem = None if usable else (f"the default point {default['id']} {default['status']}"
                                   + ("" if default["status"] != "ok" else " without measurements")
                                   + ": nothing to compare with, nothing chosen")
    return {
        "schema": TUNING_SCHEMA, "site": sweep.get("site"), "job_id": sweep.get("job_id"), "date": date,
        "started": sweep.get("started"),   # the sweep's start: the history's run id (docs/history.md)
        "launcher": sweep.get("launcher"), "nodes": sweep.get("nodes"), "world_size": sweep.get("world_size"),
        "backend": sweep.get("backend"), "device": sweep.get("device"), "stack": sweep.get("stack"),
        "sizes": plan.get("sizes"), "repeats": plan.get("repeats"), "min_gain": min_gain,
        "points": records,
        "chosen": {n: best[n][1]["settings"][n] for n in names},
        "evidence": {n: evidence(best[n][1], default, best[n][2], job, day) for n in names},
        "dropped": dropped,
        "problem": problem,
        "results": results,
    }
