"""The tuning decision (sitestack/engine/tune_decision.py) on sweep documents built here: noise, a
worse candidate, a hung and a crashed point, a candidate that wins on the step time only, and
sweep files that are not sweeps."""

from __future__ import annotations

import random
from typing import Any

import pytest

from sitestack.core.errors import InputError
from sitestack.engine.tune_decision import check_sweep, decide, judge, summary

SIZES = ("65536", "1048576", "4194304")


def samples(center: float, rel: float, n: int = 5, seed: int = 0) -> list[float]:
    """``n`` samples within +-``rel`` of ``center`` (a fixed seed: the same document every run)."""
    rng = random.Random(seed)
    return [center * (1 + rng.uniform(-rel, rel)) for _ in range(n)]


def point(pid: str, settings: dict[str, str], busbw: float | None = 1.0, step: float | None = 20.0,
          status: str = "ok", rel: float = 0.01, seed: int = 0, cause: str | None = None) -> dict[str, Any]:
    label = ", ".join(f"{k}={v}" for k, v in settings.items()) or "default"
    measured = status == "ok"
    return {"id": pid, "label": label, "settings": settings, "status": status, "cause": cause,
            "exit_code": 0 if measured else 124, "seconds": 10.0, "result": f"points/{pid}/result.json",
            "busbw_gbs": {s: samples(busbw * (i + 1), rel, seed=seed + i) for i, s in enumerate(SIZES)}
            if measured and busbw is not None else {},
            "step_ms": samples(step, rel, seed=seed + 10) if measured and step is not None else []}


def sweep(points: list[dict[str, Any]], min_gain: float = 0.03) -> dict[str, Any]:
    variables = list(dict.fromkeys(k for p in points for k in p["settings"]))
    return {"schema": "sitestack-sweep/1", "site": "local", "job_id": "123", "launcher": "srun", "nodes": 1,
            "world_size": 2, "ranks_per_node": 2, "backend": "gloo", "device": "cpu",
            "stack": {"module": "pytorch/2.13.0-cpu", "digest": "abcd"},
            "plan": {"schema": "sitestack-tune-plan/1", "sizes": [int(s) for s in SIZES], "repeats": 5,
                     "min_gain": min_gain, "variables": variables, "points": []},
            "points": points}


def decided(points: list[dict[str, Any]], min_gain: float = 0.03) -> dict[str, Any]:
    return decide(check_sweep(sweep(points, min_gain), "sweep.json"), date="2026-11-25T10:00:00Z",
                  results="/r/sitestack-tune-123")


def test_summary_gives_median_range_and_relative_spread() -> None:
    s = summary([10.0, 12.0, 9.0, 11.0, 10.5])
    assert (s["median"], s["min"], s["max"]) == (10.5, 9.0, 12.0)
    assert s["spread"] == pytest.approx(3.0 / 10.5)


def test_judge_needs_the_gain_and_separated_samples() -> None:
    base = [10.0, 10.2, 9.9, 10.1, 10.0]
    assert judge([11.0, 11.1, 10.9, 11.2, 11.0], base, True, 0.03)[0] == "beats"
    # the same gain with one sample inside the default's range: noise
    assert judge([11.0, 11.1, 10.1, 11.2, 11.0], base, True, 0.03)[0] == "noise"
    # separated but below min_gain: noise
    assert judge([10.3, 10.3, 10.35, 10.3, 10.3], base, True, 0.05)[0] == "noise"
    assert judge([9.0, 9.1, 8.9, 9.2, 9.0], base, True, 0.03)[0] == "worse"
    # lower is better: a shorter step beats
    verdict, gain = judge([8.0, 8.1, 7.9, 8.0, 8.0], base, False, 0.03)
    assert verdict == "beats" and gain == pytest.approx(10.0 / 8.0 - 1)
    assert judge([0.0, 0.0, 0.0], base, True, 0.03) is None


def test_a_clear_winner_is_chosen_with_its_evidence_and_noise_is_not() -> None:
    doc = decided([point("p00", {}), point("p01", {"OMP_NUM_THREADS": "1"}, busbw=1.4, step=12.0, seed=3),
                   point("p02", {"GLOO_SOCKET_IFNAME": "lo"}, busbw=1.005, step=19.95, rel=0.02, seed=5)])
    assert doc["schema"] == "sitestack-tuning/1"
    assert doc["chosen"] == {"OMP_NUM_THREADS": "1"}
    line = doc["evidence"]["OMP_NUM_THREADS"]
    assert "vs" in line and "unset" in line and "job 123, 2026-11-25" in line and "beyond a spread of" in line
    verdicts = {p["id"]: p["verdict"] for p in doc["points"]}
    assert verdicts == {"p00": "default", "p01": "beats", "p02": "noise"}
    p01 = next(p for p in doc["points"] if p["id"] == "p01")
    assert set(p01["summary"]["busbw_gbs"]) == set(SIZES) and "median" in p01["summary"]["step_ms"]
    assert p01["gain"]["step_ms"] == pytest.approx(20.0 / 12.0 - 1, rel=0.05)
    assert doc["dropped"] == [] and doc["problem"] is None and doc["results"] == "/r/sitestack-tune-123"


