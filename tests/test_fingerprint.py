"""The host's fingerprint (sitestack/onsite/fingerprint.py) read from hostile inputs: stand-in commands on
PATH that print escapes, floods or hang, a /sys tree of a test's own, module lists out of step; its
record in the history (host_facts), what --if-changed decides from it (engine/host_fingerprint.py, the
shipped program run through the Host) and the verdict's line naming what changed (engine/regression.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from sitestack.core.host import local_host
from sitestack.engine import host_fingerprint, regression
from sitestack.engine import playbook as pb
from sitestack.onsite import fingerprint as fp
from sitestack.onsite import history
from sitestack.onsite.history_record import host_facts
from tests.onsite_dir import install_programs

PROVIDERS = "cxi:\n    version: 1.0\ntcp;ofi_rxm:\n    version: 1.0\nshm:\n    version: 120.10\n"


def stand_in(bindir: Path, name: str, body: str) -> None:
    """An executable ``name`` in ``bindir`` running the shell ``body``."""
    bindir.mkdir(parents=True, exist_ok=True)
    path = bindir / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def fi_info(bindir: Path, version: str) -> None:
    stand_in(bindir, "fi_info", f'case "$1" in --version) printf "fi_info: 1.0\\nlibfabric: {version}\\n";; '
                                f"-l) printf '{PROVIDERS}';; *) exit 1;; esac")


def test_the_collector_reads_libfabric_its_providers_and_slurm_from_the_commands(tmp_path, monkeypatch):
    fi_info(tmp_path / "bin", "1.20.1")
    stand_in(tmp_path / "bin", "srun", 'echo "slurm 24.05.3"')
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    found = fp.fingerprint({"LOADEDMODULES": "libfabric/1.20.1:cray-mpich/8.1.29",
                            "_LMFILES_": "/opt/m/libfabric/1.20.1.lua:/opt/m/cray-mpich/8.1.29.lua"}, str(tmp_path))
    assert found["libfabric"] == "1.20.1" and found["providers"] == "cxi,shm,tcp+ofi_rxm" and found["slurm"] == "24.05.3"
    assert found["modules"] == ["libfabric/1.20.1", "cray-mpich/8.1.29"]
    assert found["module_files"] == {"libfabric/1.20.1": "/opt/m/libfabric/1.20.1.lua",
                                     "cray-mpich/8.1.29": "/opt/m/cray-mpich/8.1.29.lua"}
    assert found["glibc"].startswith("glibc ") and found["kernel"]


def test_hostile_commands_give_bounded_clean_values_or_null(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    # escapes and a shell's words in the version, a flood of providers, a failing and a hanging command
    stand_in(bindir, "fi_info", 'case "$1" in --version) printf "libfabric: 1.2\\033]0;owned\\007$(printf x%.0s $(seq 300))\\n";; '
                                "-l) yes 'p\\033[31m:' | head -c 100000;; esac")
    stand_in(bindir, "srun", "echo 'slurm 23.11'; exit 3")
    stand_in(bindir, "ofed_info", "sleep 30")
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    monkeypatch.setattr(fp, "COMMAND_TIMEOUT", 0.5)
    started = time.monotonic()
    found = fp.fingerprint({}, str(tmp_path))
    assert time.monotonic() - started < 10   # the hung ofed_info is given up on
    assert found["libfabric"] is not None and "\x1b" not in found["libfabric"] and "\x07" not in found["libfabric"]
    assert len(found["libfabric"]) <= fp.VALUE_MAX
    assert found["providers"] is None    # "p\x1b[31m:" is no provider's name
    assert found["slurm"] is None and found["network"] is None   # exit 3; timed out


def test_a_sys_tree_gives_the_driver_firmware_and_slingshot_stack(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    (tmp_path / "sys/module/amdgpu").mkdir(parents=True)
    (tmp_path / "sys/module/amdgpu/version").write_text("6.8.5\x1b[2J\n")
    for card, vbios in (("card0", "113-D65201-042"), ("card1", "113-D65201-042"), ("card2", "113-D65201-046")):
        (tmp_path / f"sys/class/drm/{card}/device").mkdir(parents=True)
        (tmp_path / f"sys/class/drm/{card}/device/vbios_version").write_text(vbios + "\n")
    for dev in ("cxi0", "cxi1"):
        (tmp_path / f"sys/class/cxi/{dev}").mkdir(parents=True)
    (tmp_path / "sys/module/cxi_ss1").mkdir(parents=True)
    (tmp_path / "sys/module/cxi_ss1/version").write_text("1.5.2\n")
    assert fp.driver_version(str(tmp_path)) == "amdgpu 6.8.5??2J"
    assert fp.firmware_version(str(tmp_path)) == "113-D65201-042,113-D65201-046"
    assert fp.network_stack(str(tmp_path)) == "cxi 1.5.2 (2 devices)"
    (tmp_path / "sys/module/amdgpu/version").write_bytes(b"\xff" * (fp.READ_MAX * 4))   # not text, too long
    assert len(fp.driver_version(str(tmp_path)) or "") <= fp.VALUE_MAX


def test_module_lists_out_of_step_keep_the_modules_and_no_files():
    many = ":".join(f"m{i}/1" for i in range(1000))
    modules, files = fp.loaded_modules({"LOADEDMODULES": many, "_LMFILES_": "/a.lua"})
    assert len(modules) == fp.MODULES_MAX and files == {}
    modules, files = fp.loaded_modules({"LOADEDMODULES": "a/1\x1b[31m", "_LMFILES_": "/x/\u202ea.lua"})
    assert modules == ["a/1??31m"] and files == {"a/1??31m": "/x/?a.lua"}


def test_the_program_refuses_a_bad_configuration_in_one_line(tmp_path, capsys):
    bad = tmp_path / "check-config.json"
    bad.write_text("{not json")
    assert fp.main(["--config", str(bad)]) == 1
    assert capsys.readouterr().err.count("\n") == 1
    assert fp.main(["--what"]) == 2


def test_a_record_keeps_the_fingerprint_bounded_and_names_a_module_file_change():
    hostile = {"modules": ["a/1"] * 500 + [7, None], "module_files": {f"m{i}/1": "/p" * 500 for i in range(300)},
               "libfabric": ["1.2"], "kernel": "6.1\x1b[31m"}
    facts = host_facts(hostile, fp.KEYS)
    assert len(facts["modules"]) == 100 and len(facts["module_files"]) == 100
    assert all(len(v) <= 400 for v in facts["module_files"].values())
    assert facts["libfabric"] is None and facts["kernel"] == "6.1?[31m"
    old = {"modules": ["cray-mpich/8.1.27"], "module_files": {"cray-mpich/8.1.27": "/opt/a.lua"}, "libfabric": "1.15.2.0"}
    new = {"modules": ["cray-mpich/8.1.27"], "module_files": {"cray-mpich/8.1.27": "/opt/b.lua"}, "libfabric": "1.20.1"}
    assert history.toolchain_changes(old, new, fp.KEYS) == [
        "module file of cray-mpich/8.1.27 /opt/a.lua -> /opt/b.lua", "libfabric 1.15.2.0 -> 1.20.1"]


def record(n: int, fingerprint: dict | None, *, digest: str = "d1", verdict: str = "passed",
           busbw: float = 10.0) -> dict:
    return {"schema": history.SCHEMA, "id": f"20261125T1000{n:02d}Z-validation-{n}", "kind": "validation",
            "started": 1764000000.0 + n, "verdict": verdict, "stack": {"digest": digest},
            "layout": {"nodes": 1, "world_size": 2, "launcher": "torchrun", "backend": "gloo", "device": "cpu"},
            "metrics": {"busbw_gbs": busbw}, "toolchain": {"libfabric": (fingerprint or {}).get("libfabric")},
            "fingerprint": fingerprint}


OLD = {"libfabric": "1.15.2.0", "kernel": "6.1"}
NEW = {"libfabric": "1.20.1", "kernel": "6.1"}


def test_if_changed_runs_only_when_the_fingerprint_differs_from_the_last_passing_run_of_the_generation():
    now = host_fingerprint.Reading(host_facts(OLD, fp.KEYS), "d1")
    assert host_fingerprint.decide(now, [])[0] is True
    runs = [record(1, OLD), record(2, NEW, verdict="failed"), record(3, NEW, digest="d2")]
    run, line = host_fingerprint.decide(now, runs)
    assert not run and line.startswith("unchanged: ") and "20261125T100001Z-validation-1" in line
    run, line = host_fingerprint.decide(host_fingerprint.Reading(host_facts(NEW, fp.KEYS), "d1"), runs)
    assert run and line.endswith("since the last passing run 20261125T100001Z-validation-1: libfabric 1.15.2.0 -> 1.20.1")
    run, line = host_fingerprint.decide(host_fingerprint.Reading(None, None, "fingerprint.py is not installed"), runs)
    assert run and "cannot be read (fingerprint.py is not installed)" in line


def test_the_verdict_names_what_changed_and_busbw_against_the_last_passing_run():
    line = regression.since_last_pass(record(5, NEW, busbw=6.2), [record(1, OLD), record(2, OLD, busbw=10.0)])
    assert line == ("changed since the last passing run 20261125T100002Z-validation-2: libfabric 1.15.2.0 -> 1.20.1; "
                    "busbw -38% vs the last passing run")
    assert regression.since_last_pass(record(5, OLD), [record(1, OLD)]) is None
    assert line in regression.judge(record(5, NEW, busbw=6.2), [record(1, OLD), record(2, OLD)])["lines"]


def test_the_shipped_program_reads_the_fingerprint_through_the_host(tmp_path, monkeypatch):
    directory = install_programs(tmp_path / "validation", ("fingerprint.py",))
    (directory / "check-config.json").write_text(json.dumps({"stack": {"module": None, "manifest": None}}))
    fi_info(tmp_path / "bin", "1.15.2.0")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{__import__('os').environ['PATH']}")
    site = pb.load("local")
    resolved = site.resolve(home=str(tmp_path), user="u", account=None, prefix=str(tmp_path / "prefix"))
    reading = host_fingerprint.read(local_host(), resolved.facts, resolved.values, str(directory), {"stack": {}})
    assert reading.fingerprint is not None, reading.why
    assert reading.fingerprint["libfabric"] == "1.15.2.0" and reading.digest is None
    missing = host_fingerprint.read(local_host(), resolved.facts, resolved.values, str(tmp_path), {})
    assert missing.fingerprint is None and "is not installed" in missing.why


@pytest.mark.parametrize("junk", ["", "[]", '{"fingerprint": 3}', "x" * 100])
def test_output_that_is_no_fingerprint_is_a_reading_without_one(tmp_path, junk):
    directory = tmp_path / "validation"
    directory.mkdir()
    (directory / host_fingerprint.PROGRAM).write_text(f"import sys\nsys.stdout.write({junk!r})\n")
    site = pb.load("local")
    resolved = site.resolve(home=str(tmp_path), user="u", account=None, prefix=str(tmp_path / "prefix"))
    reading = host_fingerprint.read(local_host(), resolved.facts, resolved.values, str(directory), {})
    assert reading.fingerprint is None and reading.why


@pytest.mark.parametrize(("changed", "why"), [({"wait": False}, "drop --no-wait"), ({"collect": "123"}, "--collect reads")])
def test_if_changed_refuses_what_would_lose_the_comparison(tmp_path, changed, why):
    from sitestack.core.errors import InputError
    from sitestack.core.report import Reporter
    from sitestack.engine import validate as v

    options = v.ValidateOptions(if_changed=True, prefix=str(tmp_path / "prefix"), **changed)
    with pytest.raises(InputError, match=why):
        v.fingerprint_now(pb.load("local"), options, Reporter(), local_host(), {})
