"""Defaults move only after validation (sitestack/engine/promotion.py), with real Lmod: a stack whose
modulefiles step claims the default of a directory another stack holds is installed hidden and
loadable by its full name while `module load pytorch` keeps the old one; promotion is refused without
a passing run of the stack's exact generation in the site's history (a passing run of another digest
does not count), and `--force` promotes and is recorded in the generation record and the promotion
log. The end-to-end run (`invoke provision` validating for real, a failing validation injected) is
test_provision_validates_then_promotes."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import time
from pathlib import Path

import pytest
import yaml

from sitestack.actions import ACTIONS
from sitestack.core.errors import SitestackError
from sitestack.core.host import local_host
from sitestack.engine import lifecycle, promotion
from sitestack.engine import playbook as pb
from sitestack.engine import site_history as history
from sitestack.installs import generations as gens
from sitestack.installs.venv_manifest import dump, plan_digest
from sitestack.installs.venv_stack import MANIFEST
from sitestack.onsite.history_record import record_from_result
from tests.conftest import LMOD_INIT, REPO, clean_env, run_invoke, shell
from tests.contexts import offline_context
from tests.onsite_dir import install_programs

pytestmark = pytest.mark.integration

if not Path(LMOD_INIT, "bash").exists():  # pragma: no cover - the test script installs lmod
    pytest.skip("Lmod is not installed (Debian package lmod)", allow_module_level=True)

OLD, NEW = "pytorch/2.12.0-cpu", "pytorch/2.13.0-cpu"


def playbook(tmp: Path, stack: str, *, steps: tuple[str, ...] = ("modulefiles",), name: str = "local",
             default: bool = True) -> Path:
    """The local site's playbook with only ``steps`` (by name) and ``stack`` its modulefiles step's
    default, module files in ``<prefix>/modules``."""
    data = yaml.safe_load((REPO / "playbooks" / "local.yml").read_text())
    data["steps"] = [s for s in data["steps"] if s["name"] in steps]
    for s in data["steps"]:
        if s["action"] == "modulefiles":
            s["args"] = {"name": stack, "recipes": [], "default": default}
        if s["action"] == "stack-venv":
            s["args"] = {**s.get("args", {}), "name": stack}
    path = tmp / f"book-{stack.replace('/', '-')}{'' if default else '-plain'}" / f"{name}.yml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def fake_generation(prefix: Path, stack: str, plan: dict) -> str:
    """``<prefix>/<stack>`` as a stack-venv step leaves it: a link to a generation holding the
    manifest, the stable manifest link beside it; the plan's digest."""
    parent, leaf = (prefix / stack).parent, (prefix / stack).name
    gen = parent / f".{leaf}.gen-{abs(hash(json.dumps(plan))) % 10**8:08d}"
    gen.mkdir(parents=True)
    (gen / ".sitestack-manifest.json").write_text(dump({"plan": plan}))
    for link, target in ((parent / leaf, gen.name), (parent / f"{leaf}.manifest.json", f"{leaf}/.sitestack-manifest.json")):
        if link.is_symlink():
            link.unlink()
        link.symlink_to(target)
    return plan_digest(plan)


def lmod(root: Path, commands: str) -> str:
    out = shell(["bash", "-c"], f"set -e\n. {LMOD_INIT}/bash\nmodule use {shlex.quote(str(root))}\n{commands}",
                clean_env())
    assert out.returncode == 0 and "Lmod has detected the following error" not in out.stderr, out.stderr
    return out.stdout + out.stderr


def loaded(root: Path) -> list[str]:
    return lmod(root, 'module load pytorch; echo "$LOADEDMODULES"').split()


