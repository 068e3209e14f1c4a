"""Where sitestack finds its data: playbooks/, sources/ (recipes), patches/ and modulefiles/.

The data directory is, first found:

1. ``$SITESTACK_DATA_DIR``: a directory with the four folders (a site's own copy, edited);
2. the checkout: the folders beside ``sitestack/`` (running ``invoke`` in it, or an editable install);
3. the installed package: ``sitestack/_data/``, which the wheel carries (setup.py copies the
   checkout's folders there when it builds).

docs/ and benchmarks/ are the checkout's only (the docs reference generator, ``invoke benchmark``).
"""

from __future__ import annotations

from pathlib import Path

from sitestack.core import envvars
from sitestack.core.errors import InputError

#: The package directory (``sitestack/``).
PACKAGE = Path(__file__).resolve().parents[1]
#: The checkout: the directory holding ``sitestack/``, ``playbooks/`` and ``sources/`` (in an
#: install, the site-packages directory, which has none of them).
REPO = PACKAGE.parent
#: The folders of the data directory; setup.py copies them into the wheel.
DATA_FOLDERS = ("playbooks", "sources", "patches", "modulefiles")
#: The environment variable naming a data directory of one's own (docs/cli.md).
DATA_ENV = "SITESTACK_DATA_DIR"


def data_dir() -> Path:
    """The data directory, as the module docstring orders them."""
    try:
        configured = envvars.get(DATA_ENV)
    except InputError:   # refused, naming the variable, when a task starts (envvars.check_all)
        configured = None
    if configured:
        return Path(configured).resolve()
    if all((REPO / name).is_dir() for name in DATA_FOLDERS):
        return REPO
    return PACKAGE / "_data"


DATA_DIR = data_dir()
PLAYBOOK_DIR = DATA_DIR / "playbooks"
SOURCES_DIR = DATA_DIR / "sources"
MODULEFILE_DIR = DATA_DIR / "modulefiles"
DOCS_DIR = REPO / "docs"


def derived_cache(name: str) -> Path | None:
    """``~/.cache/sitestack/<name>``, where sitestack keeps what it can derive again (parsed data files,
    rendered text, probe answers); None until ``~/.cache/sitestack`` exists. A run makes that directory
    when it first writes logs or builds, so a run refused for bad input writes nothing, not even there."""
    root = Path.home() / ".cache" / "sitestack"
    return root / name if root.is_dir() else None
