"""``facts.tuning``: the settings ``invoke tune`` measures; refused at load, naming file, line and key,
when a sweep could not measure them as written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from sitestack.core.errors import InputError
from sitestack.core.paths import PLAYBOOK_DIR
from sitestack.engine import playbook as pb
from sitestack.model.facts import Tuning, TuningVariable
from tests.conftest import run_invoke


def local_with(tmp_path: Path, tuning: Any, env: dict[str, str] | None = None) -> Path:
    data = yaml.safe_load((PLAYBOOK_DIR / "local.yml").read_text())
    data["facts"]["tuning"] = tuning
    if env is not None:
        data["facts"]["env"] = env
    path = tmp_path / "local.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def test_a_tuning_block_loads_typed_in_playbook_order(tmp_path: Path):
    tuning = {"sizes": [65536, 1048576], "repeats": 6, "point_time": "00:00:40", "min_gain": 0.05,
              "variables": {"OMP_NUM_THREADS": {"candidates": ["2", "1"], "note": "threads per rank"},
                            "GLOO_SOCKET_IFNAME": {"candidates": ["lo"]}}}
    facts = pb.load(None, local_with(tmp_path, tuning, env={})).facts
    assert isinstance(facts.tuning, Tuning)
    assert list(facts.tuning.variables) == ["OMP_NUM_THREADS", "GLOO_SOCKET_IFNAME"]
    variable = facts.tuning.variables["OMP_NUM_THREADS"]
    assert isinstance(variable, TuningVariable)
    assert variable.candidates == ("2", "1") and variable.note == "threads per rank"
    assert facts.tuning.sizes == (65536, 1048576) and facts.tuning.repeats == 6
    assert facts.tuning.point_seconds == 40 and facts.tuning.min_gain == 0.05
    assert facts.tuning.points() == [("default", {}), ("OMP_NUM_THREADS=2", {"OMP_NUM_THREADS": "2"}),
                                     ("OMP_NUM_THREADS=1", {"OMP_NUM_THREADS": "1"}),
                                     ("GLOO_SOCKET_IFNAME=lo", {"GLOO_SOCKET_IFNAME": "lo"}),
                                     ("default (again)", {})]


def test_without_a_tuning_block_there_is_nothing_to_tune(tmp_path: Path):
    data = yaml.safe_load((PLAYBOOK_DIR / "local.yml").read_text())
    data["facts"].pop("tuning", None)
    path = tmp_path / "local.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    assert pb.load(None, path).facts.tuning is None


def test_the_defaults_are_five_repeats_of_two_minutes():
    tuning = Tuning(variables={"X": TuningVariable(candidates=("1",))})
    assert (tuning.sizes, tuning.repeats, tuning.point_seconds, tuning.min_gain) == ((), 5, 120, 0.03)


OMP = {"OMP_NUM_THREADS": {"candidates": ["1", "2"]}}


@pytest.mark.parametrize(("tuning", "key", "line_text", "says"), [
    ({"variables": {"OMP_NUM_THREADS": {"candidates": []}}}, "facts.tuning.variables.OMP_NUM_THREADS",
     "OMP_NUM_THREADS:", "at least one value to try"),
    ({"variables": {"OMP_NUM_THREADS": {"candidates": ["1", "2", "1"]}}}, "facts.tuning.variables.OMP_NUM_THREADS",
     "OMP_NUM_THREADS:", "'1' repeated"),
    ({"variables": {"OMP-THREADS": {"candidates": ["1"]}}}, "facts.tuning.variables.OMP-THREADS",
     "OMP-THREADS:", "is not an environment variable name"),
    ({"variables": {"OMP_NUM_THREADS": {"candidates": ["1\n2"]}}},
     "facts.tuning.variables.OMP_NUM_THREADS.candidates[0]", "- '1", "newline"),
    ({"variables": {"OMP_NUM_THREADS": {"candidates": ["$HOME"]}}}, "facts.tuning.variables.OMP_NUM_THREADS",
     "OMP_NUM_THREADS:", "measured as written"),
    ({"variables": {"OMP_NUM_THREADS": {"candidates": [""]}}}, "facts.tuning.variables.OMP_NUM_THREADS",
     "OMP_NUM_THREADS:", "an empty value is the default"),
    ({"variables": {"PIP_INDEX_URL": {"candidates": ["https://u:sekrit@example.org/simple"]}}}, "facts.tuning",
     "tuning:", "holds a credential"),
    ({"repeats": 4, "variables": OMP}, "facts.tuning.repeats", "repeats:", "4"),
    ({"sizes": [65536, 1000001], "variables": OMP}, "facts.tuning", "tuning:", "1000001 is not a positive multiple of 4"),
    ({"sizes": [0], "variables": OMP}, "facts.tuning", "tuning:", "0 is not a positive multiple of 4"),
    ({"point_time": "2 minutes", "variables": OMP}, "facts.tuning.point_time", "point_time:", "Slurm time"),
    ({"variables": {}}, "facts.tuning", "tuning:", "at least one variable"),
])
def test_a_tuning_block_the_sweep_cannot_run_is_refused_naming_file_line_and_key(
        tmp_path: Path, tuning: dict, key: str, line_text: str, says: str):
    path = local_with(tmp_path, tuning, env={})
    with pytest.raises(InputError) as caught:
        pb.load(None, path)
    error = caught.value
    assert error.where == f"{path}:{line_of(path, line_text)}", (error.where, str(error))
    assert error.key == key and says in error.detail, str(error)


def test_a_variable_also_set_in_env_is_refused(tmp_path: Path):
    """A setting both in env and tuned would be set for everyone untried: the module must set it only
    after a measurement."""
    path = local_with(tmp_path, {"variables": {"GLOO_SOCKET_IFNAME": {"candidates": ["lo"]}}},
                      env={"GLOO_SOCKET_IFNAME": "lo"})
    with pytest.raises(InputError) as caught:
        pb.load(None, path)
    assert caught.value.where == f"{path}:{line_of(path, 'facts:')}" and caught.value.key == "facts"
    assert "tuning.variables.GLOO_SOCKET_IFNAME: also set in env" in caught.value.detail


@pytest.mark.parametrize("name", ["PATH", "LD_PRELOAD", "PYTHONPATH", "HOME", "MASTER_PORT", "LOCAL_RANK", "SLURM_JOB_ID",
                                  "PMI_RANK", "OMPI_COMM_WORLD_RANK", "SITESTACK_TIME_LIMIT", "LMOD_CMD", "MODULEPATH",
                                  "NNODES", "NCCL_DEBUG_FILE", "MIOPEN_USER_DB_PATH", "APPTAINERENV_OMP_NUM_THREADS"])
def test_a_variable_the_job_itself_needs_is_refused(tmp_path: Path, name: str):
    """The sweep unsets every tuning variable at each point: PATH or the launchers' variables would take the
    job down with it."""
    path = local_with(tmp_path, {"variables": {name: {"candidates": ["1"]}}}, env={})
    with pytest.raises(InputError) as caught:
        pb.load(None, path)
    assert caught.value.where == f"{path}:{line_of(path, name + ':')}", str(caught.value)
    assert caught.value.key == f"facts.tuning.variables.{name}" and "the job itself needs or sets" in caught.value.detail


def test_the_fault_injection_variable_may_be_swept(tmp_path: Path):
    path = local_with(tmp_path, {"variables": {"SITESTACK_CHECK_FAULT": {"candidates": ["hang@1"]}}}, env={})
    tuning = pb.load(None, path).facts.tuning
    assert tuning is not None and list(tuning.variables) == ["SITESTACK_CHECK_FAULT"]


def test_a_plan_longer_than_the_schedulers_longest_job_is_refused_by_tune_not_by_the_playbook(tmp_path: Path):
    """local allows 10-minute jobs: 6 points of 2 minutes (and the guard's 20 s each) cannot fit. The playbook
    still loads (provision must not fail over a measurement); `invoke tune` refuses, naming facts.tuning."""
    path = local_with(tmp_path, {"point_time": "00:02:00",
                                 "variables": {"OMP_NUM_THREADS": {"candidates": ["1", "2", "3", "4"]}}}, env={})
    detail = pb.load(None, path).facts.tuning_problem() or ""
    assert "tuning: the sweep cannot fit in one job: 6 points x (120s point_time + 20s)" in detail, detail
    assert "scheduler.max_job_time 00:10:00 (600s)" in detail
    out = run_invoke("tune", "--playbook", str(path), "--check", env={"HOME": str(tmp_path)})
    assert out.returncode == 1 and "facts.tuning" in out.stderr and "cannot fit in one job" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
