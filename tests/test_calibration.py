"""References measured on the site's own machines (sitestack/onsite/calibration.py,
sitestack/engine/site_calibration.py): the figures a passing run gives, how the checks judge by the
stored calibration, when sitestack stores one, and the degraded cases that still fail against it."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from sitestack.core.host import local_host
from sitestack.core.report import Reporter
from sitestack.engine import site_calibration
from sitestack.onsite import calibration
from sitestack.onsite.ddpcheck import compute
from sitestack.onsite.ddpcheck.bandwidth import judge_bandwidth

GIVEN = {"compute": {"gflops": None, "lower": -0.67, "source": "calibrated on this machine"},
         "bandwidth": {"single_node": {"busbw_gbs": None, "lower": -0.95, "message_bytes": 4194304, "source": "x"},
                       "multi_node": None}}


def result(judged: list[float], busbw: float = 0.62, verdict: str = "passed", nodes: int = 1) -> dict:
    """A result.json as the job writes it, as far as a calibration reads it."""
    ranks = [{"rank": i, "host": "vm", "device": "cpu", "gflops": rate / 2, "gflops_own": rate, "judged_gflops": rate}
             for i, rate in enumerate(judged)]
    rows = [{"bytes": size, "busbw_gbs": busbw * size / 4194304} for size in (1048576, 4194304)]
    return {"verdict": verdict, "job_id": "local-1-2", "hosts": ["vm"],
            "checks": [{"name": "compute", "status": "passed", "details": {"ranks": ranks}}],
            "bandwidth": {"rows": rows, "nodes": nodes, "ranks": len(judged)}}


def config_in(tmp_path: Path) -> dict:
    return {**GIVEN, "history_dir": str(tmp_path / "history")}


def store(tmp_path: Path, judged: list[float], busbw: float = 0.62) -> dict:
    config = config_in(tmp_path)
    data = calibration.document(calibration.figures(result(judged, busbw), config), None, "local-1-2", "vm", "test",
                                1796565000.0)
    (tmp_path / "history").mkdir(exist_ok=True)
    (tmp_path / "history" / calibration.FILE).write_text(json.dumps(data))
    return config


def test_the_figures_are_the_ranks_median_judged_rate_and_busbw_at_the_reference_size(tmp_path):
    figures = calibration.figures(result([44.0, 36.0, 50.0]), config_in(tmp_path))
    assert figures["compute"] == {"gflops": 44.0, "ranks": 3, "range": [36.0, 50.0]}
    assert figures["single_node"]["busbw_gbs"] == 0.62 and figures["single_node"]["message_bytes"] == 4194304
    assert "multi_node" in calibration.figures(result([44.0], nodes=2), config_in(tmp_path))


def test_a_fixed_figure_is_used_as_given_and_an_absent_one_comes_from_the_calibration(tmp_path):
    fixed = {"gflops": 140.0, "lower": -0.67, "source": "measured elsewhere"}
    assert calibration.reference(fixed, "compute", "gflops", {}) == (fixed, None)
    config = store(tmp_path, [44.0, 46.0])
    reference, note = calibration.reference(config["compute"], "compute", "gflops", config, environ={})
    assert note is None and reference is not None and reference["gflops"] == 45.0 and reference["lower"] == -0.67
    assert reference["source"] == ("calibrated on vm at 2026-12-06 13:50 UTC by run local-1-2 (test)")
    busbw, _ = calibration.reference(config["bandwidth"]["single_node"], "single_node", "busbw_gbs", config, environ={})
    assert busbw is not None and busbw["busbw_gbs"] == 0.62 and busbw["message_bytes"] == 4194304


def test_without_a_calibration_on_a_calibration_run_or_with_a_bad_file_nothing_is_judged_and_it_is_said(tmp_path):
    config = config_in(tmp_path)
    assert calibration.reference(config["compute"], "compute", "gflops", config, environ={}) == (
        None, "not judged against a reference: none calibrated yet (the first passing run calibrates, or "
              "`invoke validate --calibrate`)")
    config = store(tmp_path, [44.0])
    calibrating = calibration.reference(config["compute"], "compute", "gflops", config, {calibration.CALIBRATING: "1"})
    assert calibrating == (None, "not judged against a reference: this run calibrates it")
    (tmp_path / "history" / calibration.FILE).write_text('{"schema": "sitestack-calibration/1", "compute": {"gflops": -1}}')
    reference, note = calibration.reference(config["compute"], "compute", "gflops", config, environ={})
    assert reference is None and note is not None and "calibration.json: compute.gflops is not a positive number" in note


def rank_record(rank: int, own: float, **extra: object) -> dict:
    return {"rank": rank, "host": "vm", "device": "cpu", "gflops": own, "gflops_own": own, "ran_per_s": 1.0,
            "waited_per_s": 0.0, "quota": None, "throttled": None, "threads": 1, **extra}


def test_healthy_ranks_of_a_slower_machine_pass_its_own_calibration_and_degraded_ones_still_fail(tmp_path):
    """Calibrated at 45 GFLOPS (this kind of machine reaches 35-50): healthy ranks pass; a rank held to
    30% of a CPU (judged by the clock: it ran 0.3 s per second) or oversubscribed threads fail."""
    config = store(tmp_path, [45.0, 45.0])
    reference, _, note = compute.read_reference(config, environ={})
    assert note is None and reference is not None
    ranks = [{"rank": 0, "host": "vm"}, {"rank": 1, "host": "vm"}]
    assert compute.judge_reference([rank_record(0, 35.0), rank_record(1, 50.0)], ranks, reference)[0] == []
    stopped = rank_record(1, 45.0, gflops=13.0, ran_per_s=0.3, waited_per_s=0.0)
    found = compute.judge_reference([rank_record(0, 44.0), stopped], ranks, reference)[0]
    assert len(found) == 1 and found[0].startswith("rank below the site's compute reference: rank 1 on vm reaches 13 GFLOPS")
    assert "calibrated on vm at" in found[0] and "it was stopped part of the time" in found[0]
    over = [{"rank": r, "host": "vm", "affinity": [0, 1], "threads": {"torch_threads": 2, "ranks_sharing": 2,
                                                                      "env": {"OMP_NUM_THREADS": "32"}}} for r in (0, 1)]
    slow = [rank_record(0, 12.0, waited_per_s=0.5), rank_record(1, 14.0, waited_per_s=0.5)]
    assert len(compute.judge_reference(slow, over, reference)[0]) == 2


def test_the_bandwidth_check_says_where_its_calibrated_reference_comes_from(tmp_path):
    config = store(tmp_path, [45.0], busbw=0.62)
    reference, _ = calibration.reference(config["bandwidth"]["single_node"], "single_node", "busbw_gbs", config, environ={})
    rows = [{"bytes": 4194304, "busbw_gbs": 0.3, "time_us": 1.0, "algbw_gbs": 0.3}]
    status, text, _ = judge_bandwidth(rows, reference, 1)
    assert status == "passed" and "(single-node reference 0.62 GB/s; calibrated on vm at" in text
    status, text, _ = judge_bandwidth([{**rows[0], "busbw_gbs": 0.01}], reference, 1)
    assert status == "failed" and "below 0.031 GB/s" in text
    assert judge_bandwidth(rows, None, 1, "not judged: why")[1].endswith("; not judged: why")


def run_after(tmp_path: Path, run: dict, calibrate: bool = False) -> tuple[dict | None, str]:
    stream = io.StringIO()
    stored = site_calibration.after_validation(local_host(), str(tmp_path / "history"), run, config_in(tmp_path),
                                               run["job_id"], calibrate, Reporter(stream))
    return stored, stream.getvalue()


def test_the_first_passing_run_calibrates_a_failed_one_never_and_calibrate_measures_again(tmp_path):
    stored, said = run_after(tmp_path, result([40.0, 42.0], verdict="failed"))
    assert stored is None and "not stored: the run did not pass" in said
    stored, said = run_after(tmp_path, result([40.0, 42.0]))
    assert stored is not None and stored["compute"]["gflops"] == 41.0 and stored["how"].startswith("the first passing")
    assert "calibration: stored in" in said and "compute 41 GFLOPS per rank; single-node busbw 0.62 GB/s" in said
    on_disk = json.loads((tmp_path / "history" / calibration.FILE).read_text())
    assert calibration.invalid(on_disk) is None and on_disk["compute"]["gflops"] == 41.0
    kept, said = run_after(tmp_path, result([90.0, 90.0]))    # a later run leaves it, and shows it
    assert kept == on_disk and said.startswith("calibration: compute 41 GFLOPS per rank")
    again, _ = run_after(tmp_path, result([90.0, 90.0], busbw=0.5), calibrate=True)
    assert again is not None and again["compute"]["gflops"] == 90.0 and again["single_node"]["busbw_gbs"] == 0.5
    assert again["how"] == "`invoke validate --calibrate`"


def test_a_site_with_fixed_figures_stores_nothing_unless_asked(tmp_path):
    config = {"compute": {"gflops": 140.0, "lower": -0.67}, "bandwidth": {"single_node": None}}
    assert not site_calibration.calibrates(config) and site_calibration.calibrates(GIVEN)
    stored = site_calibration.after_validation(local_host(), str(tmp_path / "h"), result([40.0]), config, "1", False,
                                               Reporter(io.StringIO()))
    assert stored is None and not (tmp_path / "h").exists()


@pytest.mark.parametrize("text", ["not json", "[]", '{"schema": "sitestack-calibration/1", "measured": true}'])
def test_a_calibration_file_that_is_not_one_is_named_and_a_passing_run_replaces_it(tmp_path, text):
    (tmp_path / "history").mkdir()
    (tmp_path / "history" / calibration.FILE).write_text(text)
    stored, said = run_after(tmp_path, result([40.0, 42.0]), calibrate=True)
    assert "warning: calibration: " in said and calibration.FILE in said
    assert stored is not None and stored["compute"]["gflops"] == 41.0


def test_the_bandwidth_sweep_records_how_long_its_ranks_waited_for_a_cpu():
    from sitestack.onsite.ddpcheck.bandwidth import cpu_waited
    assert cpu_waited((1.0, 2.0), (1.5, 2.8), 2.0) == 0.4
    assert cpu_waited(None, (1.5, 2.8), 2.0) is None and cpu_waited((1.0, 2.0), (1.5, 2.8), 0.0) is None