def install(book: Path, prefix: Path, tmp: Path) -> str:
    out = run_invoke("install-modulefiles", "--playbook", str(book), "--prefix", str(prefix),
                     env={"SITESTACK_LOG_DIR": str(tmp / "logs")})
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_a_new_default_awaits_its_validation_and_force_is_recorded(tmp_path: Path):
    prefix, host = tmp_path / "prefix", local_host()
    root = prefix / "modules"
    fake_generation(prefix, OLD, {"requirements": ["torch==2.12.0"]})
    digest = fake_generation(prefix, NEW, {"requirements": ["torch==2.13.0"]})
    install(playbook(tmp_path, OLD), prefix, tmp_path)
    assert loaded(root) == [OLD]
    # the new stack claims the default: installed hidden, loadable by its full name; the old stays
    said = install(playbook(tmp_path, NEW), prefix, tmp_path)
    assert f"{NEW} awaits validation: {OLD} stays the default" in said
    assert loaded(root) == [OLD]
    assert NEW not in lmod(root, "module -t avail pytorch")
    assert lmod(root, f'module load {NEW}; echo "$LOADEDMODULES"').split()[0] == NEW
    # a second run changes nothing (the claim still awaits)
    again = run_invoke("install-modulefiles", "--playbook", str(playbook(tmp_path, NEW)), "--prefix", str(prefix),
                       "--check", "--fail-on-change", env={"SITESTACK_LOG_DIR": str(tmp_path / "logs")})
    assert again.returncode == 0, again.stdout + again.stderr

    ctx = offline_context(pb.load(path=playbook(tmp_path, NEW)), home=str(Path.home()), user=host.user(),
                          prefix=str(prefix))
    (cand,) = promotion.candidates(host, ctx, planned=False)
    assert cand.awaiting and cand.holder == OLD
    with pytest.raises(SitestackError, match=f"{NEW} .* has no passing validation run"):
        promotion.promote_on(host, ctx, cand, force=False, check=False)
    # a passing run of another generation of the same module does not count
    validation = install_programs(prefix / "validation", ("history.py",))
    other = record_from_result({"verdict": "passed", "started": time.time() - 60, "job_id": "7",
                                "stack": {"module": NEW, "digest": "0" * 16}}, "validation", None)
    assert history.append_on(host, history.program_of(str(validation)), str(prefix / "history"), other) is None
    with pytest.raises(SitestackError, match="has no passing validation run"):
        promotion.promote_on(host, ctx, cand, force=False, check=False)
    # nor does a run of this generation whose checks passed but whose comparison with the history failed
    slower = {**record_from_result({"verdict": "passed", "started": time.time() - 30, "job_id": "8",
                                    "stack": {"module": NEW, "digest": digest}}, "validation", None),
              "regression": {"status": "fail", "lines": ["busbw -60% vs the last passing run"]}}
    assert history.append_on(host, history.program_of(str(validation)), str(prefix / "history"), slower) is None
    with pytest.raises(SitestackError, match="has no passing validation run"):
        promotion.promote_on(host, ctx, cand, force=False, check=False)
    good = record_from_result({"verdict": "passed", "started": time.time() - 20, "job_id": "9",
                               "stack": {"module": NEW, "digest": digest}}, "validation", None)
    assert history.append_on(host, history.program_of(str(validation)), str(prefix / "history"), good) is None
    assert promotion.promote_on(host, ctx, cand, force=False, check=True).endswith(f"(run {good['id']} passed)")
    # the force path, on a history without that run
    (prefix / "history").rename(prefix / "history-kept")
    assert "would make" in promotion.promote_on(host, ctx, cand, force=True, check=True)
    assert loaded(root) == [OLD]  # check mode changed nothing

    line = promotion.promote_on(host, ctx, cand, force=True, check=False)
    assert line.startswith(f"made {NEW}") and f"instead of {OLD}" in line and "--force" in line
    assert loaded(root) == [NEW] and NEW in lmod(root, "module -t avail pytorch")
    gens = json.loads((prefix / "pytorch" / f".{NEW.split('/')[1]}.generations.json").read_text())
    assert "--force" in gens["generations"][-1]["promoted"]
    (entry,) = [json.loads(x) for x in (root / promotion.LOG).read_text().splitlines()]
    assert entry["forced"] and entry["digest"] == digest and entry["previous"] == OLD and entry["run"] is None
    # `invoke generations` shows it under the generation
    shown = lifecycle.describe(host, NEW, str(prefix / NEW), (None, "kept"))
    assert any("--force" in line for line in lifecycle.lines([shown]))
    # the playbook's next run keeps the promoted default
    install(playbook(tmp_path, NEW), prefix, tmp_path)
    assert loaded(root) == [NEW]


