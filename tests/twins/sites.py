"""Twins of the remote sites (frontier, cirrus, lumi, dawn) on this machine, made by the tests.

A twin is a directory tree plus a facts overlay. The tree holds the site's marker path, an Lmod
module tree with the site's module names (the ones its playbook loads), and the few commands and
prefixes this Debian machine lacks. The overlay is merged into ``playbooks/<site>.yml`` (a copy,
given to ``invoke provision --playbook``); it changes only what the machine makes impossible:

- where things are: the marker, the prefix, the ROCm/CUDA/libfabric trees (the twin's, not /opt);
- what the hardware forces: no GPU, so the collectives are gloo on CPU (the validation DDP check
  and Horovod then build and run for CPU), and the device counts and binding of a 2-core node;
- what the twin's stand-ins report: Debian's MPICH stands in for cray-mpich / Open MPI / Intel MPI,
  so the library the MPI checks expect is ``MPICH``; Debian's Python 3.11 stands in for the site's
  Python (3.10, 3.12), so the stack's Python version is 3.11; torch 2.13.0 CPU, from this machine's
  pip configuration (local disk), stands in for the site's GPU wheels and their index.

Everything else runs as the playbook says: its modules are loaded with Lmod, the Cray ``cc``/``CC``
wrappers compile mpi4py and Horovod, the network plugin is configured against the twin's ROCm and
libfabric, the stack env is made by the site's Python source (conda through the miniforge3 module).
Each stand-in says in its first lines what it stands for and why (:data:`STAND_IN`).
"""

from __future__ import annotations

import glob
import os
import shutil
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.twins.rocm import make_rccl_header, make_rocm

LMOD_INIT = "/usr/share/lmod/lmod/init/bash"
MPICH_INCLUDE = "/usr/include/x86_64-linux-gnu/mpich"
MPICH_LIBS = "/usr/lib/x86_64-linux-gnu/libmpich.so*"
FABRIC_LIBS = "/usr/lib/x86_64-linux-gnu/libfabric.so*"

#: The first lines of every stand-in file (a module, a command): what it stands for, and why.
STAND_IN = "STAND-IN for {what}, written by sitestack's tests (tests/twins/sites.py): {why}"


@dataclass
class Twin:
    """A site's twin: its tree under ``root``, the facts overlay, step arguments to change, and
    ``stand_ins`` (what -> why) for the report."""

    site: str
    root: Path
    facts: dict[str, Any]
    step_args: dict[str, dict[str, Any]] = field(default_factory=dict)   # step name -> package args merged
    stand_ins: dict[str, str] = field(default_factory=dict)
    path: list[str] = field(default_factory=list)   # system commands of the site (on its default PATH)

    @property
    def prefix(self) -> Path:
        return Path(self.facts["prefix"])

    def playbook(self) -> Path:
        """``playbooks/<site>.yml`` with the overlay merged in, written under the twin's root."""
        import yaml
        repo = Path(__file__).resolve().parent.parent.parent
        data = yaml.safe_load((repo / "playbooks" / f"{self.site}.yml").read_text())
        merge(data["facts"], self.facts)
        for step in data["steps"]:
            if step["name"] in self.step_args:
                args = step.setdefault("args", {}) or {}
                args["package"] = {**(args.get("package") or {}), **self.step_args[step["name"]]}
                step["args"] = args
        path = self.root / "playbook" / f"{self.site}.yml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path


def merge(into: dict[str, Any], new: Mapping[str, Any]) -> None:
    """Deep-merge ``new`` into ``into`` (mappings merged, an empty one and anything else replaced, None
    kept as null)."""
    for key, value in new.items():
        if isinstance(value, Mapping) and value and isinstance(into.get(key), dict):
            merge(into[key], value)
        else:
            into[key] = value


# -- the pieces -----------------------------------------------------------------------------------------
def module(tree: Path, name: str, body: str, *, what: str, why: str) -> Path:
    """A Lua module file ``tree/<name>.lua`` (Lmod) that says what it stands for."""
    path = tree / f"{name}.lua"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"-- {STAND_IN.format(what=what, why=why)}\n{body}")
    return path


