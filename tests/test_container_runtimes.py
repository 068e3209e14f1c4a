"""Each container runtime (model/container_runtimes.py) renders its own documented forms: the local
site's playbook with facts.container set to each runtime, rendered as `invoke render` renders it
(engine/render.py), and its job template; the messages for a misspelt runtime and for
``net_plugin``/``mpi: runtime`` on a runtime that has no such option."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from sitestack.actions.launch_env import launch_inputs
from sitestack.core.errors import SitestackError
from sitestack.engine import playbook as pb
from sitestack.engine import render
from sitestack.model.container_facts import runtime_named
from sitestack.model.context import RunOptions
from sitestack.validation.launch_helpers import render_job_template
from tests.contexts import offline_context

REPO = Path(__file__).resolve().parent.parent

#: What each runtime's documentation writes (the sources in model/container_runtimes.py), by hand:
#: the launch line of the srun job, the lines the job must hold, and what it must not.
DOCUMENTED: dict[str, dict[str, Any]] = {
    "singularity": {"exec": 'singularity exec "$SIF" "$PYTHON"', "lines": ['export SINGULARITY_BINDPATH="'],
                    "not": ["#SBATCH --image", "CONTAINER_OPTIONS"]},
    "apptainer": {"exec": 'apptainer exec "$SIF" "$PYTHON"', "lines": ['export APPTAINER_BINDPATH="'],
                  "not": ["#SBATCH --image", "CONTAINER_OPTIONS"]},
    "shifter": {"exec": 'shifter --image="$SIF" "${CONTAINER_OPTIONS[@]}" "$PYTHON"',
                "lines": ["#SBATCH --image=docker:nersc/pytorch:24.06.01", "--module=gpu,nccl-plugin", '"--volume=$OUT:$OUT"'],
                "not": ["BINDPATH", "ENV_"]},
    "podman-hpc": {"exec": 'podman-hpc run --rm --env-host "${CONTAINER_OPTIONS[@]}" "$SIF" "$PYTHON"',
                   "lines": ["--gpu --nccl", '"--volume=$OUT:$OUT"'], "not": ["#SBATCH --image", "BINDPATH", "ENV_"]},
}


def playbook_with(tmp_path: Path, **container: Any) -> Path:
    """The local site's playbook with ``facts.container`` (an NVIDIA-style runtime plugin where the
    runtime has one), as a file of its own."""
    data = yaml.safe_load((REPO / "playbooks" / "local.yml").read_text())
    data["facts"]["container"] = container
    data["site"] = "boxed"
    path = tmp_path / "boxed.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def container_of(runtime: str) -> dict[str, Any]:
    plugin = "runtime" if runtime_named(runtime).modules else "container"
    return {"runtime": runtime, "image": "nersc/pytorch:24.06.01", "net_plugin": plugin, "bind": ["/tmp"]}


@pytest.mark.parametrize("runtime", list(DOCUMENTED))
def test_each_runtime_renders_its_documented_forms(runtime: str, tmp_path: Path):
    site = pb.load(None, path=playbook_with(tmp_path, **container_of(runtime)))
    rendering = render.render_site(site, RunOptions(account="proj123"))
    files = {path: text for step in rendering.steps for path, (text, _mode) in step.files.items()}
    (job,) = [text for path, text in files.items() if path.endswith("/validate-srun.sbatch")]
    want = DOCUMENTED[runtime]
    one_line = re.sub(r"\\\n\s*", " ", job)   # a command continued over lines, as one
    assert re.search(r"\bsrun [^\n]*" + re.escape(want["exec"]), one_line), job
    for line in want["lines"]:
        assert line in job, line
    for line in want["not"]:
        assert line not in job, line
    # every launcher's job runs its Python in the image the same way; and they are bash that parses
    for path, text in files.items():
        if path.endswith(".sbatch"):
            assert want["exec"].rsplit(" ", 1)[0] in text, path
            checked = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True)
            assert checked.returncode == 0, (path, checked.stderr)


@pytest.mark.parametrize("runtime", ["shifter", "podman-hpc", "apptainer"])
def test_the_job_template_passes_the_users_choices_in_the_runtimes_way(runtime: str, tmp_path: Path):
    path = playbook_with(tmp_path, **container_of(runtime))
    data = yaml.safe_load(path.read_text())
    data["facts"]["env_defaults"] = ["GLOO_SOCKET_IFNAME"]
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    ctx = offline_context(pb.load(None, path=path))
    text = render_job_template(launch_inputs(ctx, "/p/bin"), "srun")
    passed = {"shifter": '--env=GLOO_SOCKET_IFNAME="${GLOO_SOCKET_IFNAME}"', "podman-hpc": "-e GLOO_SOCKET_IFNAME",
              # Apptainer: the launch helper exports APPTAINERENV_NAME (the template says so)
              "apptainer": "APPTAINERENV_GLOO_SOCKET_IFNAME"}[runtime]
    assert passed in text
    assert DOCUMENTED[runtime]["exec"].rsplit(" ", 1)[0] + " /p/bin/sitestack-launch python" in text
    assert subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True).returncode == 0


def test_a_misspelt_runtime_says_what_is_accepted(tmp_path: Path):
    path = playbook_with(tmp_path, runtime="shifterr", image="x")
    with pytest.raises(SitestackError) as err:
        pb.load(None, path=path)
    message = str(err.value)
    assert f"{path}:" in message and "runtime" in message and "did you mean 'shifter'" in message
    assert all(repr(name) in message for name in DOCUMENTED)
    with pytest.raises(SitestackError, match="did you mean 'podman-hpc'"):
        runtime_named("podman")


@pytest.mark.parametrize("runtime, key", [("apptainer", "net_plugin"), ("singularity", "mpi")])
def test_runtime_injection_is_refused_for_a_runtime_without_the_option(runtime: str, key: str, tmp_path: Path):
    path = playbook_with(tmp_path, runtime=runtime, image="/p/i.sif", **{key: "runtime"})
    with pytest.raises(SitestackError) as err:
        pb.load(None, path=path)
    message = str(err.value)
    assert f"{path}:" in message and f"{key}: runtime" in message and f"{runtime} has no such option" in message
    assert "shifter, podman-hpc" in message


def test_an_image_build_is_refused_for_a_runtime_that_builds_none(tmp_path: Path):
    path = playbook_with(tmp_path, runtime="podman-hpc", image="x/y:1",
                         build={"base": "intel-extension-for-pytorch", "version": "2.8.10"})
    with pytest.raises(SitestackError, match=r"build: podman-hpc builds no images here \(runtimes that do: "
                                             r"singularity, apptainer\)"):
        pb.load(None, path=path)


def test_shifter_injects_mpi_with_its_module(tmp_path: Path):
    site = pb.load(None, path=playbook_with(tmp_path, **container_of("shifter"), mpi="runtime"))
    rendering = render.render_site(site, RunOptions(account="proj123"))
    jobs = [text for step in rendering.steps for path, (text, _m) in step.files.items() if path.endswith("-mpiexec.sbatch")]
    assert jobs and " --module=gpu,nccl-plugin,mpich" in jobs[0]


def test_the_shifter_example_renders_the_sites_documented_lines():
    """docs/examples/example-shifter.yml (NERSC's Shifter how-to: #SBATCH --image=docker:IMG, srun shifter,
    --module=gpu,nccl-plugin) through the runtime's row."""
    site = pb.load(None, path=REPO / "docs" / "examples" / "example-shifter.yml")
    rendering = render.render_site(site, RunOptions(account="proj123"))
    (job,) = [text for step in rendering.steps for path, (text, _m) in step.files.items()
              if path.endswith("/validate-srun.sbatch")]
    one_line = re.sub(r"\\\n\s*", " ", job)
    assert "#SBATCH --image=docker:nersc/pytorch:24.06.01\n" in job
    assert re.search(r"^CONTAINER_OPTIONS=\(.* --module=gpu,nccl-plugin\)$", job, re.M), job
    assert re.search(r'\bsrun [^\n]* shifter --image="\$SIF" "\$\{CONTAINER_OPTIONS\[@\]\}" "\$PYTHON"', one_line)


