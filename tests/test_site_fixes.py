"""What the sites' documented procedures need and the playbooks once lacked, each checked where it
runs (OLCF's Frontier guide, https://docs.olcf.ornl.gov/software/python/pytorch_frontier.html;
Dawn's Apptainer containers, https://github.com/kh296/dawn-containers;
Cirrus' build instructions, https://github.com/hpc-uk/build-instructions/blob/main/pyenvs/pytorch/build_pytorch_2.3.1_cirrus_gpu.md): Frontier's mpi4py step and --index-url line, `unset SLURM_EXPORT_ENV` for `sbatch --export=NONE`,
Dawn's COMPOSITE/FLAT geometry run for real with MPICH's Hydra on the Dawn twin, the install prefix
bound into Dawn's container, Cirrus' HOROVOD_CPU_OPERATIONS and libcuda stub, and a plugin module that
does not force NCCL_NET on one node."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from sitestack.core.errors import SitestackError
from sitestack.core.host import local_host
from sitestack.engine import playbook as pb
from sitestack.packages.horovod import build_env, build_env_commands, horovod_data, plan_for
from sitestack.packages.horovod_hooks import cuda_stub
from sitestack.validation import jobs
from tests.conftest import uv_dir
from tests.contexts import offline_context
from tests.onsite_dir import install_programs
from tests.twins import sites


def inputs_of(site: str, playbook: Path | None = None, prefix: str | None = None,
              python: str | None = None) -> jobs.JobInputs:
    """The site's job inputs; with ``python``, a job that validates that Python instead of loading
    the stack's module (as ``install-validation-job --python`` does)."""
    loaded = pb.load(None if playbook else site, path=playbook)
    ctx = offline_context(loaded, home="/home/alice", user="alice", account="proj123", prefix=prefix)
    from sitestack.installs.site_stack import job_inputs
    return job_inputs(ctx, f"{ctx.values['prefix']}/validation", python)


def job_text(site: str, launcher: str, playbook: Path | None = None, prefix: str | None = None,
             python: str | None = None) -> str:
    """The site's batch script (see inputs_of)."""
    return jobs.render_job(inputs_of(site, playbook, prefix, python), launcher)


# -- Frontier --------------------------------------------------------------------------------------------
def test_frontier_builds_mpi4py_with_the_cray_driver_in_the_stack_env(cli, tmp_path):
    site = pb.load("frontier")
    names = [s.name for s in site.steps]
    step = next(s for s in site.steps if s.name == "mpi4py")
    assert step.action == "recipe-install" and step.args["recipe"] == "mpi4py"
    # the conda env first (its interpreter builds mpi4py and Horovod), then their wheels installed into it
    assert names.index("stack-venv") < names.index("mpi4py") < names.index("horovod") < names.index("stack-packages")
    assert next(s for s in site.steps if s.name == "stack-packages").action == "stack-venv"
    assert site.facts.mpi.cc == "cc -shared"                    # MPICC of OLCF's Frontier guide
    out = cli("provision", "--site", "frontier", "--check", "--account", "proj123", "--tags", "mpi4py",
              env={"SITESTACK_LOG_DIR": str(tmp_path / "logs")})
    assert out.returncode == 0 and "would build and install mpi4py 4.1.2 into /lustre/orion/proj123/" in out.stdout


def test_frontier_takes_its_torch_line_from_the_rocm_index_only():
    facts = pb.load("frontier").facts
    assert facts.torch.index == "only"
    commands = build_env_commands("python3", "/env", facts)
    torch_line = next(c for c in commands if "torch==2.2.2" in c)
    assert torch_line[-3:] == ["--index-url", "https://download.pytorch.org/whl/rocm5.7", "torch==2.2.2"]
    assert not any("--extra-index-url" in c for c in commands)
    # the other packages of the build environment come from the default index, in a run of their own
    assert "setuptools" in commands[-1] and "--index-url" not in commands[-1]
    cirrus = build_env_commands("python3", "/env", pb.load("cirrus").facts)
    assert "--extra-index-url" in cirrus[-1]   # Cirrus' instructions use --extra-index-url