def test_promote_refuses_with_one_line_and_no_traceback(tmp_path: Path):
    prefix = tmp_path / "prefix"
    fake_generation(prefix, OLD, {"requirements": ["torch==2.12.0"]})
    fake_generation(prefix, NEW, {"requirements": ["torch==2.13.0"]})
    install(playbook(tmp_path, OLD), prefix, tmp_path)
    book = playbook(tmp_path, NEW)
    # a playbook without a validation job: provision leaves the new stack hidden and says how to promote it
    held = run_invoke("provision", "--playbook", str(book), "--prefix", str(prefix),
                      env={"SITESTACK_LOG_DIR": str(tmp_path / "logs")})
    assert held.returncode == 0, held.stdout + held.stderr
    assert f"left hidden (the playbook has no validation job for it); {OLD} stays the default" in held.stdout
    out = run_invoke("promote", "--playbook", str(book), "--prefix", str(prefix))
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stdout + out.stderr
    assert f"{NEW} (" in out.stderr and "has no passing validation run" in out.stderr
    assert loaded(prefix / "modules") == [OLD]
    unknown = run_invoke("promote", "--playbook", str(book), "--prefix", str(prefix), "--stack", "pytorch/9")
    assert unknown.returncode == 1 and "--stack" in unknown.stderr and "Traceback" not in unknown.stderr
    plain = run_invoke("promote", "--playbook", str(playbook(tmp_path, NEW, default=False)), "--prefix", str(prefix),
                       "--stack", NEW, "--force")
    assert plain.returncode == 1 and "does not say `default: true`" in plain.stderr, plain.stdout + plain.stderr
    planned = run_invoke("promote", "--playbook", str(book), "--prefix", str(prefix), "--force", "--check")
    assert planned.returncode == 0 and f"would make {NEW}" in planned.stdout, planned.stdout + planned.stderr
    assert loaded(prefix / "modules") == [OLD]


