"""Horovod's hooks: the host-side part of its install (the torch of the build interpreter, the
toolkits, a build environment with the site's torch where the site's Python lacks it).

Everything that needs the host (the torch in the interpreter, ``$VARIABLES`` in paths set by
site modules, the NCCL of a pip wheel) is probed read-only in :meth:`HorovodHooks.prepare`; the
digest of the install covers the resulting environment, so a different torch or toolkit rebuilds.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sitestack.core import versions
from sitestack.core.cores import CORES_SH
from sitestack.core.errors import SitestackError
from sitestack.core.host import Completed, Host
from sitestack.core.pip_auth import configured_for, pip_auth
from sitestack.core.shipped import single_file
from sitestack.model.context import RunContext
from sitestack.model.recipe import Recipe
from sitestack.model.site import Facts
from sitestack.model.siteenv import in_site_env, probe_in_site_env
from sitestack.packages.hooks import InstallInfo, NotReady, PackageHooks, Prepared
from sitestack.packages.horovod import (
    Probed,
    TorchInfo,
    build_env,
    build_env_commands,
    build_env_dir,
    build_env_marker,
    check_build_check,
    horovod_data,
    link_dir,
    plan_for,
    with_site,
)
from sitestack.packages.package_args import HorovodArgs
from sitestack.packages.shared import resolve_refs, site_environment

#: Run by the build interpreter (its text is passed with ``python -c``).


def try_probe_torch(host: Host, facts: Facts, python: str) -> tuple[TorchInfo | None, str]:
    """What ``python`` (run with the site's modules loaded) has: torch, its CUDA/HIP, its C++ standard;
    or (None, why not)."""
    out = probe_in_site_env(host, facts, [python, "-c", single_file("torch_probe")], vouchers=_torch_vouchers)
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


def _torch_vouchers(out: Completed) -> list[str] | None:
    """The files the torch probe's answer depends on (it lists them); None: not an answer to keep.
    "No torch" is kept too: installing torch changes a ``sys.path`` directory it vouches with."""
    try:
        info = json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None
    vouch = info.get("vouch") if isinstance(info, dict) else None
    return [str(v) for v in vouch] if isinstance(vouch, list) else None


def nproc(host: Host) -> int:
    """The cores the build may use (:mod:`sitestack.core.cores`: nproc, capped by a Slurm job's)."""
    out = host.probe(["sh", "-c", CORES_SH])
    return int(out.stdout.strip()) if out.ok and out.stdout.strip().isdigit() else 1


class HorovodHooks(PackageHooks):
    """Horovod built from its sdist for the site (NCCL/RCCL/CPU from the facts), checked with --check-build."""

    Args = HorovodArgs

    @classmethod
    def site_problem(cls, facts: Facts, python: str | None, package: Mapping[str, Any] | None = None) -> str | None:
        """Where the site's torch is inside its image (``python.source: container``), its interpreter
        (facts.python.executable) is not on the host: a host build without a ``python:`` of its own
        would run a path that exists only in the image. Horovod for such a stack must be built inside
        the image, against the image's ROCm or CUDA and Python, which sitestack does not do."""
        if facts.python.source == "container" and not python:
            return (f"builds Horovod on the host, but the site's torch is inside its container image "
                    f"(facts.python.source: container; {facts.python.executable} is the image's interpreter): "
                    "Horovod must be built inside the image against its ROCm and Python, which sitestack does "
                    "not do; remove the step, or give python: a host interpreter with the site's torch")
        return None

    def __init__(self, ctx: RunContext, recipe: Recipe, args: Any) -> None:
        super().__init__(ctx, recipe, args)
        self.data = horovod_data(recipe)
        self.plan = plan_for(recipe, ctx.facts, args.gpu_operations, ctx.site.name, cpu_ops=args.cpu_operations)
        # build-horovod --python, else the step's python:
        self.given_python: str | None = ctx.options.python or args.python
        self.links: list[tuple[str, str]] = []   # (link path, target) to make before building
        self.env_dir: str | None = None
        self.base_python = ctx.facts.python.executable   # what a build environment is made from (choose_python)

    def install_args(self) -> Mapping[str, str | None]:
        return {"python": self.given_python}

    def describe(self, info: InstallInfo) -> str:
        plan = self.plan
        ops = "CPU (MPI + Gloo)" if plan.gpu_operations == "none" else f"{plan.gpu_operations} on {plan.gpu}"
        return f"build and install {info.label} ({ops}) into {info.dest}"

    def prepare(self, host: Host, info: InstallInfo) -> Prepared:
        """Probe the host; the recipe with the site's build environment and --check-build."""
        facts = self.ctx.facts
        python, torch = self.choose_python(host, info)
        self.check_torch(torch, info)
        env = site_environment(host, facts)
        jobs = int(self.ctx.options.jobs or facts.build_jobs or nproc(host))
        probed = Probed(torch=torch, env=env, jobs=jobs)
        self.links = []
        if self.plan.gpu == "CUDA":
            probed = self.cuda_parts(host, probed, info.cache_root)
        elif self.plan.gpu == "ROCM":
            assert facts.rocm is not None   # plan_for refused a ROCm plan without facts.rocm
            home = resolve_refs(facts.rocm.home, env, "facts.rocm.home")
            if not host.exists(f"{home}/include/hip/hip_runtime.h"):
                raise SitestackError(f"no HIP in {home} (facts.rocm.home): include/hip/hip_runtime.h is missing")
            probed = dataclasses.replace(probed, rocm_home=home)
        build = build_env(self.plan, facts, self.data, probed)
        return Prepared(with_site(self.recipe, build, [check_build_check(self.plan)]), python)

    def setup(self, host: Host, info: InstallInfo) -> None:
        """A venv of the install's interpreter with the site's torch and what building Horovod needs."""
        facts, env_dir = self.ctx.facts, self.env_dir
        assert env_dir is not None   # NotReady is raised only once env_dir is chosen
        log = Path(self.ctx.log_dir or Path.home() / ".cache" / "sitestack" / "logs") / "horovod-build-env.log"
        self.ctx.note(f"    [{host.name}] {info.label}: making the build environment {env_dir} "
                      f"(torch {facts.torch.version}; log: {log})")
        host.run(["mkdir", "-p", env_dir.rsplit("/", 1)[0]])
        with host.lock(f"{env_dir}.lock", wait=self.ctx.options.install_lock_wait):
            if host.read_text(f"{env_dir}/.sitestack-ready") != build_env_marker(facts):
                commands = build_env_commands(self.base_python, env_dir, facts)
                if host.exists(f"{env_dir}/bin/python"):
                    commands = commands[-1:]   # there already: complete it (pip install is idempotent)
                for argv in commands:
                    # facts.torch.index_url's credentials by environment, not on the command line
                    auth = pip_auth(argv, (), lambda: configured_for(host, in_site_env(facts, [f"{env_dir}/bin/python"])))
                    host.run(in_site_env(facts, auth.options), log=log, secrets=auth.env)
                host.write_text(f"{env_dir}/.sitestack-ready", build_env_marker(facts))

    def before_install(self, host: Host) -> None:
        for link, target in self.links:
            host.run(["mkdir", "-p", link.rsplit("/", 1)[0]])
            host.run(["ln", "-sfn", target, link])

    # -- the parts of prepare --------------------------------------------------------------------------
    def choose_python(self, host: Host, info: InstallInfo) -> tuple[str, TorchInfo]:
        """The interpreter that builds Horovod: the one given (it must have the site's torch), else the
        install's (``info.python``) when it has that torch and the build's packages, else a build
        environment made from it with that torch."""
        facts = self.ctx.facts
        if self.given_python:
            info_, problem = try_probe_torch(host, facts, self.given_python)
            if info_ is None:
                raise SitestackError(f"{problem}; Horovod builds against the stack's torch: give an interpreter "
                                     "that has it (the step's python, `invoke build-horovod --python`), or none "
                                     "and sitestack makes a build environment with the site's torch")
            return self.given_python, info_
        # The install's interpreter: the stack env's where Horovod is built for a conda env, else the site's
        # Python (installs/site_stack.py:stack_interpreter); a build environment is a venv of that interpreter.
        base = self.base_python = info.python
        torch, _ = try_probe_torch(host, facts, base)
        if torch is not None and versions.parse(torch.torch) == versions.parse(facts.torch.version) \
                and not torch.missing:
            return base, torch
        self.env_dir = build_env_dir(info.cache_root, facts, base)
        python = f"{self.env_dir}/bin/python"
        ready = host.read_text(f"{self.env_dir}/.sitestack-ready") == build_env_marker(facts)
        torch, _ = try_probe_torch(host, facts, python) if ready else (None, "")
        if torch is None:
            raise NotReady(f"no build environment with torch {facts.torch.version} at {self.env_dir} ({base} "
                           "does not have that torch): it is made first, then Horovod is built with it")
        return python, torch

    def check_torch(self, torch: TorchInfo, info: InstallInfo) -> None:
        facts, site, plan = self.ctx.facts, self.ctx.site.name, self.plan
        if versions.parse(torch.torch) != versions.parse(facts.torch.version):
            raise SitestackError(f"{torch.python} has torch {torch.torch}, but site {site} is on torch "
                                 f"{facts.torch.version} (facts.torch.version): build Horovod with the stack's interpreter")
        for rule in self.recipe.rules:
            if rule.requires.torch and versions.matches(rule.versions, info.version) \
                    and not versions.matches(rule.requires.torch, torch.torch):
                raise SitestackError(f"{info.label} needs torch {rule.requires.torch}; {torch.python} has "
                                     f"{torch.torch} ({rule.why})")
        if torch.missing:
            names = " ".join(m if m != "yaml" else "pyyaml" for m in torch.missing)
            raise SitestackError(f"{torch.python} lacks {', '.join(torch.missing)}, which building and running Horovod "
                                 f"need (`{torch.python} -m pip install {names}`)")
        if plan.gpu == "CUDA" and not torch.cuda:
            raise SitestackError(f"torch {torch.torch} of {torch.python} has no CUDA, but the build asks for "
                                 f"HOROVOD_GPU_OPERATIONS={plan.gpu_operations} with CUDA")
        if plan.gpu == "CUDA" and facts.cuda and torch.cuda \
                and versions.parse(torch.cuda)[0] != versions.parse(facts.cuda.version)[0]:
            raise SitestackError(f"torch {torch.torch} is built for CUDA {torch.cuda}, the site's toolkit is CUDA "
                                 f"{facts.cuda.version} (facts.cuda.version): the major versions must match")
        if plan.gpu == "ROCM" and not torch.hip:
            raise SitestackError(f"torch {torch.torch} of {torch.python} is not a ROCm build, but the build asks for "
                                 f"HOROVOD_GPU_OPERATIONS={plan.gpu_operations} with ROCm")

    def cuda_parts(self, host: Host, probed: Probed, links_root: str) -> Probed:
        """The CUDA toolkit, the NCCL (and the links it and the libcuda stub need) for the build."""
        facts, env = self.ctx.facts, probed.env
        assert facts.cuda is not None   # plan_for refused a CUDA plan without facts.cuda
        home = resolve_refs(facts.cuda.home, env, "facts.cuda.home")
        if not host.exists(f"{home}/bin/nvcc"):
            raise SitestackError(f"no CUDA toolkit in {home} (facts.cuda.home): bin/nvcc is missing")
        # NCCL: the step's nccl_home, else the nvidia-nccl wheel the interpreter's torch uses.
        nccl_home = getattr(self.args, "nccl_home", None)
        if nccl_home:
            nccl = resolve_refs(nccl_home, env, "nccl_home")
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
            self.links.append((f"{lib}/libnccl.so", f"{nccl}/lib/{real}"))
        else:
            raise SitestackError(f"no libnccl.so in {nccl}/lib")
        # Login nodes have no GPU driver. Horovod links the CUDA runtime, not the driver, but libraries
        # it links (NVHPC's, on Cirrus) may need libcuda.so.1: offer the toolkit's stub under both names.
        given = getattr(self.args, "cuda_stubs", None)
        stub = cuda_stub(host, resolve_refs(given, env, "cuda_stubs") if given else f"{home}/lib64/stubs",
                         "the step's cuda_stubs" if given else "facts.cuda.home + /lib64/stubs")
        stubs = None
        if stub:
            stubs = link_dir(links_root, "cuda-stubs", stub)
            self.links += [(f"{stubs}/libcuda.so", stub), (f"{stubs}/libcuda.so.1", stub)]
        return dataclasses.replace(probed, cuda_home=home, nccl_home=nccl, nccl_include=f"{nccl}/include", nccl_lib=lib,
                                   cuda_stubs=stubs)


def cuda_stub(host: Host, directory: str, given_by: str) -> str | None:
    """The libcuda stub to link against on a host without a GPU driver (login nodes), None where the
    driver's libcuda.so.1 is installed. Cirrus' instructions
    (https://github.com/hpc-uk/build-instructions/blob/main/pyenvs/pytorch/build_pytorch_2.3.1_cirrus_gpu.md)
    ask for ``libcuda.so.1 -> libcuda.so`` in
    ``${NVHPC_ROOT}/cuda/lib64/stubs``; sitestack makes that link itself, beside the build cache, so
    only ``libcuda.so`` must be there. Neither driver nor stub: an error naming the directory, because
    the build would otherwise fail late, or link a library that cannot load."""
    driver = host.probe(["bash", "-c", "ldconfig -p 2>/dev/null | grep -q 'libcuda.so.1 '"])
    if driver.ok:
        return None
    stub = f"{directory.rstrip('/')}/libcuda.so"
    if not host.exists(stub):
        raise SitestackError(f"{host.name} has no GPU driver (no libcuda.so.1 known to ldconfig) and no CUDA driver stub "
                             f"{stub} ({given_by}): Horovod's CUDA build links against libcuda; give the directory "
                             "that has it (the step's cuda_stubs)")
    return stub
