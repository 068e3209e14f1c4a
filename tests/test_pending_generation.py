"""A generation pending validation, on the real functions: the generation record keeps it apart from the
retired ones (rollback and gc never take it), switching it in retires the current one, a newer pending
generation retires the older; a job's record names the digest of the generation its module loaded
(sitestack.onsite.stack_digest.loaded_manifest), only where that is a generation of the stack's own path.
The end-to-end run (Lmod, the validation job) is tests/test_promotion.py."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from sitestack.installs.generations import Generation, History, _entries
from sitestack.installs.venv_manifest import MANIFEST_FORMAT, plan_digest
from sitestack.onsite.stack_digest import MANIFEST, generation_var, loaded_manifest, stack_record


def test_a_pending_generation_is_neither_retired_nor_current_until_switched_in():
    old, new = Generation(".x.gen-a", 10.0, "d1"), Generation(".x.gen-b", 20.0, "d2")
    history = History("/p/pytorch", "x", (old,), ".x.gen-a", frozenset({".x.gen-a"}))
    parked = history.parked(new, 30.0)
    assert parked.current == ".x.gen-a" and parked.pending() == replace_pending(new)
    assert parked.retired() == []                      # rollback and gc see no generation to take
    again = json.loads(parked.to_json())
    read = _entries(again, 40.0)
    assert [g.pending for g in read] == [False, True]   # the record keeps it pending
    assert "pending" not in again["generations"][0]      # and writes the mark only where it is set
    newer = parked.parked(Generation(".x.gen-c", 35.0, "d3"), 36.0)
    assert newer.pending() is not None and newer.pending().name == ".x.gen-c"
    assert [g.name for g in newer.retired()] == [".x.gen-b"]  # the older pending one goes the retired way
    switched = parked.switched(parked.pending() or new, 50.0)
    assert switched.current == ".x.gen-b" and switched.pending() is None
    assert [(g.name, g.retired) for g in switched.retired()] == [(".x.gen-a", 50.0)]


def replace_pending(g: Generation) -> Generation:
    return Generation(g.name, g.created, g.digest, g.change, None, g.promoted, True)


def test_the_record_names_the_generation_the_module_loaded(tmp_path: Path):
    plans = {name: {"requirements": [f"torch=={v}"]} for name, v in ((".x.gen-a", "2.12.0"), (".x.gen-b", "2.13.0"))}
    for name, plan in plans.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / MANIFEST).write_text(json.dumps({"plan": plan}))
    (tmp_path / "x").symlink_to(".x.gen-a")
    (tmp_path / "x.manifest.json").symlink_to(f"x/{MANIFEST}")
    stack = {"module": "pytorch/x", "manifest": str(tmp_path / "x.manifest.json")}
    var = generation_var("pytorch/x")
    assert var == "__SITESTACK_GENERATION_PYTORCH"
    assert loaded_manifest(stack, {}) == stack["manifest"]
    assert loaded_manifest(stack, {var: str(tmp_path / ".x.gen-b")}) == str(tmp_path / ".x.gen-b" / MANIFEST)
    # another stack's generation (same family, other path) is not this stack's: the stable manifest
    assert loaded_manifest(stack, {var: str(tmp_path / ".y.gen-b")}) == stack["manifest"]
    assert loaded_manifest(stack, {var: "/elsewhere/.x.gen-b"}) == stack["manifest"]
    assert stack_record({"stack": stack})["digest"] == plan_digest(plans[".x.gen-a"])


def test_the_step_parks_a_new_generation_of_the_default_and_a_rerun_builds_nothing(tmp_path: Path):
    """The stack-venv step's publishing, on the real step and this host: the first generation is switched in;
    the next one of the local site's default stack (validated by its playbook) is parked beside it, the link
    and the stable manifest unchanged, and the step then finds nothing to do for the plan it realises."""
    from sitestack.actions import ACTIONS
    from sitestack.actions.stack_venv import Builder
    from sitestack.core.host import local_host
    from sitestack.engine import playbook as pb
    from sitestack.installs import generations as gens
    from tests.conftest import REPO
    from tests.contexts import offline_context

    host, prefix = local_host(), tmp_path / "prefix"
    data = yaml.safe_load((REPO / "playbooks" / "local.yml").read_text())
    for s in data["steps"]:
        if s["action"] == "modulefiles":
            s["args"] = {**(s.get("args") or {}), "default": True}   # the stack claims its directory's default
    (tmp_path / "local.yml").write_text(yaml.safe_dump(data, sort_keys=False))
    ctx = offline_context(pb.load(path=tmp_path / "local.yml"), home=str(tmp_path), user=host.user(), prefix=str(prefix))
    (spec,) = [s for s in ctx.site.steps if s.action == "stack-venv"]
    step = ACTIONS["stack-venv"].from_spec(spec, ctx.for_step(spec))
    assert step.waits
    plan = step.desired(host)[0]
    old_plan = {**plan, "extras": [*plan.get("extras", []), "six"]}

    def publish(plan: dict, manifest: dict | None) -> str:
        builder = Builder(step, host, plan, [], manifest, "test")
        (Path(builder.gen) / "lib" / f"python{step.stack.python_version}" / "site-packages").mkdir(parents=True)
        builder._publish(builder.gen, {"format": MANIFEST_FORMAT, "plan": plan, "packages": []})
        return Path(builder.gen).name

    first = publish(old_plan, None)
    assert Path(step.stack.path).readlink().name == first   # nothing to protect: switched in
    packages_plan = {**old_plan, "extras": [*old_plan["extras"], "rich"]}
    first = publish(packages_plan, {"plan": old_plan})
    assert Path(step.stack.path).readlink().name == first   # made by this run too (stack-packages): replaced at once
    # the next provision: a run of its own
    ctx = offline_context(pb.load(path=tmp_path / "local.yml"), home=str(tmp_path), user=host.user(), prefix=str(prefix))
    step = ACTIONS["stack-venv"].from_spec(spec, ctx.for_step(spec))
    second = publish(plan, {"plan": packages_plan})
    history = gens.read_history(host, step.stack.path)
    assert history.current == first and history.pending() is not None and history.pending().name == second
    assert json.loads(Path(step.stack.manifest).read_text())["plan"] == packages_plan
    assert step.pending_for(host) is not None and step._reason(host) is None   # a re-run builds nothing more
