"""What a recipe install is: a recipe version for a site at a destination (:class:`Target`), and the
pure functions that turn it into commands: the build plan, the install commands, the checks, the
argv run on a host with the site's modules loaded.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sitestack.builders import Builder, BuildRequest, Command, Layout, builder_for
from sitestack.model.recipe import Recipe, expand
from sitestack.model.site import Facts
from sitestack.model.siteenv import in_site_env


@dataclass(frozen=True)
class Target:
    """What is installed where: a recipe version for a site, at ``dest``."""

    recipe: Recipe
    version: str
    facts: Facts
    dest: str
    site_prefix: str
    python: str

    @property
    def label(self) -> str:
        return f"{self.recipe.name} {self.version}"

    @property
    def builder(self) -> Builder:
        """The build system the recipe names."""
        return builder_for(self.recipe.build)

    def values(self, install: str | None = None) -> dict[str, str]:
        """Placeholder values for the recipe's strings."""
        f = self.facts
        return {
            "name": self.recipe.name,
            "version": self.version,
            "prefix": self.dest,
            "site_prefix": self.site_prefix,
            "install": install or self.dest,
            "mpicc": f.mpi.cc,
            "mpicxx": f.mpi.cxx,
            "mpi_library_match": f.mpi.library_match,
            "python": self.python,
            "python_version": f.python.version,
            "torch_version": f.torch.version,
            **({"rocm_home": f.rocm.home, "rocm_version": f.rocm.version} if f.rocm else {}),
            **({"cuda_home": f.cuda.home, "cuda_version": f.cuda.version} if f.cuda else {}),
        }

    def args(self) -> list[str]:
        values = self.values()
        return [expand(a, values) for a in (*self.recipe.args, *self.recipe.versions[self.version].args)]

    def env(self) -> dict[str, str]:
        values = self.values()
        merged = {**self.recipe.env, **self.recipe.versions[self.version].env}
        return {k: expand(v, values) for k, v in merged.items()}

    def tools(self) -> list[str]:
        """Commands that must exist (first word of each), the builder's own included."""
        values = self.values()
        names = [shlex.split(expand(t, values))[0] for t in self.recipe.tools if expand(t, values).strip()]
        return list(dict.fromkeys([*names, *self.builder.tools(self.python)]))


def build_plan(target: Target, layout: Layout, *, has_configure: bool = True, program: str | None = None,
               make_program: str | None = None) -> list[Command]:
    """The builder's commands for ``target`` in ``layout`` (pure).

    ``program`` is the build tool to run where it is not the builder's default (a cmake from a
    tool venv), ``make_program`` the tool it drives when that comes from one too.
    """
    request = BuildRequest(layout=layout, options=target.recipe.builder_options(), python=target.python,
                           args=target.args(), env=target.env(), has_configure=has_configure, program=program,
                           make_program=make_program)
    return target.builder.plan(request)


def install_commands(target: Target, artefact: str, tree: str) -> list[Command]:
    """Install the artefact file into ``tree`` (a directory that does not exist yet)."""
    return target.builder.install(target.python, artefact, tree)


def launcher_argv(facts: Facts, ranks: int) -> list[str]:
    """The site's MPI launcher starting ``ranks`` ranks (mpiexec unless the facts say srun or mpirun)."""
    launcher = facts.mpi.launcher
    return {"srun": ["srun", "-n", str(ranks)], "mpirun": ["mpirun", "-np", str(ranks)]}.get(
        launcher, ["mpiexec", "-n", str(ranks)])


#: One recipe check, resolved: (name, argv, env, expected text or None, ranks).
CheckCommand = tuple[str, list[str], dict[str, str], str | None, int]


def check_commands(target: Target, tree: str) -> list[CheckCommand]:
    """(name, argv, env, expected text, ranks) for each of the recipe's checks on ``tree``."""
    values = target.values(install=tree)
    out: list[CheckCommand] = []
    for check in target.recipe.checks:
        argv = [expand(a, values) for a in check.run]
        if check.ranks > 1:
            argv = launcher_argv(target.facts, check.ranks) + argv
        env = {k: expand(v, values) for k, v in check.env.items()}
        expect = expand(check.expect, values) if check.expect is not None else None
        out.append((check.name, argv, env, expect, check.ranks))
    return out


def env_argv(argv: Sequence[str], env: Mapping[str, str] | None) -> list[str]:
    """``argv`` run with ``env`` added (through env(1), so it works over ssh too)."""
    if not env:
        return list(argv)
    return ["env", *(f"{k}={v}" for k, v in sorted(env.items())), *argv]


def host_argv(facts: Facts, command: Command | Sequence[str], env: Mapping[str, str] | None = None) -> list[str]:
    """The argv run on the host: the site's modules loaded, then ``env`` set, then the command."""
    if isinstance(command, Command):
        return in_site_env(facts, env_argv(command.argv, command.env))
    return in_site_env(facts, env_argv(command, env))
