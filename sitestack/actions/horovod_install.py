"""Horovod from source for a site: its HOROVOD_* configuration, its version rules, --check-build.

The ``horovod-install`` action (and ``invoke build-horovod``) is a recipe install of
``sources/horovod.yml`` (fetch, patches, ``pip wheel --no-build-isolation``, wheel cached by
digest, atomic stamped install) whose build environment and checks come from the site:

- which tensor operations run on the GPU (``HOROVOD_GPU_OPERATIONS``): NCCL where the site has
  NVIDIA GPUs with NCCL or AMD GPUs with RCCL, none on CPU sites; asking for operations a site
  cannot provide is refused (the table is ``data.gpu_operations`` in the recipe);
- the CUDA compute capability (``HOROVOD_BUILD_CUDA_CC_LIST``) from ``facts.gpu.arch``, refused
  when the site's CUDA cannot target it (``data.cuda_architectures``: CUDA 13 dropped sm_70);
- the C++ standard of the torch extension from the torch installed in the build interpreter
  (``data.cxx_standard``, raised to what that torch declares);
- the toolkit locations (CUDA, NCCL, ROCm/RCCL), the site's MPI compilers, the libcuda stub
  for login nodes without a GPU driver.

Everything that needs the host (the torch in the interpreter, ``$VARIABLES`` in paths set by
site modules, the NCCL of a pip wheel) is probed read-only in ``pending``; the digest of the
install covers the resulting environment, so a different torch or toolkit rebuilds.

After the install, ``horovodrun --check-build`` must list exactly the frameworks, controllers
and tensor operations asked for; :func:`parse_check_build` reads that output.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sitestack.actions.recipe_install import RecipeInstall
from sitestack.core import schema, versions
from sitestack.core.errors import SitestackError
from sitestack.core.host import Host
from sitestack.model.context import RunContext
from sitestack.model.recipe import Check, Recipe
from sitestack.model.site import Facts
from sitestack.model.siteenv import in_site_env, probe_in_site_env


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

    def expected_check_build(self) -> dict[str, dict[str, bool]]:
        """What ``horovodrun --check-build`` must show, section by section."""
        return {
            "Available Frameworks": {"TensorFlow": False, "PyTorch": True, "MXNet": False},
            "Available Controllers": {"MPI": True, "Gloo": True},
            "Available Tensor Operations": {"NCCL": self.gpu_operations == "NCCL", "DDL": False, "CCL": False,
                                            "MPI": True, "Gloo": True},
        }


def plan_for(recipe: Recipe, facts: Facts, asked_ops: str | None, site: str) -> Plan:
    """Check the version rules that need only the facts; say what will be built."""
    data = horovod_data(recipe)
    cxx_standard(data, facts.torch.version)  # torch too old / too new for the patches
    ops = gpu_operations(data, facts, asked_ops, site)
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
        m = re.match(r"^\s*\[([ X])\]\s+(\S.*?)\s*$", line)
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


# -- what the host provides (probed) ---------------------------------------------------------------
TORCH_PROBE = r"""
import glob, importlib.util, json, os, re, sys
out = {"python": sys.executable, "version": "%d.%d.%d" % sys.version_info[:3]}
# Read torch/version.py instead of importing torch: the import takes seconds, and this probe runs
# on every (no-op) provision.
spec = importlib.util.find_spec("torch")
if spec is None or not spec.origin or not os.path.exists(os.path.join(os.path.dirname(spec.origin), "version.py")):
    out["error"] = "ModuleNotFoundError: No module named 'torch'"
    print(json.dumps(out)); sys.exit(0)
root = os.path.dirname(spec.origin)
info = {}
exec(compile(open(os.path.join(root, "version.py")).read(), "torch/version.py", "exec"), info)
out.update(torch=info["__version__"], cuda=info.get("cuda"), hip=info.get("hip"), root=root)
declared = []
for cfg in glob.glob(os.path.join(root, "share", "cmake", "Torch", "TorchConfig.cmake")):
    declared += [int(x) for x in re.findall(r"CXX_STANDARD\s+(\d+)", open(cfg).read())]
for hdr in ("include/torch/csrc/api/include/torch/all.h", "include/ATen/ATen.h", "include/c10/macros/Macros.h"):
    path = os.path.join(root, hdr)
    if os.path.exists(path):
        declared += [int(x) for x in re.findall(r"#\s*error\s+C\+\+(\d+) or later", open(path).read())]
