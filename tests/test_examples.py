"""The guide's example playbooks (docs/examples/*.yml, docs/new-site.md "Your site in a playbook").

Each example loads, plans in check mode off its site (every step "not probed", the pointer to `invoke
render`), and renders every file it would install without an error; every YAML snippet of the guide
parses. The A100 example is provisioned and validated on a twin made like the site twins
(tests/twins/): its paths in a mount namespace, the Cray PE, conda and module stand-ins of
tests/twins/stand_ins.py, and a Slurm cluster; only what the hardware forces differs
(tests/twins/sites.py HARDWARE_KEYS), given through SITESTACK_FACTS. The Shifter example runs on the
same twin (no second cluster): the runtime stand-in of tests/twins/runtime_modules.py with Shifter's
modules, its image, and a SPANK plugin stand-in that gives sbatch Shifter's options.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

from sitestack.engine import playbook as pb
from sitestack.engine.render import render_site
from sitestack.model.context import RunOptions
from tests.conftest import REPO, run_invoke

EXAMPLES = REPO / "docs" / "examples"
GUIDE = REPO / "docs" / "new-site.md"
ACCOUNT = "m0000"


def examples() -> list[Path]:
    found = sorted(EXAMPLES.glob("*.yml"))
    assert len(found) >= 3, found
    return found


@pytest.mark.parametrize("path", examples(), ids=lambda p: p.stem)
def test_example_loads_and_renders(path, tmp_path):
    """The example loads (its site is its file name), and every step renders (no step error); the
    rendered files include the validation job's batch scripts, and module files where it installs them."""
    site = pb.load(None, path)
    assert site.name == path.stem
    rendering = render_site(site, RunOptions(account=ACCOUNT))
    errors = {s.name: s.error for s in rendering.steps if s.error}
    assert not errors, errors
    files = rendering.final()
    if any(s.action == "modulefiles" for s in site.steps):
        assert any(p.endswith(".lua") or "/modules/" in p for p in files), sorted(files)
    assert any(p.endswith(".sbatch") for p in files), sorted(files)
    # the scripts, helpers and check programs carry no other site's instructions (OLCF's advice was
    # once in every site's affinity check and staging helper)
    assert not [p for p, (text, _m, _s) in files.items() if "OLCF" in text]


@pytest.mark.parametrize("path", examples(), ids=lambda p: p.stem)
def test_example_plans_in_check_mode_off_its_site(path):
    """`invoke provision --playbook X --check` here (not the site): exit 0, every step planned, not
    probed, and one line pointing to `invoke render`."""
    out = run_invoke("provision", "--playbook", str(path), "--account", ACCOUNT, "--check")
    assert out.returncode == 0, out.stdout + out.stderr
    steps = [s.name for s in pb.load(None, path).steps]
    for name in steps:
        assert re.search(rf"^\[\S+\] changed\s+{re.escape(name)}: would .*not probed", out.stdout, re.M), name
    assert out.stdout.count("invoke render") == 1, out.stdout


def guide_snippets() -> list[str]:
    return re.findall(r"^```yaml\n(.*?)^```", GUIDE.read_text(), re.M | re.S)


def test_every_yaml_snippet_of_the_guide_parses():
    snippets = guide_snippets()
    assert len(snippets) >= 5
    for text in snippets:
        assert yaml.safe_load(text) is not None, text


def test_the_guide_names_every_example():
    text = GUIDE.read_text()
    for path in sorted(EXAMPLES.glob("*.yml")):
        assert f"examples/{path.name}" in text, path.name


def test_the_a100_example_renders_the_sites_job_lines(tmp_path):
    """The lines the site documents: its masks with hyperthread siblings (threads_per_core: 2: GPU 0 is
    NUMA 3's cores 48-63 and their siblings 112-127), the constraint and QOS, no forced NCCL_NET (the
    site's module provides the plugin: net_plugin null), the site's modules in the stack's module."""
    site = pb.load(None, EXAMPLES / "example-a100.yml")
    files = {p: text for p, (text, _m, _s) in render_site(site, RunOptions(account=ACCOUNT)).final().items()}
    srun = next(t for p, t in files.items() if p.endswith("/validate-srun.sbatch"))
    assert "CPU_MASKS=0xffff000000000000ffff000000000000," in srun
    assert "#SBATCH --constraint=gpu" in srun and "#SBATCH --qos=regular" in srun
    assert not re.search(r"^\s*export NCCL_NET=", srun, re.M)
    module = files["/global/common/software/m0000/sitestack/modules/pytorch/2.3.1-cu121.lua"]
    assert 'load("nccl/2.21.5")' in module or "nccl/2.21.5" in module, module


