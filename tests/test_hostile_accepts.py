"""What earlier rounds accepted without a word, refused now with one line (or, for numbers JSON has no
way to write, written as ``null``): a MASTER_ADDR with a trailing newline, rank files whose rank is a
boolean or whose times are NaN or infinite, a hard-linked history index, a history_dir that walks out
with ``..``, and a data directory others can write or another user owns. Unit-level, on the real
functions; one run of the command for the data directory, as a user meets it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from sitestack.core import envvars
from sitestack.core.errors import InputError
from sitestack.core.host import local_host
from sitestack.engine import batchjob
from sitestack.onsite import fileio, history, history_store, import_probe
from sitestack.onsite.ddpcheck.rank_progress import read_progress
from sitestack.onsite.history_record import HistoryError
from tests.conftest import REPO
from tests.test_hostile import Case, assert_refused_cleanly, git_status, run_case
from tests.test_hostile_dirs import OTHER, needs_chown


def _strict(text: str) -> Any:
    """JSON as a reader other than Python's takes it: NaN and Infinity are not JSON (RFC 8259, section 6)."""
    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON")
    return json.loads(text, parse_constant=refuse)


# -- MASTER_ADDR ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("addr", ["node1\n", "node1\nevil", "\nnode1"])
def test_a_master_address_with_a_newline_is_refused(addr):
    args = argparse.Namespace(rank=0, world_size=2, master_addr=addr, master_port=29500)
    with pytest.raises(import_probe.ProbeError, match="expected a host name or IP address"):
        import_probe.rendezvous(args)
    ok = argparse.Namespace(rank=0, world_size=2, master_addr="node1", master_port=29500)
    assert import_probe.rendezvous(ok)[2] == "node1"


# -- rank files: typed, finite ---------------------------------------------------------------------------------
def test_rank_files_with_booleans_nan_or_infinity_do_not_reach_the_summary(tmp_path):
    ranks = tmp_path / "startup"
    ranks.mkdir()
    good = {"rank": 0, "host": "n1", "imported_at": 100.5, "imported_s": 2.0, "ddp_ready_at": 101.0, "ddp_ready_s": 3.0}
    (ranks / "rank-0.json").write_text(json.dumps(good))
    (ranks / "rank-1.json").write_text('{"rank": true, "host": "n1", "imported_at": 100.0}')
    (ranks / "rank-2.json").write_text('{"rank": 2, "host": "n1", "imported_at": NaN, "imported_s": Infinity}')
    (ranks / "rank-3.json").write_text('{"rank": 3, "host": "n1", "imported_at": 1e999, "ddp_ready_at": -Infinity}')
    summary_path = tmp_path / "startup.json"
    assert import_probe.main(["--aggregate", str(ranks), "--t0", "98.5", "--expect", "4", "--json", str(summary_path)]) == 0
    summary = _strict(summary_path.read_text())
    # NaN and 1e999 are no JSON numbers: those records are not read at all (fileio.parse_json), each said
    assert summary["failed"] == [] and summary["imported"] == 1 and summary["missing"] == [1, 2, 3]
    assert summary["unreadable"] == ["rank-1.json: not a rank record", "rank-2.json: not JSON (NaN is not a JSON number)",
                                     "rank-3.json: not JSON (1e999 is not a finite number)"]
    assert summary["all_imported_s"] is None and summary["imported_s"] == {"median": 2.0, "max": 2.0}


def test_a_progress_record_whose_rank_is_not_a_number_is_not_a_rank(tmp_path):
    directory = tmp_path / "ranks"
    directory.mkdir()
    (directory / "rank-0.json").write_text('{"rank": 0, "phase": "ddp"}')
    (directory / "rank-1.json").write_text('{"rank": true, "phase": "report"}')
    (directory / "rank-2.json").write_text('{"rank": "2", "phase": "report"}')
    assert sorted(read_progress(str(tmp_path))) == [0]


def test_json_written_on_site_is_json_whatever_the_numbers(tmp_path):
    path = tmp_path / "record.json"
    fileio.write_json(str(path), {"loss": float("nan"), "steps": [1.0, float("inf"), -float("inf")], "ok": True})
    assert _strict(path.read_text()) == {"loss": None, "steps": [1.0, None, None], "ok": True}


# -- the history ------------------------------------------------------------------------------------------------
def _record() -> dict[str, Any]:
    result = {"site": "local", "job_id": "7", "started": 1764000000.0, "verdict": "passed", "nodes": 1, "world_size": 2}
    return history.record_from_result(result, "validation", "/r/7")


@pytest.mark.parametrize("name", [history_store.INDEX, history_store.LOCK])
def test_a_hard_linked_index_or_lock_is_refused_and_left_alone(tmp_path, name):
    directory = tmp_path / "history"
    directory.mkdir()
    outside = tmp_path / "outside.jsonl"
    outside.write_text("someone else's file\n")
    os.link(outside, directory / name)
    with pytest.raises(HistoryError, match=f"^{directory / name} has 2 hard links: not the history's own file"):
        history_store.append(str(directory), _record())
    assert outside.read_text() == "someone else's file\n"


