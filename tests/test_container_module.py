"""The LUMI EasyBuild container module (https://lumi-supercomputer.github.io/LUMI-EasyBuild-docs/p/PyTorch/),
the playbook's ``stacks: easybuild`` made the main stack of a copy: the container-image step (copy or link, sha256), the stack module in real Lmod (every variable
LUMI's module sets, no host modules forced on container users), and the run scripts under srun
with 2 ranks on the test Slurm cluster, in the stand-in runtime (tests/twins/runtime.py:
Singularity is not available here)."""

from __future__ import annotations

import getpass
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sitestack.actions import ACTIONS
from sitestack.engine import playbook as pb
from tests.conftest import LMOD_INIT, REPO, clean_env, parse_env, playbook_copy, run_invoke, shell
from tests.contexts import offline_context
from tests.onsite_dir import install_programs
from tests.test_modulefile_golden import built_for
from tests.twins import runtime as twin
from tests.twins.stand_ins import lumi_conda

STACK = "pytorch/2.7.1-rocm6.2.4"
STACK_STEPS = {stack: tuple(f"{stack}-{step}" for step in ("container-image", "stack-venv", "venv-hook", "modulefiles"))
               for stack in ("easybuild", "seed")}


@pytest.mark.parametrize(("nodelist", "first", "every"), [
    ("nid[001,005-007]", "nid001", "nid001 nid005 nid006 nid007"),
    ("nid005252", "nid005252", "nid005252"),
    ("nid[005252-005253],nid005300", "nid005252", "nid005252 nid005253 nid005300"),
    ("gpu[1-2]-s[3,4],login", "gpu1-s3", "gpu1-s3 gpu1-s4 gpu2-s3 gpu2-s4 login"),
])
def test_get_master(nodelist: str, first: str, every: str, tmp_path: Path) -> None:
    get_master = install_programs(tmp_path, ("get-master",)) / "get-master"  # as the run scripts' directory holds it
    out = subprocess.run([sys.executable, str(get_master), nodelist], capture_output=True, text=True)
    assert out.stdout == f"{first}\n"
    out = subprocess.run([sys.executable, str(get_master), "--all", nodelist], capture_output=True, text=True)
    assert out.stdout.split() == every.split()
    bad = subprocess.run([sys.executable, str(get_master), "nid[001-"], capture_output=True, text=True)
    assert bad.returncode == 2 and "cannot parse" in bad.stderr


@pytest.fixture
def lumi(tmp_path: Path) -> dict:
    """LUMI's playbook with this machine's paths: a stand-in SIF as the site's central image, shaped like
    LUMI's: its Python in the conda env /opt/miniconda3/envs/pytorch (not on the container's PATH until
    $WITH_CONDA, which the image defines, activates it: tests/twins/sites.py lumi_conda)."""
    tree = tmp_path / "image"
    (tree / "opt/miniconda3/envs/pytorch/bin").mkdir(parents=True)
    python = os.path.realpath(sys.executable)
    (tree / "opt/miniconda3/envs/pytorch/bin/python").symlink_to(python)
    lumi_conda(tree)
    source = twin.make_image(tree, tmp_path / "central.sif")
    data = tmp_path / "data"
    data.mkdir()
    prefix = tmp_path / "prefix"

    easybuild = yaml.safe_load((REPO / "playbooks" / "lumi.yml").read_text())["stacks"]["easybuild"]["facts"]

    def copy(**container: object) -> Path:
        facts = {**easybuild, "marker": None, "prefix": str(prefix), "node": {"local_scratch": str(tmp_path / "scratch")},
                 "container": {**easybuild["container"], "source": str(source), "image": "{prefix}/container/lumi.sif",
                               "bind": [str(data)], "install": "copy", **container}}
        # the easybuild stack is the main one here (its run scripts, no site module); the playbook's own
        # stacks run LUMI's images from LUMI's central areas: not here
        return playbook_copy(tmp_path / f"pb-{len(list(tmp_path.glob('pb-*')))}", "lumi", facts=facts,
                             step_args={"container-image": {"runscripts": True}, "modulefiles": {"requires": []}},
                             without=STACK_STEPS["easybuild"] + STACK_STEPS["seed"])

    (tmp_path / "scratch").mkdir()
    return {"copy": copy, "prefix": prefix, "source": source, "data": data, "tmp": tmp_path}