# -- the A100 example on its twin ------------------------------------------------------------------------
A100_MODULES = "/opt/cray/pe/lmod/modulefiles/core"
#: Where the Shifter stand-in's nccl-plugin module says the plugin is, inside the image.
SHIFTER_PLUGIN_DIR = "/opt/udiImage/modules/nccl-plugin/aws-ofi-nccl/lib"
CONDA_HOME = "/opt/miniforge3/24.7.1-0"


def _a100_stand_ins(stands: Path) -> None:
    from tests.twins import stand_ins as si
    tree = stands / A100_MODULES.lstrip("/")
    si.cray_pe(stands, tree, mpich="8.1.28", loads_mpich=True)   # PrgEnv-gnu loads cray-mpich, as on a Cray EX
    si.conda(stands, tree, "conda/Miniforge3-24.7.1-0", CONDA_HOME)
    si.plain(tree, {"cudatoolkit/12.4": "NVIDIA's CUDA 12.4 (no GPU here: torch is the CPU build)",
                    "craype-accel-nvidia80": "the Cray drivers' A100 target (no GPU here)",
                    "nccl/2.21.5": "the site's NCCL with its aws-ofi-nccl plugin (collectives are gloo here)"})


def a100_overlay(facts: dict) -> dict:
    """What the hardware forces on the example (the keys of tests/twins/sites.py HARDWARE_KEYS only)."""
    from tests.twins import sites
    options = [o for o in facts["scheduler"]["options"] if not o.startswith("--gpus-per-node")]
    return {"gpu": {"vendor": "none", "per_node": 0, "cores_per_gpu": 1, "cpu_bind": None},
            "collectives": "gloo", "torch": sites.CPU_TORCH, "cuda": None, "node": {"cores": 2}, "build_jobs": 2,
            "python": {"version": "3.11"}, "scheduler": {"options": options},
            "validation": {"ranks_per_node": 2, "bind": "launcher", "multi_node": None,
                           "single_node": sites.GLOO_REFERENCE}}


@pytest.fixture(scope="module")
def a100_twin(tmp_path_factory):
    """The A100 example's twin, started (namespace + Slurm), provisioned once."""
    from tests import slurm
    from tests.twins import namespace, sites
    from tests.twins import stand_ins as si
    from tests.twins.provision import RunningTwin, login_env
    for why in (namespace.available(), slurm.available()):
        if why:
            pytest.skip(f"the example's twin cannot run here: {why}")
    if not Path(sites.LMOD_INIT).exists() or not Path("/usr/bin/mpicc").exists():
        pytest.skip("the example's twin needs Lmod and MPICH (scripts/test.sh installs them)")
    root = tmp_path_factory.mktemp("a100-twin")
    # named for the stand-ins' code: si.cached remakes a directory only when tests/twins/ changes
    code = hashlib.sha256(inspect.getsource(_a100_stand_ins).encode()).hexdigest()[:8]
    stands = si.cached(f"example-a100-{code}", _a100_stand_ins)
    fs = root / "fs"
    home = f"/global/homes/{sites.USER}"
    binds = {"/opt/cray": stands / "opt/cray", "/opt/miniforge3": stands / "opt/miniforge3",
             "/global/common/software": fs / "common", home: fs / "home"}
    for host in binds.values():
        host.mkdir(parents=True, exist_ok=True)
    profile = root / "site-profile.sh"
    profile.write_text(f"export MODULEPATH={shlex.quote(A100_MODULES)}\n")
    binds["/etc/profile.d/zz-site.sh"] = profile
    facts = yaml.safe_load((EXAMPLES / "example-a100.yml").read_text())["facts"]
    twin = sites.Twin("example-a100", ACCOUNT, root, binds, {"MODULEPATH": A100_MODULES, "HOME": home},
                      a100_overlay(facts), {}, {"Cray PE, conda, cudatoolkit, nccl": "tests/twins/stand_ins.py"}, home)
    for key in _flat(twin.overlay):
        assert key in sites.HARDWARE_KEYS, key
    ns = namespace.SiteNamespace(binds).start()
    cluster = slurm.SlurmCluster(root / "slurm", partition="regular", node="RealMemory=262144 Features=gpu",
                                 mpi_default="pmi2", launch=ns.argv)
    running = RunningTwin(twin, ns, cluster, login_env(twin, root, cluster))
    shifter_bin = _shifter_stand_in(root / "shifter")
    if shifter_bin:   # on the login node's and the jobs' PATH (sbatch passes the environment on), as /usr/bin is
        running.env["PATH"] = f"{running.env['PATH']}:{shifter_bin}"
        _shifter_spank(root / "shifter", cluster.root)
    cluster.start()
    try:
        running.args = ["provision", "--playbook", str(EXAMPLES / "example-a100.yml"), "--account", ACCOUNT]
        running.first = running.invoke(*running.args, timeout=3600)
        yield running
    finally:
        running.stop()


