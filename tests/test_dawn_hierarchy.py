"""Dawn's device hierarchy is the submission's choice, inside the image too.

dawn-containers (https://github.com/kh296/dawn-containers, setup_mpi.sh) lets a job choose
ZE_FLAT_DEVICE_HIERARCHY: COMPOSITE (a GPU root device is a card: one rank per card, 4 per node) or
FLAT (one per stack, 8 per node; the default). sitestack keeps FLAT only as the default
(facts.env_defaults): the stack's module (Lua and Tcl, loaded by real Lmod), the launch helper, the job
template and the image's %environment keep a value the job was submitted with, and the helper passes
it into the image (APPTAINERENV_ZE_FLAT_DEVICE_HIERARCHY). The image is built from the product's
definition file by the container runtime stand-in (tests/twins/runtime.py), and the job template runs
for real: Lmod, the module, the helper, the stand-in's `apptainer exec`, with `mpiexec` a stand-in
that starts one rank and says what it was asked for.
"""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from sitestack.actions import ACTIONS
from sitestack.actions.launch_env import launch_inputs
from sitestack.engine import playbook as pb
from sitestack.installs.site_stack import module_root
from sitestack.validation.launch_helpers import helper_files, render_job_template
from tests.conftest import LMOD_INIT, clean_env, playbook_copy, run_invoke
from tests.contexts import offline_context
from tests.test_modulefile_lmod import load_unload, write_site_modules
from tests.twins import runtime as twin

HIERARCHY = "ZE_FLAT_DEVICE_HIERARCHY"
STACK_MODULE = "pytorch/2.8.0-xpu"
#: The stand-in's python in Intel's image: %post's pip calls succeed; run as the program, it prints
#: what a rank sees inside the container.
PYTHON = """#!/bin/sh
[ "$1" = -m ] && exit 0
echo "inside: hierarchy=${ZE_FLAT_DEVICE_HIERARCHY-<unset>} tasks=${TASKS_PER_NODE-} rank=${RANK-}"
"""
#: Intel MPI's mpiexec, as far as the job template uses it: says what it was asked for, starts rank 0.
MPIEXEC = """#!/bin/sh
while [ $# -gt 0 ]; do
  case "$1" in
    -n) n=$2; shift 2 ;;
    -ppn) ppn=$2; shift 2 ;;
    -hosts) shift 2 ;;
    *) break ;;
  esac
done
echo "mpiexec: -n $n -ppn $ppn"
PMI_RANK=0 PMI_SIZE=$n MPI_LOCALRANKID=0 exec "$@"
"""

needs_twin = pytest.mark.skipif(twin.available() is not None, reason=f"stand-in runtime: {twin.available()}")


def dawn_context(tmp_path: Path, prefix: Path | None = None):
    """Dawn's playbook resolved for this machine: its own facts, but no host library binds (this machine
    has none of the bound paths, and a bind whose source is missing stops the runtime, as on the site)."""
    playbook = playbook_copy(tmp_path / "playbook", "dawn", facts={"container": {"bind": []}})
    return offline_context(pb.load("dawn", playbook), home="/home/alice", user="alice", account="XYZ-DAWN-GPU",
                           prefix=str(prefix) if prefix else None)


# -- the stack's module with real Lmod: Lua and Tcl (Dawn's format) ------------------------------------------
@pytest.mark.parametrize("fmt", ["tcl", "lua"])
@pytest.mark.parametrize("chosen, loaded", [("COMPOSITE", "COMPOSITE"), ("FLAT", "FLAT"), (None, "FLAT"), ("", "FLAT")])
def test_the_module_keeps_the_hierarchy_the_user_chose(fmt: str, chosen: str | None, loaded: str, tmp_path: Path):
    """Loaded with COMPOSITE set, the module keeps it; without (or empty), it sets FLAT. Unloading gives
    back exactly what the user had: their own value stays, the module's FLAT goes."""
    root, stubs = tmp_path / "modules", tmp_path / "site-modules"
    write_site_modules(dawn_context(tmp_path), fmt, root, stubs)
    start = {} if chosen is None else {HIERARCHY: chosen}
    before, during, after, _ = load_unload([str(stubs), str(root)], [STACK_MODULE], start=start)
    assert STACK_MODULE in during["LOADEDMODULES"].split(":")
    assert during[HIERARCHY] == loaded
    assert after.get(HIERARCHY) == (chosen or None) and before.get(HIERARCHY) == (chosen if chosen is not None else None)
    assert not any(name.startswith("__SITESTACK_DEFAULT_") for name in after)


