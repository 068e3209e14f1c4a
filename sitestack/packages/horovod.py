"""Horovod's package knowledge: its recipe tables, version rules, build environment, --check-build.

Pure functions of the recipe (``sources/horovod.yml``), the site's facts and what was probed on
the host (:class:`Probed`); the probing itself and the hooks are in
:mod:`sitestack.packages.horovod_hooks`. What is decided here:

- which tensor operations run on the GPU (``HOROVOD_GPU_OPERATIONS``): NCCL where the site has
  NVIDIA GPUs with NCCL or AMD GPUs with RCCL, none on CPU sites; asking for operations a site
  cannot provide is refused (the table is ``data.gpu_operations`` in the recipe);
- the CUDA compute capability (``HOROVOD_BUILD_CUDA_CC_LIST``) from ``facts.gpu.arch``, refused
  when the site's CUDA cannot target it (``data.cuda_architectures``: CUDA 13 dropped sm_70);
- the C++ standard of the torch extension from the torch installed in the build interpreter
  (``data.cxx_standard``, raised to what that torch declares);
- the toolkit locations (CUDA, NCCL, ROCm/RCCL), the site's MPI compilers, the libcuda stub
  for login nodes without a GPU driver;
- what ``horovodrun --check-build`` must list (:func:`parse_check_build` reads its output).
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from sitestack.core import schema, versions
from sitestack.core.errors import SitestackError
from sitestack.model.recipe import Check, Recipe
from sitestack.model.site import Facts
from sitestack.packages.shared import braces, replace_recipe


# -- the recipe's tables -----------------------------------------------------------------------
@dataclass(frozen=True)
class CxxRow:
    torch: str = field(metadata={"doc": "range of torch versions"})
    standard: int = field(metadata={"doc": "C++ standard those versions need at least"})
    why: str = field(default="", metadata={"doc": "where that comes from"})

    def check(self) -> str | None:
        if self.standard not in (14, 17, 20, 23):
            return f"standard: 14, 17, 20 or 23, not {self.standard}"
        return versions.check_spec(self.torch) and f"torch: {versions.check_spec(self.torch)}"


@dataclass(frozen=True)
class CudaRow:
    cuda: str = field(metadata={"doc": "range of CUDA toolkit versions"})
    sm: tuple[int, ...] = field(metadata={"doc": "compute capabilities (as 70, 80, 90) those toolkits can target"})
    why: str = field(default="", metadata={"doc": "where that comes from"})

    def check(self) -> str | None:
        return versions.check_spec(self.cuda) and f"cuda: {versions.check_spec(self.cuda)}"


@dataclass(frozen=True)
class OpsRow:
    gpu: str = field(metadata={"doc": "facts.gpu.vendor"})
    collectives: str = field(metadata={"doc": "facts.collectives"})
    why: str = field(default="", metadata={"doc": "what it means"})


@dataclass(frozen=True)
class HorovodData:
    """``data:`` of sources/horovod.yml."""

    cxx_standard: tuple[CxxRow, ...]
    cuda_architectures: tuple[CudaRow, ...]
    gpu_operations: Mapping[str, tuple[OpsRow, ...]]


def horovod_data(recipe: Recipe) -> HorovodData:
    """The recipe's tables, validated (errors name the recipe file, line and key)."""
    return schema.build(HorovodData, dict(recipe.data), recipe.path, line=1, key="data")


# -- version rules (pure: facts only) -------------------------------------------------------------
GPU_NAMES = {"nvidia": "CUDA", "amd": "ROCM"}


def gpu_operations(data: HorovodData, facts: Facts, asked: str | None, site: str) -> str:
    """The HOROVOD_GPU_OPERATIONS value for the site: ``asked`` when the site can provide it,
    else the default (NCCL where the site has it, ``none`` on CPU sites)."""
    def fits(op: str) -> bool:
        return any(r.gpu == facts.gpu.vendor and r.collectives == facts.collectives for r in data.gpu_operations[op])

    if asked is None:
        return "NCCL" if "NCCL" in data.gpu_operations and fits("NCCL") else "none"
    if asked.lower() == "none":
        return "none"
    op = asked.upper()
    if op not in data.gpu_operations:
        raise SitestackError(f"HOROVOD_GPU_OPERATIONS={asked} is not something Horovod 0.28.1 builds "
                             f"(known: {', '.join(sorted(data.gpu_operations))}, none)")
    if not fits(op):
        needs = "; ".join(f"gpu {r.gpu} with collectives {r.collectives} ({r.why})" for r in data.gpu_operations[op])
        raise SitestackError(f"HOROVOD_GPU_OPERATIONS={op} cannot be provided by site {site}: it has gpu "
                             f"{facts.gpu.vendor} and collectives {facts.collectives} (facts.gpu.vendor, facts.collectives); "
                             f"{op} needs {needs}")
    return op