def command(bindir: Path, name: str, script: str, *, what: str, why: str) -> Path:
    """An executable ``bindir/name`` (a POSIX shell script) that says what it stands for."""
    bindir.mkdir(parents=True, exist_ok=True)
    path = bindir / name
    path.write_text(f"#!/bin/sh\n# {STAND_IN.format(what=what, why=why)}\n{script}")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def link_tree(root: Path, include: Mapping[str, str], libs: str) -> Path:
    """A prefix whose ``include/`` holds only the given entries and whose ``lib/`` links the libraries
    matching ``libs``: Debian installs into /usr, and ``-I/usr/include`` breaks GCC's
    ``#include_next`` (docs/netplugin.md), so a site prefix cannot simply be /usr."""
    (root / "include").mkdir(parents=True, exist_ok=True)
    (root / "lib").mkdir(exist_ok=True)
    for name, target in include.items():
        (root / "include" / name).symlink_to(target)
    for lib in glob.glob(libs):
        (root / "lib" / os.path.basename(lib)).symlink_to(lib)
    return root


def cray_pe(root: Path, tree: Path, *, mpich: str, prgenv: str = "8.5.0", loads_mpich: bool = False) -> dict[str, str]:
    """Cray PE stand-ins: ``PrgEnv-gnu`` (the ``cc``/``CC`` drivers over GCC) and ``cray-mpich/<mpich>``
    (MPICH_DIR, and the drivers then compile and link MPI, as craype does with cray-mpich loaded);
    ``loads_mpich``: PrgEnv-gnu loads cray-mpich, as on LUMI (its playbook loads no cray-mpich)."""
    bindir = root / "opt/cray/pe/craype/bin"
    why = "this machine has no Cray PE; the drivers add MPI only with cray-mpich loaded, as craype does"
    for name, plain, mpi in (("cc", "gcc", "mpicc"), ("CC", "g++", "mpicxx"), ("ftn", "gfortran", "mpifort")):
        command(bindir, name, f'[ -n "${{SITESTACK_TWIN_CRAY_MPICH:-}}" ] && exec {mpi} "$@"\nexec {plain} "$@"\n',
                what=f"Cray's {name} compiler driver (craype)", why=why)
    load = f'load("cray-mpich/{mpich}")\n' if loads_mpich else ""
    module(tree, f"PrgEnv-gnu/{prgenv}", f'prepend_path("PATH", "{bindir}")\nsetenv("PE_ENV", "GNU")\n{load}',
           what="Cray's PrgEnv-gnu", why=why)
    mpich_dir = link_tree(root / f"opt/cray/pe/mpich/{mpich}/ofi/gnu/12.3", {"mpi.h": f"{MPICH_INCLUDE}/mpi.h",
                          "mpio.h": f"{MPICH_INCLUDE}/mpio.h", "mpicxx.h": f"{MPICH_INCLUDE}/mpicxx.h",
                          "mpi_proto.h": f"{MPICH_INCLUDE}/mpi_proto.h"}, MPICH_LIBS)
    for lib in glob.glob(MPICH_LIBS):   # cray-mpich names its library libmpi.so
        (mpich_dir / "lib" / os.path.basename(lib).replace("libmpich", "libmpi")).symlink_to(lib)
    module(tree, f"cray-mpich/{mpich}", f'setenv("MPICH_DIR", "{mpich_dir}")\nsetenv("SITESTACK_TWIN_CRAY_MPICH", "1")\n',
           what=f"cray-mpich {mpich} (Debian's MPICH 4.0.2, through the cc/CC drivers)", why=why)
    return {"cc": str(bindir / "cc"), "mpich_dir": str(mpich_dir)}


def rocm(root: Path, tree: Path, version: str, accel: str) -> Path:
    """``rocm/<version>`` over a ROCm tree made from Debian's HIP (tests/twins/rocm.py) with the stand-in
    RCCL header, and ``craype-accel-<accel>``."""
    home = make_rccl_header(make_rocm(root / f"opt/rocm-{version}"))
    module(tree, f"rocm/{version}", f'setenv("ROCM_PATH", "{home}")\n',
           what=f"ROCm {version}", why="Debian packages HIP 5.2 (hipcc, libamdhip64) and no RCCL")
    module(tree, f"craype-accel-{accel}", f'setenv("CRAY_ACCEL_TARGET", "{accel}")\n',
           what=f"craype-accel-{accel}", why="it only sets the GPU target of the Cray drivers; there is no GPU here")
    return home


