"""The regression judgment (sitestack/engine/regression.py): a run against the site's recent healthy runs
of the same stack and layout, and facts.validation.regression as the playbook states it."""

from __future__ import annotations

import pytest

from sitestack.core.errors import SitestackError
from sitestack.engine import playbook as pb
from sitestack.engine import regression
from sitestack.model.validation_facts import Regression
from tests.conftest import playbook_copy

TOOLCHAIN = {"modules": ["mpich/4.0.2"], "libfabric": "1.15.2.0", "kernel": "6.1", "python": "3.11.2"}


def run(n: int, busbw: float | None = 10.0, compute: float | None = 100.0, startup: float | None = 5.0, *,
        verdict: str = "passed", digest: str = "d1", world: int = 2, toolchain: dict | None = None) -> dict:
    return {"schema": "sitestack-history/1", "id": f"20261125T1000{n:02d}Z-validation-{n}", "kind": "validation",
            "started": 1764000000.0 + n, "verdict": verdict, "stack": {"digest": digest},
            "layout": {"nodes": 1, "world_size": world, "launcher": "srun", "backend": "gloo", "device": "cpu"},
            "metrics": {"busbw_gbs": busbw, "compute_judged_min_gflops": compute, "startup_s": startup},
            "toolchain": toolchain or TOOLCHAIN}


HEALTHY = [run(1, 10.0, 100, 5.0), run(2, 10.4, 104, 5.2), run(3, 9.8, 98, 4.9), run(4, 10.1, 101, 5.1)]


def test_a_run_like_the_healthy_ones_is_ok():
    report = regression.judge(run(9, 10.2, 99, 5.0), HEALTHY)
    assert report["status"] == "ok" and report["lines"][0].startswith("regression: none: busbw 10.2 GB/s (median 10")


def test_a_drop_beyond_the_spread_warns_and_a_large_one_fails_naming_the_metric():
    warn = regression.judge(run(9, 8.5, 100, 5.0), HEALTHY)
    assert warn["status"] == "warn"
    assert warn["lines"][0] == ("regression WARN: busbw 8.5 GB/s: 15% below the median 10.1 GB/s of 4 healthy runs "
                                "(spread 0.67 GB/s)")
    assert warn["lines"][-1] == ("regression: since the last healthy run 20261125T100004Z-validation-4: nothing in the "
                                 "recorded toolchain changed")
    fail = regression.judge(run(9, 10.0, 50, 5.0, toolchain={**TOOLCHAIN, "libfabric": "1.20.1"}), HEALTHY)
    assert fail["status"] == "fail" and fail["lines"][0].startswith("regression FAIL: compute (slowest rank) 50 GFLOPS: 50% below")
    assert fail["lines"][-1].endswith(": libfabric 1.15.2.0 -> 1.20.1")


def test_start_up_is_worse_when_longer():
    assert regression.judge(run(9, startup=4.0), HEALTHY)["status"] == "ok"   # faster is never a regression
    slow = regression.judge(run(9, startup=9.0), HEALTHY)
    assert slow["status"] == "fail" and "start-up 9 s: 78% above the median 5.05 s" in slow["lines"][0]
    assert regression.judge(run(9, startup=5.9), HEALTHY)["status"] == "warn"


def test_only_passed_runs_of_the_same_stack_and_layout_before_it_count():
    others = [run(5, 1.0, verdict="failed"), run(6, 1.0, digest="d2"), run(7, 1.0, world=4), run(20, 1.0)]
    report = regression.judge(run(9, 8.5), HEALTHY + others)
    assert report["status"] == "warn" and "of 4 healthy runs" in report["lines"][0]
    assert regression.judge(run(9, 8.5, digest="d2"), HEALTHY + others)["status"] == "unknown"


def test_too_few_healthy_runs_is_unknown_and_said_so():
    report = regression.judge(run(9, 1.0, 1.0, 100.0), HEALTHY[:2])
    assert report["status"] == "unknown"
    assert report["lines"] == ["regression: unknown: 2 healthy runs of this stack and layout in the history, "
                               "3 needed to compare with"]
    # a metric the run did not measure is unknown, the others are judged
    partial = regression.judge(run(9, None, 100, 5.0), HEALTHY)
    assert partial["status"] == "ok" and partial["metrics"]["busbw_gbs"]["status"] == "unknown"


