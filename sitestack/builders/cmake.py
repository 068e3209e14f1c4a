"""The CMake builder: configure (Ninja by default), build, install into a staging DESTDIR.

Where the host has no cmake (or one older than the recipe's ``minimum``), cmake and ninja come
from PyPI into a tool venv (:func:`venv_packages`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from sitestack.builders.builder import (
    BuildRequest,
    Command,
    HostTools,
    Layout,
    Options,
    staged_prefix,
    tree_install,
)
from sitestack.core import versions
from sitestack.model.recipe import CMake


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
    return staged_prefix(layout)


def venv_packages(minimum: str, generator: str) -> list[str]:
    """What the tool venv holds: cmake >= ``minimum``, and ninja for the Ninja generator."""
    return [f"cmake>={minimum}"] + (["ninja"] if generator == "Ninja" else [])


def judge(opts: CMake, found: Mapping[str, str]) -> HostTools:
    """Use the host's cmake when it is new enough, its ninja when the generator needs one; else PyPI's."""
    have, ninja_found = found.get("cmake"), found.get("ninja")
    shown: dict[str, str] = {}
    program = None
    if have:
        version = have.split("|", 1)[1].strip().rsplit(" ", 1)[-1] if "|" in have else ""
        try:
            if versions.matches(f">={opts.minimum}", version):
                program = have.split(" | ")[0]
                shown["cmake"] = have
        except ValueError:
            pass  # an unreadable version is as good as none: cmake comes from PyPI
    ninja_ok = bool(ninja_found) or opts.generator != "Ninja"
    if ninja_found and opts.generator == "Ninja":
        shown["ninja"] = ninja_found
    if program is not None and ninja_ok:
        return HostTools(program=program, shown=shown)
    shown["cmake"] = f"PyPI cmake>={opts.minimum}" + (" + ninja" if not ninja_ok else "")
    return HostTools(program=program, venv_packages=tuple(venv_packages(opts.minimum, opts.generator)),
                     venv_name=f"cmake-{opts.minimum}", venv_program="cmake",
                     venv_make_program=None if ninja_ok else "ninja", shown=shown)


class CMakeBuilder:
    """:class:`~sitestack.builders.builder.Builder` for ``build: cmake``."""

    name = "cmake"
    artefact: Literal["tree", "wheel"] = "tree"
    optional_tools: tuple[str, ...] = ("cmake", "ninja")

    def tools(self, python: str) -> list[str]:
        return []  # cmake and ninja are optional: PyPI has them

    def plan(self, request: BuildRequest) -> list[Command]:
        opts = request.options
        assert isinstance(opts, CMake)
        return plan(layout=request.layout, args=request.args, env=request.env, cmake=request.program or "cmake",
                    generator=opts.generator, build_type=opts.build_type, source_subdir=opts.source_subdir,
                    make_program=request.make_program)

    def staged_tree(self, layout: Layout) -> str:
        return staged_tree(layout)

    def install(self, python: str, artefact: str, tree: str) -> list[Command]:
        return tree_install(artefact, tree)

    def host_tools(self, options: Options, found: Mapping[str, str]) -> HostTools:
        assert isinstance(options, CMake)
        return judge(options, found)


BUILDER = CMakeBuilder()