def provision(playbook: Path, prefix: Path, *extra: str, env_path: str | None = None) -> subprocess.CompletedProcess[str]:
    return run_invoke("provision", "--site", "lumi", "--playbook", str(playbook), "--prefix", str(prefix),
                      "--tags", "container", "--account", "proj123", *extra,
                      env={"SITESTACK_LOG_DIR": str(prefix.parent / "logs"), **({"PATH": env_path} if env_path else {})})


def test_container_image_copy_link_and_sha256(lumi: dict) -> None:
    import hashlib
    prefix, source = lumi["prefix"], lumi["source"]
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    wrong = lumi["copy"](sha256="0" * 64)
    bad = provision(wrong, prefix)
    assert bad.returncode == 1, bad.stdout
    assert f"sha256 is {digest}, but facts.container.sha256 is {'0' * 64}" in bad.stdout
    assert not (prefix / "container" / "lumi.sif").exists()
    good = lumi["copy"](sha256=digest)
    first = provision(good, prefix)
    assert first.returncode == 0 and "changed  container-image" in first.stdout, first.stdout
    image = prefix / "container" / "lumi.sif"
    assert image.is_file() and not image.is_symlink() and image.read_bytes() == source.read_bytes()
    assert sorted(p.name for p in (prefix / "runscripts").iterdir()) == [
        "conda-python-distributed", "conda-python-simple", "get-master", "onsite"]
    assert sorted(p.name for p in (prefix / "runscripts" / "onsite").iterdir()) == [  # what get-master imports
        "__init__.py", "get_master.py", "hostlist.py"]
    again = provision(good, prefix)
    assert again.returncode == 0 and "ok       container-image" in again.stdout, again.stdout
    linked = provision(lumi["copy"](install="link"), prefix)
    assert linked.returncode == 0 and os.readlink(image) == str(source), linked.stdout
    for script in [p for p in (prefix / "runscripts").rglob("*") if p.is_file()]:
        assert subprocess.run(["bash", "-n", str(script)] if script.name.startswith("conda-python") else
                              [sys.executable, "-m", "py_compile", str(script)]).returncode == 0


def test_a_stack_whose_image_is_gone_fails_only_its_own_steps(lumi: dict) -> None:
    """The seed stack's archived image is not on this host (as when LUMI removes it): check mode says
    that step would fail, naming the image, and plans the rest; applying, the seed stack's steps fail
    or are skipped, and the current stack's image and the steps of no stack after them (the launch
    helpers, the packed env) still run."""
    tmp, prefix, source = lumi["tmp"], lumi["prefix"], lumi["source"]
    facts = {"marker": None, "prefix": str(prefix), "node": {"local_scratch": str(tmp / "scratch")},
             "container": {"source": str(source), "image": "{prefix}/container/lumi.sif", "bind": [str(lumi["data"])]}}
    book = playbook_copy(tmp / "with-seed", "lumi", facts=facts, without=STACK_STEPS["easybuild"])
    checked = provision(book, prefix, "--check")
    assert checked.returncode == 1 and "changed  container-image" in checked.stdout, checked.stdout
    assert re.search(r"failed   seed-container-image: would fail: no such image: /appl/\S+\.sif", checked.stdout), \
        checked.stdout
    applied = run_invoke("provision", "--site", "lumi", "--playbook", str(book), "--prefix", str(prefix),
                         "--tags", "container,launch,packed-env", "--account", "proj123",
                         env={"SITESTACK_LOG_DIR": str(tmp / "logs")})
    assert applied.returncode == 1, applied.stdout
    assert "changed  container-image" in applied.stdout and "changed  launch-helpers" in applied.stdout, applied.stdout
    assert re.search(r"^\[login\] (ok|changed)\s+packed-env", applied.stdout, re.M), applied.stdout
    # the one failed step is the seed stack's, naming its image
    assert re.findall(r"^\[login\] failed\s+(\S+): no such image: (\S+)", applied.stdout, re.M) == [
        ("seed-container-image", yaml.safe_load((REPO / "playbooks" / "lumi.yml").read_text())
         ["stacks"]["seed"]["facts"]["container"]["source"])], applied.stdout
    assert re.search(r"failed   seed-container-image: no such image", applied.stdout), applied.stdout
    assert (prefix / "container" / "lumi.sif").is_file() and (prefix / "bin" / "sitestack-launch-env").is_file()