def test_worse_hung_and_crashed_points_are_never_chosen() -> None:
    doc = decided([point("p00", {}), point("p01", {"A": "1"}, busbw=0.5, step=30.0, seed=1),
                   point("p02", {"A": "2"}, status="hung", cause="rank 1 hung"),
                   point("p03", {"B": "x"}, status="crashed", cause="rank 0 killed by SIGSEGV"),
                   point("p04", {"B": "y"}, status="skipped", cause="not run: 12 s left")])
    assert doc["chosen"] == {} and doc["evidence"] == {}
    assert [(d["id"], d["status"], d["cause"]) for d in doc["dropped"]] == [
        ("p02", "hung", "rank 1 hung"), ("p03", "crashed", "rank 0 killed by SIGSEGV"),
        ("p04", "skipped", "not run: 12 s left")]
    assert {p["id"]: p["verdict"] for p in doc["points"]} == {
        "p00": "default", "p01": "worse", "p02": "dropped", "p03": "dropped", "p04": "dropped"}


def test_a_candidate_better_on_step_time_only_qualifies_but_one_worse_elsewhere_does_not() -> None:
    doc = decided([point("p00", {}), point("p01", {"A": "1"}, busbw=1.0, step=15.0, seed=2),
                   point("p02", {"B": "1"}, busbw=0.8, step=10.0, seed=4)])
    assert doc["chosen"] == {"A": "1"}
    assert doc["evidence"]["A"].startswith("DDP step 15")
    p01 = next(p for p in doc["points"] if p["id"] == "p01")
    assert p01["verdicts"]["step_ms"] == "beats" and set(p01["verdicts"]["busbw_gbs"].values()) == {"noise"}
    assert next(p for p in doc["points"] if p["id"] == "p02")["verdict"] == "worse"


def test_the_larger_mean_gain_wins_among_a_variables_candidates() -> None:
    doc = decided([point("p00", {}), point("p01", {"A": "1"}, busbw=1.2, seed=2),
                   point("p02", {"A": "2"}, busbw=1.5, seed=6), point("p03", {"A": "3"}, busbw=1.3, seed=8)])
    assert doc["chosen"] == {"A": "2"}


def test_a_default_that_hung_decides_nothing() -> None:
    doc = decided([point("p00", {}, status="hung", cause="x"), point("p01", {"A": "1"}, busbw=3.0)])
    assert doc["chosen"] == {} and "default point p00 hung" in doc["problem"]


@pytest.mark.parametrize(("edit", "key"), [
    (lambda d: d.update(schema="sitestack-sweep/9"), "schema"),
    (lambda d: d.update(points=[]), "points"),
    (lambda d: d["points"][1].update(status="great"), "points[1].status"),
    (lambda d: d["points"][1]["busbw_gbs"].update({"65536": [1.0, "fast"]}), "points[1].busbw_gbs.65536"),
    (lambda d: d["points"][1].update(step_ms=[float("nan")]), "points[1].step_ms"),
    (lambda d: d["points"].append(point("p02", {})) or d["points"][1].update(settings={}), "points"),  # 3 defaults
    (lambda d: d["points"][1].update(settings={"A B": "1"}), "points[1].settings"),
    (lambda d: d["plan"].update(min_gain=3), "plan.min_gain"),
])
def test_a_document_that_is_not_a_sweep_is_one_error_naming_the_file_and_key(edit: Any, key: str) -> None:
    doc = sweep([point("p00", {}), point("p01", {"A": "1"})])
    edit(doc)
    with pytest.raises(InputError) as err:
        check_sweep(doc, "/r/sweep.json")
    assert err.value.where == "/r/sweep.json" and err.value.key == key
    assert str(err.value).startswith(f"/r/sweep.json: {key}: ")
    with pytest.raises(InputError):
        check_sweep(["not", "an", "object"], "/r/sweep.json")


