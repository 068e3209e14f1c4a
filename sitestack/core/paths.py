"""Where sitestack finds its data: the checkout's playbooks/, sources/, patches/, modulefiles/, docs/.

sitestack runs from its checkout (see README): the data directories sit beside the package.
"""

from __future__ import annotations

from pathlib import Path

#: The checkout: the directory holding ``sitestack/``, ``playbooks/`` and ``sources/``.
REPO = Path(__file__).resolve().parents[2]
PLAYBOOK_DIR = REPO / "playbooks"
SOURCES_DIR = REPO / "sources"
PATCHES_DIR = REPO / "patches"
MODULEFILE_DIR = REPO / "modulefiles"
DOCS_DIR = REPO / "docs"


def derived_cache(name: str) -> Path | None:
    """``~/.cache/sitestack/<name>``, where sitestack keeps what it can derive again (parsed data files,
    rendered text, probe answers); None until ``~/.cache/sitestack`` exists. A run makes that directory
    when it first writes logs or builds, so a run refused for bad input writes nothing, not even there."""
    root = Path.home() / ".cache" / "sitestack"
    return root / name if root.is_dir() else None
