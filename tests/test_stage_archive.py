"""The stage-archive step packs the stack env by what it is when packed, not by the playbook's facts:
``conda-meta/`` -> conda-pack, ``pyvenv.cfg`` -> tar + sitestack's fix-up, neither -> one error naming
the path. Frontier's playbook (``python.source: conda``) on this machine, with its stack env made as the
Frontier twin's conda stand-in makes it (``python3 -m venv``), or with a ``conda-meta/`` directory.

The real staging (sbcast, unpack, fix-up, use) of such a pack is in tests/test_staging.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

from sitestack.actions import ACTIONS
from sitestack.actions.stage_archive import MakeStageArchive
from sitestack.core.errors import SitestackError
from sitestack.core.host import LocalHost
from sitestack.core.paths import PLAYBOOK_DIR
from sitestack.engine import playbook as pb
from sitestack.installs.staging import env_kind
from sitestack.model.context import RunContext, RunOptions


def step(prefix: Path, *, check: bool = False) -> MakeStageArchive:
    """Frontier's stage-archive step with ``prefix`` as the install prefix."""
    site = pb.load("frontier")
    assert site.facts.python.source == "conda" and site.facts.node.stage_env
    ctx = RunContext.resolve(site, home="/home/u", user="u", account="proj", prefix=str(prefix),
                             options=RunOptions(), actions=ACTIONS, check=check)
    spec = next(s for s in site.steps if s.action == "stage-archive")
    action = MakeStageArchive.from_spec(spec, ctx)
    assert isinstance(action, MakeStageArchive)
    return action


def link_stack(action: MakeStageArchive, env: Path) -> Path:
    """The stack's stable path made a link to ``env`` (as the stack-venv step links it to its generation)."""
    stable = Path(action.pack().stack.path)
    stable.parent.mkdir(parents=True, exist_ok=True)
    stable.symlink_to(env)
    return stable


def test_a_conda_source_stack_that_is_a_venv_is_packed_as_a_venv(tmp_path: Path):
    action = step(tmp_path / "prefix")
    env = tmp_path / "gen-1"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)  # the twin's "conda create"
    link_stack(action, env)
    host = LocalHost()
    pack = action.pack()
    assert pack.expected_kind == "conda"  # what the facts say; the env says otherwise
    assert action.pending(host) == f"{pack.path} missing (venv pack of {env})"
    action.apply(host)
    with tarfile.open(pack.path) as tar:
        names = set(tar.getnames())
    assert {".sitestack-unpack.py", ".sitestack-pack.json", "./pyvenv.cfg"} <= names
    assert not Path(pack.tools).exists()  # no conda-pack was installed for it
    stamp = json.loads(Path(pack.stamp).read_text())
    assert stamp["kind"] == "venv" and stamp["source"] == str(env)
    assert action.pending(host) is None
    # The same path becoming a conda env: packed again, and the plan says why.
    (env / "conda-meta").mkdir()
    assert action.pending(host) == "the stack env is a conda now, packed as venv"


def test_an_env_with_conda_meta_is_packed_by_conda_pack(tmp_path: Path):
    """conda-pack needs a real conda env, which this machine cannot make: the tools venv's conda-pack is
    a stand-in that records its argv and writes the tarball, so the step's own choice and argv are real."""
    action = step(tmp_path / "prefix")
    env = tmp_path / "conda-env"
    (env / "conda-meta").mkdir(parents=True)
    (env / "pyvenv.cfg").write_text("home = /usr/bin\n")  # conda-meta/ decides, as conda-pack requires it
    link_stack(action, env)
    pack = action.pack()
    record = tmp_path / "argv.json"
    tool = Path(pack.tools) / "bin" / "conda-pack"
    tool.parent.mkdir(parents=True)
    tool.write_text(f"""#!{sys.executable}
import json, sys, tarfile
json.dump(sys.argv[1:], open({str(record)!r}, "w"))
out = sys.argv[sys.argv.index("--output") + 1]
with tarfile.open(out, "w:gz") as tar:
    tar.add({str(env / "conda-meta")!r}, arcname="conda-meta")
""")
    tool.chmod(0o755)
    host = LocalHost()
    assert action.pending(host) == f"{pack.path} missing (conda pack of {env})"
    action.apply(host)
    assert json.loads(record.read_text()) == ["--prefix", str(env), "--output", f"{pack.path}.new", "--format",
                                              "tar.gz", "--n-threads", "-1", "--force", "--quiet"]
    assert json.loads(Path(pack.stamp).read_text())["kind"] == "conda"
    assert action.pending(host) is None


def test_check_mode_before_the_env_exists_plans_the_facts_kind(tmp_path: Path):
    action = step(tmp_path / "prefix", check=True)
    pending = action.pending(LocalHost(read_only=True))
    assert pending is not None and "missing (made by the stack-venv step)" in pending
    assert "expected a conda pack from facts.python.source conda" in pending
    assert "confirmed by what the env is when it is packed" in pending


