"""The site playbooks: every one loads, resolves, and plans in check mode from its facts alone."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sitestack.core.errors import InputError
from sitestack.core.paths import PLAYBOOK_DIR
from sitestack.engine import playbook as pb
from sitestack.model.site import PLACEHOLDERS, RENAMED_ACTIONS, STEP_NAME, list_sites

SITES = list_sites()
REMOTE_SITES = [s for s in SITES if s != "local"]


def test_the_five_sites_exist():
    assert set(SITES) >= {"lumi", "frontier", "dawn", "cirrus", "local"}


@pytest.mark.parametrize("name", SITES)
def test_playbook_loads_with_known_actions(name):
    site = pb.load(name)
    assert site.name == name and site.steps
    assert site.facts.prefix


@pytest.mark.parametrize("name", REMOTE_SITES)
def test_remote_sites_name_a_marker_and_the_facts_the_issue_lists(name):
    facts = pb.load(name).facts
    assert facts.marker and facts.marker.startswith("/")
    assert facts.gpu.vendor in {"amd", "nvidia", "intel"} and facts.gpu.arch and facts.gpu.per_node >= 1
    assert facts.modules.system != "none" and facts.modules.load
    assert facts.scheduler.kind == "slurm" and facts.scheduler.account == "{account}"
    assert facts.torch.variant and facts.network.fabric


def test_frontier_facts_match_the_olcf_procedure():
    facts = pb.load("frontier").facts
    assert facts.modules.load[:4] == ("PrgEnv-gnu/8.5.0", "rocm/5.7.1", "craype-accel-amd-gfx90a", "miniforge3/23.11.0-0")
    assert facts.mpi.cc == "cc -shared" and facts.mpi.launcher == "srun"
    assert facts.gpu.arch == "gfx90a" and facts.torch.variant == "rocm5.7"


def test_cirrus_uses_the_gpu_python_module():
    facts = pb.load("cirrus").facts
    assert facts.gpu.arch == "sm_70" and facts.torch.variant == "cu121"
    assert any(m.startswith("python/3.12.1-gpu") for m in facts.modules.load) or facts.python.module == "python/3.12.1-gpu"


@pytest.mark.parametrize("name", REMOTE_SITES)
def test_check_mode_plans_a_site_that_is_not_here(name, cli, tmp_path: Path):
    site = pb.load(name)
    result = cli("provision", "--site", name, "--check", "--account", "proj123",
                 env={"SITESTACK_LOG_DIR": str(tmp_path / "logs")})
    assert result.returncode == 0, result.stdout + result.stderr
    for step in site.steps:
        assert f"] changed  {step.name}: would " in result.stdout, step.name
    assert result.stdout.count(f"(not probed: login is not a {name} host ({site.facts.marker} missing))") == len(site.steps)
    assert result.stdout.count(f"`invoke render --site {name} --out DIR`") == 1   # once: where the files can be read
    assert not Path(site.facts.marker).exists()
    assert not (tmp_path / "logs").exists()
    failing = cli("provision", "--site", name, "--check", "--fail-on-change", "--account", "proj123")
    assert failing.returncode == 2
    # Its facts use {account}: a plan without one would show (and its job scripts hold) a literal {account}.
    unnamed = cli("provision", "--site", name, "--check", env={"SITESTACK_ACCOUNT": ""})
    assert unnamed.returncode == 1 and unnamed.stdout == ""
    assert unnamed.stderr.startswith(f"error: --account: site {name} needs an account: facts ")


@pytest.mark.parametrize("name", REMOTE_SITES)
def test_applying_on_a_host_that_is_not_the_site_is_refused(name, cli, tmp_path: Path):
    result = cli("provision", "--site", name, "--account", "proj123", "--prefix", str(tmp_path / "p"),
                 env={"SITESTACK_LOG_DIR": str(tmp_path / "logs")})
    assert result.returncode == 1
    assert f"login is not a {name} host" in result.stdout
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize("name", SITES)
def test_show_site_resolves_placeholders(name, cli):
    result = cli("show-site", "--site", name, "--account", "proj123")
    assert result.returncode == 0, result.stderr
    data = yaml.safe_load(result.stdout)
    text = yaml.safe_dump(data["facts"])
    for placeholder in PLACEHOLDERS:
        assert "{" + placeholder + "}" not in text, placeholder
    assert data["facts"]["prefix"] == data["facts"]["prefix"].strip() and "{" not in data["facts"]["prefix"]


@pytest.mark.parametrize("name", SITES)
def test_resolve_derives_values_plain_data_and_typed_facts_together(name):
    from sitestack.model.context import RunContext

    site = pb.load(name)
    resolved = site.resolve(home="/home/alice", user="alice", account="proj1", prefix=None)
    assert resolved.data == site.resolved_facts(resolved.values)
    assert resolved.facts.prefix == resolved.data["prefix"] == resolved.values["prefix"]
    assert "{home}" not in resolved.facts.prefix and "{account}" not in resolved.facts.prefix
    ctx = RunContext.resolve(site, home="/home/alice", user="alice", account="proj1", prefix=None)
    assert ctx.facts == resolved.facts and ctx.resolved == resolved.data and ctx.values == resolved.values


#: Step kinds that more than one site has, with the one name every site gives them.
SHARED_STEP_NAMES = {"modules-available": "site-modules", "require-tools": "site-tools", "directory": "prefix-layout",
                     "site-facts": "site-facts", "install-validation-job": "validation-job", "stack-venv": "stack-venv",
                     "venv-hook": "venv-hook", "modulefiles": "modulefiles", "stage-archive": "stage-archive",
                     "install-launch-env": "launch-helpers", "container-image": "container-image",
                     "apptainer-image": "container-image", "pack-env": "packed-env"}

#: The one name of a step kind's second step: Frontier's stack env is made before the builds that use its
#: interpreter, and takes their wheels in a second stack-venv step.
AGAIN = {"stack-venv": ("stack-packages",)}


@pytest.mark.parametrize("name", SITES)
def test_step_names_are_kebab_case_and_the_same_across_sites(name):
    """``--start-at stack-venv`` means the same step at every site."""
    site = pb.load(name)
    for step in site.steps:
        assert STEP_NAME.fullmatch(step.name), f"{name}: step {step.name!r} is not kebab-case"
        if step.action in SHARED_STEP_NAMES:
            names = (SHARED_STEP_NAMES[step.action], *AGAIN.get(step.action, ()))
            if step.stack:   # a step of another stack of the playbook: the same name after the stack's
                names = tuple(f"{step.stack}-{n}" for n in names)
            assert step.name in names, f"{name}: {step.action} step is called {step.name!r}"
        if step.action == "recipe-install":
            recipe = step.args["recipe"]
            expected = {"aws-ofi-rccl": "rccl-net-plugin"}.get(recipe, recipe)
            expected = f"{step.stack}-{expected}" if step.stack else expected   # as a shared step of another stack
            assert step.name == expected, f"{name}: {step.name!r}"


def edited_playbook(tmp_path: Path, edit) -> Path:
    data = yaml.safe_load((PLAYBOOK_DIR / "local.yml").read_text())
    edit(data)
    path = tmp_path / "local.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.parametrize("bad", ["Stack venv", "stack venv", "stack_venv", "-stack", "stack--venv"])
def test_loading_refuses_a_step_name_that_is_not_kebab_case(tmp_path: Path, bad: str):
    path = edited_playbook(tmp_path, lambda d: d["steps"][0].update(name=bad))
    with pytest.raises(InputError, match=r"local.yml:\d+: steps\[0\]: name: .* is not a step name \(kebab-case"):
        pb.load(None, path)


@pytest.mark.parametrize(("old", "new"), sorted(RENAMED_ACTIONS.items()))
def test_a_renamed_action_is_refused_naming_the_new_name(tmp_path: Path, old: str, new: str):
    path = edited_playbook(tmp_path, lambda d: d["steps"][0].update(action=old))
    with pytest.raises(InputError, match=rf"local.yml:\d+.*steps\[0\]\.action.*{old!r} is now called {new!r}"):
        pb.load(None, path)


# -- LUMI: one model, everything GPU-related from the container ------------------------------------
PLUGIN_STEP = {"name": "rccl-net-plugin", "action": "recipe-install",
               "args": {"recipe": "aws-ofi-rccl", "package": {"libfabric": "/opt/cray/libfabric/1.15.2.0"}}}
HOROVOD_STEP = {"name": "horovod", "action": "recipe-install", "args": {"recipe": "horovod"}}


def lumi_with(tmp_path: Path, step: dict, **container: object) -> Path:
    data = yaml.safe_load((PLAYBOOK_DIR / "lumi.yml").read_text())
    data["facts"]["container"].update(container)
    data["steps"].insert(5, step)
    path = tmp_path / "lumi.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_lumi_builds_nothing_against_rocm_on_the_host():
    """The container's plugin and no host builds: no step compiles against ROCm, no module or tool for
    it is asked for, and facts.rocm is the image's (LUMI's PyTorch page: the plugin is in the image)."""
    site = pb.load("lumi")
    assert site.facts.container is not None and site.facts.container.net_plugin == "container"
    assert [s for s in site.steps if s.action == "recipe-install"] == []
    assert not any(m.startswith(("rocm", "craype-accel")) for m in site.facts.modules.load)
    tools = next(s for s in site.steps if s.action == "require-tools").args["tools"]
    assert "hipcc" not in tools and "CC" not in tools and "cc" in tools   # cc: the validation job's MPI probe


@pytest.mark.parametrize(("step", "says"), [
    (PLUGIN_STEP, "the image's own plugin (facts.container.net_plugin: container)"),
    (HOROVOD_STEP, "Horovod must be built inside the image against its ROCm and Python"),
])
def test_a_host_build_the_container_stack_cannot_use_is_refused_at_load(tmp_path: Path, step: dict, says: str):
    path = lumi_with(tmp_path, step)
    with pytest.raises(InputError) as caught:
        pb.load(None, path)
    text = str(caught.value)
    assert f"{path}:" in text and f"step {step['name']!r}" in text and says in text, text


def test_the_host_plugin_model_accepts_the_plugin_step(tmp_path: Path):
    site = pb.load(None, lumi_with(tmp_path, PLUGIN_STEP, net_plugin="host"))
    assert [s.name for s in site.steps if s.action == "recipe-install"] == ["rccl-net-plugin"]
    # Horovod given a host interpreter with the site's torch is the admin's choice, and accepted
    site = pb.load(None, lumi_with(tmp_path, {**HOROVOD_STEP, "args": {"recipe": "horovod", "python": "/x/bin/python"}}))
    assert [s.name for s in site.steps if s.action == "recipe-install"] == ["horovod"]


def test_build_rccl_plugin_for_lumi_is_refused_before_anything_runs(cli):
    out = cli("build-rccl-plugin", "--site", "lumi", "--account", "project_465000123", "--check")
    text = out.stdout + out.stderr
    assert out.returncode == 1 and "Traceback" not in text, text
    assert "facts.container.net_plugin: container" in text, text
