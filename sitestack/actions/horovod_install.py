"""The ``horovod-install`` action: Horovod from source for a site, checked with --check-build.

The action (and ``invoke build-horovod``) is a recipe install of ``sources/horovod.yml`` (fetch,
patches, ``pip wheel --no-build-isolation``, wheel cached by digest, atomic stamped install)
whose build environment and checks come from Horovod's hooks
(:class:`sitestack.packages.horovod_hooks.HorovodHooks`; the rules are in
:mod:`sitestack.packages.horovod`). After the install, ``horovodrun --check-build`` must list
exactly the frameworks, controllers and tensor operations asked for.

``plan_for`` is re-exported for callers that import it from the action.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sitestack.actions.hooked_install import HookedInstall
from sitestack.packages.horovod import plan_for
from sitestack.packages.horovod_hooks import HorovodArgs, HorovodHooks


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


__all__ = ["HorovodInstall", "plan_for"]
