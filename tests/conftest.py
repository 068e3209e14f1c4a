"""Shared fixtures: the repository, running the CLI as a user would, scratch prefixes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


def run_invoke(*args: str, cwd: Path = REPO, env: dict[str, str] | None = None,
               timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    """Run ``invoke ARGS`` in the checkout the way a user does; capture everything."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=cwd, env=full_env, text=True,
                          capture_output=True, timeout=timeout)


@pytest.fixture
def cli():
    """``cli("provision", "--site", "local")`` -> CompletedProcess (stdout, stderr, returncode)."""
    return run_invoke


@pytest.fixture
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty directory for a prefix; logs of runs go beside it, not to ~/.cache (for this test
    only: the variable is restored afterwards, so no later test inherits a removed directory)."""
    monkeypatch.setenv("SITESTACK_LOG_DIR", str(tmp_path / "logs"))
    return tmp_path / "prefix"


def uv_dir(tmp: Path) -> str:
    """A directory holding the uv the test extras install (``pip install -e .[test]``), as a site's own
    PATH entry: the one beside this interpreter is sitestack's venv, which the site's commands never
    see (sitestack/core/host.py: site_environ)."""
    import shutil
    found = shutil.which("uv", path=os.path.dirname(sys.executable)) or shutil.which("uv")
    assert found, "uv is missing: install the test extras (pip install -e '.[test]')"
    where = tmp / "uv-bin"
    where.mkdir(parents=True, exist_ok=True)
    if not (where / "uv").exists():
        (where / "uv").symlink_to(os.path.realpath(found))
    return str(where)


def tree(path: Path) -> list[str]:
    """Every path below ``path``, relative and sorted (to compare before/after a run)."""
    if not path.exists():
        return []
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


# -- the validation job's integration tests -----------------------------------------------------------
# A session-wide Python with torch (CPU build), matplotlib and mpi4py for the DDP check program, kept
# in ~/.cache between sessions; a real one-node Slurm cluster (tests/slurm.py); the job installed by
# `invoke install-validation-job --site local` into a scratch prefix (which also builds the MPI probe).

VALIDATION_REQUIREMENTS = ("torch==2.13.0", "matplotlib", "mpi4py", "numpy")


def _mpi_abi_shim(venv: Path) -> dict[str, str]:
    """mpi4py's binary wheel loads libmpi.so.12 (the MPICH ABI); Debian's MPICH names it libmpich.so.12."""
    import glob
    if glob.glob("/usr/lib/*/libmpi.so.12") or glob.glob("/usr/lib64/libmpi.so.12"):
        return {}
    found = glob.glob("/usr/lib/*/libmpich.so.12")
    if not found:
        return {}
    shim = venv / "mpi-abi"
    shim.mkdir(exist_ok=True)
    link = shim / "libmpi.so.12"
    if not link.exists():
        link.symlink_to(found[0])
    return {"LD_LIBRARY_PATH": f"{shim}:{os.environ.get('LD_LIBRARY_PATH', '')}".rstrip(":")}


@pytest.fixture(scope="session")
def validation_python() -> tuple[str, dict[str, str]]:
    """(python, env) of a venv with torch, matplotlib and mpi4py. When pip cannot make it, every test
    that needs it errors with pip's output: the validation and fault tests must not pass by being
    skipped."""
    import fcntl
    import hashlib
    key = hashlib.sha256(" ".join(VALIDATION_REQUIREMENTS).encode() + sys.version.encode()).hexdigest()[:12]
    venv = Path(os.environ.get("SITESTACK_TEST_VENVS", Path.home() / ".cache" / "sitestack" / "test-venvs")) / f"validation-{key}"
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f".{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (venv / ".complete").exists():
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
            out = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                                  *VALIDATION_REQUIREMENTS], capture_output=True, text=True, timeout=1500)
            if out.returncode != 0:
                pytest.fail(f"cannot make the validation venv {venv} (pip install {' '.join(VALIDATION_REQUIREMENTS)} "
                            f"exited {out.returncode}):\n{(out.stdout + out.stderr)[-4000:]}", pytrace=False)
            (venv / ".complete").write_text("ok\n")
    return str(venv / "bin" / "python"), _mpi_abi_shim(venv)


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """A running one-node Slurm cluster (slurmctld + slurmd, auth/none) for the whole session."""
    from tests.slurm import SlurmCluster, available
    why = available()
    if why:
        pytest.skip(f"no Slurm cluster here: {why}")
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm")).start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def installed_local_job(tmp_path_factory, validation_python) -> dict:
    """The local site's validation job installed into a scratch prefix (MPI probe built for real)."""
    python, env = validation_python
    prefix = tmp_path_factory.mktemp("validation") / "prefix"
    logs = prefix.parent / "logs"
    result = run_invoke("install-validation-job", "--site", "local", "--prefix", str(prefix), "--python", python,
                        env={"SITESTACK_LOG_DIR": str(logs)}, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    return {"prefix": prefix, "dir": prefix / "validation", "python": python, "env": env, "install_output": result.stdout,
            "logs": logs}


@pytest.fixture(scope="session")
def mpi4py_build(tmp_path_factory):
    """mpi4py built ONCE per session, for real, from its PyPI sdist against the local site's MPICH
    (`invoke build-mpi4py --site local`), with a check-mode run before it. Its build cache
    (``env["SITESTACK_BUILD_CACHE"]``) holds the wheel: later installs with that env reuse it."""
    import time
    from types import SimpleNamespace

    root = tmp_path_factory.mktemp("mpi4py")
    env = {"SITESTACK_BUILD_CACHE": str(root / "build-cache"), "SITESTACK_SOURCE_CACHE": str(root / "source-cache"),
           "SITESTACK_LOG_DIR": str(root / "logs")}
    prefix = root / "prefix"
    check = run_invoke("build-mpi4py", "--site", "local", "--prefix", str(prefix), "--check", "--fail-on-change", env=env)
    start = time.monotonic()
    build = run_invoke("build-mpi4py", "--site", "local", "--prefix", str(prefix), env=env, timeout=3600)
    seconds = time.monotonic() - start
    return SimpleNamespace(root=root, prefix=prefix, dest=prefix / "mpi4py" / "4.1.2", env=env, check=check,
                           build=build, seconds=seconds)


# -- the stack: venv, extend-venv-activate, module files (tests/test_venv*, test_modulefile*, test_activate*) --
import re  # noqa: E402

#: Variables only Lmod reads: its loaded-module table (split into _ModuleTable###_ chunks), the
#: reference counts of path entries and the pushenv stacks. Lmod leaves some behind after the last
#: unload (an emptied table chunk, the counts of entries that were there before); nothing else
#: reads them, so comparisons of the environment before and after `module unload` ignore them.
LMOD_BOOKKEEPING = re.compile(r"_ModuleTable\d+_|_ModuleTable_Sz_|__LMOD_REF_COUNT_\w+|__LMOD_STACK_\w+|"
                              r"__LMOD_Priority_\w+|LOADEDMODULES|_LMFILES_")
LMOD_INIT = "/usr/share/lmod/lmod/init"


def clean_env(**extra: str) -> dict[str, str]:
    """A minimal login-like environment for a shell under test."""
    return {"HOME": os.environ.get("HOME", "/root"), "USER": os.environ.get("USER") or "root", "LANG": "C.UTF-8",
            "PATH": "/usr/local/bin:/usr/bin:/bin", **extra}


def shell(argv: list[str], script: str, env: dict[str, str] | None = None, timeout: float = 300,
          cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``script`` with ``argv`` (e.g. ["bash", "-c"]) in a clean environment."""
    return subprocess.run([*argv, script], env=env or clean_env(), text=True, capture_output=True, timeout=timeout,
                          cwd=cwd)


def parse_env(dump: str) -> dict[str, str]:
    """``env -0`` output -> mapping."""
    out = {}
    for item in dump.split("\0"):
        if "=" in item:
            key, _, value = item.partition("=")
            out[key] = value
    return out


def without_lmod_bookkeeping(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if not LMOD_BOOKKEEPING.fullmatch(k)}


def playbook_copy(tmp: Path, site: str = "local", *, facts: dict | None = None, step_args: dict | None = None,
                  without: tuple[str, ...] = ()) -> Path:
    """``playbooks/<site>.yml`` copied to ``tmp/<site>.yml`` with facts merged in, step arguments changed
    (``{action: {arg: value}}``) and the steps named in ``without`` left out."""
    import yaml
    data = yaml.safe_load((REPO / "playbooks" / f"{site}.yml").read_text())

    def merge(into: dict, new: dict) -> None:
        for key, value in new.items():
            if isinstance(value, dict) and isinstance(into.get(key), dict):
                merge(into[key], value)
            else:
                into[key] = value

    merge(data["facts"], facts or {})
    data["steps"] = [step for step in data["steps"] if step.get("name") not in without]
    for step in data["steps"]:
        if step_args and step["action"] in step_args:
            step["args"] = {**(step.get("args") or {}), **step_args[step["action"]]}
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / f"{site}.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture(scope="session")
def local_stack(tmp_path_factory, request):
    """The local site's stack, made ONCE per session the way a user makes it: mpi4py built
    (`invoke build-mpi4py`; from the build cache when an earlier run built the same inputs, so no
    compiling then), `invoke install-venv`, `invoke install-modulefiles`. Horovod too when
    the build-horovod task exists (unless SITESTACK_TEST_HOROVOD=0; the build cache is the default one,
    shared with test_horovod's build, so a session compiles Horovod once):
    it is built (against the same torch, in its build environment), then install-venv runs again and
    adds it in place.
    ``seconds`` holds the timings; ``horovod`` is None or why Horovod is missing."""
    import time
    from types import SimpleNamespace

    root = tmp_path_factory.mktemp("stack")
    prefix = root / "prefix"
    env = {"SITESTACK_LOG_DIR": str(root / "logs")}
    seconds: dict[str, float] = {}

    def step(name: str, *args: str, timeout: float = 3600) -> subprocess.CompletedProcess[str]:
        start = time.monotonic()
        out = run_invoke(*args, "--site", "local", "--prefix", str(prefix), env=env, timeout=timeout)
        seconds[name] = time.monotonic() - start
        assert out.returncode == 0, f"{' '.join(args)} failed:\n{out.stdout}\n{out.stderr}"
        return out

    step("build-mpi4py", "build-mpi4py")
    venv_run = step("install-venv", "install-venv")
    venv = prefix / "pytorch" / "2.13.0-cpu"
    horovod = "Horovod is not built for this stack: SITESTACK_TEST_HOROVOD=0 left it out"
    listing = run_invoke("--list").stdout
    if "build-horovod" not in listing:
        horovod = "Horovod is not built for this stack: this checkout has no build-horovod task"
    elif os.environ.get("SITESTACK_TEST_HOROVOD") != "0":
        request.getfixturevalue("horovod_build")  # compiles it (cold, with its own log) into the shared cache
        step("build-horovod", "build-horovod")
        step("install-venv (adds horovod)", "install-venv")
        horovod = None
    modules = step("install-modulefiles", "install-modulefiles")
    return SimpleNamespace(root=root, prefix=prefix, env=env, venv=venv, name="pytorch/2.13.0-cpu",
                           modules=prefix / "modules", manifest=prefix / "pytorch" / "2.13.0-cpu.manifest.json",
                           seconds=seconds, horovod=horovod, venv_output=venv_run.stdout, modules_output=modules.stdout)


# -- Horovod, built once per session (tests/test_horovod.py; the stack fixture reuses the wheel) ------
import dataclasses  # noqa: E402
import time  # noqa: E402


@dataclasses.dataclass
class Build:
    root: Path
    env: dict
    prefix: Path
    dest: Path
    first: subprocess.CompletedProcess
    seconds: float
    python: str


@pytest.fixture(scope="session")
def horovod_build(tmp_path_factory) -> Build:
    """Horovod 0.28.1 built for real for the `local` site (CPU: MPI + Gloo, torch 2.13.0+cpu)."""
    root = tmp_path_factory.mktemp("horovod")
    # The default build cache, shared with the stack fixture (tests/conftest.py: local_stack), so a
    # session compiles Horovod once; on a fresh machine (CI) that build is cold.
    # SITESTACK_TEST_BUILD_CACHE names another one.
    builds = Path(os.environ.get("SITESTACK_TEST_BUILD_CACHE") or Path.home() / ".cache" / "sitestack" / "builds")
    env = {"SITESTACK_LOG_DIR": str(root / "logs"), "SITESTACK_SOURCE_CACHE": str(root / "sources"),
           "SITESTACK_BUILD_CACHE": str(builds), "SITESTACK_PROGRESS_INTERVAL": "60"}
    prefix = root / "prefix"
    start = time.monotonic()
    first = run_invoke("build-horovod", "--site", "local", "--prefix", str(prefix), env=env, timeout=3600)
    seconds = time.monotonic() - start
    python = str(builds / "envs" / "torch-2.13.0-cpu-py3.11" / "bin" / "python")
    return Build(root, env, prefix, prefix / "horovod" / "0.28.1", first, seconds, python)




@pytest.fixture(scope="session")
def site_twins(tmp_path_factory, request):
    """``site_twins(site)``: the site's twin (tests/twins/provision.py) brought up and provisioned on
    first use, kept for the session (its namespace and Slurm cluster stopped at the end)."""
    from tests import slurm
    from tests.twins import namespace, provision, runtime
    from tests.twins.rocm import have_debian_hip
    running: dict[str, provision.RunningTwin] = {}

    def get(site: str) -> provision.RunningTwin:
        if site in running:
            return running[site]
        needs = [(Path("/usr/share/lmod/lmod/init/bash").exists(), "Lmod (scripts/test.sh installs it)"),
                 (Path("/usr/bin/mpicc").exists(), "MPICH (scripts/test.sh installs it)"),
                 (site != "frontier" or have_debian_hip(), "Debian's HIP for the ROCm twin")]
        for ok, what in needs:
            if not ok:
                pytest.skip(f"the {site} twin needs {what}")
        for why in (namespace.available(), slurm.available(), runtime.available() if site in ("lumi", "dawn") else None):
            if why:
                pytest.skip(f"the {site} twin cannot run here: {why}")
        python = request.getfixturevalue("validation_python")[0] if site in ("lumi", "dawn") else None
        twin = provision.bring_up(site, tmp_path_factory.mktemp(f"{site}-twin"), python)
        running[site] = twin
        return provision.provision(twin)

    yield get
    for twin in running.values():
        twin.stop()