def test_an_env_that_is_neither_is_one_clear_error(tmp_path: Path):
    action = step(tmp_path / "prefix")
    env = tmp_path / "not-an-env"
    (env / "bin").mkdir(parents=True)
    link_stack(action, env)
    with pytest.raises(SitestackError, match=f"^{env} is neither a conda env \\(conda-meta/ missing\\) nor a venv"):
        action.pending(LocalHost())
    with pytest.raises(SitestackError, match=str(env)):
        env_kind(LocalHost(), str(env))
    assert not (tmp_path / "prefix" / "packs").exists()


def test_a_job_stages_the_pack_of_the_generation_it_loaded(tmp_path: Path):
    """Each generation has its pack; the stable name links to the current one's; sitestack-stage-env takes
    the pack of the generation the job's stack module loaded; a removed generation's pack goes."""
    from sitestack.validation.launch_helpers import LaunchInputs, StackPack, render_stage

    action = step(tmp_path / "prefix")
    pack, host = action.pack(), LocalHost()
    stable = Path(pack.stack.path)
    stable.parent.mkdir(parents=True)
    for token in ("a", "b"):
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(stable.parent / f".{stable.name}.gen-{token}")],
                       check=True)
    stable.symlink_to(f".{stable.name}.gen-a")
    action.apply(host)
    subprocess.run(["ln", "-sfn", f".{stable.name}.gen-b", str(stable)], check=True)   # the upgrade
    assert action.pending(host) == "the stack changed since it was packed"
    action.apply(host)
    packs = Path(pack.generations)
    assert sorted(p.name for p in packs.iterdir()) == [f"{stable.name}.gen-a.tar.gz", f"{stable.name}.gen-b.tar.gz"]
    assert Path(pack.path).resolve() == packs / f"{stable.name}.gen-b.tar.gz"
    assert action.pending(host) is None

    own = StackPack(module=pack.stack.name, pack=pack.path, generations=pack.generations,
                    generation_var="__SITESTACK_GENERATION_PYTORCH", own=True)
    inputs = LaunchInputs(site="frontier", facts=action.ctx.facts, bin="/opt/bin", env={}, scratch="/tmp/stage",
                          packs=(own,))
    script, stubs = tmp_path / "sitestack-stage-env", tmp_path / "stubs"
    script.write_text(render_stage(inputs))
    stubs.mkdir()
    (stubs / "srun").write_text("#!/bin/sh\nexit 1\n")   # the copy stops here: the pack was chosen before
    (stubs / "srun").chmod(0o755)
    job = {"SLURM_JOB_ID": "42", "SLURM_JOB_NUM_NODES": "1", "USER": "tester", "PATH": f"{stubs}:{os.defpath}"}
    sourced = ["sh", "-c", '. "$1"; printf "%s\\n" "$SITESTACK_PACK"', "sh", str(script)]
    loaded = {**job, "__SITESTACK_GENERATION_PYTORCH": str(stable.parent / f".{stable.name}.gen-a")}
    chosen = subprocess.run(sourced, env=loaded, capture_output=True, text=True, timeout=30).stdout.strip()
    assert chosen == str(packs / f"{stable.name}.gen-a.tar.gz")     # the job that loaded gen-a stages gen-a
    none = subprocess.run(sourced, env=job, capture_output=True, text=True, timeout=30)
    assert none.stdout.strip() == pack.path                          # no module loaded: the current pack

    shutil.rmtree(stable.parent / f".{stable.name}.gen-a")           # the generation collected
    assert action.pending(host) == f"remove the packs of removed generations: {stable.name}.gen-a.tar.gz"
    action.apply(host)
    assert sorted(p.name for p in packs.iterdir()) == [f"{stable.name}.gen-b.tar.gz"]
    with pytest.raises(ValueError):
        render_stage(dataclasses.replace(inputs, packs=(dataclasses.replace(own, generation_var="X}; rm -rf /; : ${Y"),)))