def lumi_module(playbook: Path, prefix: Path, root: Path) -> None:
    """The stack's module files of the site, rendered for ``prefix`` into ``root``."""
    site = pb.load("lumi", playbook)
    ctx = offline_context(site, home="/home/alice", user="alice", account="proj123", prefix=str(prefix))
    step = ACTIONS["modulefiles"].from_spec(next(s for s in site.steps if s.action == "modulefiles"), ctx)
    for path, text in step.render_files(built_for(ctx), "lua", plugins=True).items():
        target = root / os.path.relpath(path, step.root)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)


def test_module_loads_in_lmod_and_sets_every_variable(lumi: dict) -> None:
    prefix, modules = lumi["prefix"], lumi["tmp"] / "modules"
    lumi_module(lumi["copy"](), prefix, modules)
    script = f". {LMOD_INIT}/bash\nmodule use {shlex.quote(str(modules))}\nmodule load {STACK}\nenv -0"
    out = shell(["bash", "-c"], script, clean_env())
    assert out.returncode == 0 and "error" not in out.stderr.lower(), out.stderr
    env = parse_env(out.stdout)
    sif, runscripts = f"{prefix}/container/lumi.sif", f"{prefix}/runscripts"
    assert env["SIF"] == env["SIFPYTORCH"] == sif
    assert env["RUNSCRIPTS"] == env["RUNSCRIPTSPYTORCH"] == runscripts
    assert env["CONTAINERROOT"] == env["EBROOTPYTORCH"] == str(prefix)   # the page's $EBROOTPYTORCH/runscripts
    assert env["WITH_CONDA"] == "source /opt/miniconda3/bin/activate pytorch"
    assert env["SINGULARITY_BINDPATH"] == f"{prefix},{lumi['data']},{runscripts}:/runscripts"
    assert env["SINGULARITYENV_PREPEND_PATH"] == f"/runscripts:{prefix}/{STACK}/bin"
    assert env["NCCL_SOCKET_IFNAME"] == "hsn0,hsn1,hsn2,hsn3"
    # the container's own network plugin: no host module (LUMI, partition, rocm, the plugin) is loaded
    assert env["LOADEDMODULES"] == STACK


def test_host_plugin_fact_loads_the_plugin_module(lumi: dict) -> None:
    site = pb.load("lumi", lumi["copy"](net_plugin="host"))
    ctx = offline_context(site, home="/home/alice", user="alice", account="proj123", prefix=str(lumi["prefix"]))
    step = ACTIONS["modulefiles"].from_spec(next(s for s in site.steps if s.action == "modulefiles"), ctx)
    stack = next(text for path, text in step.render_files(built_for(ctx), "lua", plugins=True).items()
                 if "/pytorch/" in path)
    assert 'depends_on("aws-ofi-rccl/' in stack