@pytest.mark.parametrize("installer", ["pip", "uv"])
def test_the_stack_env_installs_the_torch_line_with_index_url_alone(tmp_path, installer, monkeypatch):
    """EnvTools runs pip (or uv: the test extras install it beside this interpreter) for real here:
    a file:// index holding one wheel, the torch line from it alone, the rest in a second run
    without it."""
    from sitestack.installs.venv_env import EnvTools
    from sitestack.installs.venv_stack import Base, Stack

    index = tmp_path / "index"
    wheel = make_wheel(tmp_path / "wheels", "sitestack_twin_torch", "1.0")
    (index / "sitestack-twin-torch").mkdir(parents=True)
    (index / "sitestack-twin-torch" / "index.html").write_text(f'<a href="file://{wheel}">{wheel.name}</a>\n')
    venv = tmp_path / "venv"
    subprocess.run(["python3", "-m", "venv", str(venv)], check=True)
    stack = Stack(site="t", name="pytorch/t", path=str(venv), source="system", python_version="3.11",
                  requirements=("sitestack-twin-torch==1.0",), extras=(), checks=(), index_url=f"file://{index}",
                  system_site_packages=False, compile=False, index_only=True, installer=installer)
    if installer == "uv":
        monkeypatch.setenv("PATH", f"{uv_dir(tmp_path)}{os.pathsep}{os.environ['PATH']}")
    facts = pb.load("local").facts
    log = tmp_path / "pip.log"
    tools = EnvTools(local_host(), stack, Base(facts, stack, str(tmp_path)), log)
    other = make_wheel(tmp_path / "wheels", "sitestack_twin_other", "2.0")
    text = tools.pip_install(str(venv), ["sitestack-twin-torch==1.0", str(other)], str(tmp_path / "report.json"))
    site_packages = venv / "lib" / "python3.11" / "site-packages"
    assert sorted(p.name for p in site_packages.glob("sitestack_twin_*.dist-info")) == [
        "sitestack_twin_other-2.0.dist-info", "sitestack_twin_torch-1.0.dist-info"]
    if installer == "pip":  # pip's report lists both; uv writes none
        installed = re.findall(r'"name": "([^"]+)"', text or "")
        assert sorted(installed) == ["sitestack-twin-other", "sitestack-twin-torch"] or \
            sorted(installed) == ["sitestack_twin_other", "sitestack_twin_torch"]
    else:
        assert text is None
    tag = "uv pip install" if installer == "uv" else "--report"
    runs = [line for line in log.read_text().splitlines() if " install " in line and tag in line]
    assert len(runs) == 2, log.read_text()
    assert any("--index-url" in r and "sitestack-twin-torch==1.0" in r for r in runs), runs
    assert any("--index-url" not in r and "sitestack_twin_other" in r for r in runs), runs


def make_wheel(where: Path, name: str, version: str) -> Path:
    """A minimal pure-Python wheel (one module) built by hand: zip + METADATA + WHEEL + RECORD."""
    import zipfile
    where.mkdir(parents=True, exist_ok=True)
    path = where / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name}.py", "VALUE = 1\n")
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: {version}\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", f"{name}.py,,\n{info}/METADATA,,\n{info}/WHEEL,,\n{info}/RECORD,,\n")
    return path


@pytest.mark.parametrize("site, launcher", [("frontier", "srun"), ("lumi", "srun"), ("cirrus", "srun"),
                                            ("cirrus", "horovodrun"), ("local", "srun")])
def test_jobs_that_use_srun_unset_slurm_export_env_before_it(site, launcher):
    text = job_text(site, launcher)
    unset = text.index("unset SLURM_EXPORT_ENV\n")
    # srun runs behind `timeout` (the MPI probe) or the guard ("${GUARD[@]}" srun ...): any command line
    first_srun = min(m.start() for m in re.finditer(r"^(?!\s*#).*?\bsrun --", text, re.M))
    assert unset < first_srun


# -- Dawn ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def dawn_twin(tmp_path_factory):
    """Dawn's twin namespace (tests/twins/sites.py; no cluster, not provisioned) with the site's geometry,
    not the 2-rank node of the provisioned twin: 4 cards of 2 stacks, 96 cores; alice's home in it."""
    from tests.twins import namespace, runtime
    for why in (namespace.available(), runtime.available()):
        if why:
            pytest.skip(f"the Dawn twin cannot run here: {why}")
    if not shutil.which("mpiexec") or not Path(sites.LMOD_INIT).exists():
        pytest.skip("needs MPICH's mpiexec and Lmod (scripts/test.sh installs them)")
    root = tmp_path_factory.mktemp("dawn-twin")
    twin = sites.dawn(root, "proj123")
    twin.binds["/home/alice"] = root / "alice"
    (root / "alice").mkdir()
    twin.overlay["node"] = {"cores": 96}
    twin.overlay["gpu"] = {"vendor": "none", "unit": "stack", "per_node": 8, "cores_per_gpu": 12, "cpu_bind": None}
    ns = namespace.SiteNamespace(twin.binds).start()
    yield twin, ns
    ns.stop()


