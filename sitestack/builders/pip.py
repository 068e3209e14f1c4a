"""The pip builder: an sdist (unpacked and patched) -> one wheel; a wheel -> an install tree.

Builds never use pip's cache (``--no-cache-dir``: a wheel cached by pip would hide which MPI
it was built against) and build from the unpacked, patched tarball (a local directory, never a
name pip would resolve on an index), so what is built is always this recipe's source.
``build_isolation=False`` builds in the interpreter's own environment, for packages that must
see its torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from sitestack.builders.builder import BuildRequest, Command, HostTools, Layout, Options
from sitestack.model.recipe import Pip

#: Set for every pip command: no version check chatter, never a cache.
PIP_ENV = {"PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_CACHE_DIR": "1"}
#: Kept in the install: the wheel it was installed from (a venv can install the same one).
WHEEL_DIR = ".sitestack/wheels"


def plan(*, layout: Layout, python: str, args: Sequence[str] = (), env: Mapping[str, str] | None = None,
         build_isolation: bool = True) -> list[Command]:
    """The command that builds one wheel from ``layout.src`` into ``layout.stage``."""
    argv = [python, "-m", "pip", "wheel", "--verbose", "--no-deps", "--no-cache-dir"]
    if not build_isolation:
        argv.append("--no-build-isolation")
    argv += ["--wheel-dir", layout.stage, *args, layout.src]
    return [Command("build", tuple(argv), layout.build, {**PIP_ENV, **dict(env or {})})]


def install(*, python: str, wheel: str, target: str) -> Command:
    """Install ``wheel`` (no dependencies, no index) into the directory ``target``."""
    return Command("install", (python, "-m", "pip", "install", "--no-deps", "--no-index", "--no-cache-dir",
                               "--target", target, wheel), "/", dict(PIP_ENV))


class PipBuilder:
    """:class:`~sitestack.builders.builder.Builder` for ``build: pip``."""

    name = "pip"
    artefact: Literal["tree", "wheel"] = "wheel"
    optional_tools: tuple[str, ...] = ()

    def tools(self, python: str) -> list[str]:
        return [python]

    def plan(self, request: BuildRequest) -> list[Command]:
        opts = request.options
        assert isinstance(opts, Pip)
        return plan(layout=request.layout, python=request.python, args=request.args, env=request.env,
                    build_isolation=opts.build_isolation)

    def staged_tree(self, layout: Layout) -> str:
        return layout.stage  # the wheel directory: a pip build has no prefix tree

    def install(self, python: str, artefact: str, tree: str) -> list[Command]:
        """pip-install the wheel into ``tree`` and keep the wheel there (for venvs to install)."""
        wheel_dir = f"{tree}/{WHEEL_DIR}"
        return [install(python=python, wheel=artefact, target=tree),
                Command("install", ("mkdir", "-p", wheel_dir), "/"),
                Command("install", ("cp", artefact, wheel_dir + "/"), "/")]

    def host_tools(self, options: Options, found: Mapping[str, str]) -> HostTools:
        return HostTools()


BUILDER = PipBuilder()