def compute_capability(facts: Facts) -> int:
    """``sm_70`` -> 70."""
    m = re.fullmatch(r"sm_(\d+)[a-z]?", facts.gpu.arch or "")
    if not m:
        raise SitestackError(f"facts.gpu.arch is {facts.gpu.arch!r}: an NVIDIA site needs a CUDA compute capability "
                             "like sm_70 or sm_90 (HOROVOD_BUILD_CUDA_CC_LIST is made from it)")
    return int(m.group(1))


def check_cuda_arch(data: HorovodData, cuda: str, cc: int, gpu: str = "the site's GPU") -> None:
    """Refuse a compute capability the CUDA toolkit ``cuda`` cannot target."""
    rows = [r for r in data.cuda_architectures if versions.matches(r.cuda, cuda)]
    if not rows:
        known = ", ".join(r.cuda for r in data.cuda_architectures)
        raise SitestackError(f"no row for CUDA {cuda} in sources/horovod.yml data.cuda_architectures (rows: {known}): "
                             "add the compute capabilities it targets (`nvcc --list-gpu-arch`) before building")
    if cc not in rows[0].sm:
        can = [r.cuda for r in data.cuda_architectures if cc in r.sm]
        raise SitestackError(
            f"CUDA {cuda} cannot target sm_{cc} ({gpu}): it targets {', '.join(f'sm_{s}' for s in rows[0].sm)} "
            f"({rows[0].why}). Use a CUDA toolkit that can"
            + (f" (CUDA {' or '.join(can)})" if can else "") + " for this site (facts.cuda)")


def cxx_standard(data: HorovodData, torch: str, declared: int | None = None) -> int:
    """The C++ standard for the torch extension: the table's row for ``torch``, raised to what the
    installed torch ``declared`` (TorchConfig.cmake / its headers)."""
    rows = [r for r in data.cxx_standard if versions.matches(r.torch, torch)]
    if not rows:
        known = ", ".join(r.torch for r in data.cxx_standard)
        raise SitestackError(f"torch {torch} is outside what the Horovod patches carried support (torch {known} in "
                             "sources/horovod.yml data.cxx_standard)")
    return max(rows[0].standard, declared or 0)


@dataclass(frozen=True)
class Plan:
    """What is built for a site, from its facts (before anything is probed)."""

    gpu_operations: str                 # NCCL | MPI | none
    gpu: str | None                     # CUDA | ROCM | None
    cuda_cc: int | None = None
    cpu_operations: str | None = None   # HOROVOD_CPU_OPERATIONS (MPI | GLOO | CCL), None: Horovod's default

    def expected_check_build(self) -> dict[str, dict[str, bool]]:
        """What ``horovodrun --check-build`` must show, section by section."""
        return {
            "Available Frameworks": {"TensorFlow": False, "PyTorch": True, "MXNet": False},
            "Available Controllers": {"MPI": True, "Gloo": True},
            "Available Tensor Operations": {"NCCL": self.gpu_operations == "NCCL", "DDL": False, "CCL": False,
                                            "MPI": True, "Gloo": True},
        }


def plan_for(recipe: Recipe, facts: Facts, asked_ops: str | None, site: str, cpu_ops: str | None = None) -> Plan:
    """Check the version rules that need only the facts; say what will be built (``cpu_ops``: the
    step's HOROVOD_CPU_OPERATIONS, kept as given)."""
    data = horovod_data(recipe)
    cxx_standard(data, facts.torch.version)  # torch too old / too new for the patches
    ops = gpu_operations(data, facts, asked_ops, site)
    plan = _plan(facts, ops, site, data)
    return dataclasses.replace(plan, cpu_operations=cpu_ops) if cpu_ops else plan


