"""The autotools builder: [bootstrap], configure, make -jN, make install into a staging DESTDIR."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sitestack.builders import Command, Layout


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
    return layout.stage.rstrip("/") + "/" + layout.prefix.lstrip("/")
