"""Per-package hooks (like Spack's package.py): what a recipe's build needs beyond its YAML.

Adding a package is one YAML in ``sources/``; a package whose build depends on the site in ways a
recipe cannot say (probing the host, choosing versions from the facts) adds a hooks class
(:class:`~sitestack.packages.hooks.PackageHooks`) and one line to :data:`HOOKS`. Generic install
code asks ``HOOKS.get(recipe.name, PackageHooks)``; it never tests a package's name.

This layer sits below installs and actions: it imports core, model and builders only.
"""

from __future__ import annotations

from sitestack.core.lazytable import LazyTable
from sitestack.packages.hooks import InstallInfo, NotReady, PackageHooks, Prepared

#: recipe name (``name:`` of sources/<recipe>.yml) -> its hooks class (imported when that recipe is
#: first installed: :mod:`sitestack.core.lazytable`).
HOOKS: LazyTable[type[PackageHooks]] = LazyTable({
    "horovod": "sitestack.packages.horovod_hooks:HorovodHooks",
    "aws-ofi-rccl": "sitestack.packages.aws_ofi_rccl:PluginHooks",
})


def hooks_for(recipe_name: str) -> type[PackageHooks]:
    """The hooks of a recipe (the default hooks where it has none)."""
    return HOOKS.get(recipe_name, PackageHooks)


__all__ = ["HOOKS", "InstallInfo", "NotReady", "PackageHooks", "Prepared", "hooks_for"]
