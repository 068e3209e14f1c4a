"""The on-site programs installed into a directory of a test's own, as a job directory holds them
(:func:`sitestack.core.shipped.shipped`: ``onsite/`` whole and a launcher per program), so they run
with nothing of sitestack on the path."""

from __future__ import annotations

from pathlib import Path

from sitestack.core.shipped import shipped
from sitestack.validation.jobs import PROGRAMS


def install_programs(directory: Path, names: tuple[str, ...] = PROGRAMS) -> Path:
    """``directory`` (made if missing) with ``onsite/`` and the launchers ``names``; ``directory``."""
    for relative, (text, mode) in shipped(names).items():
        path = directory / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        path.chmod(mode)
    return directory
