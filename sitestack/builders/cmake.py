"""The CMake builder: configure (Ninja by default), build, install into a staging DESTDIR.

Where the host has no cmake (or one older than the recipe's ``minimum``), cmake and ninja come
from PyPI into a tool venv: :func:`tool_venv_commands`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sitestack.builders import Command, Layout


def plan(*, layout: Layout, args: Sequence[str] = (), env: Mapping[str, str] | None = None, cmake: str = "cmake",
         generator: str = "Ninja", build_type: str = "Release", source_subdir: str | None = None,
         make_program: str | None = None) -> list[Command]:
    """The commands that configure, build and stage a CMake project."""
    env = dict(env or {})
    src = f"{layout.src}/{source_subdir}" if source_subdir else layout.src
    configure = [cmake, "-S", src, "-B", layout.build, "-G", generator,
                 f"-DCMAKE_BUILD_TYPE={build_type}", f"-DCMAKE_INSTALL_PREFIX={layout.prefix}"]
    if make_program:
        configure.append(f"-DCMAKE_MAKE_PROGRAM={make_program}")
    configure += list(args)
    return [
        Command("configure", tuple(configure), layout.build, env),
        Command("build", (cmake, "--build", layout.build, "--parallel", layout.jobs), layout.build, env),
        Command("stage", (cmake, "--install", layout.build), layout.build, {**env, "DESTDIR": layout.stage}),
    ]


def staged_tree(layout: Layout) -> str:
    return layout.stage.rstrip("/") + "/" + layout.prefix.lstrip("/")


def tool_venv_commands(python: str, venv: str, minimum: str, generator: str) -> list[Command]:
    """Make ``venv`` with cmake >= ``minimum`` (and ninja for the Ninja generator) from PyPI."""
    packages = [f"cmake>={minimum}"] + (["ninja"] if generator == "Ninja" else [])
    return [
        Command("tools", (python, "-m", "venv", venv), "/"),
        Command("tools", (f"{venv}/bin/python", "-m", "pip", "install", "--no-cache-dir",
                          "--disable-pip-version-check", *packages), "/"),
    ]