# -- on the twin: the runtime stand-ins (tests/twins/runtime_modules.py) ----------------------------------
@pytest.mark.integration
@pytest.mark.parametrize("runtime", ["shifter", "podman-hpc"])
def test_a_playbook_with_the_runtime_validates_on_the_twin(runtime: str, validation_python, tmp_path: Path):
    """The validation job installed from a playbook whose container runs on ``runtime`` with the runtime's
    plugin option (container.net_plugin: runtime), then `invoke validate` (torchrun, no scheduler): the
    ranks run in the stand-in's image, given its site modules (an unknown module stops the runtime)."""
    from tests.conftest import run_invoke
    from tests.twins import runtime as twin

    if twin.available():
        pytest.skip(f"stand-in runtime: {twin.available()}")
    python, env = validation_python
    (tmp_path / "empty").mkdir()
    (tmp_path / "images").mkdir()
    twin.make_image(tmp_path / "empty", tmp_path / "images" / "twin_torch_1.sif")   # the host's / is the image's
    for module in runtime_named(runtime).module_words(["gpu", "net_plugin"]):
        for name in module.removeprefix("--module=").removeprefix("--").split(","):
            (tmp_path / "modules" / runtime).mkdir(parents=True, exist_ok=True)
            (tmp_path / "modules" / runtime / name).write_text(
                f"# STAND-IN for the site's {name} module: no GPU or NCCL here (gloo)\nSITESTACK_TWIN_MODULE_{len(name)}=1\n")
    bin_dir = twin.install(tmp_path / "bin", tmp_path / "images", tmp_path / "modules")
    path = playbook_with(tmp_path, runtime=runtime, image="twin/torch:1", net_plugin="runtime")
    prefix = tmp_path / "prefix"
    env = {**env, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SITESTACK_LOG_DIR": str(tmp_path / "logs")}
    installed = run_invoke("install-validation-job", "--playbook", str(path), "--prefix", str(prefix), "--python", python,
                           env=env, timeout=900)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    job = (prefix / "validation" / "jobs" / "validate-torchrun.sbatch").read_text()
    assert f"{runtime} " in job and DOCUMENTED[runtime]["lines"][-2 if runtime == "shifter" else 0] in job
    result = run_invoke("validate", "--playbook", str(path), "--prefix", str(prefix), "--results", str(tmp_path / "results"),
                        "--python", python, "--scheduler", "none", "--launcher", "torchrun", "--timeout", "600",
                        env=env, timeout=700)
    assert result.returncode == 0, result.stdout + result.stderr
    out = sorted(p for p in (tmp_path / "results").glob("sitestack-validation-*") if p.is_dir())[-1]
    report = json.loads((out / "result.json").read_text())
    assert report["verdict"] == "passed" and report["launcher"] == "torchrun" and report["world_size"] == 2, report
