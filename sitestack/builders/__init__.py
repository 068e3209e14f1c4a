"""Builders: pure functions from a recipe's resolved arguments to the commands that build it.

Each builder module has ``plan(...) -> list[Command]`` (the build, ending with the package
installed under ``layout.stage``) and says where the installed tree then is
(``staged_tree``). Nothing here runs anything: :mod:`sitestack.install` runs the commands, in
the site environment, and the unit tests pin them.

The same functions, called with :func:`symbolic` paths, give the plan that goes into an
install's digest: the directories that change from run to run (build dir, staging dir, job
count) are placeholders there, so only real inputs change the digest.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


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

    def as_dict(self) -> dict:
        return {"phase": self.phase, "argv": list(self.argv), "cwd": self.cwd, "env": dict(sorted(self.env.items()))}


def symbolic(prefix: str) -> Layout:
    """A layout whose run-to-run paths are placeholders (for digests)."""
    return Layout(src="$SRC", build="$BUILD", stage="$STAGE", prefix=prefix, jobs="$JOBS")
