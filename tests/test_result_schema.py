"""result.json, the job's document for the controller: one type, one builder, one reader's check.

A finished run's result and a fault's are made by the same builder and have the same fields of the
same types; a document of another schema version or with a field of another type is refused by
``invoke validate`` with one line naming the file; and no second builder of the document appears."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from sitestack.core.errors import SitestackError
from sitestack.core.report import Reporter
from sitestack.engine import validate
from sitestack.onsite import result_schema
from sitestack.onsite.ddpcheck import faults, verdicts
from sitestack.onsite.ddpcheck.checks import CHECKS
from tests.conftest import REPO


def built(**overrides: object) -> dict:
    """A finished run's result as rank 0 builds it (two passed checks, the rest skipped)."""
    checks = [{"name": n, "status": "passed" if n in ("environment", "ddp") else "skipped", "summary": "ok",
               "details": {}, "seconds": 1.5} for n in CHECKS]
    fields = {"site": "local", "job_id": "7", "launcher": "mpiexec", "job_launcher": "mpiexec", "started": 1764000000.0,
              "backend": "gloo", "device": "cpu", "world_size": 2, "hosts": ["vm"], "torch": "2.13.0",
              "verdict": verdicts.verdict(checks), "checks": checks, "fault": None, "ranks": [{"rank": 0}],
              "time_limit": {"seconds": 60.0, "from": "--time-limit"}, "bandwidth": {"rows": []},
              "startup": {"ready_s": 1.0}, "stack": {"module": "pytorch/2", "digest": None},
              "toolchain": {"modules": []}, "job_environment": {"modules": []}, **overrides}
    return dict(result_schema.build_result(**fields))  # type: ignore[arg-type]


def test_a_fault_result_has_every_field_of_a_finished_runs_of_the_same_type(tmp_path: Path) -> None:
    (tmp_path / "ranks").mkdir()
    (tmp_path / "ranks" / "rank-0.json").write_text(json.dumps({"rank": 0, "world_size": 2, "host": "vm",
                                                                "phase": "ddp", "started": 1764000000.0}))
    fault = {"kind": "timeout", "cause": "the time limit passed", "phase": "ddp", "expected": 2}
    fault_result = dict(faults.fault_result(str(tmp_path), fault))
    normal = built()
    assert result_schema.problem(normal) is None and result_schema.problem(fault_result) is None
    assert set(fault_result) == set(normal) == set(result_schema.FIELDS)
    for key in result_schema.FIELDS:
        assert isinstance(fault_result[key], result_schema.FIELDS[key]), key
    # the sections the fault's writer could not know are empty, as the type says, not missing
    assert {k: fault_result[k] for k in ("stack", "toolchain", "startup", "job_environment")} == \
        {"stack": {}, "toolchain": {}, "startup": {}, "job_environment": {}}
    assert fault_result["verdict"] == "failed" and fault_result["cause"] == "the time limit passed"
    assert fault_result["artefacts"]["plot_note"] == "the run did not finish"
    # the type and its run-time table name the same fields
    assert set(result_schema.Result.__required_keys__) == set(result_schema.FIELDS)
    assert set(result_schema.Result.__optional_keys__) == set(result_schema.OPTIONAL)


def test_the_builder_decides_the_verdict_cause_and_counts() -> None:
    failed = built(checks=[{"name": "ddp", "status": "failed", "summary": "slow rank", "details": {}, "seconds": 2.0}],
                   verdict="failed", hosts=["a", "b"])
    assert failed["cause"] == "ddp: slow rank" and failed["nodes"] == 2
    faulted = built(fault={"kind": "killed", "cause": "rank 1 was killed"})
    assert faulted["verdict"] == "failed" and faulted["cause"] == "rank 1 was killed"
    assert "tune" not in built() and built(tune={"busbw_gbs": {}})["tune"] == {"busbw_gbs": {}}


@pytest.mark.parametrize("change, words", [
    ({"schema": 1}, "schema 1, not 2"),
    ({"schema": "2"}, "schema '2', not 2"),
    ({"world_size": "2"}, "`world_size` is a JSON str, not int"),
    ({"world_size": True}, "`world_size` is a JSON bool, not int"),
    ({"stack": None}, "`stack` is null, not dict"),
    ({"verdict": "ok"}, "`verdict` is 'ok', not passed or failed"),
    ({"checks": [{"name": "a", "status": "passed", "summary": 3, "details": {}, "seconds": 0}]},
     "`checks[0].summary` is a JSON int"),
    ({"checks": [{"name": "a", "status": "done", "summary": "", "details": {}, "seconds": 0}]},
     "`checks[0].status` is 'done'"),
])
def test_the_controller_refuses_a_result_of_another_version_or_type(tmp_path: Path, change: dict, words: str) -> None:
    path = str(tmp_path / "result.json")
    text = json.dumps({**built(), **change})
    with pytest.raises(SitestackError) as caught:
        validate.report_result(text, path, str(tmp_path), Reporter())
    message = str(caught.value)
    assert message.startswith(f"{path} is not a result of the validation job (") and words in message, message
    assert "\n" not in message
    missing = {k: v for k, v in built().items() if k != "toolchain"}
    with pytest.raises(SitestackError, match=r"is not a result of the validation job \(no `toolchain`\)"):
        validate.report_result(json.dumps(missing), path, str(tmp_path), Reporter())


def test_exit_codes_are_decided_in_one_place() -> None:
    passed, failed = built(), built(verdict="failed")
    assert [result_schema.exit_code(passed), result_schema.exit_code(failed), result_schema.exit_code(None)] == [0, 1, 1]
    assert result_schema.exit_code(passed, 137) == 137 and result_schema.exit_code(failed, timed_out=True) == 1
    assert result_schema.exit_code(passed, 0, timed_out=True) == 3
    assert not hasattr(verdicts, "exit_code")


def _builders(tree: ast.AST) -> list[int]:
    """The lines of dict displays, or ``dict(...)`` calls, holding both "verdict" and "checks" keys (a result
    built by hand; calls of the builder itself pass them too, and are not counted)."""
    lines = []
    for node in ast.walk(tree):
        keys = {k.value for k in node.keys if isinstance(k, ast.Constant)} if isinstance(node, ast.Dict) else set()
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) != "build_result":
            keys = {k.arg for k in node.keywords}
        if {"verdict", "checks"} <= keys:
            lines.append(node.lineno)
    return lines


def test_result_json_has_one_builder() -> None:
    found = {str(path.relative_to(REPO)): _builders(ast.parse(path.read_text(encoding="utf-8")))
             for path in sorted((REPO / "sitestack").rglob("*.py"))}
    found = {path: lines for path, lines in found.items() if lines}
    builder = "sitestack/onsite/result_schema.py"
    assert list(found) == [builder], f"result.json built outside {builder}: {found}"
    # the finder sees the builder's own dict display (and the table of the fields' types beside it)
    assert len(found[builder]) == 2
