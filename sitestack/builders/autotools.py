"""The autotools builder: [bootstrap], configure, make -jN, make install into a staging DESTDIR."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from sitestack.builders.builder import BuildRequest, Command, HostTools, Layout, Options, staged_prefix, tree_install
from sitestack.model.recipe import Autotools


def needs_bootstrap(mode: str, has_configure: bool) -> bool:
    """Whether to run the bootstrap command (autoreconf / autogen.sh) before configure."""
    return mode == "always" or (mode == "auto" and not has_configure)


def plan(*, layout: Layout, args: Sequence[str] = (), env: Mapping[str, str] | None = None,
         bootstrap: str = "auto", bootstrap_command: Sequence[str] = ("autoreconf", "-fi"),
         has_configure: bool = True, out_of_tree: bool = False, make_args: Sequence[str] = ()) -> list[Command]:
    """The commands that build an autotools package and install it under ``layout.stage``.

    ``make install`` gets ``DESTDIR``: files land in ``<stage>/<prefix>/...`` with the final
    prefix compiled in, so the staged tree can be renamed into place unchanged.
    """
    env = dict(env or {})
    work = layout.build if out_of_tree else layout.src
    commands = []
    if needs_bootstrap(bootstrap, has_configure):
        commands.append(Command("bootstrap", tuple(bootstrap_command), layout.src, env))
    commands.append(Command("configure", (f"{layout.src}/configure", f"--prefix={layout.prefix}", *args), work, env))
    commands.append(Command("build", ("make", f"-j{layout.jobs}", *make_args), work, env))
    commands.append(Command("stage", ("make", *make_args, "install", f"DESTDIR={layout.stage}"), work, env))
    return commands


def staged_tree(layout: Layout) -> str:
    """Where the installed files are after the plan ran."""
    return staged_prefix(layout)


class AutotoolsBuilder:
    """:class:`~sitestack.builders.builder.Builder` for ``build: autotools``."""

    name = "autotools"
    artefact: Literal["tree", "wheel"] = "tree"
    optional_tools: tuple[str, ...] = ()

    def tools(self, python: str) -> list[str]:
        return ["make"]

    def plan(self, request: BuildRequest) -> list[Command]:
        opts = request.options
        assert isinstance(opts, Autotools)
        return plan(layout=request.layout, args=request.args, env=request.env, bootstrap=opts.bootstrap,
                    bootstrap_command=opts.bootstrap_command, has_configure=request.has_configure,
                    out_of_tree=opts.out_of_tree, make_args=opts.make_args)

    def staged_tree(self, layout: Layout) -> str:
        return staged_tree(layout)

    def install(self, python: str, artefact: str, tree: str) -> list[Command]:
        return tree_install(artefact, tree)

    def host_tools(self, options: Options, found: Mapping[str, str]) -> HostTools:
        return HostTools()


BUILDER = AutotoolsBuilder()