@pytest.mark.integration
@pytest.mark.parametrize("hierarchy, ranks, cores", [("COMPOSITE", 4, 24), ("FLAT", 8, 12), (None, 8, 12)])
def test_dawn_geometry_follows_the_hierarchy_chosen_at_submission(dawn_twin, tmp_path, monkeypatch, hierarchy, ranks,
                                                                   cores):
    """The Dawn job, run with bash in Dawn's twin (Lmod at the site's module path, the site's module names,
    MPICH's Hydra mpiexec, apptainer at /usr/bin): 4 cards give 4 ranks x 24 cores with COMPOSITE, 8 x 12
    with FLAT (Dawn's setup_mpi.sh), and every rank sees the hierarchy the job chose."""
    twin, ns = dawn_twin
    monkeypatch.setenv("SITESTACK_FACTS", str(twin.facts_file()))
    job = tmp_path / "job.sbatch"
    report = tmp_path / "report.sh"
    # the geometry alone: the job runs report.sh as its Python, not the stack module's (not installed here)
    inputs = inputs_of("dawn", python=str(report))
    job.write_text(jobs.render_job(inputs, "mpiexec"))
    report.write_text('#!/bin/sh\necho "rank ${PMI_RANK:-?} of ${PMI_SIZE:-?}: $ZE_FLAT_DEVICE_HIERARCHY '
                      'omp=$OMP_NUM_THREADS mask=$ZE_AFFINITY_MASK"\n')
    report.chmod(0o755)
    from tests.twins import runtime
    prefix = twin.site_dir("/home/alice/sitestack/dawn")
    image = prefix / "apptainer" / "pytorch2.8.sif"   # facts.container.image
    image.parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / "empty").mkdir()
    runtime.make_image(tmp_path / "empty", image)   # the host's / is the container's
    validation = prefix / "validation"
    validation.mkdir(parents=True, exist_ok=True)
    install_programs(validation)   # the job's guard around the launcher runs the check program
    (validation / "check-config.json").write_text("{}\n")
    # the job loads the stack's module as users do; this job runs without a provisioned stack
    sites.si.module(prefix / "modules", "pytorch/2.13.0-cpu", "", what="the stack's module",
                    why="the job runs here without a provisioned stack (the twin's provision: tests/test_twins.py)")
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "USER": "alice", "SLURM_GPUS_ON_NODE": "4",
           "SLURM_CPUS_ON_NODE": "96", "SITESTACK_PYTHON": str(report), "SITESTACK_VALIDATION_OUT": str(tmp_path / "out"),
           "SLURM_JOB_ID": "4242", **twin.login, "HOME": "/home/alice"}   # no SLURM_JOB_NODELIST: this host
    if hierarchy:
        env["ZE_FLAT_DEVICE_HIERARCHY"] = hierarchy
    out = ns.run(["bash", str(job)], env=env, timeout=300, cwd=tmp_path)
    lines = sorted(line for line in out.stdout.splitlines() if line.startswith("rank "))
    assert len(lines) == ranks, out.stdout + out.stderr
    want = hierarchy or "FLAT"
    mask = ",".join(str(i) for i in range(ranks))
    assert all(line.endswith(f"of {ranks}: {want} omp={cores} mask={mask}") for line in lines), lines
    assert f"{ranks} ranks (1 x {ranks}) via mpiexec" in out.stdout


def test_dawn_binds_the_install_prefix_into_the_container():
    text = job_text("dawn", "mpiexec")
    # after the binds the loaded modules set (a site's bindings module), then the job's own
    binds = re.search(r'^export APPTAINER_BINDPATH="\$\{APPTAINER_BINDPATH:\+\$APPTAINER_BINDPATH,\}""([^"]*)"$', text, re.M)
    assert binds and "/home/alice/sitestack/dawn" in binds.group(1).split(",")
    # what needs it: the stack, whose module the job loads (its Python first on the container's PATH)
    assert "module use /home/alice/sitestack/dawn/modules" in text and "module load pytorch/" in text


