"""Only a whole sweep replaces the published decision (sitestack/engine/tune_run.py conclude): a sweep
cut short, with points skipped for want of time or a default that did not measure, keeps its decision
in its own results directory and leaves {prefix}/tuning, and so the stack's module, as they were."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path
from typing import Any

import pytest

from sitestack.core.host import local_host
from sitestack.core.report import Reporter
from sitestack.engine import playbook as pb
from sitestack.engine.tune_run import TuneOutcome, conclude

SIZES = ("65536", "1048576")


def point(pid: str, label: str, settings: dict[str, str], busbw: float, step: float, status: str = "ok",
          seed: int = 0) -> dict[str, Any]:
    rng = random.Random(seed)
    ok = status == "ok"
    return {"id": pid, "label": label, "settings": settings, "status": status,
            "cause": None if ok else f"not run: 3s of the job's time limit left ({status})", "exit_code": 0 if ok else None,
            "seconds": 5.0, "result": None,
            "busbw_gbs": {s: [busbw * (1 + rng.uniform(-0.01, 0.01)) for _ in range(5)] for s in SIZES} if ok else {},
            "step_ms": [step * (1 + rng.uniform(-0.01, 0.01)) for _ in range(5)] if ok else []}


def sweep_doc(last_status: str, finished: bool = True) -> dict[str, Any]:
    points = [point("p00", "default", {}, 1.0, 20.0), point("p01", "OMP_NUM_THREADS=1", {"OMP_NUM_THREADS": "1"}, 1.5, 10.0, seed=1),
              point("p02", "OMP_NUM_THREADS=2", {"OMP_NUM_THREADS": "2"}, 1.0, 40.0, seed=2),
              point("p03", "default (again)", {}, 1.0, 20.0, status=last_status, seed=3)]
    return {"schema": "sitestack-sweep/1", "site": "local", "job_id": "77", "launcher": "srun", "nodes": 1,
            "world_size": 2, "backend": "gloo", "device": "cpu", "finished": finished, "stack": {"module": None, "digest": None},
            # the plan the sweep ran, as the job's tune-plan.json holds it: its points are the ones published
            "plan": {"schema": "sitestack-tune-plan/1", "sizes": [int(s) for s in SIZES], "repeats": 5, "min_gain": 0.03,
                     "point_seconds": 60, "variables": ["OMP_NUM_THREADS"],
                     "points": [{"id": p["id"], "label": p["label"], "settings": p["settings"]} for p in points]},
            "points": points}


def run_conclude(tmp_path: Path, doc: dict[str, Any], rc: int | None) -> tuple[TuneOutcome, str, Path]:
    prefix, out = tmp_path / "prefix", tmp_path / "results" / "sitestack-tune-77"
    out.mkdir(parents=True)
    (out / "sweep.json").write_text(json.dumps(doc))
    log = tmp_path / "results" / "sitestack-tune-77.log"
    log.write_text("sitestack tune: sweep written, exit code 0\n")
    published = prefix / "tuning" / "tuning.json"
    published.parent.mkdir(parents=True)
    published.write_text('{"earlier": "decision"}\n')
    facts = pb.load("local").facts
    stream = io.StringIO()
    outcome = conclude("local", facts, (str(prefix), str(prefix / "validation")), TuneOutcome(0, "77", str(out), str(log)),
                       rc, Reporter(stream=stream), local_host())
    return outcome, stream.getvalue(), published


@pytest.mark.parametrize(("status", "finished", "rc", "why"), [
    ("skipped", True, 0, "not run for want of time"),
    ("ok", False, 0, "ended before its last point"),
    ("ok", True, 143, "exit code 143"),
])
def test_a_sweep_that_is_not_whole_does_not_replace_the_published_decision(tmp_path: Path, status: str, finished: bool,
                                                                           rc: int, why: str) -> None:
    outcome, said, published = run_conclude(tmp_path, sweep_doc(status, finished), rc)
    assert outcome.code == 1 and why in said and "unchanged" in said
    assert published.read_text() == '{"earlier": "decision"}\n'
    decision = json.loads(Path(outcome.files[-1]).read_text())
    assert outcome.files[-1].endswith("sitestack-tune-77/decision/tuning.json") and decision["job_id"] == "77"


def test_a_whole_sweep_is_published(tmp_path: Path) -> None:
    outcome, said, published = run_conclude(tmp_path, sweep_doc("ok"), 0)
    assert outcome.code == 0 and "provision will now set" in said
    assert json.loads(published.read_text())["chosen"] == {"OMP_NUM_THREADS": "1"}
