"""Each remote site's playbook applied end to end on its twin (tests/twins/sites.py): `invoke provision
--playbook <the site's playbook with the twin's overlay>` applies every step for real, a second run
is all ok, and `invoke validate` passes on the test Slurm cluster.

The builds share the default build cache (~/.cache/sitestack/builds, or SITESTACK_TEST_BUILD_CACHE)
with the other tests, so a CI run compiles each package once per compiler/MPI: Frontier's mpi4py
(`cc -shared`, the Cray driver) and Horovod (`CC`) and Cirrus' Horovod (HOROVOD_CPU_OPERATIONS=MPI)
are builds of their own (their inputs differ from the local site's); the plugin is built from the
checked archives in tests/data/upstream, given as --mirror. torch is 2.13.0+cpu from this machine's pip
configuration (local disk), as for the local site. The timings of each provision are printed.

LUMI's and Dawn's stacks are venvs inside their images, run by the container runtime stand-in
(tests/twins/runtime.py: bubblewrap + squashfuse, root only); their stand-in images carry the test venv's
torch (tests/conftest.py validation_python). LUMI's Horovod is a build of its own (cray-mpich 8.1.29's
drivers); Dawn's playbook builds neither Horovod nor mpi4py, and its image is built in a batch job.

Measured on the 2-core development machine: cold (nothing in the build cache) the Frontier twin's
Horovod build alone takes about 12 min, Cirrus' about 14 min, LUMI's about as long: all of them
together would take the suite past its 60 minutes. So the twins always leave out their steps tagged
``horovod`` (:data:`TWIN_SKIP_TAGS`), whatever the build cache holds: a warm cache only makes a run
faster, never makes it do other work. Horovod itself is built from source and tested for the local
site (tests/test_horovod.py, tests/test_venv.py), and each twin's Horovod build plan is checked by
``--check`` in tests/test_sites.py. ``SITESTACK_TEST_TWIN_SKIP_TAGS`` (comma-separated; empty for
none) overrides the choice for a run by hand; only tags a twin's playbook has are passed to it.
"""

from __future__ import annotations

import getpass
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from sitestack.engine import playbook as pb
from tests.conftest import REPO, run_invoke
from tests.twins import runtime, sites
from tests.twins.rocm import have_debian_hip, upstream_sources

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TWINS = ("frontier", "cirrus", "lumi", "dawn")
CONTAINED = ("lumi", "dawn")   # stacks in container images: the runtime stand-in (tests/twins/runtime.py)
#: The tags whose steps every twin leaves out (module docstring): the same every run.
TWIN_SKIP_TAGS = ("horovod",)
STEP_LINE = re.compile(r"^\[login\] (ok|changed|failed|skipped|unprobed)\s+(.+?)(?::|$)", re.M)


def skip_tags_for(playbook: Path) -> tuple[str, ...]:
    """The tags of :data:`TWIN_SKIP_TAGS` (or ``SITESTACK_TEST_TWIN_SKIP_TAGS``) that ``playbook`` has:
    a tag the playbook does not have is never passed (``--skip-tags`` refuses it)."""
    wanted = os.environ.get("SITESTACK_TEST_TWIN_SKIP_TAGS")
    tags = TWIN_SKIP_TAGS if wanted is None else tuple(t for t in wanted.split(",") if t)
    have = {t for step in pb.load(None, playbook).steps for t in step.tags}
    return tuple(t for t in tags if t in have)


def left_out(playbook: Path, tags: tuple[str, ...]) -> set[str]:
    """The names of the steps of ``playbook`` that ``--skip-tags tags`` leaves out."""
    return {step.name for step in pb.load(None, playbook).steps if set(step.tags) & set(tags)}


def steps_of(stdout: str) -> list[tuple[str, str]]:
    """(outcome, step name) of each step line of a provision run."""
    return [(m.group(1), m.group(2).strip()) for m in STEP_LINE.finditer(stdout)]