# -- Cirrus ----------------------------------------------------------------------------------------------
def test_cirrus_builds_horovod_with_mpi_cpu_operations():
    from sitestack.model.recipe import load_recipe
    recipe = load_recipe("horovod")
    site = pb.load("cirrus")
    step = next(s for s in site.steps if s.name == "horovod")
    package = step.args["package"]
    assert package["cpu_operations"] == "MPI" and package["cuda_stubs"] == "$NVHPC_ROOT/cuda/lib64/stubs"
    plan = plan_for(recipe, site.facts, None, "cirrus", cpu_ops=package["cpu_operations"])
    from tests.test_horovod import probed
    env = build_env(plan, site.facts, horovod_data(recipe), probed(cuda_home="/n/cuda/12.4", nccl_home="/n/nccl"))
    assert env["HOROVOD_CPU_OPERATIONS"] == "MPI"                       # Cirrus' instructions
    assert "HOROVOD_CPU_OPERATIONS" not in build_env(plan_for(recipe, pb.load("local").facts, None, "local"),
                                                     pb.load("local").facts, horovod_data(recipe), probed())


def test_the_libcuda_stub_is_looked_for_where_cirrus_documents_it(tmp_path):
    """Real directories on this host, which has no GPU driver (no libcuda.so.1 known to ldconfig)."""
    if subprocess.run(["sh", "-c", "ldconfig -p | grep -q 'libcuda.so.1 '"]).returncode == 0:
        pytest.skip("this host has a GPU driver: no stub is needed")
    host = local_host()
    stubs = tmp_path / "nvhpc/cuda/lib64/stubs"
    with pytest.raises(SitestackError, match=f"no CUDA driver stub {stubs}/libcuda.so \\(the step's cuda_stubs\\)"):
        cuda_stub(host, str(stubs), "the step's cuda_stubs")
    stubs.mkdir(parents=True)
    (stubs / "libcuda.so").write_text("stub\n")
    assert cuda_stub(host, str(stubs), "the step's cuda_stubs") == f"{stubs}/libcuda.so"


# -- the plugin module -----------------------------------------------------------------------------------
@pytest.mark.integration
def test_loading_the_plugin_module_does_not_force_nccl_net(tmp_path):
    """The Frontier plugin module rendered and loaded with Lmod: NCCL_NET stays unset (one node works);
    its name is there for jobs on two or more nodes."""
    if not Path(sites.LMOD_INIT).exists():
        pytest.skip("needs Lmod")
    from sitestack.actions.recipe_install import module_spec
    from sitestack.installs.modulefile_render import render
    from sitestack.model.recipe import load_recipe
    from sitestack.packages.aws_ofi_rccl import module_settings, plugin_data, plugin_row
    recipe = load_recipe("aws-ofi-rccl")
    row = plugin_row(plugin_data(recipe), "1.4.0+17d41cb")
    ctx = offline_context(pb.load("frontier"), account="proj123")
    dest = str(tmp_path / "plugin")
    spec = module_spec(ctx, recipe, module_settings(recipe, row, "rocm", "5.7.1", "1.4.0+17d41cb"), "1.4.0+17d41cb", dest,
                       {"install": dest, "version": "1.4.0+17d41cb"})
    tree = tmp_path / "modules"
    (tree / "aws-ofi-rccl").mkdir(parents=True)
    text = render(spec, "lua")
    # its site modules are not here: load the file alone (the dependencies are Lmod's business)
    text = "\n".join(line for line in text.splitlines() if not line.startswith(("depends_on", "load(")))
    (tree / "aws-ofi-rccl" / "1.4.0.lua").write_text(text + "\n")
    out = subprocess.run(["bash", "-c", f". {sites.LMOD_INIT}; module use {tree}; module load aws-ofi-rccl/1.4.0 && "
                          'echo "net=${NCCL_NET-unset} name=$SITESTACK_NCCL_NET plugin=${NCCL_NET_PLUGIN-unset} '
                          'path=$LD_LIBRARY_PATH"'],
                         capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    # RCCL 5.7.1 opens librccl-net.so by its default name from LD_LIBRARY_PATH (tests/test_comm_oracle.py)
    assert f"net=unset name=AWS Libfabric plugin=unset path={dest}/lib" in out.stdout, out.stdout + out.stderr