def _shifter_stand_in(root: Path) -> Path | None:
    """The Shifter stand-in for the Shifter example (tests/twins/runtime_modules.py over bwrap + squashfuse):
    its commands in ``root/bin``, the images it pulls from ``root/images`` (made by the test that runs it),
    and the site's Shifter modules; None where the stand-in cannot run here (that test then skips)."""
    from tests.twins import runtime
    if runtime.available():
        return None
    modules = root / "modules" / "shifter"
    modules.mkdir(parents=True)
    (root / "images").mkdir()
    (modules / "gpu").write_text("# STAND-IN for Shifter's gpu module (mounts the driver's libraries): no GPU here\n")
    # Shifter's nccl-plugin module mounts the site's NCCL network plugin into the image and puts its
    # directory on the library path (https://docs.nersc.gov/development/containers/shifter/how-to-use/,
    # "Shifter modules"): the same here, so the ranks' recorded settings show it only where the job
    # asked for the module
    (modules / "nccl-plugin").write_text(
        "# STAND-IN for Shifter's nccl-plugin module (no plugin is loaded: the twin's collectives are gloo)\n"
        f"LD_LIBRARY_PATH={SHIFTER_PLUGIN_DIR}\nNCCL_NET_GDR_LEVEL=PHB\n")
    return runtime.install(root / "bin", root / "images", root / "modules")


#: STAND-IN for Shifter's Slurm plugin (shifter wlm_integration/slurm/shifterSpank.c, release 18.03): the
#: options it adds to sbatch and srun, so that the job's ``#SBATCH --image=...`` is accepted. The real one
#: also prepares the image on the nodes; here the stand-in ``shifter`` mounts it when a rank starts.
#: Written without slurm/spank.h (Debian's libslurm-dev is not installed): its structures as in Slurm
#: 22.05 (slurm/spank.h, SPANK_PLUGIN, struct spank_option).
SPANK_C = """\
const char plugin_name[] = "shifter-stand-in";
const char plugin_type[] = "spank";
const unsigned int plugin_version = %(version)d;
const unsigned int spank_plugin_version = 1;
struct spank_option { char *name; char *arginfo; char *usage; int has_arg; int val; void *cb; };
struct spank_option spank_options[] = {
    {"image", "image", "the Shifter image of the job (stand-in: accepted only)", 1, 0, 0},
    {"volume", "volumes", "Shifter volumes (stand-in: accepted only)", 1, 1, 0},
    {"module", "modules", "Shifter modules (stand-in: accepted only)", 1, 2, 0},
    {0, 0, 0, 0, 0, 0},
};
/* sbatch and salloc read no spank_options table: a plugin registers its options there (slurm/spank.h);
   elsewhere the table has registered them already (the second registration's error is of no matter) */
extern int spank_option_register(void *spank, struct spank_option *option);
int slurm_spank_init(void *spank, int argc, char **argv)
{
    struct spank_option *option;
    (void)argc; (void)argv;
    for (option = spank_options; option->name; option++)
        (void)spank_option_register(spank, option);
    return 0;
}
"""


