"""Each remote site's playbook applied end to end on its twin (tests/twins/sites.py): a mount namespace
in which the site's own paths exist, with the stand-ins there, and a Slurm cluster shaped like the
site's running inside it. `invoke provision --site <site>` applies ``playbooks/<site>.yml`` unchanged,
every step for real; a second run is all ok; `invoke validate` passes on the twin's cluster. The only
facts that differ are what the hardware forces (tests/twins/sites.py HARDWARE_KEYS), given through the
product's site-local facts (SITESTACK_FACTS).

The builds share the default build cache (~/.cache/sitestack/builds, or SITESTACK_TEST_BUILD_CACHE)
with the other tests, so a CI run compiles each package once per compiler/MPI: Frontier's mpi4py
(`cc -shared`, the Cray driver) is a build of its own; the plugin is built from the checked archives
in tests/data/upstream, given as --mirror. torch is 2.13.0+cpu from this machine's pip configuration
(local disk). The timings of each provision are printed.

LUMI's and Dawn's stacks are venvs inside their images, run by the container runtime stand-in
(tests/twins/runtime.py: bubblewrap + squashfuse, root only); their stand-in images carry the test venv's
torch (tests/conftest.py validation_python). LUMI builds nothing on the host; Dawn's playbook builds
neither Horovod nor mpi4py, and its image is built in a batch job.

Measured on the 2-core development machine: cold (nothing in the build cache) the Frontier twin's
Horovod build alone takes about 12 min, Cirrus' about 14 min: both together would take the suite past
its 60 minutes. So the twins always leave out their steps tagged ``horovod``
(tests/twins/provision.py TWIN_SKIP_TAGS), whatever the build cache holds: a warm cache only makes a
run faster, never makes it do other work. Horovod itself is built from source and tested for the local
site (tests/test_horovod.py, tests/test_venv.py), and each twin's Horovod build plan is checked by
``--check`` below. ``SITESTACK_TEST_TWIN_SKIP_TAGS`` (comma-separated; empty for none) overrides the
choice for a run by hand; only tags a twin's playbook has are passed to it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from sitestack.engine import playbook as pb
from tests.conftest import REPO
from tests.twins import sites
from tests.twins.provision import TWIN_SKIP_TAGS

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TWINS = ("frontier", "cirrus", "lumi", "dawn")
STEP_LINE = re.compile(r"^\[login\] (ok|changed|failed|skipped|unprobed)\s+(.+?)(?::|$)", re.M)


def steps_of(stdout: str) -> list[tuple[str, str]]:
    """(outcome, step name) of each step line of a provision run."""
    return [(m.group(1), m.group(2).strip()) for m in STEP_LINE.finditer(stdout)]


def left_out(site: str, tags: tuple[str, ...]) -> set[str]:
    """The names of the steps of the site's playbook that ``--skip-tags tags`` leaves out."""
    return {step.name for step in pb.load(site).steps if set(step.tags) & set(tags)}


@pytest.fixture(scope="module", params=TWINS)
def provisioned(request, site_twins):
    """The site's twin, provisioned twice the way an administrator runs it."""
    running = site_twins(request.param)
    return SimpleNamespace(name=request.param, running=running, twin=running.twin, first=running.first,
                           second=running.second, args=running.args,
                           left_out=left_out(request.param, running.skipped_tags))