@pytest.mark.parametrize("value", ["/p/validation/../../tmp/h", "/p/./history", "//p/history", "/p/history/", "p/history"])
def test_a_history_dir_that_is_not_absolute_and_normalised_is_refused(tmp_path, value, capsys):
    config = tmp_path / "check-config.json"
    config.write_text(json.dumps({"history_dir": value, "stack": {}}))
    assert history.main(["append", "--config", str(config), json.dumps(_record())]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "history_dir is not an absolute path without '.', '..' or '//'" in err, err
    with pytest.raises(InputError, match="`history_dir` .* is not an absolute path without"):
        batchjob.job_config(local_host(), str(tmp_path))
    assert not (tmp_path / "tmp").exists()


# -- the data directory ----------------------------------------------------------------------------------------
def _data_copy(root: Path) -> Path:
    data = root / "data"
    for folder in ("playbooks", "sources", "patches", "modulefiles"):
        shutil.copytree(REPO / folder, data / folder)
    return data


def test_a_data_directory_others_can_write_is_refused(tmp_path, monkeypatch):
    data = _data_copy(tmp_path)
    monkeypatch.setenv("SITESTACK_DATA_DIR", str(data))
    assert envvars.get("SITESTACK_DATA_DIR") == str(data)   # the user's own, as copied: taken
    template = next((data / "modulefiles").rglob("*.j2"))
    template.chmod(0o666)
    with pytest.raises(InputError, match=f"SITESTACK_DATA_DIR: {template} is writable by every user"):
        envvars.get("SITESTACK_DATA_DIR")
    template.chmod(0o644)
    (data / "playbooks").chmod(0o777)
    with pytest.raises(InputError, match="writable by every user .mode 777."):
        envvars.get("SITESTACK_DATA_DIR")


@needs_chown
def test_a_data_directory_another_user_owns_is_refused(tmp_path, monkeypatch):
    data = _data_copy(tmp_path)
    recipe = next((data / "sources").rglob("*.yml"))
    os.chown(recipe, OTHER, OTHER)
    monkeypatch.setenv("SITESTACK_DATA_DIR", str(data))
    with pytest.raises(InputError, match=f"{recipe} is owned by another user .uid {OTHER}."):
        envvars.get("SITESTACK_DATA_DIR")


def test_a_world_writable_data_directory_stops_a_run_before_it_starts(tmp_path):
    data = _data_copy(tmp_path / "site")
    data.chmod(0o777)
    case = Case("data-dir-world-writable", "SITESTACK_DATA_DIR", args=("provision", "--site", "local", "--check"),
                expect="writable by every user", extra_env={"SITESTACK_DATA_DIR": str(data)})
    result, paths = run_case(case, tmp_path)
    assert_refused_cleanly(case, result, paths, git_status())


# -- invoke tune publishes only what the plan declared ----------------------------------------------------------
PLAN = {"schema": "sitestack-tune-plan/1", "sizes": [65536], "repeats": 5, "point_seconds": 60,
        "variables": ["NCCL_ALGO", "NCCL_PROTO"],
        "points": [{"id": "p00", "label": "default", "settings": {}},
                   {"id": "p01", "label": "NCCL_ALGO=Ring", "settings": {"NCCL_ALGO": "Ring"}},
                   {"id": "p02", "label": "NCCL_ALGO=Tree", "settings": {"NCCL_ALGO": "Tree"}},
                   {"id": "p03", "label": "NCCL_PROTO=LL", "settings": {"NCCL_PROTO": "LL"}}]}


@pytest.mark.parametrize(("settings", "key", "says"), [
    ({"LD_PRELOAD": "/tmp/x.so"}, "points[2].settings.LD_PRELOAD", "not a variable of the plan the sweep ran"),
    ({"NCCL_ALGO": "CollNet"}, "points[2].settings.NCCL_ALGO", "'CollNet' is not a candidate value of NCCL_ALGO"),
    ({"NCCL_ALGO": "Ring\nexport X=1"}, "points[2].settings.NCCL_ALGO", "'Ring\\nexport X=1' is not a candidate value"),
], ids=["undeclared", "not-a-candidate", "newline"])
def test_tune_publishes_only_declared_variables_and_candidate_values(settings, key, says):
    from sitestack.engine.tune_decision import check_declared

    points = [{"settings": {}}, {"settings": {"NCCL_ALGO": "Ring"}}]
    with pytest.raises(InputError) as exc:
        check_declared({"plan": PLAN, "points": [*points, {"settings": settings}]}, "/r/sweep.json")
    assert str(exc.value).startswith(f"/r/sweep.json: {key}: {says}"), str(exc.value)
    check_declared({"plan": PLAN, "points": points}, "/r/sweep.json")   # the declared ones pass
    newline_plan = {**PLAN, "points": [*PLAN["points"], {"id": "p04", "label": "x", "settings": {"NCCL_ALGO": "a\nb"}}]}
    with pytest.raises(InputError, match="plan: not the plan of a sweep .*NCCL_ALGO: a value of one printable line"):
        check_declared({"plan": newline_plan, "points": points}, "/r/sweep.json")


# -- rollback: only to a generation the tool made ---------------------------------------------------------------
def test_rollback_never_switches_to_a_link_named_like_a_generation(tmp_path):
    from sitestack.core.errors import SitestackError
    from sitestack.installs import generations

    parent = tmp_path / "prefix"
    current = parent / ".stack.gen-aaaa1111"
    current.mkdir(parents=True)
    (parent / "stack").symlink_to(current.name)
    outside = tmp_path / "outside"
    outside.mkdir()
    (parent / ".stack.gen-bbbb2222").symlink_to(outside)
    record = {"format": 1, "path": str(parent / "stack"), "generations": [
        {"name": ".stack.gen-bbbb2222", "created": 1.0, "retired": 2.0},
        {"name": ".stack.gen-aaaa1111", "created": 2.0, "retired": None}]}
    (parent / ".stack.generations.json").write_text(json.dumps(record))
    with pytest.raises(SitestackError, match="no earlier generation is left on disk"):
        generations.rollback(local_host(), str(parent / "stack"))
    assert os.readlink(parent / "stack") == current.name


# -- the playbook: one module per step, `stack:` only where it does something ----------------------------------
def _second_stack(data: dict[str, Any], overlay: dict[str, Any]) -> None:
    data["stacks"] = {"other": {"facts": overlay}}


def _same_module(data: dict[str, Any], _mark: str) -> None:
    _second_stack(data, {"python": {"version": data["facts"]["python"].get("version", "3.11")}})
    data["steps"].append({"name": "other-modulefiles", "action": "modulefiles", "stack": "other"})


def _stack_on_launch_helpers(data: dict[str, Any], _mark: str) -> None:
    _second_stack(data, {"python": {"version": data["facts"]["python"].get("version", "3.11")}})
    step = next(s for s in data["steps"] if s["action"] == "install-launch-env")
    step["stack"] = "other"


PLAYBOOK_CASES = [
    Case("two-stacks-one-module", r"local\.yml:\d+: steps\[\d+\]\.args: ", edit=_same_module, args=("provision", "--check"),
         expect="is also the module of step 'modulefiles'"),
    Case("stack-on-launch-helpers", r"local\.yml:\d+: stack: ", edit=_stack_on_launch_helpers, args=("provision", "--check"),
         expect="install-launch-env uses the playbook's own stack"),
]


@pytest.mark.parametrize("case", PLAYBOOK_CASES, ids=[c.id for c in PLAYBOOK_CASES])
def test_a_playbook_step_that_would_do_nothing_or_undo_another_is_refused(case, tmp_path):
    result, paths = run_case(case, tmp_path)
    assert_refused_cleanly(case, result, paths, git_status())


# -- conda channels: credentials never on argv; channels without conda refused ----------------------------------
def test_a_channel_credential_never_reaches_condas_command_line(tmp_path):
    from sitestack.actions.pack_env import private_condarc
    from sitestack.installs.conda_env import conda_create_argv, load_env_file

    token = "tk-0123456789abcdef"
    path = tmp_path / "env.yml"
    path.write_text(f"name: tools\nchannels:\n  - https://conda.anaconda.org/t/{token}/private\n  - conda-forge\n"
                    "dependencies:\n  - python=3.11\n  - six=1.16.0\n")
    env = load_env_file(path)
    argv = conda_create_argv("/opt/mm", "/r", env, "3.11.7")
    assert token not in " ".join(argv) and "--channel" not in argv and "--override-channels" not in argv
    host = local_host()
    with private_condarc(host, env) as extra:
        condarc = Path(extra["CONDARC"])
        assert os.stat(condarc).st_mode & 0o777 == 0o600 and os.stat(condarc.parent).st_mode & 0o777 == 0o700
        assert condarc.read_text() == (f'channels:\n  - "https://conda.anaconda.org/t/{token}/private"\n'
                                       '  - "conda-forge"\n')
    assert not condarc.parent.exists()
    public = tmp_path / "public.yml"
    public.write_text("name: tools\nchannels: [conda-forge]\ndependencies:\n  - six=1.16.0\n")
    with private_condarc(host, load_env_file(public)) as extra:
        assert extra == {}


def test_env_yml_channels_without_conda_are_refused_unless_the_playbook_maps_them(tmp_path):
    from tests.conftest import run_invoke

    path = tmp_path / "env.yml"
    path.write_text("name: tools\nchannels: [my-private-channel]\ndependencies:\n  - six=1.16.0\n")
    out = run_invoke("pack-env", "--site", "local", "--requirements", str(path), "--prefix", str(tmp_path / "p"),
                     "--check", env={"SITESTACK_LOG_DIR": str(tmp_path / "logs")}, timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode == 1 and "Traceback" not in text, text
    assert f"{path}: channels: my-private-channel, and " in text and "has no conda or micromamba" in text, text
    assert "channels_without_conda: index" in text and not (tmp_path / "p").exists()