def test_the_spread_is_robust_and_has_a_floor():
    assert regression.spread([10.0, 10.0, 10.0], 0.05) == pytest.approx(0.5)   # the floor
    assert regression.spread([9.0, 10.0, 11.0], 0.0) == pytest.approx(3 * 1.4826)   # MAD 1
    # one wild healthy run widens the range, not the MAD: half the range is the spread then
    assert regression.spread([10.0, 10.0, 10.0, 10.0, 30.0], 0.05) == pytest.approx(10.0)


def test_the_window_and_threshold_come_from_the_policy():
    many = [run(i, 100.0 if i <= 10 else 10.0) for i in range(1, 15)]   # the last four at 10 GB/s
    assert regression.judge(run(30, 10.0), many, Regression(window=4, min_runs=3))["status"] == "ok"
    # below the median of the last ten beyond their spread, but their worst reached it: WARN, never FAIL
    assert regression.judge(run(30, 10.0), many, Regression(window=10, min_runs=3))["status"] == "warn"
    assert regression.judge(run(30, 6.9), many, Regression(window=10, min_runs=3))["status"] == "fail"
    assert regression.judge(run(9, 8.5), HEALTHY, Regression(fail=-0.1))["status"] == "fail"


def test_noise_the_healthy_runs_showed_is_no_alarm_and_fail_is_measured_from_the_worst_of_them():
    """gloo busbw over loopback on a 2-core machine, one healthy run beside a busy process at 0.3 GB/s, the
    others 0.68-0.72 (median 0.7, spread half the range, 0.21): WARN below 0.49, FAIL only 30% below
    the worst healthy run (0.21); start-up, where longer is worse, mirrors it (longest healthy 6 s)."""
    noisy = [run(i, busbw, 40.0 + i, 6.0 if i == 6 else 5.0)
             for i, busbw in enumerate([0.3, 0.7, 0.7, 0.72, 0.68, 0.7], 1)]
    assert regression.judge(run(9, 0.5, 42.0, 5.0), noisy)["status"] == "ok"
    report = regression.judge(run(9, 0.45, 42.0, 5.0), noisy)
    assert report["status"] == "warn" and report["metrics"]["busbw_gbs"]["spread"] == pytest.approx(0.21)
    assert regression.judge(run(9, 0.22, 42.0, 5.0), noisy)["status"] == "warn"
    assert regression.judge(run(9, 0.2, 42.0, 5.0), noisy)["status"] == "fail"
    assert regression.judge(run(9, 0.7, 42.0, 7.7), noisy)["status"] == "warn"
    assert regression.judge(run(9, 0.7, 42.0, 7.9), noisy)["status"] == "fail"


def test_the_playbook_states_the_policy(tmp_path):
    site = pb.load(None, playbook_copy(tmp_path / "a", facts={"validation": {"regression": {"window": 5, "fail": -0.5}}}))
    assert site.facts.validation.regression == Regression(window=5, min_runs=3, fail=-0.5)
    for bad, words in (({"window": 2, "min_runs": 3}, "min_runs (3) must be at most window (2)"),
                       ({"fail": 0.3}, "fail must be in (-1, 0)"), ({"windows": 3}, "windows")):
        with pytest.raises(SitestackError, match=words.replace("(", r"\(").replace(")", r"\)")):
            pb.load(None, playbook_copy(tmp_path / str(len(words)), facts={"validation": {"regression": bad}}))


def test_clock_timed_metrics_of_a_run_whose_ranks_waited_for_a_cpu_warn_and_say_why_instead_of_failing():
    """Seen here: busbw 0.08-0.26 GB/s beside a busy process against healthy runs at 0.95 (2 cores)."""
    contended = run(9, 2.0)
    contended["metrics"]["cpu_waited"] = 0.42
    report = regression.judge(contended, HEALTHY)
    assert report["status"] == "warn" and report["lines"][0].endswith(
        "(spread 0.67 GB/s); the ranks waited for a CPU 0.42 s per second while timed (other processes): not a FAIL")
    idle = run(9, 2.0)
    idle["metrics"]["cpu_waited"] = 0.02
    assert regression.judge(idle, HEALTHY)["status"] == "fail"
    late = run(9, 10.0, startup=9.0)   # start-up is timed by the clock too
    late["metrics"]["cpu_waited"] = 0.42
    assert regression.judge(late, HEALTHY)["status"] == "warn"
    slow = run(9, 2.0, compute=50.0)   # the compute rate, on CPU time, is not excused: its drop still fails
    slow["metrics"]["cpu_waited"] = 0.42
    assert regression.judge(slow, HEALTHY)["status"] == "fail"