def _shifter_spank(root: Path, slurm_dir: Path) -> None:
    """Build the SPANK stand-in and name it in the cluster's plugstack.conf (read from beside slurm.conf)."""
    import subprocess
    out = subprocess.run(["slurmd", "-V"], capture_output=True, text=True, check=True).stdout
    major, minor, micro = (int(n) for n in re.findall(r"(\d+)\.(\d+)\.(\d+)", out)[0])
    source = root / "shifter_spank.c"
    source.write_text(SPANK_C % {"version": (major << 16) | (minor << 8) | micro})   # SLURM_VERSION_NUM
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(root / "shifter_spank.so"), str(source)], check=True)
    slurm_dir.mkdir(parents=True, exist_ok=True)
    (slurm_dir / "plugstack.conf").write_text(f"required {root / 'shifter_spank.so'}\n")


def _flat(mapping: dict, prefix: str = "") -> list[str]:
    from tests.twins import sites
    out: list[str] = []
    for key, value in mapping.items():
        name = f"{prefix}{key}"
        out += _flat(value, name + ".") if isinstance(value, dict) and value and name not in sites.HARDWARE_KEYS else [name]
    return out


@pytest.mark.integration
@pytest.mark.slow
def test_the_a100_example_provisions_and_validates_on_its_twin(a100_twin, tmp_path):
    """`invoke provision --playbook docs/examples/example-a100.yml` applies every step on the twin; `invoke
    validate --playbook ...` submits the srun job to the twin's Slurm and the DDP check passes."""
    first = a100_twin.first
    assert first.returncode == 0, first.stdout[-8000:] + first.stderr
    outcomes = dict((n, o) for o, n in re.findall(r"^\[login\] (\w+)\s+([\w-]+)", first.stdout, re.M))
    steps = [s.name for s in pb.load(None, EXAMPLES / "example-a100.yml").steps]
    assert list(outcomes) == steps, outcomes
    assert all(o in ("ok", "changed") for o in outcomes.values()), outcomes
    out = a100_twin.invoke("validate", "--playbook", str(EXAMPLES / "example-a100.yml"), "--account", ACCOUNT,
                           "--results", str(tmp_path), "--timeout", "900", timeout=1000)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr + a100_twin.cluster.logs()
    assert "submitted validate-srun.sbatch to Slurm as job" in out.stdout
    (result,) = tmp_path.glob("sitestack-validation-*/result.json")
    checks = {c["name"]: c for c in json.loads(result.read_text())["checks"]}
    assert checks["ddp"]["status"] == "passed", checks
    assert checks["mpi4py"]["status"] == "skipped", checks["mpi4py"]   # the example builds no mpi4py
    assert checks["affinity"]["status"] == "passed", checks["affinity"]


# -- the Shifter example on the same twin ----------------------------------------------------------------
SHIFTER = EXAMPLES / "example-shifter.yml"


def _shifter_image(twin, name: str) -> None:
    """The image ``name`` as the Shifter stand-in pulls it: a squashfs laid over the node's ``/`` whose
    ``python`` (first on the image's PATH) is the PyTorch environment the A100 example installed on this
    twin, standing for the image's own (the same torch the twin's facts name)."""
    from tests.twins import runtime
    envs = twin.twin.site_dir(f"/global/common/software/{ACCOUNT}/sitestack/pytorch")
    (env,) = [p.name for p in envs.iterdir() if p.is_symlink() and (p / "bin" / "python").exists()]
    tree = twin.twin.root / "shifter" / "image"
    (tree / "usr/local/bin").mkdir(parents=True, exist_ok=True)
    python = tree / "usr/local/bin/python"
    python.write_text(f"#!/bin/sh\n# STAND-IN for the Python of the image {name}: the twin's A100 stack\n"
                      f"exec /global/common/software/{ACCOUNT}/sitestack/pytorch/{env}/bin/python \"$@\"\n")
    python.chmod(0o755)
    runtime.make_image(tree, twin.twin.root / "shifter" / "images" / (name.replace("/", "_").replace(":", "_") + ".sif"))


