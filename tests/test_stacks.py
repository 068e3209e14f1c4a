"""Several stacks in one playbook (`stacks:`, a step's `stack:`), for real on the local site: each stack's
steps run with its facts (the playbook's, its overlay over them, the site-local files over that), each
stack is its own environment and module version, one is the default, one deprecated; a second
provision changes nothing; bad stack declarations are refused (docs/playbooks.md)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml

from sitestack.core.errors import InputError
from sitestack.engine import playbook as pb
from tests.conftest import LMOD_INIT, REPO, clean_env, run_invoke, shell
from tests.contexts import offline_context

MAIN, TOOLS = "pytorch/2.13.0-cpu", "pytorch/2.13.0-cpu-tools"
NOTICE = f"{TOOLS} is deprecated and will be removed after 2027-03-31; use {MAIN}"


def playbook(tmp: Path, fmt: str = "lua", *, stacks: object = None) -> Path:
    """The local playbook's stack steps, plus a second stack `tools` (the same torch, one more extra)
    with its own environment, hook and module file."""
    data = yaml.safe_load((REPO / "playbooks" / "local.yml").read_text())
    data["facts"]["modules"] = {**data["facts"]["modules"], "format": fmt}
    data["stacks"] = stacks if stacks is not None else {
        "tools": {"description": "the stack with the analysis tools", "facts": {"torch": {"extras": ["six"]}}}}
    data["steps"] = [
        {"name": "prefix-layout", "action": "directory", "args": {"paths": ["{prefix}", "{prefix}/modules"]}},
        {"name": "stack-venv", "action": "stack-venv", "args": {"compile": False}},
        {"name": "venv-hook", "action": "venv-hook"},
        {"name": "modulefiles", "action": "modulefiles", "args": {"default": True}},
        {"name": "tools-venv", "action": "stack-venv", "stack": "tools", "args": {"name": TOOLS, "compile": False}},
        {"name": "tools-hook", "action": "venv-hook", "stack": "tools", "args": {"name": TOOLS}},
        {"name": "tools-modulefiles", "action": "modulefiles", "stack": "tools",
         "args": {"name": TOOLS, "deprecated": NOTICE}},
    ]
    path = tmp / "book" / "local.yml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_each_stack_step_runs_with_its_stacks_facts(tmp_path: Path):
    site = pb.load(path=playbook(tmp_path))
    ctx = offline_context(site, prefix=str(tmp_path / "prefix"))
    tools = next(s for s in site.steps if s.name == "tools-venv")
    assert ctx.facts.torch.extras == () and ctx.for_step(tools).facts.torch.extras == ("six",)
    assert ctx.for_step(tools).facts.torch.version == ctx.facts.torch.version   # the rest is the playbook's
    assert ctx.for_step(tools).values["prefix"] == ctx.values["prefix"]
    assert ctx.for_step(tools).for_stack(None) is not None


@pytest.mark.parametrize("stacks, message", [
    ({"tools": {"facts": {"prefix": "/elsewhere"}}}, "prefix is the site's, not a stack's"),
    ({"tools": {"facts": {"torch": {"version": 7}}}}, "stacks.tools.facts"),
    ({"tools": {"facts": {}, "modules": []}}, "a stack is {facts: {...}, description: ...}"),
    ({"9x": {"facts": {}}}, "is not a stack name"),
    ([], "expected a mapping of stack names"),
])
def test_bad_stack_declarations_are_refused(tmp_path: Path, stacks: object, message: str):
    with pytest.raises(InputError) as err:
        pb.load(path=playbook(tmp_path, stacks=stacks))
    assert message in str(err.value)


def test_a_step_naming_an_unknown_stack_is_refused(tmp_path: Path):
    path = playbook(tmp_path)
    data = yaml.safe_load(path.read_text())
    data["steps"][4]["stack"] = "tool"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    out = run_invoke("provision", "--playbook", str(path), "--check")
    assert out.returncode == 1 and "stack 'tool' is not one of the playbook's stacks (tools)" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.integration
@pytest.mark.parametrize("fmt", ["lua", "tcl"])
def test_two_stacks_one_default_one_deprecated_in_real_lmod(tmp_path: Path, fmt: str):
    book, prefix = playbook(tmp_path, fmt), tmp_path / "prefix"
    env = {"SITESTACK_LOG_DIR": str(tmp_path / "logs")}
    first = run_invoke("provision", "--playbook", str(book), "--prefix", str(prefix), env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    manifests = {name: json.loads((prefix / f"{name}.manifest.json").read_text()) for name in (MAIN, TOOLS)}
    assert manifests[MAIN]["plan"]["extras"] == [] and manifests[TOOLS]["plan"]["extras"] == ["six"]
    modules = shlex.quote(str(prefix / "modules"))
    script = f"""set -e
. {LMOD_INIT}/bash
module use {modules}
module -t avail pytorch 2>&1
echo ---
module load pytorch
echo "loaded $LOADEDMODULES"
python3 -c 'import sys; print("python", sys.prefix)'
module unload pytorch
module load {TOOLS} 2>&1
python3 -c 'import six, sys; print("tools", sys.prefix)'
"""
    out = shell(["bash", "-c"], script, clean_env())
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"{MAIN}" in out.stdout and TOOLS in out.stdout.split("---")[0]
    assert f"loaded {MAIN}" in out.stdout                    # `module load pytorch`: the default
    assert f"python {(prefix / MAIN).resolve()}" in out.stdout
    assert NOTICE in " ".join(out.stdout.split())     # (Lmod wraps messages at the terminal's width)
    assert f"tools {(prefix / TOOLS).resolve()}" in out.stdout
    again = run_invoke("provision", "--playbook", str(book), "--prefix", str(prefix), "--check", "--fail-on-change",
                       env=env)
    assert again.returncode == 0, again.stdout