def test_provision_validates_then_promotes(local_stack, tmp_path: Path):
    """`invoke provision` for real on the local site, over the session's stack (linked into a prefix of
    the test's own, once as the old default and once as the new stack): check mode says what it would
    promote; --no-promote leaves the new stack hidden; an injected validation failure (rank 1's allreduce
    off by one) leaves the old default and says so in one line naming the run and its report; a passing
    validation makes the new stack what `module load pytorch` loads."""
    prefix = tmp_path / "prefix"
    env_dir = local_stack.venv.resolve()
    for stack in (OLD, NEW):
        (prefix / stack).parent.mkdir(parents=True, exist_ok=True)
        (prefix / stack).symlink_to(env_dir)
        Path(f"{prefix / stack}.manifest.json").symlink_to(local_stack.manifest.resolve())
    home = tmp_path / "home"   # the validation's results go to ~/sitestack-validation/local
    home.mkdir()
    env = {"SITESTACK_LOG_DIR": str(tmp_path / "logs"), "HOME": str(home),
           "SITESTACK_BUILD_CACHE": os.environ.get("SITESTACK_BUILD_CACHE", str(Path.home() / ".cache/sitestack/builds"))}
    out = run_invoke("install-modulefiles", "--playbook", str(playbook(tmp_path, OLD)), "--prefix", str(prefix), env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    book = playbook(tmp_path, NEW, steps=("validation-job", "stack-venv", "modulefiles", "launch-helpers"))
    args = ("provision", "--playbook", str(book), "--prefix", str(prefix), "--skip-tags", "venv")

    planned = run_invoke(*args, "--check", env=env, timeout=600)
    assert planned.returncode == 0, planned.stdout + planned.stderr
    assert f"would validate {NEW} and make it the default on PASS ({OLD} until then)" in planned.stdout
    held = run_invoke(*args, "--no-promote", env=env, timeout=900)
    assert held.returncode == 0 and "left hidden (--no-promote)" in held.stdout, held.stdout + held.stderr
    assert loaded(prefix / "modules") == [OLD]

    failed = run_invoke(*args, env={**env, "SITESTACK_CHECK_FAULT": "allreduce@1"}, timeout=900)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    (line,) = [x for x in failed.stdout.splitlines() if f"promote {NEW}" in x]
    assert "not promoted: validation run local-" in line and "summary.md" in line and f"{OLD} stays the default" in line
    report = line.split("(report ")[1].split(")")[0]
    assert Path(report).is_file() and "FAIL" in Path(report).read_text()
    assert loaded(prefix / "modules") == [OLD]

    passed = run_invoke(*args, env=env, timeout=900)
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert f"made {NEW} (" in passed.stdout and f"instead of {OLD} (run " in passed.stdout
    assert loaded(prefix / "modules") == [NEW]
    (entry,) = [json.loads(x) for x in (prefix / "modules" / promotion.LOG).read_text().splitlines()]
    assert entry["run"] and not entry["forced"]
    shutil.rmtree(home / "sitestack-validation", ignore_errors=True)


def generation_of(prefix: Path, stack: str, token: str, env_dir: Path, plan: dict) -> str:
    """A generation directory of ``stack`` beside its link, its content the session stack's (each entry a
    link into it) and its own manifest: the session's with ``plan``; its name."""
    parent, leaf = (prefix / stack).parent, (prefix / stack).name
    gen = parent / f".{leaf}.gen-{token}"
    gen.mkdir(parents=True)
    for entry in env_dir.iterdir():
        if entry.name != MANIFEST:
            (gen / entry.name).symlink_to(entry)
    manifest = json.loads((env_dir / MANIFEST).read_text())
    (gen / MANIFEST).write_text(dump({**manifest, "plan": plan}))
    return gen.name


def test_a_new_generation_of_the_default_waits_for_its_validation(local_stack, tmp_path: Path):
    """A new generation of the default stack (same module name) made by a re-provision: the link, and so
    `module load pytorch` and `module load pytorch/X`, stays on generation N while N+1 is pending; check
    mode says it would validate it; `invoke promote` refuses it without a passing run; an injected failing
    validation (run on N+1: its record carries N+1's digest) keeps N and says so in one line; a passing one
    switches N+1 in, and rollback returns to N."""
    prefix, host = tmp_path / "prefix", local_host()
    book = playbook(tmp_path, NEW, steps=("validation-job", "stack-venv", "modulefiles", "launch-helpers"))
    ctx = offline_context(pb.load(path=book), home=str(Path.home()), user=host.user(), prefix=str(prefix))
    (spec,) = [s for s in ctx.site.steps if s.action == "stack-venv"]
    plan = ACTIONS["stack-venv"].from_spec(spec, ctx.for_step(spec)).desired(host)[0]
    env_dir = local_stack.venv.resolve()
    old = generation_of(prefix, NEW, "0ld0ld00", env_dir, {**plan, "extras": [*plan.get("extras", []), "six"]})
    new = generation_of(prefix, NEW, "5ee5ee00", env_dir, plan)
    (prefix / NEW).symlink_to(old)
    Path(f"{prefix / NEW}.manifest.json").symlink_to(f"{(prefix / NEW).name}/{MANIFEST}")
    history_file = prefix / "pytorch" / f".{(prefix / NEW).name}.generations.json"
    history_file.write_text(json.dumps({"format": 1, "path": str(prefix / NEW), "generations": [
        {"name": old, "created": time.time() - 60}, {"name": new, "created": time.time() - 30,
                                                     "digest": plan_digest(plan), "pending": True}]}))
    home = tmp_path / "home"
    home.mkdir()
    env = {"SITESTACK_LOG_DIR": str(tmp_path / "logs"), "HOME": str(home)}
    args = ("provision", "--playbook", str(book), "--prefix", str(prefix), "--skip-tags", "venv")

    planned = run_invoke(*args, "--check", env=env, timeout=600)
    assert planned.returncode == 0, planned.stdout + planned.stderr
    assert f"would validate generation {new} of {NEW} and switch it in on PASS ({old} until then)" in planned.stdout
    held = run_invoke(*args, "--no-promote", env=env, timeout=600)
    assert held.returncode == 0 and f"generation {new} left pending (--no-promote)" in held.stdout, held.stdout
    root = prefix / "modules"
    for name in ("pytorch", NEW):   # the default and its full name both load N
        assert lmod(root, f'module load {name}; echo "$__SITESTACK_GENERATION_PYTORCH"').split()[0].endswith(old)
    refused = run_invoke("promote", "--playbook", str(book), "--prefix", str(prefix), env=env)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stdout + refused.stderr
    assert f"generation {new} (digest {plan_digest(plan)}) has no passing validation run" in refused.stderr

    failed = run_invoke(*args, env={**env, "SITESTACK_CHECK_FAULT": "allreduce@1"}, timeout=900)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    (line,) = [x for x in failed.stdout.splitlines() if f"switch in {NEW}" in x]
    assert "validation run local-" in line and f"of generation {new} failed" in line and f"{old} stays" in line
    assert (prefix / NEW).readlink().name == old
    _dir, runs, _ = history.list_runs(host, str(prefix / "validation"), str(prefix), None)
    assert runs[-1]["verdict"] == "failed" and runs[-1]["stack"]["digest"] == plan_digest(plan)  # ran on N+1

    passed = run_invoke(*args, env=env, timeout=900)
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert f"switched in generation {new} of {NEW} (instead of {old}) (run " in passed.stdout
    assert lmod(root, 'module load pytorch; echo "$__SITESTACK_GENERATION_PYTORCH"').split()[0].endswith(new)
    (entry,) = [json.loads(x) for x in (root / promotion.LOG).read_text().splitlines()]
    assert entry["generation"] == new and entry["previous"] == old and not entry["forced"]
    assert gens.rollback(host, str(prefix / NEW))[1].name == old   # rollback keeps working
    shutil.rmtree(home / "sitestack-validation", ignore_errors=True)