out["declared_cxx"] = max(declared) if declared else None
out["missing"] = [m for m in ("setuptools", "wheel", "packaging", "psutil", "cloudpickle", "yaml", "cffi")
                  if importlib.util.find_spec(m) is None]
nccl = None
for base in sys.path:
    for sub in ("nvidia/nccl", "nvidia/cu13", "nvidia/cu12"):
        d = os.path.join(base, sub)
        if os.path.exists(os.path.join(d, "include", "nccl.h")):
            nccl = d
            break
    if nccl:
        break
out["nccl_wheel"] = nccl
if nccl:
    out["nccl_libs"] = sorted(os.path.basename(p) for p in glob.glob(os.path.join(nccl, "lib", "libnccl.so*")))
print(json.dumps(out))
"""


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


def probe_torch(host: Host, facts: Facts, python: str) -> TorchInfo:
    """What ``python`` (run with the site's modules loaded) has: torch, its CUDA/HIP, its C++ standard."""
    info, problem = try_probe_torch(host, facts, python)
    if info is None:
        raise SitestackError(problem)
    return info


def try_probe_torch(host: Host, facts: Facts, python: str) -> tuple[TorchInfo | None, str]:
    """:func:`probe_torch`, or (None, why not)."""
    out = probe_in_site_env(host, facts, [python, "-c", TORCH_PROBE])
    if out.rc != 0:
        return None, (f"cannot run {python} on {host.name} (with the site modules loaded): "
                      f"{(out.stderr or out.stdout).strip()[-400:]}")
    try:
        info = json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None, f"cannot read what {python} reports about torch: {out.stdout.strip()[-300:]}"
    if "error" in info:
        return None, f"torch is not importable by {python} on {host.name} ({info['error']})"
    return TorchInfo(info["python"], info["torch"], info.get("cuda"), info.get("hip"), info.get("declared_cxx"),
                     tuple(info.get("missing") or ()), info.get("nccl_wheel"), tuple(info.get("nccl_libs") or ())), ""


#: What the build environment gets besides torch: setup.py's setup_requires (cloudpickle, psutil,
#: pyyaml, packaging, cffi; fetched from PyPI at build time when missing, which fails offline) and
#: what horovodrun needs.
BUILD_ENV_PACKAGES = ("setuptools", "wheel", "packaging", "psutil", "cloudpickle", "pyyaml", "cffi")


def build_env_dir(cache_root: str, facts: Facts) -> str:
    """The build environment for a site's torch: beside the build cache, so that every prefix on the
    host shares it (and the wheel built with it)."""
    return f"{cache_root}/envs/torch-{facts.torch.version}-{facts.torch.variant}-py{facts.python.version}"


def build_env_marker(facts: Facts) -> str:
    """What a complete build environment records (another torch or package list: it is completed again)."""
    return f"torch {facts.torch.version}\npackages: {' '.join(BUILD_ENV_PACKAGES)}\n"


def build_env_commands(base_python: str, env_dir: str, facts: Facts) -> list[list[str]]:
    """Commands that make the build environment: a venv of the site's Python with the site's torch."""
    index = ["--extra-index-url", facts.torch.index_url] if facts.torch.index_url else []
    pip = [f"{env_dir}/bin/python", "-m", "pip", "install", "--no-cache-dir", "--disable-pip-version-check"]
    return [["rm", "-rf", "--", env_dir],
            [base_python, "-m", "venv", env_dir],
            pip + [*index, f"torch=={facts.torch.version}", *BUILD_ENV_PACKAGES]]


ENV_REF = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


def site_environment(host: Host, facts: Facts) -> dict[str, str]:
    """The environment with the site's modules loaded (for ``$VARIABLES`` in facts and paths)."""
    out = probe_in_site_env(host, facts, ["env", "-0"])
    if out.rc != 0:
        raise SitestackError(f"cannot read the site environment on {host.name}: {out.stderr.strip()}")
    env = {}
    for item in out.stdout.split("\0"):
        if "=" in item:
            key, value = item.split("=", 1)
            env[key] = value
    return env


def resolve_refs(text: str, env: Mapping[str, str], what: str) -> str:
    """``$NAME`` / ``${NAME}`` in ``text`` from ``env``; an unset variable is an error."""
    def one(m: re.Match) -> str:
        name = m.group(1) or m.group(2)
        if name not in env:
            raise SitestackError(f"{what} is {text!r}, but ${name} is not set with the site's modules loaded")
        return env[name]
    return ENV_REF.sub(one, text)


# -- the build environment (pure) -------------------------------------------------------------------
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
            # this development machine) hides the toolkit (build_facts s5).
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


def _braces(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


def with_site(recipe: Recipe, env: Mapping[str, str], checks: Sequence[Check]) -> Recipe:
    """``recipe`` with ``env`` added to its build environment and ``checks`` run first."""
    new = dataclasses.replace(recipe, env={**recipe.env, **{k: _braces(v) for k, v in env.items()}},
                              checks=(*checks, *recipe.checks))
    object.__setattr__(new, "path", recipe.path)
    object.__setattr__(new, "patch_dir", recipe.patch_dir)
    return new


def check_build_check(plan: Plan) -> Check:
    """``horovodrun --check-build`` must print exactly the expected block."""
    return Check(name="horovodrun --check-build", run=("{install}/bin/horovodrun", "--check-build"),
                 expect=_braces(render_check_build(plan.expected_check_build())),
                 env={"PYTHONPATH": "{install}"})


def link_dir(cache_root: str, kind: str, target: str) -> str:
    """A private directory of symlinks (libnccl.so, libcuda.so.1) for one target, beside the build cache."""
    return f"{cache_root}/links/{kind}-{hashlib.sha256(target.encode()).hexdigest()[:12]}"


# -- the action -----------------------------------------------------------------------------------
class NeedsBuildEnv(Exception):
    """The build environment with the site's torch does not exist yet (pending's reason)."""


class HorovodInstall(RecipeInstall):
    """Horovod built from its sdist for the site (NCCL/RCCL/CPU from the facts), checked with --check-build."""

    action = "horovod-install"

    @dataclass(frozen=True)
    class Args:
        version: str | None = field(default=None, metadata={"doc": "Horovod version (default: the recipe's default_version)"})
        python: str | None = field(default=None, metadata={"doc": (
            "interpreter with the stack's torch that builds and runs Horovod (default: facts.python.executable; "
            "`invoke build-horovod --python` overrides)")})
        gpu_operations: str | None = field(default=None, metadata={"doc": (
            "HOROVOD_GPU_OPERATIONS: NCCL, MPI or none (default: NCCL where the site has NCCL/RCCL, else none)")})
        nccl_home: str | None = field(default=None, metadata={"doc": (
            "NCCL with include/nccl.h and lib/ (CUDA sites; may use $VARIABLES set by the site modules; "
            "default: the nvidia-nccl wheel of the interpreter)")})
        dest: str | None = field(default=None, metadata={"doc": "install prefix (default: {prefix}/horovod/<version>)"})
        mirror: str | None = field(default=None, metadata={"doc": "controller directory with source tarballs (air-gapped sites)"})
        recipe: str = field(default="horovod", metadata={"doc": "recipe name (sources/<recipe>.yml)"})

    def __init__(self, spec: Any, args: Any, ctx: RunContext) -> None:
        options = ctx.options
        python = options.python or args.python
        self.given_python = python
        base = RecipeInstall.Args(recipe=args.recipe, version=args.version, dest=args.dest, python=python,
                                  mirror=args.mirror)
        super().__init__(spec, base, ctx)
        self.hvd_args = args
        self.data = horovod_data(self.recipe)
        self.plan = plan_for(self.recipe, ctx.facts, options.gpu_operations or args.gpu_operations,
                             ctx.site.name)
        self.base_recipe = self.recipe
        self._prepared = False
        self._links: list[tuple[str, str]] = []   # (link path, target) to make before building
        self.env_dir: str | None = None
        self.make_env = False

    def describe(self) -> str:
        ops = "CPU (MPI + Gloo)" if self.plan.gpu_operations == "none" else f"{self.plan.gpu_operations} on {self.plan.gpu}"
        return f"build and install {self.target.label} ({ops}) into {self.target.dest}"

    # -- Step --------------------------------------------------------------------------------------
    def pending(self, host: Host) -> str | None:
        try:
            self.prepare(host)
        except NeedsBuildEnv as exc:
            return str(exc)
        return super().pending(host)

    def apply(self, host: Host) -> None:
        try:
            self.prepare(host)
        except NeedsBuildEnv:
            self.make_build_env(host)
            self.prepare(host)
        for link, target in self._links:
            host.run(["mkdir", "-p", link.rsplit("/", 1)[0]])
            host.run(["ln", "-sfn", target, link])
        super().apply(host)

    # -- the site's part ------------------------------------------------------------------------------
    def prepare(self, host: Host) -> None:
        """Probe the host and put the site's build environment and checks into the target."""
        if self._prepared:
            return
        facts = self.ctx.facts
        torch = self.choose_python(host)
        t = self.target
        self.check_torch(torch)
        env = site_environment(host, facts)
        jobs = int(self.options.jobs or facts.build_jobs or _nproc(host))
        probed = Probed(torch=torch, env=env, jobs=jobs)
        links: list[tuple[str, str]] = []
        if self.plan.gpu == "CUDA":
            probed, links = self.cuda_parts(host, probed)
        elif self.plan.gpu == "ROCM":
            home = resolve_refs(facts.rocm.home, env, "facts.rocm.home")
            if not host.exists(f"{home}/include/hip/hip_runtime.h"):
                raise SitestackError(f"no HIP in {home} (facts.rocm.home): include/hip/hip_runtime.h is missing")
            probed = dataclasses.replace(probed, rocm_home=home)
        build = build_env(self.plan, facts, self.data, probed)
        recipe = with_site(self.base_recipe, build, [check_build_check(self.plan)])
        self.recipe = recipe
        self.target = dataclasses.replace(t, recipe=recipe)
        self._links = links
        self._prepared = True

    def make_build_env(self, host: Host) -> None:
        """A venv of the site's Python with the site's torch and what building Horovod needs."""
        from pathlib import Path

        facts, env_dir = self.ctx.facts, self.env_dir
        log = Path(self.ctx.log_dir or Path.home() / ".cache" / "sitestack" / "logs") / "horovod-build-env.log"
        self.report(f"    [{host.name}] {self.target.label}: making the build environment {env_dir} "
                    f"(torch {facts.torch.version}; log: {log})")
        host.run(["mkdir", "-p", env_dir.rsplit("/", 1)[0]])
        with host.lock(f"{env_dir}.lock", wait=self.options.install_lock_wait):
            if host.read_text(f"{env_dir}/.sitestack-ready") != build_env_marker(facts):
                commands = build_env_commands(facts.python.executable, env_dir, facts)
                if host.exists(f"{env_dir}/bin/python"):
                    commands = commands[-1:]   # there already: complete it (pip install is idempotent)
                for argv in commands:
                    host.run(in_site_env(facts, argv), log=log)
                host.write_text(f"{env_dir}/.sitestack-ready", build_env_marker(facts))
        self.make_env = False
        self._prepared = False

    def cache_root(self, host: Host) -> str:
        return self.options.build_cache or f"{host.home()}/.cache/sitestack/builds"

    def choose_python(self, host: Host) -> TorchInfo:
        """The interpreter that builds Horovod: the one given (it must have the site's torch), else
        facts.python.executable when it has that torch, else a build environment made for it."""
        facts = self.ctx.facts
        if self.given_python:
            info, problem = try_probe_torch(host, facts, self.given_python)
            if info is None:
                raise SitestackError(f"{problem}; Horovod builds against the stack's torch: give an interpreter "
                                     "that has it (the step's python, `invoke build-horovod --python`), or none "
                                     "and sitestack makes a build environment with the site's torch")
            return info
        base = facts.python.executable
        info, _ = try_probe_torch(host, facts, base)
        if info is not None and versions.parse(info.torch) == versions.parse(facts.torch.version) and not info.missing:
            return info
        self.env_dir = build_env_dir(self.cache_root(host), facts)
        python = f"{self.env_dir}/bin/python"
        self.target = dataclasses.replace(self.target, python=python)
        ready = host.read_text(f"{self.env_dir}/.sitestack-ready") == build_env_marker(facts)
        info, _ = try_probe_torch(host, facts, python) if ready else (None, "")
        if info is None:
            self.make_env = True
            raise NeedsBuildEnv(f"no build environment with torch {facts.torch.version} at {self.env_dir} ({base} "
                                "does not have that torch): it is made first, then Horovod is built with it")
        return info

    def check_torch(self, torch: TorchInfo) -> None:
        facts, site = self.ctx.facts, self.ctx.site.name
        if versions.parse(torch.torch) != versions.parse(facts.torch.version):
            raise SitestackError(f"{torch.python} has torch {torch.torch}, but site {site} is on torch "
                                 f"{facts.torch.version} (facts.torch.version): build Horovod with the stack's interpreter")
        for rule in self.recipe.rules:
            if rule.requires.torch and versions.matches(rule.versions, self.version) \
                    and not versions.matches(rule.requires.torch, torch.torch):
                raise SitestackError(f"{self.target.label} needs torch {rule.requires.torch}; {torch.python} has "
                                     f"{torch.torch} ({rule.why})")
        if torch.missing:
            raise SitestackError(f"{torch.python} lacks {', '.join(torch.missing)}, which building and running Horovod "
                                 f"need (`{torch.python} -m pip install {' '.join(m if m != 'yaml' else 'pyyaml' for m in torch.missing)}`)")
        if self.plan.gpu == "CUDA" and not torch.cuda:
            raise SitestackError(f"torch {torch.torch} of {torch.python} has no CUDA, but the build asks for "
                                 f"HOROVOD_GPU_OPERATIONS={self.plan.gpu_operations} with CUDA")
        if self.plan.gpu == "CUDA" and facts.cuda and torch.cuda \
                and versions.parse(torch.cuda)[0] != versions.parse(facts.cuda.version)[0]:
            raise SitestackError(f"torch {torch.torch} is built for CUDA {torch.cuda}, the site's toolkit is CUDA "
                                 f"{facts.cuda.version} (facts.cuda.version): the major versions must match")
        if self.plan.gpu == "ROCM" and not torch.hip:
            raise SitestackError(f"torch {torch.torch} of {torch.python} is not a ROCm build, but the build asks for "
                                 f"HOROVOD_GPU_OPERATIONS={self.plan.gpu_operations} with ROCm")

    def cuda_parts(self, host: Host, probed: Probed) -> tuple[Probed, list[tuple[str, str]]]:
        facts, links_root = self.ctx.facts, self.cache_root(host)
        env = probed.env
        home = resolve_refs(facts.cuda.home, env, "facts.cuda.home")
        if not host.exists(f"{home}/bin/nvcc"):
            raise SitestackError(f"no CUDA toolkit in {home} (facts.cuda.home): bin/nvcc is missing")
        links: list[tuple[str, str]] = []
        # NCCL: the step's nccl_home, else the nvidia-nccl wheel the interpreter's torch uses.
        if self.hvd_args.nccl_home:
            nccl = resolve_refs(self.hvd_args.nccl_home, env, "nccl_home")
            listing = host.probe(["bash", "-c", 'cd "$1/lib" 2>/dev/null && ls -1 libnccl.so* 2>/dev/null', "sitestack", nccl])
            libs = tuple(listing.stdout.split())
        elif probed.torch.nccl_wheel:
            nccl, libs = probed.torch.nccl_wheel, probed.torch.nccl_libs
        else:
            raise SitestackError(f"no NCCL for the build: {probed.torch.python} has no nvidia-nccl wheel; give the "
                                 "step's nccl_home (e.g. $NVHPC_ROOT/comm_libs/nccl)")
        if not host.exists(f"{nccl}/include/nccl.h"):
            raise SitestackError(f"no include/nccl.h in {nccl} (the NCCL to build Horovod against)")
        if "libnccl.so" in libs:
            lib = f"{nccl}/lib"
        elif any(n.startswith("libnccl.so.") for n in libs):
            # pip's NCCL wheels ship only libnccl.so.2, which CMake's find_library(nccl) misses.
            real = sorted(n for n in libs if n.startswith("libnccl.so."))[0]
            lib = link_dir(links_root, "nccl", f"{nccl}/lib")
            links.append((f"{lib}/libnccl.so", f"{nccl}/lib/{real}"))
        else:
            raise SitestackError(f"no libnccl.so in {nccl}/lib")
        # Login nodes have no GPU driver. Horovod links the CUDA runtime, not the driver, but libraries
        # it links (NVHPC's, seed 004) may need libcuda.so.1: offer the toolkit's stub under both names.
        stubs = None
        driver = host.probe(["bash", "-c", "ldconfig -p 2>/dev/null | grep -q 'libcuda.so.1 '"])
        stub = f"{home}/lib64/stubs/libcuda.so"
        if not driver.ok and host.exists(stub):
            stubs = link_dir(links_root, "cuda-stubs", stub)
            links += [(f"{stubs}/libcuda.so", stub), (f"{stubs}/libcuda.so.1", stub)]
        return dataclasses.replace(probed, cuda_home=home, nccl_home=nccl, nccl_include=f"{nccl}/include", nccl_lib=lib,
                                   cuda_stubs=stubs), links


def _nproc(host: Host) -> int:
    out = host.probe(["nproc"])
    return int(out.stdout.strip()) if out.ok and out.stdout.strip().isdigit() else 1