@pytest.mark.skipif(twin.available() is not None, reason=f"stand-in runtime: {twin.available()}")
def test_run_scripts_under_srun(lumi: dict, slurm_cluster) -> None:
    prefix, tmp = lumi["prefix"], lumi["tmp"]
    playbook = lumi["copy"]()
    bin_dir = twin.install(tmp / "bin")
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    done = run_invoke("provision", "--site", "lumi", "--playbook", str(playbook), "--prefix", str(prefix),
                      "--tags", "container", "--account", "proj123", env={**env, "SITESTACK_LOG_DIR": str(tmp / "logs")})
    assert done.returncode == 0, done.stdout
    lumi_module(playbook, prefix, tmp / "modules")
    show = ("import os; e = os.environ; print('R', e['RANK'], e['WORLD_SIZE'], e['LOCAL_RANK'], e['MASTER_ADDR'], "
            "e['MASTER_PORT'], e['MIOPEN_USER_DB_PATH'], e['NCCL_SOCKET_IFNAME'], os.path.isdir(e['MIOPEN_USER_DB_PATH']))")
    jobs = []
    for n in range(2):
        out_file = tmp / f"job{n}.out"
        body = (f"#!/bin/bash\nexport PATH={shlex.quote(str(bin_dir))}:$PATH\n. {LMOD_INIT}/bash\nmodule use {shlex.quote(str(tmp / 'modules'))}\nmodule load {STACK}\n"
                f"srun -n 2 singularity exec \"$SIF\" conda-python-distributed -c {shlex.quote(show)}\n"
                f"srun -n 1 singularity exec \"$SIF\" conda-python-simple -c 'print(\"simple ok\")'\n"
                f"singularity exec \"$SIF\" get-master 'nid[001,005-007]'\n")
        script = tmp / f"job{n}.sh"
        script.write_text(body)
        sub = slurm_cluster.run("sbatch", "--parsable", "-n", "2", "-o", str(out_file), str(script))
        assert sub.returncode == 0, sub.stderr
        jobs.append((sub.stdout.strip().split(";")[0], out_file))
    ports = []
    for job, out_file in jobs:
        import time
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            state = slurm_cluster.run("squeue", "-h", "-j", job, "-o", "%T").stdout.strip()
            if not state:
                break
            time.sleep(1)
        text = out_file.read_text()
        ranks = sorted(line.split() for line in text.splitlines() if line.startswith("R "))
        assert [r[1:4] for r in ranks] == [["0", "2", "0"], ["1", "2", "1"]], text + slurm_cluster.logs()
        assert {r[4] for r in ranks} == {slurm_cluster.node}
        assert ranks[0][5] == ranks[1][5] == str(20000 + int(job) % 10000)
        # the job's own MIOpen cache (model/miopen.py), made by local rank 0
        assert ranks[0][6] == f"/tmp/{getpass.getuser()}-miopen-{job}" == ranks[1][6]
        assert ranks[0][7] == "hsn0,hsn1,hsn2,hsn3" and ranks[0][8] == "True"
        assert "simple ok" in text and "nid001" in text.splitlines()
        ports.append(ranks[0][5])
    assert ports[0] != ports[1]