def libfabric(root: Path, path: str) -> Path:
    """A libfabric prefix at the twin's copy of ``path`` (e.g. /opt/cray/libfabric/1.15.2.0) over
    Debian's libfabric 1.17 (headers in /usr/include/rdma)."""
    return link_tree(root / path.lstrip("/"), {"rdma": "/usr/include/rdma"}, FABRIC_LIBS)


def conda(root: Path, tree: Path, name: str) -> Path:
    """A ``miniforge3`` module whose ``conda`` makes environments with Python's venv: conda is neither
    in Debian nor usable from PyPI here. Only what sitestack runs is accepted:
    ``conda create --yes --quiet --prefix P python=X.Y pip``."""
    bindir = root / "opt/miniforge3/bin"
    command(bindir, "conda", r'''set -eu
[ "${1:-}" = create ] || { echo "conda stand-in: only 'create' is provided" >&2; exit 2; }
shift; prefix=""; want=""
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix|-p) prefix=$2; shift 2 ;;
    python=*) want=${1#python=}; shift ;;
    *) shift ;;
  esac
done
have=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[ -n "$prefix" ] || { echo "conda stand-in: --prefix is required" >&2; exit 2; }
[ -z "$want" ] || [ "$want" = "$have" ] || { echo "conda stand-in: python=$want asked, this machine has $have" >&2; exit 1; }
exec python3 -m venv "$prefix"
''', what="conda of Miniforge3 (conda create --prefix)", why="conda cannot be installed on this machine")
    module(tree, name, f'prepend_path("PATH", "{bindir}")\n', what=f"the {name} module",
           why="its conda is a stand-in (see bin/conda)")
    return bindir


def plain(tree: Path, names: Mapping[str, str]) -> None:
    """Site modules that change nothing the twin needs (name -> what it stands for)."""
    for name, what in names.items():
        module(tree, name, "", what=what, why="what it provides on the site is not used by the stack's build here")


