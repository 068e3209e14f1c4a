"""Builders: pure functions from a recipe's resolved arguments to the commands that build it.

Each build system is a :class:`~sitestack.builders.builder.Builder` in :data:`BUILDERS`, keyed by
the recipe's ``build``: its ``plan`` (the build, ending with the package installed under
``layout.stage``), where the installed tree then is (``staged_tree``), the artefact kind and how
it installs. Nothing here runs anything: :mod:`sitestack.installs.installer` runs the commands,
in the site environment, and the unit tests pin them.

The same functions, called with :func:`symbolic` paths, give the plan that goes into an
install's digest: the directories that change from run to run (build dir, staging dir, job
count) are placeholders there, so only real inputs change the digest.
"""

from __future__ import annotations

from collections.abc import Mapping

from sitestack.builders import autotools, cmake, pip
from sitestack.builders.builder import Builder, BuildRequest, Command, HostTools, Layout, symbolic

#: Every build system a recipe's ``build`` may name.
BUILDERS: Mapping[str, Builder] = {
    "autotools": autotools.BUILDER,
    "cmake": cmake.BUILDER,
    "pip": pip.BUILDER,
}


def builder_for(name: str) -> Builder:
    """The builder a recipe's ``build`` names (the recipe schema allows only the keys of :data:`BUILDERS`)."""
    return BUILDERS[name]


__all__ = ["BUILDERS", "BuildRequest", "Builder", "Command", "HostTools", "Layout", "autotools", "builder_for",
           "cmake", "pip", "symbolic"]