@pytest.mark.skipif(twin.available() is not None, reason=f"stand-in runtime: {twin.available()}")
def test_the_pages_commands_run_in_the_activated_conda_env(lumi: dict) -> None:
    """LUMI's PyTorch page, verbatim once the module is loaded (real Lmod):
    ``singularity exec $SIF /runscripts/conda-python-simple -c ...`` and, in a job step,
    ``singularity exec $SIFPYTORCH conda-python-distributed ...``: /runscripts is bound and on the
    container's PATH, $WITH_CONDA ran first (CONDA_DEFAULT_ENV is the image's env), and the stack's
    venv is still the Python that runs."""
    prefix, tmp = lumi["prefix"], lumi["tmp"]
    playbook = lumi["copy"]()
    bin_dir = twin.install(tmp / "bin")
    done = provision(playbook, prefix, env_path=f"{bin_dir}:{os.environ['PATH']}")
    assert done.returncode == 0, done.stdout
    lumi_module(playbook, prefix, tmp / "modules")
    venv = prefix / STACK   # the stack venv (what the stack-venv step makes, here without packages)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    show = 'import os, sys; print("ENV", os.environ["CONDA_DEFAULT_ENV"], os.environ["CONDA_PREFIX"], sys.prefix)'
    job = {"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_JOB_ID": "7",
           "SLURM_NTASKS_PER_NODE": "1", "SLURM_JOB_NODELIST": "nid[001,005]"}
    distributed = show + '; print(os.environ["MASTER_ADDR"])'
    script = (f". {LMOD_INIT}/bash\nmodule use {shlex.quote(str(tmp / 'modules'))}\nmodule load {STACK}\n"
              f"singularity exec $SIF /runscripts/conda-python-simple -c {shlex.quote(show)}\n"
              f"{' '.join(f'{k}={shlex.quote(v)}' for k, v in job.items())} "
              f"singularity exec $SIFPYTORCH conda-python-distributed -c {shlex.quote(distributed)}\n")
    out = shell(["bash", "-c"], script, clean_env(PATH=f"{bin_dir}:/usr/local/bin:/usr/bin:/bin"))
    assert out.returncode == 0, out.stdout + out.stderr
    expect = f"ENV pytorch /opt/miniconda3/envs/pytorch {venv}"
    assert out.stdout.splitlines() == [expect, expect, "nid001"], out.stdout + out.stderr


def test_run_scripts_fall_back_to_the_fact_where_the_image_defines_no_with_conda(tmp_path: Path) -> None:
    """$WITH_CONDA is the image's; where it is unset, facts.container.with_conda is run instead."""
    import dataclasses

    from sitestack.installs.runscripts import scripts
    env_bin = tmp_path / "envs" / "one" / "bin"
    env_bin.mkdir(parents=True)
    (env_bin / "python").symlink_to(os.path.realpath(sys.executable))
    (tmp_path / "activate").write_text(f'export CONDA_DEFAULT_ENV=$1 PATH={env_bin}:"$PATH"\n')
    facts = pb.load("lumi").facts
    assert facts.container is not None
    facts = dataclasses.replace(facts, container=dataclasses.replace(
        facts.container, with_conda=f"source {tmp_path}/activate from-fact"))
    simple = tmp_path / "conda-python-simple"
    simple.write_text(scripts("lumi", facts)["conda-python-simple"][0])
    show = 'import os; print(os.environ["CONDA_DEFAULT_ENV"])'
    for with_conda, expect in ((None, "from-fact"), (f"source {tmp_path}/activate from-image", "from-image")):
        env = clean_env(PATH="/usr/bin:/bin", **({"WITH_CONDA": with_conda} if with_conda else {}))
        out = subprocess.run(["bash", str(simple), "-c", show], env=env, capture_output=True, text=True)
        assert out.returncode == 0 and out.stdout == f"{expect}\n", out.stderr


def test_unknown_runtime_is_one_clear_error(tmp_path: Path) -> None:
    from sitestack.core.errors import SitestackError
    from sitestack.model.container_facts import runtime_named
    bad = playbook_copy(tmp_path, "lumi", facts={"container": {"runtime": "docker"}})
    out = run_invoke("provision", "--site", "lumi", "--playbook", str(bad), "--check", "--account", "x")
    text = out.stdout + out.stderr
    assert out.returncode == 1 and "Traceback" not in text
    assert f"{bad}:" in text and "container.runtime" in text and "'docker'" in text, text
    with pytest.raises(SitestackError, match="unknown container runtime 'docker' .known: singularity, apptainer."):
        runtime_named("docker")
    assert runtime_named("apptainer").env_var("X") == "APPTAINERENV_X"
    assert runtime_named("singularity").bind_var == "SINGULARITY_BINDPATH"