@pytest.fixture(scope="module", params=TWINS)
def provisioned(request, tmp_path_factory):
    """The site's twin provisioned twice, the way an administrator runs it."""
    name = request.param
    for need, why in ((sites.LMOD_INIT, "Lmod"), ("/usr/bin/mpicc", "MPICH")):
        if not Path(need).exists():
            pytest.skip(f"needs {why} (scripts/test.sh installs it)")
    if name in ("frontier", "lumi") and not have_debian_hip():
        pytest.skip("needs Debian's HIP (hipcc, libamdhip64-dev) for the ROCm twin")
    root = tmp_path_factory.mktemp(f"{name}-twin")
    builds = os.environ.get("SITESTACK_TEST_BUILD_CACHE") or str(Path.home() / ".cache" / "sitestack" / "builds")
    env = {"SITESTACK_LOG_DIR": str(root / "logs"), "SITESTACK_BUILD_CACHE": builds,
           "SITESTACK_PROGRESS_INTERVAL": "120"}
    if name in CONTAINED:
        why = runtime.available()
        if why:
            pytest.skip(f"the container runtime stand-in cannot run here: {why}")
        python, _ = request.getfixturevalue("validation_python")   # the torch the stand-in images carry
        twin = getattr(sites, name)(root, python)
        # the image build runs as a batch job (Dawn: facts.container.build.where slurm); the runtime
        # stand-in takes its docker bases from this directory (no registry can be reached)
        env.update(request.getfixturevalue("slurm_cluster").env, RUNTIME_TWIN_DOCKER_DIR=str(root / "docker"))
    else:
        twin = getattr(sites, name)(root)
    if twin.path:
        env["PATH"] = os.pathsep.join([*twin.path, env.get("PATH") or os.environ["PATH"]])
    args = ["provision", "--playbook", str(twin.playbook()), "--account", "proj123"]
    if name in ("frontier", "lumi"):
        args += ["--mirror", str(upstream_sources())]   # the plugin's checked git archive (no --source)
    skip = skip_tags_for(twin.playbook())
    if skip:
        args += ["--skip-tags", ",".join(skip)]
    start = time.monotonic()
    first = run_invoke(*args, env=env, timeout=3600)
    first_s = time.monotonic() - start
    start = time.monotonic()
    second = run_invoke(*args, env=env, timeout=1800)
    second_s = time.monotonic() - start
    print(f"\n{name} twin: provision {first_s:.0f} s, again {second_s:.0f} s")
    yield SimpleNamespace(name=name, twin=twin, env=env, args=args, first=first, second=second,
                          seconds=(first_s, second_s), left_out=left_out(twin.playbook(), skip))
    shutil.rmtree(root / "logs", ignore_errors=True)


def test_provision_applies_every_step(provisioned):
    out = provisioned.first
    assert out.returncode == 0, out.stdout[-8000:] + out.stderr
    outcomes = steps_of(out.stdout)
    names = [step.name for step in pb.load(None, Path(provisioned.args[2])).steps]
    assert [n for _, n in outcomes] == names, outcomes
    # exactly the steps the skipped tags name are skipped; every other step is applied
    assert {n for o, n in outcomes if o == "skipped"} == provisioned.left_out, outcomes
    assert all(o in ("ok", "changed") for o, n in outcomes if n not in provisioned.left_out), outcomes
    # every file under the prefix: the plugin's module file once went to a relative "{prefix}/modules"
    assert not (REPO / "{prefix}").exists()
    if provisioned.name == "frontier":
        prefix = Path(str(provisioned.twin.prefix).replace("{account}", "proj123"))
        assert (prefix / "modules" / "aws-ofi-rccl" / "1.4.0+17d41cb-rocm-5.7.1.lua").is_file()


def test_second_provision_is_all_ok(provisioned):
    out = provisioned.second
    assert out.returncode == 0, out.stdout[-8000:] + out.stderr
    outcomes = steps_of(out.stdout)
    assert outcomes and {n for o, n in outcomes if o == "skipped"} == provisioned.left_out, outcomes
    assert all(o == "ok" for o, n in outcomes if n not in provisioned.left_out), outcomes