def flat(mapping: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in mapping.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value and name not in sites.HARDWARE_KEYS:
            out.update(flat(value, name + "."))
        else:
            out[name] = value
    return out


@pytest.mark.parametrize("site", TWINS)
def test_the_overlay_changes_only_what_the_hardware_forces(site, tmp_path):
    """A twin's facts differ from the playbook's only in HARDWARE_KEYS; batch options lose only GPU
    requests; no step argument is changed (the playbook is the repository's file, by --site)."""
    twin = sites.make(site, tmp_path, "proj", None) if site not in ("lumi",) else None
    overlay = twin.overlay if twin else sites.hardware("lumi")
    for key in flat(overlay):
        assert key in sites.HARDWARE_KEYS, f"{site}: the twin changes {key}, which no hardware forces"
    playbook = yaml.safe_load((REPO / "playbooks" / f"{site}.yml").read_text())["facts"]
    options = (overlay.get("scheduler") or {}).get("options")
    if options is not None:
        removed = [o for o in playbook["scheduler"]["options"] if o not in options]
        assert removed and all(o.startswith(("--gpus", "--gres")) for o in removed), removed


def test_the_twin_applies_the_repositorys_playbook(provisioned):
    """The run names the site (no --playbook copy), and inside the twin the product resolves the site
    to this checkout's playbooks/<site>.yml with the same bytes as outside it (no bind over it)."""
    import hashlib
    assert "--playbook" not in provisioned.args and provisioned.args[:3] == ["provision", "--site", provisioned.name]
    path = REPO / "playbooks" / f"{provisioned.name}.yml"
    shown = provisioned.running.invoke("show-site", "--site", provisioned.name, "--format", "json")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    loaded = Path(json.loads(shown.stdout)["playbook"])   # as the product names it: relative to the cwd, REPO
    assert (REPO / loaded).resolve() == path.resolve()
    inside = provisioned.running.shell(f"sha256sum {path}")
    assert inside.returncode == 0 and inside.stdout.split()[0] == hashlib.sha256(path.read_bytes()).hexdigest()


def test_provision_applies_every_step(provisioned):
    out = provisioned.first
    assert out.returncode == 0, out.stdout[-8000:] + out.stderr
    outcomes = steps_of(out.stdout)
    names = [step.name for step in pb.load(provisioned.name).steps]
    assert [n for _, n in outcomes] == names, outcomes
    # exactly the steps the skipped tags name are skipped; every other step is applied
    assert {n for o, n in outcomes if o == "skipped"} == provisioned.left_out, outcomes
    assert all(o in ("ok", "changed") for o, n in outcomes if n not in provisioned.left_out), outcomes
    # every file under the prefix: the plugin's module file once went to a relative "{prefix}/modules"
    assert not (REPO / "{prefix}").exists()
    if provisioned.name == "frontier":
        prefix = provisioned.twin.site_dir(f"/lustre/orion/{provisioned.twin.account}/world-shared/sitestack")
        assert (prefix / "modules" / "aws-ofi-rccl" / "1.4.0+17d41cb-rocm-5.7.1.lua").is_file()


def test_second_provision_is_all_ok(provisioned):
    out = provisioned.second
    assert out.returncode == 0, out.stdout[-8000:] + out.stderr
    outcomes = steps_of(out.stdout)
    assert outcomes and {n for o, n in outcomes if o == "skipped"} == provisioned.left_out, outcomes
    assert all(o == "ok" for o, n in outcomes if n not in provisioned.left_out), outcomes


@pytest.mark.parametrize("provisioned", [t for t in TWINS if left_out(t, TWIN_SKIP_TAGS)], indirect=True)
def test_left_out_steps_still_plan_on_the_twin(provisioned):
    """The steps the twins leave out (Horovod's build) are still planned on the twin: in check mode
    their pending probes run for real against the twin's toolchain, torch and MPI, and report a
    build, without building."""
    assert provisioned.left_out
    args = list(provisioned.args)
    if "--skip-tags" in args:
        i = args.index("--skip-tags")
        del args[i:i + 2]
    out = provisioned.running.invoke(*args, "--check", "--tags", ",".join(sorted(provisioned.left_out)), timeout=900)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr
    outcomes = dict((n, o) for o, n in steps_of(out.stdout))
    for name in provisioned.left_out:
        assert outcomes.get(name) == "changed", outcomes
    assert "would change" in out.stdout, out.stdout[-4000:]


def test_validate_passes_on_the_twins_cluster(provisioned, tmp_path):
    """Submitted with `sbatch --export=NONE` (SBATCH_EXPORT=NONE), as OLCF advises for Frontier: the
    job must `unset SLURM_EXPORT_ENV` or its srun tasks get none of its settings
    (https://docs.olcf.ornl.gov/software/python/pytorch_frontier.html). The job runs inside the twin's
    namespace (its slurmd does), so it sees the site's paths."""
    running = provisioned.running
    out = running.invoke("validate", "--site", provisioned.name, "--account", provisioned.twin.account, "--results",
                         str(tmp_path), "--timeout", "900", env={"SBATCH_EXPORT": "NONE"}, timeout=1000)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr + running.cluster.logs()
    launcher = "mpiexec" if provisioned.name == "dawn" else "srun"   # Dawn: Intel MPI's Hydra
    assert f"submitted validate-{launcher}.sbatch to Slurm as job" in out.stdout
    (result,) = tmp_path.glob("sitestack-validation-*/result.json")
    checks = {c["name"]: c for c in json.loads(result.read_text())["checks"]}
    assert checks["mpi4py"]["status"] == ("passed" if provisioned.name == "frontier" else "skipped"), checks["mpi4py"]
    assert checks["ddp"]["status"] == "passed"


@pytest.mark.parametrize("provisioned", ["frontier"], indirect=True)   # the twin whose playbook has two stacks
def test_frontier_validates_the_rocm7_stack_with_its_own_job(provisioned, tmp_path):
    """`invoke validate --stack rocm7` runs the rocm7 stack's own job (validation-rocm7/): its module, its
    env's torch and its own mpi4py (built against cray-mpich with that env's Python) pass, and the run's
    result and history record name the rocm7 stack."""
    running = provisioned.running
    out = running.invoke("validate", "--site", "frontier", "--account", provisioned.twin.account, "--stack", "rocm7",
                         "--results", str(tmp_path), "--timeout", "900", env={"SBATCH_EXPORT": "NONE"}, timeout=1000)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr + running.cluster.logs()
    assert "submitted validate-srun.sbatch to Slurm as job" in out.stdout
    (path,) = tmp_path.glob("sitestack-validation-*/result.json")
    result = json.loads(path.read_text())
    assert result["stack"]["module"] == "pytorch/2.10.0-rocm7.1", result["stack"]
    checks = {c["name"]: c for c in result["checks"]}
    assert checks["mpi4py"]["status"] == "passed" and checks["ddp"]["status"] == "passed", checks
    prefix = f"/lustre/orion/{provisioned.twin.account}/world-shared/sitestack"
    assert (provisioned.twin.site_dir(prefix) / "validation-rocm7" / "jobs" / "validate-srun.sbatch").is_file()
    history = running.invoke("history", "--site", "frontier", "--account", provisioned.twin.account, "--json", "-")
    assert history.returncode == 0, history.stdout + history.stderr
    assert "pytorch/2.10.0-rocm7.1" in history.stdout


@pytest.mark.parametrize("provisioned", ["frontier"], indirect=True)   # the one twin whose playbook builds mpi4py
def test_frontier_mpi4py_is_built_with_the_cray_driver_against_the_sites_mpi(provisioned):
    """mpi4py was built by `cc -shared` with cray-mpich loaded, and reports the site's MPI library (the
    stand-in's version string: CRAY MPICH over Debian's MPICH)."""
    twin = provisioned.twin
    prefix = f"/lustre/orion/{twin.account}/world-shared/sitestack"
    stamp = json.loads((twin.site_dir(prefix) / "mpi4py" / "4.1.2" / ".sitestack" / "install.json").read_text())
    assert stamp["inputs"]["build"]["plan"][0]["env"]["MPICC"] == "cc -shared"
    out = provisioned.running.shell(
        "module load PrgEnv-gnu/8.5.0 cray-mpich/8.1.28\n"
        f"{prefix}/pytorch/2.13.0-cpu/bin/python -c 'import mpi4py; mpi4py.rc.initialize = False; "
        "from mpi4py import MPI; print(MPI.Get_library_version())'")
    assert out.returncode == 0 and "CRAY MPICH version 8.1.28" in out.stdout, out.stdout + out.stderr


@pytest.mark.parametrize("provisioned", ["frontier"], indirect=True)   # the twin whose playbook has two stacks
def test_frontier_keeps_the_guides_stack_beside_the_current_one(provisioned):
    """The playbook's `stacks: rocm7` is its own environment and module version beside the guide's stack;
    `module load pytorch` loads it (its modulefiles step's default), with its own ROCm module, and the
    guide's stack still loads by its full name."""
    twin = provisioned.twin
    prefix = f"/lustre/orion/{twin.account}/world-shared/sitestack"
    out = provisioned.running.shell(
        f"module use {prefix}/modules\nmodule -t avail pytorch 2>&1\nmodule load pytorch\n"
        "echo \"loaded=$LOADEDMODULES\"\npython -c 'import torch, sys; print(\"prefix=\" + sys.prefix)'\n"
        "module purge\nmodule load pytorch/2.13.0-cpu\necho \"guide=$LOADEDMODULES\"")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "pytorch/2.10.0-rocm7.1" in out.stdout and "pytorch/2.13.0-cpu" in out.stdout
    loaded = next(line for line in out.stdout.splitlines() if line.startswith("loaded="))
    assert "pytorch/2.10.0-rocm7.1" in loaded and "rocm/7.1.1" in loaded and "rccl-net-plugin" in loaded, loaded
    assert f"prefix={prefix}/pytorch/.2.10.0-rocm7.1.gen-" in out.stdout      # the current stack's own env
    guide = next(line for line in out.stdout.splitlines() if line.startswith("guide="))
    assert "pytorch/2.13.0-cpu" in guide and "rocm/5.7.1" in guide, guide


@pytest.mark.parametrize("provisioned", ["lumi"], indirect=True)   # the twin whose playbook has three container stacks
def test_lumi_default_is_the_ai_factory_stack_beside_the_easybuild_ones(provisioned):
    """`module load pytorch` loads the LUMI AI Factory stack: LUMI AI Factory's bindings module with it (found
    after the `module use` LUMI's AI Guide gives), the AI Factory image, whose Python runs without conda, and
    no $EBROOTPYTORCH; `stacks: easybuild` is its own module version on its own image with the EasyBuild run
    scripts ($EBROOTPYTORCH/runscripts); `stacks: seed` (the central image, linked in place) prints its
    deprecation notice. When LUMI removes the seed's image, a provision fails the seed stack's steps only."""
    twin = provisioned.twin
    prefix = f"/projappl/{twin.account}/sitestack"
    out = provisioned.running.shell(
        f"module use {prefix}/modules\nmodule load pytorch\n"
        "echo \"current=$LOADEDMODULES SIF=$SIF EB=${EBROOTPYTORCH:-none} BIND=$SINGULARITY_BIND\"\n"
        "singularity exec \"$SIF\" python -c 'import torch, sys; print(\"aif\", torch.__version__, sys.prefix)'\n"
        "module purge\nmodule load pytorch/2.7.1-rocm6.2.4\necho \"easybuild=$LOADEDMODULES SIF=$SIF EB=$EBROOTPYTORCH\"\n"
        "module purge\nmodule load pytorch/2.2.0-rocm5.6.1 2>&1\necho \"seed=$LOADEDMODULES SIF=$SIF\"\n"
        "singularity exec \"$SIF\" bash -c \"$WITH_CONDA; python -c 'import torch; print(\\\"torch\\\", torch.__version__)'\"")
    assert out.returncode == 0, out.stdout + out.stderr
    lines = {line.split("=", 1)[0]: line for line in out.stdout.splitlines() if "=" in line}
    current = lines["current"]
    assert "pytorch/2.13.0-cpu" in current and "lumi-aif-singularity-bindings" in current, current
    assert f"SIF={prefix}/container/{sites.LUMI_AIF_SIF}" in current and "EB=none" in current, current
    assert "/var/spool/slurmd" in current   # the bindings module's binds
    # the stack's venv in the image, its Python found without conda
    assert re.search(rf"^aif 2\.13\.0\S* {re.escape(prefix)}/pytorch/\.2\.13\.0-cpu\.gen-", out.stdout, re.M), out.stdout
    assert "pytorch/2.7.1-rocm6.2.4" in lines["easybuild"] and "v2.7.1" in lines["easybuild"], lines["easybuild"]
    assert f"EB={prefix}" in lines["easybuild"] and "lumi-aif" not in lines["easybuild"], lines["easybuild"]
    assert "pytorch/2.2.0-rocm5.6.1" in lines["seed"] and "v2.2.0" in lines["seed"], lines["seed"]
    assert "runs a container LUMI has archived" in " ".join(out.stdout.split())   # (Lmod wraps the notice)
    assert "torch 2.13.0" in out.stdout   # the seed's image is the twin's stand-in image
    image = twin.site_dir(f"{prefix}/container/{sites.LUMI_SEED_SIF}")
    assert image.is_symlink() and str(image.readlink()).endswith(f"easybuild-sif-images/{sites.LUMI_SEED_SIF}")
    aif = twin.site_dir(f"{prefix}/container/{sites.LUMI_AIF_SIF}")
    assert aif.is_symlink() and str(aif.readlink()).endswith(f"{sites.LUMI_AIF_RELEASE}/{sites.LUMI_AIF_SIF}")
    # LUMI removes the seed's archived image: applied again, only the seed stack's steps fail (the recap
    # counts them), and every other stack, the launch helpers and the packed env are still applied
    central = twin.site_dir(f"/appl/local/containers/easybuild-sif-images/{sites.LUMI_SEED_SIF}")
    hidden = central.with_name(central.name + ".removed")
    central.rename(hidden)
    try:
        again = provisioned.running.invoke(*provisioned.args)
    finally:
        hidden.rename(central)
    outcomes = steps_of(again.stdout)
    assert again.returncode == 1 and re.search(r"failed\s+seed-container-image: no such image: /appl/\S+\.sif",
                                                again.stdout), again.stdout[-6000:]
    assert {n for o, n in outcomes if o not in ("ok", "skipped")} <= {n for _, n in outcomes if n.startswith("seed-")}
    assert {n for o, n in outcomes if o == "ok"} >= {"container-image", "easybuild-container-image", "modulefiles",
                                                      "easybuild-modulefiles", "launch-helpers", "packed-env"}, outcomes


@pytest.mark.parametrize("provisioned", ["frontier"], indirect=True)   # the twin that stages its env (node.stage_env)
def test_frontier_stages_the_env_of_the_loaded_stack(provisioned):
    """In a job with `module load pytorch` (rocm7, the default), sitestack-stage-env stages the rocm7 stack's own
    pack (rocm7-stage-archive), not the guide stack's: torch is imported from the node-local copy and is the
    rocm7 env's torch (on the twin the CPU build its hardware facts give every stack: tests/twins/sites.py)."""
    from tests.slurm import SBATCH_WAIT

    running, twin = provisioned.running, provisioned.twin
    prefix = f"/lustre/orion/{twin.account}/world-shared/sitestack"
    out_file = f"{twin.home}/stage-rocm7.out"
    job = (f"#!/bin/bash\n. {running.modules_init}\nmodule use {prefix}/modules\nmodule load pytorch || exit 4\n"
           f". {prefix}/bin/sitestack-stage-env || exit 1\n"
           "srun --ntasks=1 python -c 'import sys, torch; print(\"torch=\" + torch.__version__); "
           "print(\"prefix=\" + sys.prefix)'\nsitestack_unstage\n")
    (twin.site_dir(twin.home) / "stage-rocm7.sh").write_text(job)
    out = running.shell(f"{SBATCH_WAIT}\nsitestack_sbatch_wait --ntasks=1 --output={out_file} stage-rocm7.sh\n"
                        f"{prefix}/pytorch/2.10.0-rocm7.1/bin/python -c 'import torch; print(\"shared=\" + "
                        "torch.__version__)'", timeout=600)
    log = twin.site_dir(out_file).read_text() if twin.site_dir(out_file).exists() else ""
    assert out.returncode == 0, out.stdout + out.stderr + log + running.cluster.logs()
    assert "sitestack-stage-env: the stack env of pytorch/2.10.0-rocm7.1 runs from /mnt/bb/" in log, log
    values = dict(line.split("=", 1) for line in (out.stdout + log).splitlines() if line.startswith(("torch=", "prefix=", "shared=")))
    assert values["prefix"].startswith(f"/mnt/bb/{sites.USER}/sitestack-env-"), log   # the node-local copy
    assert values["torch"] == values["shared"], (values, log)                             # the rocm7 env's torch
    assert (twin.site_dir(prefix) / "packs" / "pytorch-2.10.0-rocm7.1.tar.gz").exists()