def _plan(facts: Facts, ops: str, site: str, data: HorovodData) -> Plan:
    if ops == "none":
        return Plan("none", None)
    gpu = GPU_NAMES.get(facts.gpu.vendor)
    if gpu == "CUDA":
        if facts.cuda is None:
            raise SitestackError(f"site {site} has no facts.cuda: HOROVOD_GPU_OPERATIONS={ops} needs the CUDA toolkit")
        cc = compute_capability(facts)
        check_cuda_arch(data, facts.cuda.version, cc, facts.gpu.model or facts.gpu.arch or "the site's GPU")
        return Plan(ops, gpu, cc)
    if gpu == "ROCM" and facts.rocm is None:
        raise SitestackError(f"site {site} has no facts.rocm: HOROVOD_GPU_OPERATIONS={ops} needs ROCm")
    return Plan(ops, gpu)


# -- --check-build -----------------------------------------------------------------------------
def parse_check_build(text: str) -> dict[str, dict[str, bool]]:
    """``horovodrun --check-build`` output -> {section: {name: built}}."""
    out: dict[str, dict[str, bool]] = {}
    section = None
    for line in text.splitlines():
        m = re.match(r"^\s*\[([ X])\]\s+(\S.*)", line.rstrip())  # rstrip: a lazy name before "\s*$" is quadratic
        if m and section is not None:
            out[section][m.group(2)] = m.group(1) == "X"
        elif line.strip().endswith(":") and not line.startswith(" "):
            name = line.strip()[:-1]
            if name.startswith("Available"):
                section = name
                out[section] = {}
    return out


def render_check_build(expected: Mapping[str, Mapping[str, bool]]) -> str:
    """The block ``horovodrun --check-build`` prints for ``expected`` (what the check looks for)."""
    blocks = []
    for section, items in expected.items():
        lines = [f"{section}:"] + [f"    [{'X' if on else ' '}] {name}" for name, on in items.items()]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


# -- the build environment (pure) -------------------------------------------------------------------
@dataclass(frozen=True)
class TorchInfo:
    """The torch of the build interpreter."""

    python: str
    torch: str
    cuda: str | None
    hip: str | None
    declared_cxx: int | None
    missing: tuple[str, ...] = ()
    nccl_wheel: str | None = None
    nccl_libs: tuple[str, ...] = ()


#: What the build environment gets besides torch: setup.py's setup_requires (cloudpickle, psutil,
#: pyyaml, packaging, cffi; fetched from PyPI at build time when missing, which fails offline) and
#: what horovodrun needs.
BUILD_ENV_PACKAGES = ("setuptools", "wheel", "packaging", "psutil", "cloudpickle", "pyyaml", "cffi")


def build_env_dir(cache_root: str, facts: Facts, base_python: str) -> str:
    """The build environment for a site's torch made from ``base_python``: beside the build cache, so
    that every prefix on the host shares it (and the wheel built with it). Another interpreter (a stack's
    conda env rather than facts.python.executable) gets an environment of its own."""
    name = f"{cache_root}/envs/torch-{facts.torch.version}-{facts.torch.variant}-py{facts.python.version}"
    if base_python == facts.python.executable:
        return name
    return f"{name}-{hashlib.sha256(base_python.encode()).hexdigest()[:12]}"


def build_env_marker(facts: Facts) -> str:
    """What a complete build environment records (another torch or package list: it is completed again)."""
    return f"torch {facts.torch.version}\npackages: {' '.join(BUILD_ENV_PACKAGES)}\n"


def build_env_commands(base_python: str, env_dir: str, facts: Facts) -> list[list[str]]:
    """Commands that make the build environment: a venv of the site's Python with the site's torch."""
    pip = [f"{env_dir}/bin/python", "-m", "pip", "install", "--no-cache-dir", "--disable-pip-version-check"]
    make = [["rm", "-rf", "--", env_dir], [base_python, "-m", "venv", env_dir]]
    url, torch = facts.torch.index_url, f"torch=={facts.torch.version}"
    if url and facts.torch.index == "only":
        # torch from that index alone (pip --index-url, as the site's own line), the rest from the default one
        return [*make, pip + ["--index-url", url, torch], pip + list(BUILD_ENV_PACKAGES)]
    return [*make, pip + [*(["--extra-index-url", url] if url else []), torch, *BUILD_ENV_PACKAGES]]


@dataclass(frozen=True)
class Probed:
    """What the build environment is made from, besides the facts."""

    torch: TorchInfo
    env: Mapping[str, str]              # the site environment (modules loaded)
    jobs: int
    cuda_home: str | None = None
    rocm_home: str | None = None
    nccl_home: str | None = None
    nccl_include: str | None = None
    nccl_lib: str | None = None
    cuda_stubs: str | None = None       # a directory with libcuda.so(.1) for hosts without a driver