@pytest.mark.parametrize("provisioned", [t for t in TWINS if skip_tags_for(REPO / "playbooks" / f"{t}.yml")],
                         indirect=True)
def test_left_out_steps_still_plan_on_the_twin(provisioned):
    """The steps the twins leave out (Horovod's build) are still planned on the twin: in check mode
    their pending probes run for real against the twin's toolchain, torch and MPI, and report a
    build, without building."""
    assert provisioned.left_out
    args = list(provisioned.args)
    if "--skip-tags" in args:
        i = args.index("--skip-tags")
        del args[i:i + 2]
    out = run_invoke(*args, "--check", "--tags", ",".join(sorted(provisioned.left_out)), env=provisioned.env,
                     timeout=900)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr
    outcomes = dict((n, o) for o, n in steps_of(out.stdout))
    for name in provisioned.left_out:
        assert outcomes.get(name) == "changed", outcomes
    assert "would change" in out.stdout, out.stdout[-4000:]

def test_validate_passes_on_the_test_cluster(provisioned, slurm_cluster, tmp_path):
    """Submitted with `sbatch --export=NONE` (SBATCH_EXPORT=NONE), as OLCF advises for Frontier: the
    job must `unset SLURM_EXPORT_ENV` or its srun tasks get none of its settings
    (https://docs.olcf.ornl.gov/software/python/pytorch_frontier.html)."""
    # a login shell sets USER (facts.env's {user} is $USER in the job); this machine's test runs may lack it
    env = {"USER": os.environ.get("USER") or getpass.getuser(), **provisioned.env, **slurm_cluster.env}
    if not provisioned.twin.path:
        # a twin's system commands (Dawn's apptainer) reach the job through the submitting environment
        # only: under --export=NONE a job has the node's default PATH, where no stand-in may be installed
        env["SBATCH_EXPORT"] = "NONE"
    out = run_invoke("validate", "--playbook", provisioned.args[2], "--account", "proj123", "--results",
                     str(tmp_path), "--timeout", "900", env=env, timeout=1000)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr + slurm_cluster.logs()
    launcher = "mpiexec" if provisioned.name == "dawn" else "srun"   # Dawn: Intel MPI's Hydra
    assert f"submitted validate-{launcher}.sbatch to Slurm as job" in out.stdout
    (result,) = tmp_path.glob("sitestack-validation-*/result.json")
    checks = {c["name"]: c for c in json.loads(result.read_text())["checks"]}
    assert checks["mpi4py"]["status"] == ("passed" if provisioned.name == "frontier" else "skipped"), checks["mpi4py"]
    assert checks["ddp"]["status"] == "passed"


@pytest.mark.parametrize("provisioned", ["frontier"], indirect=True)   # the one twin whose playbook builds mpi4py
def test_frontier_mpi4py_is_built_with_the_cray_driver_against_the_twins_mpi(provisioned):
    prefix = Path(str(provisioned.twin.prefix).replace("{account}", "proj123"))
    dest = prefix / "mpi4py" / "4.1.2"
    stamp = json.loads((dest / ".sitestack" / "install.json").read_text())
    assert stamp["inputs"]["build"]["plan"][0]["env"]["MPICC"] == "cc -shared"
    stack = prefix / "pytorch" / "2.13.0-cpu" / "bin" / "python"
    out = subprocess.run(["bash", "-c", f". {sites.LMOD_INIT}; module use {provisioned.twin.root}/modules; "
                          "module load PrgEnv-gnu/8.5.0 cray-mpich/8.1.28; \"$1\" -c 'import mpi4py; "
                          "mpi4py.rc.initialize = False; from mpi4py import MPI; print(MPI.Get_library_version())'",
                          "sh", str(stack)], capture_output=True, text=True)
    assert out.returncode == 0 and "MPICH Version:" in out.stdout, out.stdout + out.stderr