def test_a_drift_during_the_sweep_widens_the_default_instead_of_passing_for_a_gain() -> None:
    # the machine got 15% faster between the first default and the candidate (another job's load left):
    # against the first default alone the candidate "beats" it; the default measured again at the end
    # shows the drift, and pooled with the first it leaves the candidate within the noise
    first, candidate = point("p00", {}), point("p01", {"OMP_NUM_THREADS": "1"}, busbw=1.15, step=17.0, seed=3)
    assert decided([first, candidate])["chosen"] == {"OMP_NUM_THREADS": "1"}
    again = {**point("p02", {}, busbw=1.16, step=16.9, seed=7), "label": "default (again)"}
    doc = decided([first, candidate, again])
    assert doc["chosen"] == {} and doc["problem"] is None
    assert {p["id"]: p["verdict"] for p in doc["points"]} == {"p00": "default", "p01": "noise", "p02": "default"}
    # a real gain stays a gain: beyond both defaults
    winner = point("p01", {"OMP_NUM_THREADS": "1"}, busbw=1.6, step=10.0, seed=3)
    assert decided([first, winner, again])["chosen"] == {"OMP_NUM_THREADS": "1"}


def test_the_default_measured_once_or_twice_and_a_second_default_that_failed_is_dropped() -> None:
    again = {**point("p02", {}, status="hung", cause="rank 1 hung"), "label": "default (again)"}
    doc = decided([point("p00", {}), point("p01", {"OMP_NUM_THREADS": "1"}, busbw=1.4, step=12.0, seed=3), again])
    assert doc["chosen"] == {"OMP_NUM_THREADS": "1"}
    assert [d["id"] for d in doc["dropped"]] == ["p02"]


def test_a_point_missing_a_metric_or_measuring_zero_is_never_chosen() -> None:
    lacking = point("p01", {"A": "1"}, busbw=2.0, step=10.0, seed=3)
    del lacking["busbw_gbs"]["4194304"]   # a size the default measured: judged on less, never chosen
    zero = point("p02", {"B": "1"}, busbw=2.0, step=10.0, seed=4)
    zero["busbw_gbs"]["65536"] = [0.0] * 5   # nothing moved at one size
    doc = decided([point("p00", {}), lacking, zero])
    assert doc["chosen"] == {}
    assert {p["id"]: p["verdict"] for p in doc["points"]} == {"p00": "default", "p01": "incomplete", "p02": "worse"}


def test_a_size_that_is_not_ascii_digits_is_one_error_naming_the_key() -> None:
    doc = sweep([point("p00", {}), point("p01", {"A": "1"})])
    doc["points"][1]["busbw_gbs"]["\u00b2"] = [1.0]
    with pytest.raises(InputError) as err:
        check_sweep(doc, "/r/sweep.json")
    assert err.value.key == "points[1].busbw_gbs"


def noise_sweep(rng: random.Random, repeats: int, bracket: bool, drift: float) -> list[dict[str, Any]]:
    """A sweep of two candidates with no real difference from the default: 5% noise on every sample,
    and the machine ``drift`` faster at each point (another job's load leaving)."""
    def measured(pid: str, settings: dict[str, str], level: float, label: str | None = None) -> dict[str, Any]:
        def draw(center: float) -> list[float]:
            return [center * (1 + rng.gauss(0, 0.05)) for _ in range(repeats)]
        return {**point(pid, settings), "label": label or point(pid, settings)["label"],
                "busbw_gbs": {s: draw(level * (i + 1)) for i, s in enumerate(SIZES)}, "step_ms": draw(20.0 / level)}
    points = [measured("p00", {}, 1.0), measured("p01", {"A": "1"}, 1 + drift), measured("p02", {"A": "2"}, 1 + 2 * drift)]
    return points + ([measured("p03", {}, 1 + 3 * drift, "default (again)")] if bracket else [])


@pytest.mark.parametrize("drift", [0.0, 0.03])
def test_noise_and_drift_seldom_pass_for_a_gain_with_five_repeats_and_the_default_twice(drift: float) -> None:
    """How often a sweep with no real difference chooses a setting (docs/tuning.md, "How often noise wins"):
    at most 2% of 400 sweeps with the plan's rule (5 repeats, the default first and last); the same sweeps
    with 3 repeats and the default once choose far more often, which is why the rule is what it is."""
    def rate(repeats: int, bracket: bool) -> float:
        rng = random.Random(1)
        return sum(bool(decided(noise_sweep(rng, repeats, bracket, drift))["chosen"]) for _ in range(400)) / 400
    assert rate(5, True) <= 0.02
    assert rate(3, False) >= 0.15
