"""The pip builder: an sdist (unpacked and patched) -> one wheel; a wheel -> an install tree.

Builds never use pip's cache (``--no-cache-dir``: a wheel cached by pip would hide which MPI
it was built against) and build from the unpacked, patched tarball (a local directory, never a
name pip would resolve on an index), so what is built is always this recipe's source.
``build_isolation=False`` builds in the interpreter's own environment, for packages that must
see its torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sitestack.builders import Command, Layout

#: Set for every pip command: no version check chatter, never a cache.
PIP_ENV = {"PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_CACHE_DIR": "1"}


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