# -- the sites ------------------------------------------------------------------------------------------
def stand_ins(site: str, make: Callable[[Path], None]) -> Path:
    """The directory of a site's stand-ins (module tree, commands, prefixes), made by ``make`` at a fixed
    path (``<site>`` under $SITESTACK_TEST_TWINS, else ~/.cache/sitestack/twins): the build cache keys
    name the compilers and module trees by path, so a twin made again in the next session reuses the
    builds of the last one. Made under a lock; made again when this code changed (its sum is kept)."""
    import fcntl
    import hashlib
    here = Path(__file__).resolve().parent
    key = hashlib.sha256(b"".join((here / n).read_bytes() for n in ("sites.py", "rocm.py", "runtime.py"))).hexdigest()[:12]
    base = Path(os.environ.get("SITESTACK_TEST_TWINS") or Path.home() / ".cache" / "sitestack" / "twins")
    final = base / site
    base.mkdir(parents=True, exist_ok=True)
    with open(base / f".{site}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / ".complete").exists() and (final / ".complete").read_text() != key:
            shutil.rmtree(final)   # made by other code: made again, at the same path
        if not (final / ".complete").exists():
            shutil.rmtree(final, ignore_errors=True)
            make(final)
            (final / ".complete").write_text(key)
    return final


def common_overlay(root: Path, tree: Path, *, cores: int = 2) -> dict[str, Any]:
    """What every twin overrides: marker, modules, CPU collectives, a 2-rank geometry, local torch."""
    return {
        "modules": {"init": LMOD_INIT, "use": [str(tree)]},
        "node": {"cores": cores, "local_scratch": "/tmp"},
        # no GPU here: the check program would look for the site's GPUs; a CPU node of 2 ranks
        "gpu": {"vendor": "none", "per_node": 0, "cores_per_gpu": 0, "cpu_bind": None},
        "mpi": {"library_match": "MPICH"},
        "python": {"version": "3.11"},
        "torch": {"version": "2.13.0", "variant": "cpu", "index_url": None, "index": "extra", "packages": {},
                  "extras": []},
        "collectives": "gloo",
        "scheduler": {"partition": "debug", "options": [], "gres": None, "time": "00:10:00"},
        "validation": {"ranks_per_node": 2, "bind": "launcher", "multi_node": None, "single_node": {
            "busbw_gbs": 0.5, "lower": -0.95, "message_bytes": 4194304,
            "source": "the twin: gloo over loopback on a 2-core machine (as the local site)"}},
        "build_jobs": 2,
    }


def _frontier(stands: Path) -> None:
    tree = stands / "modules"
    cray_pe(stands, tree, mpich="8.1.28")
    rocm(stands, tree, "5.7.1", "amd-gfx90a")
    conda(stands, tree, "miniforge3/23.11.0-0")
    plain(tree, {"gcc-native/12.3": "HPE's gcc-native 12.3 (Debian's GCC 12 is on PATH)",
                 "libtool": "the libtool module (Debian's libtool is on PATH)"})
    libfabric(stands, "/opt/cray/libfabric/1.15.2.0")


def frontier(root: Path) -> Twin:
    """Frontier: Cray PE (PrgEnv-gnu, cray-mpich 8.1.28 with cc/CC), rocm/5.7.1, miniforge3, libfabric."""
    stands = stand_ins("frontier", _frontier)
    tree = stands / "modules"
    home = stands / "opt/rocm-5.7.1"
    fabric = stands / "opt/cray/libfabric/1.15.2.0"
    (root / "lustre/orion").mkdir(parents=True, exist_ok=True)
    facts = {**common_overlay(root, tree),
             "marker": str(root / "lustre/orion"),
             "prefix": str(root / "lustre/orion/{account}/world-shared/sitestack"),
             "rocm": {"version": "5.7.1", "home": str(home.parent / "rocm-{rocm_version}")},
             # Debian's MPICH under cray-mpich's name: srun starts it through Slurm's PMI-2 (--mpi=pmi2),
             # which cray-mpich does not need; the Cray drivers (mpi.cc "cc -shared", mpi.cxx CC) are kept.
             "mpi": {"flavour": "mpich", "library_match": "MPICH"},
             # conda-pack packs only what conda made (conda-meta/); the stand-in's "conda env" is a venv, so
             # the twin does not stage its env (node-local staging is tested for real in tests/test_staging.py)
             "node": {"stage_env": False}}
    return Twin("frontier", root, facts, step_args={"rccl-net-plugin": {"libfabric": str(fabric)}}, stand_ins={
        "PrgEnv-gnu, cray-mpich/8.1.28, cc/CC": f"Debian's GCC 12 and MPICH 4.0.2 ({stands}/opt/cray/pe)",
        "rocm/5.7.1": "Debian's HIP 5.2.3 and a stand-in RCCL header (tests/twins/rocm.py)",
        "miniforge3/23.11.0-0": "conda create by Python's venv (conda cannot be had here)",
        "/opt/cray/libfabric/1.15.2.0": "Debian's libfabric 1.17",
        "GPUs": "none: gloo collectives, 2 ranks, Horovod for CPU",
        "--constraint=nvme": "left out: the test cluster's node has no NVMe feature",
        "node.stage_env": "false: conda-pack needs a real conda env (conda-meta/), which the conda stand-in is not",
        "torch 2.2.2+rocm5.7 (--index-url rocm5.7)": "torch 2.13.0+cpu from local disk (this machine's pip configuration)",
    })


def cirrus(root: Path) -> Twin:
    """Cirrus: python/3.12.1-gpu (Python, NVHPC paths: CUDA and NCCL locations), cmake/3.25.2, Open MPI."""
    tree = stand_ins("cirrus", _cirrus) / "modules"
    (root / "work").mkdir(parents=True, exist_ok=True)
    common = common_overlay(root, tree)
    facts = {**common,
             "marker": str(root / "work"),
             "prefix": str(root / "work/{account}/shared/sitestack"),
             "mpi": {"flavour": "mpich", "cc": "mpicc", "cxx": "mpicxx", "library_match": "MPICH"},
             "cuda": None,
             # --qos=gpu names a QOS the test cluster has not; --exclusive stays: legacy Cirrus jobs set no
             # --ntasks in sbatch, and the job's srun gets the node's cores through it
             "scheduler": {**common["scheduler"], "options": ["--exclusive"]}}
    return Twin("cirrus", root, facts, stand_ins={
        "python/3.12.1-gpu": "Debian's Python 3.11, MPICH for NVHPC's Open MPI; NVHPC_ROOT with the libcuda stub only",
        "GPUs": "none: gpu.vendor none (no CUDA toolkit of sm_70 here), gloo collectives, Horovod for CPU",
        "--qos=gpu": "left out: the test cluster has no QOS",
        "torch 2.3.1+cu121": "torch 2.13.0+cpu from local disk (this machine's pip configuration)",
    })


def _cirrus(root: Path) -> None:
    tree = root / "modules"
    nvhpc = root / "opt/nvidia/hpc_sdk/Linux_x86_64/24.5"
    stubs = nvhpc / "cuda/lib64/stubs"
    stubs.mkdir(parents=True)
    (stubs / "libcuda.so").write_text(f"STAND-IN for the CUDA driver stub (not a library; the twin has no GPU): {STAND_IN}\n")
    pybin = root / "opt/python/3.12.1-gpu/bin"
    command(pybin, "python", 'exec python3 "$@"\n', what="the python of python/3.12.1-gpu (Miniconda 3.12.1)",
            why="Debian's Python 3.11 has no `python` command")
    module(tree, "python/3.12.1-gpu", f'setenv("NVHPC_ROOT", "{nvhpc}")\nprepend_path("PATH", "{pybin}")\n', what="python/3.12.1-gpu (Miniconda "
           "Python 3.12.1 with NVHPC 24.5: CUDA 12.4, NCCL, Open MPI)", why="Debian's Python 3.11 and MPICH are used; "
           "NVHPC_ROOT points at a tree with only the libcuda stub directory the Horovod step checks")
    plain(tree, {"cmake/3.25.2": "cmake 3.25.2 (Debian's cmake is on PATH)"})


def apptainer(root: Path) -> Path:
    """The container runtime stand-in (tests/twins/runtime.py: bubblewrap + squashfuse): ``apptainer``
    and ``singularity`` in ``root/opt/apptainer/bin``. Its ``build`` takes docker bases from
    ``$RUNTIME_TWIN_DOCKER_DIR`` (see :func:`torch_image`)."""
    from tests.twins import runtime
    return runtime.install(root / "opt/apptainer/bin")


def torch_image(tree: Path, python: str, image: Path, *, interpreter: str = "/usr/local/bin/python") -> Path:
    """A stand-in image of a PyTorch container: the host's ``/`` (the stand-in runtime lays an image over
    it) plus ``python`` on the container's PATH with torch 2.13.0 CPU: the site-packages of the test venv
    whose interpreter is ``python`` (tests/conftest.py validation_python), linked entry by entry into the
    host Python's ``/usr/local/lib/python3.X/dist-packages``, and a marker saying what it stands for."""
    from tests.twins import runtime
    site = Path(python).parent.parent / "lib"
    (packages,) = site.glob("python3.*/site-packages")
    shutil.rmtree(tree, ignore_errors=True)
    target = tree / "usr/local/lib" / packages.parent.name / "dist-packages"
    target.mkdir(parents=True)
    for entry in packages.iterdir():
        if not entry.name.startswith("mpi4py"):   # the test venv's mpi4py (built here) is no image's
            (target / entry.name).symlink_to(entry)
    # the image's interpreter: the host's Python, whose prefix (found through the link) is /usr
    (tree / interpreter.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
    (tree / interpreter.lstrip("/")).symlink_to(f"/usr/bin/{packages.parent.name}")
    (tree / ".singularity.d/env").mkdir(parents=True)
    (tree / "STAND-IN").write_text(STAND_IN.format(what=f"a PyTorch container image ({image.name})", why=(
        "no image can be pulled here; the host's Python with the test venv's torch 2.13.0 CPU")) + "\n")
    image.parent.mkdir(parents=True, exist_ok=True)
    return runtime.make_image(tree, image)


def _dawn(root: Path) -> None:
    tree = root / "modules"
    apptainer(root)
    plain(tree, {"rhel9/default-dawn": "rhel9/default-dawn (Intel oneAPI, Intel MPI: Debian's MPICH, whose Hydra "
                 "mpiexec takes the same -n/-ppn/-hosts, is on PATH)",
                 "intel-oneapi-ccl/2021.15.0": "Intel oneCCL 2021.15.0 (collectives are gloo on the twin)"})


def dawn(root: Path, python: str | None = None) -> Twin:
    """Dawn: rhel9/default-dawn and intel-oneapi-ccl (Intel MPI, oneCCL), the image built by apptainer from
    a stand-in of intel/intel-extension-for-pytorch:2.8.10-xpu (:func:`torch_image` over ``python``);
    the test gives ``RUNTIME_TWIN_DOCKER_DIR=<root>/docker`` to the runtime stand-in. Without ``python``
    there is no base image (a twin for the job alone, tests/test_site_fixes.py)."""
    stands = stand_ins("dawn", _dawn)
    tree = stands / "modules"
    software = root / "usr/local/dawn/software"
    software.mkdir(parents=True, exist_ok=True)
    if python:
        torch_image(root / "docker-tree", python, root / "docker" / "intel_intel-extension-for-pytorch_2.8.10-xpu.sif")
    common = common_overlay(root, tree)
    facts = {**common,
             "marker": str(software),
             "prefix": str(root / "dawn/sitestack"),
             # no GPU stacks to count (ranks = GPUs in the allocation x stacks per card): 2 ranks from
             # validation.ranks_per_node, as on the other twins
             "gpu": {**common["gpu"], "unit": "gpu"},
             "mpi": {"flavour": "mpich", "library_match": "MPICH"},
             "container": {
                 # the InfiniBand and oneAPI libraries of Dawn's bind list do not exist here (the runtime
                 # refuses a bind whose source is missing, as apptainer does); the marker tree stands in
                 "bind": [str(software)],
                 # the stand-in runtime's %post writes only into directories the host lacks, and the stand-in
                 # image's Python is the host's (its site-packages is a host directory): extra packages
                 # could not land in the image; the test cluster's node has no GPU gres
                 "build": {"packages": [], "slurm_options": []}},
             }
    # apptainer is a system command on Dawn (build_image.sh of https://github.com/kh296/dawn-containers
    # runs it with no module loaded)
    return Twin("dawn", root, facts, path=[str(stands / "opt/apptainer/bin")], stand_ins={
        "rhel9/default-dawn, Intel MPI": "Debian's MPICH (Hydra mpiexec)",
        "apptainer": "tests/twins/runtime.py (bubblewrap + squashfuse)",
        "intel/intel-extension-for-pytorch:2.8.10-xpu": "the host's / with Python 3.11 and torch 2.13.0 CPU "
                                                         "(tests/twins/sites.py torch_image)",
        "container.build.packages (matplotlib, pandas, seaborn)": "left out: the stand-in's %post cannot install "
                                                                   "into the image",
        "container.bind (InfiniBand, oneAPI)": "the twin's marker tree only: the host libraries do not exist here",
        "GPUs": "none: gloo collectives, 2 ranks; --gres=gpu:1 of the image build left out",
    })


LUMI_SIF = "lumi-pytorch-rocm-6.2.4-python-3.12-pytorch-v2.7.1-dockerhash-0d479e852886.sif"


def lumi_conda(tree: Path) -> None:
    """The LUMI image's conda activation in the image tree ``tree``: the image defines ``WITH_CONDA``
    (``source /opt/miniconda3/bin/activate pytorch``, https://lumi-supercomputer.github.io/LUMI-EasyBuild-docs/p/PyTorch/),
    and the activation sets CONDA_DEFAULT_ENV and CONDA_PREFIX and puts the env's ``bin`` on PATH. The
    env's python (``/opt/miniconda3/envs/pytorch/bin``) is not on the container's PATH before it."""
    (tree / "opt/miniconda3/bin").mkdir(parents=True, exist_ok=True)
    (tree / "opt/miniconda3/bin/activate").write_text(
        f"# {STAND_IN.format(what='conda activate of the LUMI image', why='the stand-in image has no conda')}\n"
        'export CONDA_DEFAULT_ENV="${1:-base}"\n'
        'export CONDA_PREFIX=/opt/miniconda3/envs/"$CONDA_DEFAULT_ENV"\n'
        'export PATH="$CONDA_PREFIX/bin:$PATH"\n')
    (tree / ".singularity.d/env").mkdir(parents=True, exist_ok=True)
    (tree / ".singularity.d/env/90-environment.sh").write_text(
        'export WITH_CONDA="source /opt/miniconda3/bin/activate pytorch"\n')


def _lumi(stands: Path) -> None:
    tree = stands / "modules"
    cray_pe(stands, tree, mpich="8.1.29", loads_mpich=True)
    rocm(stands, tree, "6.2.4", "amd-gfx90a")
    module(tree, "rocm/6.0.3", "", what="rocm/6.0.3, the host ROCm of LUMI/24.03", why="the plugin builds against "
           "the container's ROCm (facts.rocm 6.2.4, the twin's tree of Debian's HIP)")
    plain(tree, {"LUMI/24.03": "the LUMI/24.03 software stack", "partition/G": "LUMI's GPU partition of the stack"})
    libfabric(stands, "/opt/cray/libfabric/1.15.2.0")
    apptainer(stands)


def lumi(root: Path, python: str) -> Twin:
    """LUMI: LUMI/24.03, partition/G, PrgEnv-gnu (cc/CC, cray-mpich 8.1.29), rocm, the PyTorch SIF copied
    from the central area (a stand-in image, :func:`torch_image`, whose conda env python has torch)."""
    stands = stand_ins("lumi", _lumi)
    tree = stands / "modules"
    central = root / "appl/local/containers"
    image_tree = root / "lumi-image"
    sif = torch_image(image_tree, python, central / "sif-images" / LUMI_SIF,
                      interpreter="/opt/miniconda3/envs/pytorch/bin/python")
    lumi_conda(image_tree)
    from tests.twins import runtime
    runtime.make_image(image_tree, sif)   # again, with the conda activation
    import hashlib
    digest = hashlib.sha256(sif.read_bytes()).hexdigest()
    fabric = stands / "opt/cray/libfabric/1.15.2.0"
    common = common_overlay(root, tree)
    facts = {**common,
             "marker": str(central),
             "prefix": str(root / "projappl/{account}/sitestack"),
             "rocm": {"version": "6.2.4", "home": str(stands / "opt/rocm-{rocm_version}")},
             "mpi": {"flavour": "mpich", "library_match": "MPICH"},
             "container": {
                 "source": str(sif), "sha256": digest,
                 # LUMI's bind list names the site's Slurm, Cray and file-system paths, which do not exist
                 # here (the runtime refuses a missing bind source, as singularity does): the twin's
                 "bind": [str(stands / "opt/cray"), str(root / "appl")]},
             }
    # singularity is a system command on LUMI (no module loads it)
    return Twin("lumi", root, facts, path=[str(stands / "opt/apptainer/bin")],
                step_args={"rccl-net-plugin": {"libfabric": str(fabric)}}, stand_ins={
        "PrgEnv-gnu, cray-mpich/8.1.29, cc/CC": f"Debian's GCC 12 and MPICH 4.0.2 ({stands}/opt/cray/pe)",
        "rocm 6.2.4 (the plugin's), rocm/6.0.3": "Debian's HIP 5.2.3 and a stand-in RCCL header (tests/twins/rocm.py)",
        "/opt/cray/libfabric/1.15.2.0": "Debian's libfabric 1.17",
        "singularity": "tests/twins/runtime.py (bubblewrap + squashfuse)",
        LUMI_SIF: "the host's / with /opt/miniconda3/envs/pytorch/bin/python: Python 3.11, torch 2.13.0 CPU",
        "container.bind (Slurm, Cray, CXI, file systems)": "the twin's /opt/cray and /appl",
        "GPUs": "none: gloo collectives, 2 ranks, Horovod for CPU; --gpus-per-node=8 --mem=480G left out",
    })


def remove(root: Path) -> None:
    """Remove a twin's tree (its prefix included)."""
    shutil.rmtree(root, ignore_errors=True)
