"""The ``horovod-install`` action: Horovod from source for a site, checked with --check-build.

The action (and ``invoke build-horovod``) is a recipe install of ``sources/horovod.yml`` (fetch,
patches, ``pip wheel --no-build-isolation``, wheel cached by digest, atomic stamped install)
whose build environment and checks come from Horovod's hooks
(:class:`sitestack.packages.horovod_hooks.HorovodHooks`; the rules are in
:mod:`sitestack.packages.horovod`). After the install, ``horovodrun --check-build`` must list
exactly the frameworks, controllers and tensor operations asked for.

The package's names are re-exported here for callers that import them from the action.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sitestack.actions.hooked_install import HookedInstall
from sitestack.packages.environment import resolve_refs, site_environment
from sitestack.packages.horovod import (
    BUILD_ENV_PACKAGES,
    GPU_NAMES,
    CudaRow,
    CxxRow,
    HorovodData,
    OpsRow,
    Plan,
    Probed,
    TorchInfo,
    build_env,
    build_env_commands,
    build_env_dir,
    build_env_marker,
    check_build_check,
    check_cuda_arch,
    compute_capability,
    cxx_standard,
    gpu_operations,
    horovod_data,
    link_dir,
    parse_check_build,
    plan_for,
    render_check_build,
    with_site,
)
from sitestack.packages.horovod_hooks import HorovodArgs, HorovodHooks, probe_torch, try_probe_torch


class HorovodInstall(HookedInstall):
    """Horovod built from its sdist for the site (NCCL/RCCL/CPU from the facts), checked with --check-build."""

    action = "horovod-install"
    hooks_class = HorovodHooks

    @dataclass(frozen=True)
    class Args(HorovodArgs):
        version: str | None = field(default=None, metadata={"doc": "Horovod version (default: the recipe's default_version)"})
        python: str | None = field(default=None, metadata={"doc": (
            "interpreter with the stack's torch that builds and runs Horovod (default: facts.python.executable; "
            "`invoke build-horovod --python` overrides)")})
        dest: str | None = field(default=None, metadata={"doc": "install prefix (default: {prefix}/horovod/<version>)"})
        mirror: str | None = field(default=None, metadata={"doc": "controller directory with source tarballs (air-gapped sites)"})
        recipe: str = field(default="horovod", metadata={"doc": "recipe name (sources/<recipe>.yml)"})


__all__ = [
    "BUILD_ENV_PACKAGES", "GPU_NAMES", "CudaRow", "CxxRow", "HorovodData", "HorovodInstall", "OpsRow", "Plan",
    "Probed", "TorchInfo", "build_env", "build_env_commands", "build_env_dir", "build_env_marker",
    "check_build_check", "check_cuda_arch", "compute_capability", "cxx_standard", "gpu_operations", "horovod_data",
    "link_dir", "parse_check_build", "plan_for", "probe_torch", "render_check_build", "resolve_refs",
    "site_environment", "try_probe_torch", "with_site",
]