def build_env(plan: Plan, facts: Facts, data: HorovodData, probed: Probed) -> dict[str, str]:
    """The site-specific build environment of Horovod (added to the recipe's ``env``)."""
    env: dict[str, str] = {
        "HOROVOD_TORCH_CXX_STANDARD": str(cxx_standard(data, probed.torch.torch, probed.torch.declared_cxx)),
        # The compilers of the site MPI: CMake's FindMPI then needs no extra flags (Cray: the CC driver).
        "CC": shlex.split(facts.mpi.cc)[0],
        "CXX": shlex.split(facts.mpi.cxx)[0],
        "MAKEFLAGS": f"-j{probed.jobs}",
        # Not read by the build: recorded so that another torch gives another digest (and wheel).
        "SITESTACK_BUILD_TORCH": probed.torch.torch,
    }
    if plan.cpu_operations:
        # The default operations for CPU tensors (Cirrus sets HOROVOD_CPU_OPERATIONS=MPI:
        # https://github.com/hpc-uk/build-instructions, pyenvs/pytorch); Gloo is built anyway.
        env["HOROVOD_CPU_OPERATIONS"] = plan.cpu_operations
    if facts.mpi.flavour == "cray-mpich":
        # Read by Horovod's old setup.py builds (< 0.20), not by 0.28.1's CMake, where CXX=CC does it;
        # kept because site recipes (LUMI) set it and it documents the wrapper.
        env["HOROVOD_MPICXX_SHOW"] = f"{shlex.split(facts.mpi.cxx)[0]} --cray-print-opts=all"
    if plan.gpu_operations == "none":
        return env
    env["HOROVOD_GPU"] = plan.gpu or "CUDA"
    env["HOROVOD_GPU_OPERATIONS"] = plan.gpu_operations
    if plan.gpu == "CUDA":
        assert probed.cuda_home
        env.update({
            "HOROVOD_CUDA_HOME": probed.cuda_home,
            "CUDA_HOME": probed.cuda_home,
            # CMake's FindCUDAToolkit looks next to the nvcc on PATH first; a wrapper there (as on
            # this development machine) hides the toolkit.
            "CUDAToolkit_ROOT": probed.cuda_home,
            "HOROVOD_BUILD_CUDA_CC_LIST": str(plan.cuda_cc),
            "PATH": f"{probed.cuda_home}/bin:{probed.env.get('PATH', '/usr/bin:/bin')}",
        })
        if probed.nccl_home:
            env.update({"HOROVOD_NCCL_HOME": probed.nccl_home, "HOROVOD_NCCL_INCLUDE": probed.nccl_include or "",
                        "HOROVOD_NCCL_LIB": probed.nccl_lib or "", "HOROVOD_NCCL_LINK": "SHARED"})
        if probed.cuda_stubs:
            for var in ("LIBRARY_PATH", "LD_LIBRARY_PATH"):
                env[var] = ":".join(p for p in (probed.cuda_stubs, probed.env.get(var, "")) if p)
    elif plan.gpu == "ROCM":
        assert probed.rocm_home
        env.update({
            "HOROVOD_ROCM_HOME": probed.rocm_home,
            # Read by site recipes (LUMI); 0.28.1 finds RCCL through find_package(rccl) under the ROCm home.
            "HOROVOD_RCCL_HOME": probed.rocm_home,
            "HCC_AMDGPU_TARGET": facts.gpu.arch or "",
        })
    return env


def with_site(recipe: Recipe, env: Mapping[str, str], checks: Sequence[Check]) -> Recipe:
    """``recipe`` with ``env`` added to its build environment and ``checks`` run first."""
    return replace_recipe(recipe, env={**recipe.env, **{k: braces(v) for k, v in env.items()}},
                          checks=(*checks, *recipe.checks))


def check_build_check(plan: Plan) -> Check:
    """``horovodrun --check-build`` must print exactly the expected block."""
    return Check(name="horovodrun --check-build", run=("{install}/bin/horovodrun", "--check-build"),
                 expect=braces(render_check_build(plan.expected_check_build())),
                 env={"PYTHONPATH": "{install}"})


def link_dir(cache_root: str, kind: str, target: str) -> str:
    """A private directory of symlinks (libnccl.so, libcuda.so.1) for one target, beside the build cache."""
    return f"{cache_root}/links/{kind}-{hashlib.sha256(target.encode()).hexdigest()[:12]}"
