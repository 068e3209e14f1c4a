"""The vocabulary of builders: where a build happens (:class:`Layout`), one command of it
(:class:`Command`), what a builder is asked to plan (:class:`BuildRequest`) and the
:class:`Builder` protocol every build system implements.

Builders are pure: they turn resolved arguments into argv lists and never run anything.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from sitestack.model.recipe import Autotools, CMake, Pip

#: The options dataclass of any builder (``Recipe.builder_options()``).
Options = Autotools | CMake | Pip


@dataclass(frozen=True)
class Layout:
    """Where a build happens."""

    src: str      # the unpacked, patched source tree
    build: str    # a fresh, empty build directory
    stage: str    # DESTDIR for prefix builds, the wheel directory for pip
    prefix: str   # the final install prefix (baked into prefix builds)
    jobs: str     # parallel jobs, as text


@dataclass(frozen=True)
class Command:
    """One command of a build: run in ``cwd`` with ``env`` added after the site's modules load."""

    phase: str
    argv: tuple[str, ...]
    cwd: str
    env: Mapping[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        return {"phase": self.phase, "argv": list(self.argv), "cwd": self.cwd, "env": dict(sorted(self.env.items()))}


def symbolic(prefix: str) -> Layout:
    """A layout whose run-to-run paths are placeholders (for digests)."""
    return Layout(src="$SRC", build="$BUILD", stage="$STAGE", prefix=prefix, jobs="$JOBS")


@dataclass(frozen=True)
class BuildRequest:
    """Everything a builder's plan depends on, resolved (no placeholders left)."""

    layout: Layout
    options: Options
    python: str                       # the interpreter that builds Python packages
    args: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    has_configure: bool = True        # the unpacked source ships a configure script
    program: str | None = None        # the build tool to run (cmake), when not the builder's default
    make_program: str | None = None   # the tool the build tool drives (ninja), when from a tool venv


@dataclass(frozen=True)
class HostTools:
    """Which of a builder's optional tools (:attr:`Builder.optional_tools`) the host's versions serve.

    With ``venv_packages`` set, those come from PyPI into a tool venv whose ``bin/`` provides what
    the host lacks. ``shown`` is what the install's digest records for these tools.
    """

    program: str | None = None             # the host's build tool to run (None: the venv's, or the default)
    venv_packages: tuple[str, ...] = ()     # empty: no tool venv needed
    venv_name: str = ""                     # the venv's directory name under the build cache's tools/
    venv_program: str | None = None         # bin/ name of the build tool in the venv (used without a host one)
    venv_make_program: str | None = None    # bin/ name of the driven tool in the venv (the host has none)
    shown: Mapping[str, str] = field(default_factory=dict)


class Builder(Protocol):
    """A build system: its plan (argv only), where its result is, and how that result installs."""

    name: str
    #: "tree" (a staged prefix, tarred) or "wheel" (one wheel file)
    artefact: Literal["tree", "wheel"]
    #: tools probed on the host that may come from PyPI instead (their versions are judged by :meth:`host_tools`)
    optional_tools: tuple[str, ...]

    def tools(self, python: str) -> list[str]:
        """Commands that must exist on the host (their ``--version`` goes into the digest)."""
        ...

    def plan(self, request: BuildRequest) -> list[Command]:
        """The commands that build the package and leave it under ``request.layout.stage``."""
        ...

    def staged_tree(self, layout: Layout) -> str:
        """Where the installed files are after the plan ran (tree builders)."""
        ...

    def install(self, python: str, artefact: str, tree: str) -> list[Command]:
        """Install the artefact file into ``tree`` (a directory that does not exist yet)."""
        ...

    def host_tools(self, options: Options, found: Mapping[str, str]) -> HostTools:
        """Judge the probed optional tools (``found``: name -> "path | version line")."""
        ...


def staged_prefix(layout: Layout) -> str:
    """``<stage>/<prefix>``: where a DESTDIR install puts the prefix's files."""
    return layout.stage.rstrip("/") + "/" + layout.prefix.lstrip("/")


def tree_install(artefact: str, tree: str) -> list[Command]:
    """Unpack a tarred staged prefix into ``tree``."""
    return [Command("install", ("mkdir", "-p", tree), "/"),
            Command("install", ("tar", "-xf", artefact, "-C", tree), "/")]


def venv_commands(python: str, venv: str, packages: Sequence[str]) -> list[Command]:
    """Make ``venv`` holding ``packages`` from PyPI (build tools, never the package built)."""
    return [
        Command("tools", (python, "-m", "venv", venv), "/"),
        Command("tools", (f"{venv}/bin/python", "-m", "pip", "install", "--no-cache-dir",
                          "--disable-pip-version-check", *packages), "/"),
    ]
