"""The stack's module and ``invoke tune``'s decision: a setting is set only after a measurement chose it
(``{prefix}/tuning/tuning.json``), as a default, under a comment citing its evidence; Frontier's and LUMI's
untried NCCL settings are no longer set without one (check-mode text); a tuning.json that is malformed
or names what the playbook no longer declares is a warning naming the file. The module is loaded with
real Lmod."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from sitestack.actions import ACTIONS
from sitestack.core.host import local_host
from sitestack.engine import playbook as pb
from sitestack.installs.tuned import tuned_from, tuning_path
from tests.conftest import LMOD_INIT, clean_env, playbook_copy, run_invoke, shell
from tests.contexts import offline_context

EVIDENCE = "DDP step 20.1 ms vs 38.9 ms unset (-48%, beyond a spread of 3%); job 123, 2026-11-25"
#: Per site: the settings its sources advise untried, and one a measurement may choose (name, value).
UNTRIED = {"frontier": ("NCCL_NET_GDR_LEVEL", "NCCL_CROSS_NIC", "NCCL_ALGO"), "lumi": ("NCCL_CROSS_NIC",)}
CHOSEN = {"frontier": ("NCCL_NET_GDR_LEVEL", "3"), "lumi": ("NCCL_CROSS_NIC", "1")}


def tuning_doc(chosen: dict[str, str], evidence: dict[str, str] | None = None) -> str:
    return json.dumps({"schema": "sitestack-tuning/1", "site": "x", "job_id": "123", "date": "2026-11-25T10:00:00Z",
                       "points": [], "chosen": chosen,
                       "evidence": evidence if evidence is not None else {k: EVIDENCE for k in chosen},
                       "dropped": []})


def write_tuning(prefix: Path, text: str) -> Path:
    path = Path(tuning_path(str(prefix)))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# -- reading tuning.json ------------------------------------------------------------------------------------
def test_only_declared_variables_with_a_candidate_value_and_evidence_are_set():
    facts = pb.load("frontier").facts
    text = tuning_doc({"NCCL_ALGO": "RING", "NCCL_CROSS_NIC": "2", "NCCL_DEBUG": "INFO", "NCCL_NET_GDR_LEVEL": "3"},
                      {"NCCL_ALGO": EVIDENCE, "NCCL_CROSS_NIC": EVIDENCE, "NCCL_DEBUG": EVIDENCE,
                       "NCCL_NET_GDR_LEVEL": "line one\nline two"})
    tuned, warnings = tuned_from(text, "/p/tuning/tuning.json", facts)
    assert [(t.name, t.value, t.evidence) for t in tuned] == [("NCCL_ALGO", "RING", EVIDENCE)]
    assert len(warnings) == 3 and all(w.startswith("/p/tuning/tuning.json: ") for w in warnings)
    assert any("NCCL_CROSS_NIC=2, not among its candidates" in w for w in warnings)
    assert any("NCCL_DEBUG, which facts.tuning no longer declares" in w for w in warnings)
    assert any("the evidence of NCCL_NET_GDR_LEVEL" in w for w in warnings)


def test_a_decision_measured_with_another_stack_sets_nothing_in_this_ones_module():
    facts = pb.load("frontier").facts
    doc = json.loads(tuning_doc({"NCCL_ALGO": "RING"}))
    doc["stack"] = {"module": "pytorch/2.2.2-rocm5.7", "digest": "abc"}
    text = json.dumps(doc)
    tuned, warnings = tuned_from(text, "/p/tuning/tuning.json", facts, "pytorch/2.2.2-rocm5.7")
    assert [t.name for t in tuned] == ["NCCL_ALGO"] and warnings == []
    tuned, warnings = tuned_from(text, "/p/tuning/tuning.json", facts, "pytorch/2.10.0-rocm7.1")
    assert tuned == [] and warnings == ["/p/tuning/tuning.json: measured with pytorch/2.2.2-rocm5.7, not "
                                        "pytorch/2.10.0-rocm7.1: not set in its module (`invoke tune` measures the "
                                        "stack the validation job runs)"]


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", json.dumps({"schema": "other/1", "chosen": {}}),
                                  json.dumps({"schema": "sitestack-tuning/1", "chosen": {"A": 1}, "evidence": {}})])
def test_a_malformed_tuning_json_sets_nothing_and_says_so(text: str):
    tuned, warnings = tuned_from(text, "/p/tuning/tuning.json", pb.load("frontier").facts)
    assert tuned == [] and len(warnings) == 1
    assert warnings[0].startswith("/p/tuning/tuning.json: ") and warnings[0].endswith(": ignored")


# -- Frontier and LUMI: check-mode text -----------------------------------------------------------------------
def check_modules(site: str, prefix: Path, tmp_path: Path, *extra: str):
    facts = tmp_path / "site-facts.yml"
    facts.write_text("facts:\n  marker: null\n")   # this machine stands in for the site's login node
    return run_invoke("provision", "--site", site, "--account", "proj123", "--prefix", str(prefix), "--tags",
                      "modulefiles", *extra, env={"SITESTACK_FACTS": str(facts),
                                                  "SITESTACK_LOG_DIR": str(tmp_path / "logs")}, timeout=300)


def modulefiles_step(site_name: str, prefix: Path):
    site = pb.load(site_name)
    ctx = offline_context(site, prefix=str(prefix))
    return ACTIONS["modulefiles"].from_spec(next(s for s in site.steps if s.name == "modulefiles"), ctx)


@pytest.mark.parametrize("site", ["frontier", "lumi"])
def test_untried_settings_are_not_set_until_a_measurement_chooses_one(site: str, tmp_path: Path):
    prefix = tmp_path / "prefix"
    out = check_modules(site, prefix, tmp_path, "--check", "--diff")
    assert out.returncode == 0, out.stdout + out.stderr
    module = next(line for line in out.stdout.splitlines() if line.strip().startswith("+++") and "/pytorch/" in line)
    assert "NCCL_SOCKET_IFNAME" in out.stdout and "FI_MR_CACHE_MONITOR" in out.stdout   # still set: correctness
    assert not [name for name in UNTRIED[site] if name in out.stdout], out.stdout               # untried: not set
    assert "measured by `invoke tune`" not in out.stdout, module
    # a measurement chose one: the check says so, and the diff shows it with its evidence
    name, value = CHOSEN[site]
    manifest = Path(modulefiles_step(site, prefix).stack.manifest)   # the stack stands installed
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text("{}")
    installed = check_modules(site, prefix, tmp_path)
    assert installed.returncode == 0 and "changed  modulefiles" in installed.stdout, installed.stdout
    write_tuning(prefix, tuning_doc({name: value}))
    out = check_modules(site, prefix, tmp_path, "--check", "--diff")
    assert f"would change: tuned settings changed: {name}={value}" in out.stdout, out.stdout
    assert f"+-- measured by `invoke tune` (docs/tuning.md): {EVIDENCE}" in out.stdout, out.stdout
    assert f'+sitestack_default("{name}", "{value}")' in out.stdout, out.stdout
    applied = check_modules(site, prefix, tmp_path)
    assert "changed  modulefiles" in applied.stdout, applied.stdout
    again = check_modules(site, prefix, tmp_path, "--check")
    assert "ok       modulefiles" in again.stdout, again.stdout
    # the measurement is withdrawn: the setting goes, and the check says so
    write_tuning(prefix, tuning_doc({}))
    out = check_modules(site, prefix, tmp_path, "--check")
    assert f"would change: tuned settings changed: {name} unset" in out.stdout, out.stdout


def test_a_tuning_json_naming_an_undeclared_variable_is_a_warning_naming_the_file(tmp_path: Path):
    prefix = tmp_path / "prefix"
    path = write_tuning(prefix, tuning_doc({"NCCL_DEBUG": "INFO"}))
    out = check_modules("frontier", prefix, tmp_path, "--check")
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"warning: {path}: chosen NCCL_DEBUG, which facts.tuning no longer declares: not set" in out.stdout
    assert "tuned settings changed" not in out.stdout


# -- the local stack's module with real Lmod ------------------------------------------------------------------
TUNING = {"variables": {"OMP_NUM_THREADS": {"candidates": ["1", "2"], "note": "threads per rank"}}}


def local_step(tmp_path: Path, prefix: Path):
    book = playbook_copy(tmp_path / "book", facts={"tuning": TUNING})
    site = pb.load(None, book)
    ctx = offline_context(site, prefix=str(prefix))
    return ACTIONS["modulefiles"].from_spec(next(s for s in site.steps if s.action == "modulefiles"), ctx)


@pytest.mark.parametrize("fmt", ["lua", "tcl"])
def test_the_module_sets_the_winner_as_a_default_with_its_evidence(fmt: str, tmp_path: Path):
    prefix = tmp_path / "prefix"
    write_tuning(prefix, tuning_doc({"OMP_NUM_THREADS": "1"}))
    step = local_step(tmp_path, prefix)
    tuned = step.tuned(local_host())
    assert [(t.name, t.value) for t in tuned] == [("OMP_NUM_THREADS", "1")]
    root = tmp_path / "modules"
    for path, text in step.render_files([], fmt, tuned=tuned).items():
        target = root / Path(path).relative_to(step.root)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    text = (root / "pytorch" / f"2.13.0-cpu{'.lua' if fmt == 'lua' else ''}").read_text()
    mark = "--" if fmt == "lua" else "#"
    lines = text.splitlines()
    at = lines.index(f"{mark} measured by `invoke tune` (docs/tuning.md): {EVIDENCE}")
    assert "OMP_NUM_THREADS" in lines[at + 1] and '"1"' in lines[at + 1]
    script = f""". {LMOD_INIT}/bash; module use {shlex.quote(str(root))}
module load pytorch/2.13.0-cpu; echo "${{OMP_NUM_THREADS-unset}}"
module unload pytorch/2.13.0-cpu; echo "${{OMP_NUM_THREADS-unset}}" """
    out = shell(["bash", "-c"], script, clean_env())
    assert out.stdout.splitlines()[-2:] == ["1", "unset"], out.stdout + out.stderr
    # a value of the user's wins, as with facts.env's settings
    out = shell(["bash", "-c"], script, clean_env(OMP_NUM_THREADS="4"))
    assert out.stdout.splitlines()[-2:] == ["4", "4"], out.stdout + out.stderr


def test_without_a_tuning_json_nothing_is_set_and_nothing_is_said(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    step = local_step(tmp_path, tmp_path / "prefix")
    assert step.tuned(local_host()) == []
    text = "".join(step.render_files([], "lua", tuned=[]).values())
    assert "OMP_NUM_THREADS" not in text and "invoke tune" not in text
    assert "warning" not in capsys.readouterr().out