@pytest.mark.integration
@pytest.mark.slow
def test_the_shifter_example_provisions_and_validates_on_the_a100_twin(a100_twin, tmp_path):
    """The container shape on the A100 example's twin (same namespace and Slurm): `invoke provision
    --playbook docs/examples/example-shifter.yml` installs the validation job, whose lines are the site's
    documented ones (#SBATCH --image=..., srun ... shifter ... --module=gpu,nccl-plugin); `invoke validate`
    runs each rank in the image through the Shifter stand-in, which applies the runtime's modules.

    The plugin is the runtime's: the stand-in's nccl-plugin module is what puts its directory on the
    ranks' library path. Checked by hand that this fails without the option: with the job's
    ``--module=gpu,nccl-plugin`` edited to ``--module=gpu`` before `invoke validate`, every rank's
    ``setting.plugin_library_path`` is empty and the last assertion fails; with a module the stand-in
    lacks (``--module=gpu,nccl-plugin,nope``) the job fails (srun exits 255, the job log has the stand-in's
    "unknown module 'nope'", the environment check FAIL)."""
    assert a100_twin.first.returncode == 0, a100_twin.first.stdout[-8000:] + a100_twin.first.stderr
    if not (a100_twin.twin.root / "shifter" / "bin").is_dir():
        from tests.twins import runtime
        pytest.skip(f"the Shifter stand-in cannot run here: {runtime.available()}")
    facts = yaml.safe_load(SHIFTER.read_text())["facts"]
    _shifter_image(a100_twin, facts["container"]["image"])
    first = a100_twin.invoke("provision", "--playbook", str(SHIFTER), "--account", ACCOUNT, timeout=900)
    assert first.returncode == 0, first.stdout[-8000:] + first.stderr
    outcomes = dict((n, o) for o, n in re.findall(r"^\[login\] (\w+)\s+([\w-]+)", first.stdout, re.M))
    assert list(outcomes) == [s.name for s in pb.load(None, SHIFTER).steps], outcomes
    assert all(o in ("ok", "changed") for o in outcomes.values()), outcomes
    prefix = facts["prefix"].format(account=ACCOUNT)
    job = a100_twin.twin.site_dir(f"{prefix}/validation/jobs/validate-srun.sbatch").read_text()
    assert "#SBATCH --image=docker:nersc/pytorch:24.06.01\n" in job
    assert re.search(r"^CONTAINER_OPTIONS=\(.* --module=gpu,nccl-plugin\)$", job, re.M), job
    one_line = re.sub(r"\\\n\s*", " ", job)
    assert re.search(r'\bsrun [^\n]* shifter --image="\$SIF" "\$\{CONTAINER_OPTIONS\[@\]\}" "\$PYTHON" ', one_line)
    out = a100_twin.invoke("validate", "--playbook", str(SHIFTER), "--account", ACCOUNT, "--results", str(tmp_path),
                           "--timeout", "600", timeout=700)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr + a100_twin.cluster.logs()
    assert "submitted validate-srun.sbatch to Slurm as job" in out.stdout
    (result,) = tmp_path.glob("sitestack-validation-*/result.json")
    report = json.loads(result.read_text())
    checks = {c["name"]: c for c in report["checks"]}
    for name in ("environment", "process-group", "affinity", "collectives", "ddp"):
        assert checks[name]["status"] == "passed", (name, checks[name])
    assert report["world_size"] == 2 and report["launcher"] == "srun", report
    # the runtime's module was applied in every rank's container (the module file's settings)
    for rank in report["ranks"]:
        assert rank["setting"]["plugin_library_path"] == [SHIFTER_PLUGIN_DIR], rank["setting"]
        assert rank["setting"]["variables"].get("NCCL_NET_GDR_LEVEL") == "PHB", rank["setting"]