def frontier_stage_helper(tmp_path: Path, *, drop_steps: tuple[str, ...] = ()) -> tuple[Path, dict[str, str], RunContext]:
    """Frontier's sitestack-stage-env as its launch-helpers step renders it for a prefix under ``tmp_path``
    (the playbook without ``drop_steps``), an empty pack file for each stack that has a pack, and a job's
    environment whose srun stops the copy (the pack is chosen before): (script, environment, context)."""
    from sitestack.actions.launch_env import launch_inputs
    from sitestack.validation.launch_helpers import render_stage

    data = yaml.safe_load((PLAYBOOK_DIR / "frontier.yml").read_text())
    data["steps"] = [s for s in data["steps"] if s["name"] not in drop_steps]
    book = tmp_path / "frontier.yml"
    book.write_text(yaml.safe_dump(data, sort_keys=False))
    ctx = RunContext.resolve(pb.load(path=book), home="/home/u", user="u", account="proj",
                             prefix=str(tmp_path / "prefix"), options=RunOptions(), actions=ACTIONS)
    inputs = launch_inputs(ctx, str(tmp_path / "prefix" / "bin"))
    for p in inputs.packs:
        if p.pack:
            Path(p.pack).parent.mkdir(parents=True, exist_ok=True)
            Path(p.pack).write_bytes(b"")
    script, stubs = tmp_path / "sitestack-stage-env", tmp_path / "stubs"
    script.write_text(render_stage(inputs))
    stubs.mkdir()
    (stubs / "srun").write_text("#!/bin/sh\nexit 1\n")
    (stubs / "srun").chmod(0o755)
    job = {"SLURM_JOB_ID": "42", "SLURM_JOB_NUM_NODES": "1", "USER": "tester", "PATH": f"{stubs}:{os.defpath}"}
    return script, job, ctx


SOURCED = ["sh", "-c", '. "$1"; printf "%s\\n" "$SITESTACK_PACK"', "sh"]
ROCM7, GUIDE = "pytorch/2.10.0-rocm7.1", "pytorch/2.2.2-rocm5.7"


def test_the_loaded_stacks_pack_is_staged_and_its_generation(tmp_path: Path):
    """With `module load pytorch` (rocm7, the default) the rocm7 pack is staged, not the guide stack's; the
    generation the module loaded is looked up under that stack's packs; the guide stack loaded by name stages
    its own; no stack module loaded stages the playbook's own stack."""
    script, job, ctx = frontier_stage_helper(tmp_path)
    prefix = ctx.values["prefix"]
    rocm7_gen = f"{prefix}/packs/pytorch-2.10.0-rocm7.1.generations/2.10.0-rocm7.1.gen-b.tar.gz"
    Path(rocm7_gen).parent.mkdir(parents=True)
    Path(rocm7_gen).write_bytes(b"")

    def chosen(**env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*SOURCED, str(script)], env={**job, **env}, capture_output=True, text=True, timeout=30)

    loaded = f"PrgEnv-gnu/8.5.0:rocm/7.1.1:rccl-net-plugin:{ROCM7}"
    assert chosen(LOADEDMODULES=loaded).stdout.strip() == f"{prefix}/packs/pytorch-2.10.0-rocm7.1.tar.gz"
    gen = chosen(LOADEDMODULES=loaded, __SITESTACK_GENERATION_PYTORCH=f"{prefix}/pytorch/.2.10.0-rocm7.1.gen-b")
    assert gen.stdout.strip() == rocm7_gen
    # a generation of the other stack is never looked up under this one's packs
    other = chosen(LOADEDMODULES=loaded, __SITESTACK_GENERATION_PYTORCH=f"{prefix}/pytorch/.2.2.2-rocm5.7.gen-b")
    assert other.stdout.strip() == f"{prefix}/packs/pytorch-2.10.0-rocm7.1.tar.gz"
    guide = chosen(LOADEDMODULES=f"rocm/5.7.1:{GUIDE}")
    assert guide.stdout.strip() == f"{prefix}/packs/pytorch-2.2.2-rocm5.7.tar.gz"
    # a name that only contains a stack's is not that stack
    assert chosen(LOADEDMODULES=f"x{ROCM7}").stdout.strip() == f"{prefix}/packs/pytorch-2.2.2-rocm5.7.tar.gz"
    assert chosen().stdout.strip() == f"{prefix}/packs/pytorch-2.2.2-rocm5.7.tar.gz"


def test_a_loaded_stack_without_a_pack_is_refused(tmp_path: Path):
    """Without the rocm7 stage-archive step, rocm7 loaded: one message naming the module and the stacks that
    have packs, exit 1, no copy started (srun would have said so) and nothing else staged."""
    script, job, ctx = frontier_stage_helper(tmp_path, drop_steps=("rocm7-stage-archive",))
    out = subprocess.run(["sh", "-c", '. "$1"; printf "%s|%s" "$?" "${SITESTACK_STAGED_ENV-unset}"', "sh",
                          str(script)], env={**job, "LOADEDMODULES": f"rocm/7.1.1:{ROCM7}"}, capture_output=True,
                         text=True, timeout=30)
    assert out.stdout == "1|unset", out
    assert out.stderr.strip() == (f"sitestack-stage-env: the loaded module {ROCM7} has no pack to stage (no "
                                  f"stage-archive step packs its stack); the stacks with packs: {GUIDE}"), out.stderr
    # and the rocm7 validation job does not source the helper (its stack has no pack)
    from sitestack.installs.site_stack import stage_script
    assert stage_script(ctx.for_stack("rocm7")) is None and stage_script(ctx) is not None