@pytest.mark.parametrize("fmt", ["tcl", "lua"])
def test_reloading_keeps_the_module_default_and_purge_removes_it(fmt: str, tmp_path: Path):
    """The module's own FLAT is not taken for a user's choice on a second evaluation (reload, purge)."""
    root, stubs = tmp_path / "modules", tmp_path / "site-modules"
    write_site_modules(dawn_context(tmp_path), fmt, root, stubs)
    script = f""". {LMOD_INIT}/bash; module use {shlex.quote(str(stubs))} {shlex.quote(str(root))}
module load {STACK_MODULE}; module reload >/dev/null 2>&1; echo "reloaded=${{{HIERARCHY}-<unset>}}"
module purge; echo "purged=${{{HIERARCHY}-<unset>}}"
"""
    out = subprocess.run(["bash", "-c", script], env=clean_env(), capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["reloaded=FLAT", "purged=<unset>"], out.stdout + out.stderr


# -- the image, built from the product's definition file ---------------------------------------------------
@pytest.fixture
def dawn_image(tmp_path: Path) -> dict:
    """Dawn's image built by the stand-in from the definition the apptainer-image step renders (Intel's
    image a stand-in whose python is PYTHON); the stack's module files (Tcl, as Dawn has them) and the
    launch helpers installed under the prefix."""
    prefix = tmp_path / "prefix"
    ctx = dawn_context(tmp_path, prefix)
    tree = tmp_path / "intel"
    (tree / "usr" / "local" / "bin").mkdir(parents=True)
    (tree / "usr" / "local" / "bin" / "python").write_text(PYTHON)
    (tree / "usr" / "local" / "bin" / "python").chmod(0o755)
    docker = tmp_path / "docker"
    docker.mkdir()
    twin.make_image(tree, docker / "intel_intel-extension-for-pytorch_2.8.10-xpu.sif")
    tools = twin.install(tmp_path / "bin", docker_dir=docker)
    (tools / "mpiexec").write_text(MPIEXEC)
    (tools / "mpiexec").chmod(0o755)
    step = ACTIONS["apptainer-image"].from_spec(next(s for s in ctx.site.steps if s.action == "apptainer-image"), ctx)
    definition = Path(step.definition_file)
    definition.parent.mkdir(parents=True)
    definition.write_text(step.text)
    image = prefix / "apptainer" / "pytorch2.8.sif"
    env = clean_env(PATH=f"{tools}:/usr/local/bin:/usr/bin:/bin")
    built = subprocess.run(["apptainer", "build", str(image), str(definition)], env=env, capture_output=True, text=True,
                           timeout=300)
    assert built.returncode == 0, built.stdout + built.stderr
    stubs = tmp_path / "site-modules"
    write_site_modules(ctx, "tcl", Path(module_root(ctx)), stubs)
    inputs = launch_inputs(ctx, f"{prefix}/bin")
    (prefix / "bin").mkdir(parents=True, exist_ok=True)
    for name, (text, mode) in helper_files(inputs).items():
        (prefix / "bin" / name).write_text(text)
        (prefix / "bin" / name).chmod(mode)
    job = tmp_path / "job.sh"
    job.write_text(render_job_template(inputs))
    return {"image": image, "env": env, "stubs": stubs, "root": module_root(ctx), "job": job}


def run_in(dawn_image: dict, script: str, chosen: str | None, tmp_path: Path) -> str:
    env = {**dawn_image["env"], **({} if chosen is None else {HIERARCHY: chosen})}
    out = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


@needs_twin
@pytest.mark.parametrize("with_module", [False, True], ids=["image", "image-with-module"])
@pytest.mark.parametrize("chosen, inside", [("COMPOSITE", "COMPOSITE"), ("FLAT", "FLAT"), (None, "FLAT")])
def test_the_image_keeps_the_hierarchy_passed_in(dawn_image: dict, tmp_path: Path, with_module: bool,
                                                 chosen: str | None, inside: str):
    """`apptainer exec` of the image (its %environment) with the hierarchy exported, and with the stack's
    module loaded first (it once set FLAT over the user's value): the user's choice inside, else FLAT."""
    load = (f". {LMOD_INIT}/bash; module use {shlex.quote(str(dawn_image['stubs']))} "
            f"{shlex.quote(dawn_image['root'])}; module load {STACK_MODULE}; ") if with_module else ""
    script = f'{load}apptainer exec {shlex.quote(str(dawn_image["image"]))} sh -c \'echo "$1=${{{HIERARCHY}-}}"\' sh {HIERARCHY}'
    assert run_in(dawn_image, script, chosen, tmp_path).splitlines()[-1] == f"{HIERARCHY}={inside}"


@needs_twin
@pytest.mark.parametrize("chosen, ranks", [("COMPOSITE", 4), (None, 8)])
def test_the_job_template_runs_the_ranks_the_hierarchy_asks_for(dawn_image: dict, tmp_path: Path,
                                                                chosen: str | None, ranks: int):
    """The job `invoke job-template` prints, submitted on one node with COMPOSITE exported (4 ranks, one
    per card, COMPOSITE inside the image) and with nothing (8 ranks, one per stack, FLAT inside)."""
    slurm = "SLURM_JOB_ID=4242 SLURM_JOB_NODELIST=pvc-s-1 SLURM_JOB_NUM_NODES=1 SLURM_GPUS_ON_NODE=4 SLURM_CPUS_ON_NODE=96"
    script = (f". {LMOD_INIT}/bash; module use {shlex.quote(str(dawn_image['stubs']))}; export {slurm}; "
              f". {shlex.quote(str(dawn_image['job']))}")
    out = run_in(dawn_image, script, chosen, tmp_path)
    hierarchy = chosen or "FLAT"
    assert f"mpiexec: -n {ranks} -ppn {ranks}" in out, out
    assert f"inside: hierarchy={hierarchy} tasks={ranks} rank=0" in out, out


def test_a_default_without_its_value_is_one_clear_error(tmp_path: Path):
    """facts.env_defaults names entries of facts.env; one that is not there is refused at load, by name."""
    bad = playbook_copy(tmp_path, "dawn", facts={"env_defaults": ["ZE_FLAT_DEVICE_HIERARCHY", "NOT_IN_ENV"]})
    out = run_invoke("job-template", "--playbook", str(bad))
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert "env_defaults: NOT_IN_ENV not in env" in out.stderr and f"{bad}" in out.stderr, out.stderr
