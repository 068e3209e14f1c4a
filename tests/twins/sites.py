"""Twins of the remote sites (frontier, cirrus, lumi, dawn), shaped like the site.

A twin is a mount namespace (tests/twins/namespace.py) in which the site's own paths exist: its
marker, prefix, module tree, Lmod, compiler drivers, MPI, ROCm, libfabric, Python source, container
runtime and file systems sit where the site has them, made of this machine's tools
(tests/twins/stand_ins.py; each stand-in says what it stands for). ``playbooks/<site>.yml`` is applied
unchanged (``invoke provision --site <site>``), and the site's login environment (MODULEPATH, HOME,
the system commands) is what a user's shell there has.

The only facts that differ are what the hardware forces (:data:`HARDWARE_KEYS`), given through the
product's site-local facts (``SITESTACK_FACTS``): no GPU here (collectives become gloo, torch is the
CPU build, the GPU requests of the batch options go), a 2-core node (2 ranks, no CPU masks, 2 build
jobs) and Python 3.11. The twin's Slurm cluster is shaped like the site's where Slurm allows it: its
partition has the site's name, its node the site's memory and features, ``MpiDefault=pmi2`` (the
stand-in MPI is MPICH, started by srun's PMI-2 as cray-mpich is by the site's default).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.twins import stand_ins as si

REPO = Path(__file__).resolve().parent.parent.parent
USER = "root"   # the tests run as root; the twin's user is who runs them
LMOD_INIT = f"{si.LMOD}/init/bash"   # this machine's Lmod, for tests that load module files outside a twin

#: The facts a twin may change, with what forces each (a test checks every twin against this).
HARDWARE_KEYS: dict[str, str] = {
    "gpu": "no GPU here: vendor none, no GPUs per node",
    "collectives": "no GPU: the collectives are gloo on CPU",
    "torch": "no GPU: torch is the CPU build (the site's GPU wheels need their GPU, and their index cannot be reached)",
    "cuda": "no NVIDIA GPU: no CUDA toolkit",
    "node.cores": "a 2-core node",
    "build_jobs": "a 2-core login node",
    "validation.ranks_per_node": "2 ranks on a 2-core node",
    "validation.bind": "no CPU masks: they follow from the site's core count",
    "validation.single_node": "the bandwidth reference of gloo over loopback on 2 cores",
    "validation.multi_node": "one node only",
    "python.version": "this machine's Python 3.11",
    "scheduler.options": "the GPU request (--gpus-per-node) left out: the node has no GPU",
    "scheduler.gres": "the GPU request (--gres=gpu:N) left out: the node has no GPU",
    "container.build.slurm_options": "the GPU request (--gres=gpu:1) of the image build left out",
    "container.build.packages": "the runtime stand-in's %post cannot install into the image's Python "
                                "(tests/twins/runtime.py): the extra packages are left out",
}

#: torch as this machine has it: 2.13.0 CPU from local disk (its pip configuration).
CPU_TORCH = {"version": "2.13.0", "variant": "cpu", "index_url": None, "index": "extra", "packages": {}, "extras": []}
GLOO_REFERENCE = {"busbw_gbs": 0.5, "lower": -0.95, "message_bytes": 4194304,
                  "source": "the twin: gloo over loopback on a 2-core machine (as the local site)"}


@dataclass
class Twin:
    """A site's twin: the binds of its namespace (site path -> host path), the login environment, the
    facts the hardware forces, the shape of its Slurm cluster, and what stands in for what."""

    site: str
    account: str
    root: Path
    binds: dict[str, Path]
    login: dict[str, str]
    overlay: dict[str, Any]
    slurm: dict[str, Any]
    stand_ins: dict[str, str]
    home: str
    docker: Path | None = None          # where the runtime stand-in's `build` finds docker bases

    def facts_file(self) -> Path:
        """The overlay as a site-local facts file (``SITESTACK_FACTS``)."""
        path = self.root / "twin-facts.yml"
        path.write_text(yaml.safe_dump({"facts": self.overlay}, sort_keys=False))
        return path

    def site_dir(self, path: str) -> Path:
        """The host directory behind the site path ``path`` (one of the twin's own directories)."""
        for site, host in sorted(self.binds.items(), key=lambda kv: -len(kv[0])):
            if path == site or path.startswith(site.rstrip("/") + "/"):
                return Path(host) / os.path.relpath(path, site)
        raise KeyError(path)


def playbook_facts(site: str) -> dict[str, Any]:
    return dict(yaml.safe_load((REPO / "playbooks" / f"{site}.yml").read_text())["facts"])


def hardware(site: str, *, drop_options: tuple[str, ...] = ("--gpus-per-node",)) -> dict[str, Any]:
    """The overlay every twin has (only :data:`HARDWARE_KEYS`)."""
    facts = playbook_facts(site)
    overlay: dict[str, Any] = {
        # cores_per_gpu: the cores of each rank (2 cores, 2 ranks), so the jobs give each rank one thread
        "gpu": {"vendor": "none", "per_node": 0, "cores_per_gpu": 1, "cpu_bind": None},
        "collectives": "gloo",
        "torch": CPU_TORCH,
        "node": {"cores": 2},
        "build_jobs": 2,
        "python": {"version": "3.11"},
        "validation": {"ranks_per_node": 2, "bind": "launcher", "multi_node": None, "single_node": GLOO_REFERENCE},
    }
    options = facts.get("scheduler", {}).get("options") or []
    kept = [o for o in options if not o.startswith(drop_options)]
    if kept != options:
        overlay["scheduler"] = {"options": kept}
    if facts.get("scheduler", {}).get("gres"):
        overlay.setdefault("scheduler", {})["gres"] = None
    if facts.get("cuda"):
        overlay["cuda"] = None
    return overlay


def _dirs(root: Path, *names: str) -> dict[str, Path]:
    """Fresh directories of this twin for the site paths ``names`` (file systems, homes)."""
    out = {}
    for name in names:
        host = root / "fs" / name.strip("/").replace("/", "_")
        host.mkdir(parents=True, exist_ok=True)
        out[name] = host
    return out


# -- Frontier ---------------------------------------------------------------------------------------------
FRONTIER_MODULES = "/opt/cray/pe/lmod/modulefiles/core"


def _frontier(stands: Path) -> None:
    tree = stands / FRONTIER_MODULES.lstrip("/")
    si.cray_pe(stands, tree, mpich="8.1.28")
    si.rocm(stands, tree, "5.7.1", "amd-gfx90a")
    si.rocm(stands, tree, "7.1.1", "amd-gfx90a")   # the playbook's current stack (stacks: rocm7)
    si.conda(stands, tree, "miniforge3/23.11.0-0", "/sw/frontier/miniforge3/23.11.0-0")
    si.plain(tree, {"gcc-native/12.3": "HPE's gcc-native 12.3 (Debian's GCC 12 is on PATH)",
                    "libtool": "the libtool module (Debian's libtool is on PATH)",
                    "rccl-net-plugin": "OLCF's RCCL network plugin module (aws-ofi-nccl 1.19 for ROCm 7.1.1)"})
    si.libfabric(stands, "/opt/cray/libfabric/1.15.2.0")


def frontier(root: Path, account: str) -> Twin:
    """Frontier: Cray PE (PrgEnv-gnu, cray-mpich 8.1.28 with cc/CC), rocm/5.7.1, miniforge3, libfabric,
    Orion at /lustre/orion, the node-local NVMe at /mnt/bb."""
    stands = si.cached("frontier", _frontier)
    home = f"/ccs/home/{USER}"
    binds: dict[str, Path] = {"/opt/cray": stands / "opt/cray", "/opt/cray/pe/lmod/lmod": Path(si.LMOD),
                              "/opt/rocm-5.7.1": stands / "opt/rocm-5.7.1", "/opt/rocm-7.1.1": stands / "opt/rocm-7.1.1",
                              "/sw/frontier": stands / "sw/frontier",
                              **_dirs(root, "/lustre/orion", "/mnt/bb", home)}
    (binds["/mnt/bb"] / USER).mkdir(exist_ok=True)   # made for each job with -C nvme on Frontier
    return Twin("frontier", account, root, binds, {"MODULEPATH": FRONTIER_MODULES, "HOME": home}, hardware("frontier"),
                {"partition": "batch", "node": "RealMemory=524288 Features=nvme", "mpi_default": "pmi2",
                 # Frontier allocates whole nodes (https://docs.olcf.ornl.gov/systems/frontier_user_guide.html, "Slurm")
                 "partition_options": {"batch": "OverSubscribe=EXCLUSIVE"}}, {
        "PrgEnv-gnu, cray-mpich/8.1.28, cc/CC": "Debian's GCC 12 and MPICH 4.0.2, reporting CRAY MPICH 8.1.28",
        "rocm/5.7.1 (/opt/rocm-5.7.1), rocm/7.1.1 (/opt/rocm-7.1.1)": "Debian's HIP 5.2.3 and a stand-in RCCL header (tests/twins/rocm.py)",
        "rccl-net-plugin": "a module that sets nothing: no RCCL runs here",
        "miniforge3/23.11.0-0": "conda create by Python's venv (conda cannot be had here)",
        "/opt/cray/libfabric/1.15.2.0": "Debian's libfabric 1.17",
        "Lmod of the Cray PE": "Debian's Lmod 8.6",
        "Orion (/lustre/orion), NVMe (/mnt/bb)": "directories of the twin",
    }, home)


# -- Cirrus ------------------------------------------------------------------------------------------------
CIRRUS_MODULES = "/work/y07/shared/cirrus-modulefiles"
NVHPC = "/opt/nvidia/hpc_sdk/Linux_x86_64/24.5"


def _cirrus(stands: Path) -> None:
    tree = stands / CIRRUS_MODULES.lstrip("/")
    (stands / "work/y07/shared/cirrus-software").mkdir(parents=True)
    nvhpc = stands / NVHPC.lstrip("/")
    si.plain_file(nvhpc / "cuda/lib64/stubs/libcuda.so", "the CUDA driver stub", "not a library: there is no GPU here")
    ompi = f"{NVHPC}/comm_libs/mpi"
    si.mpi(stands / ompi.lstrip("/"), "Open MPI v4.1.5", "libmpi")
    si.mpi_wrappers(stands / ompi.lstrip("/") / "bin", ompi, "libmpi", what="NVHPC's Open MPI")
    pybin = stands / "opt/python/3.12.1-gpu/bin"
    si.command(pybin, "python", 'exec python3 "$@"\n', what="the python of python/3.12.1-gpu (Miniconda 3.12.1)",
               why="Debian's Python 3.11 has no `python` command")
    si.module(tree, "python/3.12.1-gpu", f'setenv("NVHPC_ROOT", "{NVHPC}")\nprepend_path("PATH", "{ompi}/bin")\n'
              f'prepend_path("PATH", "/opt/python/3.12.1-gpu/bin")\n', what="python/3.12.1-gpu (Miniconda Python 3.12.1 "
              "with NVHPC 24.5: CUDA 12.4, NCCL, Open MPI)", why="Debian's Python 3.11 and MPICH (reporting Open MPI) "
              "are used; NVHPC_ROOT holds only the libcuda stub directory the Horovod step checks")
    si.plain(tree, {"cmake/3.25.2": "cmake 3.25.2 (Debian's cmake is on PATH)"})


def cirrus(root: Path, account: str) -> Twin:
    """Cirrus: python/3.12.1-gpu (Python, NVHPC: CUDA stub, Open MPI), cmake/3.25.2; /work/<project>."""
    stands = si.cached("cirrus", _cirrus)
    home = f"/home/{account}/{account}/{USER}"
    binds = {"/work/y07": stands / "work/y07", "/opt/nvidia": stands / "opt/nvidia", "/opt/python": stands / "opt/python",
             "/usr/share/Modules": Path(si.LMOD), **_dirs(root, f"/work/{account}", home)}
    return Twin("cirrus", account, root, binds, {"MODULEPATH": CIRRUS_MODULES, "HOME": home}, hardware("cirrus"),
                {"partition": "gpu", "node": "RealMemory=393216", "mpi_default": "pmi2"}, {
        "python/3.12.1-gpu": "Debian's Python 3.11; MPICH reporting Open MPI; NVHPC_ROOT with the libcuda stub only",
        "Environment Modules (/usr/share/Modules)": "Debian's Lmod 8.6, which reads Tcl module files (Debian's "
                                                    "environment-modules package removes Lmod)",
    }, home)


# -- the container sites ------------------------------------------------------------------------------------
def container_binds(stands: Path, paths: list[str]) -> dict[str, Path]:
    """Stand-ins for what a site binds into its containers and this machine lacks (libraries of the
    network stack): files that say what they stand for (directories in the site's software tree are
    made with that tree)."""
    out = {}
    for path in paths:
        if os.path.lexists(path) or path.startswith(DAWN_SOFTWARE):
            continue
        # a library (lib*.so.N) or command (.../bin/x) is a file; anything else (libibverbs/) a directory
        file = "." in os.path.basename(path) or "/bin/" in path
        host = stands / "bind" / path.lstrip("/")
        out[path] = si.plain_file(host if file else host / "STAND-IN", f"the site's {path}",
                                  "it does not exist here; containers bind it unused (gloo)")
        if not file:
            out[path] = host
    return out


DAWN_SOFTWARE = "/usr/local/dawn/software"
IMPI = f"{DAWN_SOFTWARE}/spack-rocky9/intel-oneapi-mpi-2021.15.0"


def _dawn(stands: Path) -> None:
    tree = stands / DAWN_SOFTWARE.lstrip("/") / "modulefiles"
    si.apptainer(stands)
    si.mpi(stands / IMPI.lstrip("/"), "Intel(R) MPI Library 2021.15 for Linux* OS", "libmpi")
    si.mpi_wrappers(stands / IMPI.lstrip("/") / "bin", IMPI, "libmpi", what="Intel MPI's")
    si.module(tree, "rhel9/default-dawn", f'prepend_path("PATH", "{IMPI}/bin")\n', what="rhel9/default-dawn (Intel "
              "oneAPI, Intel MPI)", why="Debian's MPICH reporting Intel MPI; its Hydra mpiexec takes the same -n/-ppn/-hosts")
    si.plain(tree, {"intel-oneapi-ccl/2021.15.0": "Intel oneCCL 2021.15.0 (collectives are gloo on the twin)"})
    for path in playbook_facts("dawn")["container"]["bind"]:
        if path.startswith(DAWN_SOFTWARE):
            (stands / path.lstrip("/")).mkdir(parents=True, exist_ok=True)


def dawn(root: Path, account: str, python: str | None = None) -> Twin:
    """Dawn: rhel9/default-dawn and intel-oneapi-ccl (Intel MPI, oneCCL), apptainer a system command, the
    image built from a stand-in of intel/intel-extension-for-pytorch:2.8.10-xpu over ``python``."""
    stands = si.cached("dawn", _dawn)
    home = f"/home/{USER}"
    docker = root / "docker"
    if python:
        si.torch_image(root / "docker-tree", python, docker / "intel_intel-extension-for-pytorch_2.8.10-xpu.sif")
    binds = {DAWN_SOFTWARE: stands / DAWN_SOFTWARE.lstrip("/"), "/usr/share/Modules": Path(si.LMOD),
             "/usr/bin/apptainer": stands / "opt/apptainer/bin/apptainer", **_dirs(root, home, "/ramdisks"),
             **container_binds(stands, playbook_facts("dawn")["container"]["bind"])}
    overlay = hardware("dawn")
    overlay["gpu"]["unit"] = "gpu"   # no stacks to count: 2 ranks from validation.ranks_per_node
    overlay["container"] = {"build": {"packages": [], "slurm_options": []}}
    return Twin("dawn", account, root, binds, {"MODULEPATH": f"{DAWN_SOFTWARE}/modulefiles", "HOME": home}, overlay,
                {"partition": "pvc9", "node": "RealMemory=1048576", "mpi_default": "pmi2"}, {
        "rhel9/default-dawn, Intel MPI": "Debian's MPICH (Hydra mpiexec), reporting Intel MPI",
        "apptainer (/usr/bin/apptainer)": "tests/twins/runtime.py (bubblewrap + squashfuse)",
        "intel/intel-extension-for-pytorch:2.8.10-xpu": "the host's / with Python 3.11 and torch 2.13.0 CPU",
        "Environment Modules (/usr/share/Modules)": "Debian's Lmod 8.6, which reads Tcl module files",
        "the InfiniBand libraries of the bind list": "files that say what they stand for",
    }, home, docker)


#: The main stack's image, a LUMI AI Factory release in its dated directory (LUMI's AI Guide).
LUMI_AIF_RELEASE = "lumi-multitorch-u24r70f21m50t210-20260415_130625"
LUMI_AIF_SIF = "lumi-multitorch-full-u24r70f21m50t210-20260415_130625.sif"
#: The image of the playbook's easybuild stack (stacks: easybuild), in LUMI's sif-images area.
LUMI_SIF = "lumi-pytorch-rocm-6.2.4-python-3.12-pytorch-v2.7.1-dockerhash-0d479e852886.sif"
#: The image of the playbook's seed stack (stacks: seed), in LUMI's easybuild-sif-images area.
LUMI_SEED_SIF = "lumi-pytorch-rocm-5.6.1-python-3.10-pytorch-v2.2.0-dockerhash-f72ddd8ef883.sif"
LUMI_MODULES = "/opt/cray/pe/lmod/modulefiles/core"


def _lumi(stands: Path) -> None:
    tree = stands / LUMI_MODULES.lstrip("/")
    si.cray_pe(stands, tree, mpich="8.1.29", loads_mpich=True)
    si.plain(tree, {"LUMI/24.03": "the LUMI/24.03 software stack", "partition/G": "LUMI's GPU partition of the stack"})
    si.libfabric(stands, "/opt/cray/libfabric/1.15.2.0")
    si.apptainer(stands)


def _lumi_aif(appl: Path, python: str) -> None:
    """LUMI AI Factory's part of /appl (LUMI's AI Guide, 02-setting-up-environment): a release's image in
    its dated directory under /appl/local/laifs/containers (a stand-in image whose Python is the venv
    /opt/venv, on the image's PATH, and no conda: laifs-container-recipes containerfiles/torch/Venv_Torch)
    and the bindings module in /appl/local/laifs/modules."""
    tree = appl.parent / "lumi-aif-image"
    shutil.rmtree(tree, ignore_errors=True)
    (tree / ".singularity.d/env").mkdir(parents=True)
    (tree / ".singularity.d/env/90-environment.sh").write_text('export PATH="/opt/venv/bin:$PATH"\n')
    image = appl / "local/laifs/containers" / LUMI_AIF_RELEASE / LUMI_AIF_SIF
    si.torch_image(tree, python, image, interpreter="/opt/venv/bin/python", keep=True)
    # what the real module binds that the twin has: Slurm's spool and LUMI's file systems
    binds = ",".join(("/var/spool/slurmd", "/pfs", "/scratch", "/projappl", "/project", "/flash", "/appl"))
    si.module(appl / "local/laifs/modules", "lumi-aif-singularity-bindings",
              f'append_path("SINGULARITY_BIND", "{binds}", ",")\n',
              what="LUMI AI Factory's lumi-aif-singularity-bindings (the binds its images need on LUMI)",
              why="the twin's paths only; the real module's list is LUMI's")


def lumi(root: Path, account: str, python: str) -> Twin:
    """LUMI: LUMI/24.03, partition/G, PrgEnv-gnu (cc/CC, cray-mpich 8.1.29), singularity a system command,
    LUMI AI Factory's image and bindings module under /appl/local/laifs, and the EasyBuild PyTorch SIF in
    the central area (a stand-in image whose conda env has torch, $WITH_CONDA)."""
    stands = si.cached("lumi", _lumi)
    home = f"/users/{USER}"
    fs = _dirs(root, "/appl", "/pfs", "/scratch", "/projappl", "/project", "/flash", "/var/spool/slurmd", home)
    _lumi_aif(fs["/appl"], python)
    image_tree = root / "lumi-image"
    si.lumi_conda(image_tree)
    image = fs["/appl"] / "local/containers/sif-images" / LUMI_SIF
    si.torch_image(image_tree, python, image, interpreter="/opt/miniconda3/envs/pytorch/bin/python", keep=True)
    seed = fs["/appl"] / "local/containers/easybuild-sif-images" / LUMI_SEED_SIF
    seed.parent.mkdir(parents=True, exist_ok=True)
    if not seed.exists():
        os.link(image, seed)   # the same stand-in image (only the Python minor and torch differ: hardware)
    binds = {"/opt/cray": stands / "opt/cray", "/opt/cray/pe/lmod/lmod": Path(si.LMOD),
             "/usr/bin/singularity": stands / "opt/apptainer/bin/singularity", **fs,
             "/usr/lib64/libjansson.so.4": Path("/usr/lib/x86_64-linux-gnu/libjansson.so.4"),
             **container_binds(stands, ["/usr/lib64/libcxi.so.1"])}
    overlay = hardware("lumi")
    return Twin("lumi", account, root, binds, {"MODULEPATH": LUMI_MODULES, "HOME": home}, overlay,
                {"partition": "standard-g,small-g", "node": "RealMemory=524288", "mpi_default": "pmi2",
                 # standard-g allocates whole nodes, small-g shares them (https://docs.lumi-supercomputer.eu/runjobs/scheduled-jobs/partitions/)
                 "partition_options": {"standard-g": "OverSubscribe=EXCLUSIVE"}}, {
        "PrgEnv-gnu, cray-mpich/8.1.29, cc/CC": "Debian's GCC 12 and MPICH 4.0.2, reporting CRAY MPICH 8.1.29",
        "/opt/cray/libfabric/1.15.2.0": "Debian's libfabric 1.17",
        "singularity (/usr/bin/singularity)": "tests/twins/runtime.py (bubblewrap + squashfuse)",
        LUMI_AIF_SIF: "the host's / with /opt/venv/bin/python (Python 3.11, torch 2.13.0 CPU) on the image's PATH",
        "lumi-aif-singularity-bindings": "a module binding the twin's Slurm spool and file systems",
        LUMI_SIF: "the host's / with /opt/miniconda3/envs/pytorch/bin/python (Python 3.11, torch 2.13.0 CPU), "
                  "$WITH_CONDA",
        LUMI_SEED_SIF: f"the same stand-in image as {LUMI_SIF}",
        "libcxi": "a file that says what it stands for",
    }, home)


def make(site: str, root: Path, account: str, python: str | None) -> Twin:
    if site == "frontier":
        return frontier(root, account)
    if site == "cirrus":
        return cirrus(root, account)
    if site == "dawn":
        return dawn(root, account, python)
    assert python
    return lumi(root, account, python)
