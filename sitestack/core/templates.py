"""The one way sitestack makes a Jinja2 environment (module files, the validation job), and the
cache of rendered text.

Rendered files are compared with what is installed before anything is written, so the
environment is strict and reproducible: an undefined variable is an error (``StrictUndefined``),
never an empty string; nothing is escaped (the output is Lua, Tcl, shell and Markdown, not
HTML); block tags leave no stray blank lines or indentation; a template's final newline is kept.

Because the output is a pure function of the template files, the code and the inputs, a no-op
run need not import Jinja2 or compile a template: :func:`cached_text` keeps each rendered text in
``~/.cache/sitestack/renders`` (private; :func:`~sitestack.core.paths.derived_cache`), keyed by the inputs, and the path, inode, size and mtime
of every template file and every module of sitestack. ``SITESTACK_RENDER_CACHE=off`` turns it off.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sitestack.core import envvars
from sitestack.core.files import atomic_write, signature
from sitestack.core.paths import derived_cache
from sitestack.core.private import private_dir

if TYPE_CHECKING:
    import jinja2

#: The package whose modules (filters, quoting, the renderers) shape rendered text.
PACKAGE_DIR = Path(__file__).resolve().parent.parent


def environment(search_path: Sequence[str | Path],
                filters: Mapping[str, Callable[..., Any]] | None = None) -> jinja2.Environment:
    """A strict environment loading templates from ``search_path`` (first match wins), with ``filters``."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader([str(d) for d in search_path]),
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True,
        autoescape=False)
    env.filters.update(filters or {})
    return env


def cached_text(search_path: Sequence[str | Path], inputs: str, render: Callable[[], str]) -> str:
    """``render()``, or the text it returned before for the same ``inputs`` (a complete, deterministic
    description of what is rendered, e.g. the repr of frozen dataclasses), the same files under
    ``search_path`` and the same sitestack code."""
    if not envvars.switched_on("SITESTACK_RENDER_CACHE"):
        return render()
    directory = derived_cache("renders")
    if directory is None:
        return render()
    ident = "\n".join([inputs, *(_tree(str(d)) for d in search_path), _code()])
    path = directory / hashlib.sha256(ident.encode()).hexdigest()[:40]
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        pass
    text = render()
    with contextlib.suppress(OSError):
        private_dir(path.parent)
        atomic_write(path, text.encode("utf-8"), 0o600)
    return text


def _tree(directory: str, suffix: str = "") -> str:
    """Every file below ``directory`` (ending in ``suffix``; no bytecode): relative path, inode, size,
    mtime (ns), ctime (ns)."""
    lines = [directory]
    for root, dirs, files in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(f for f in files if f.endswith(suffix)):
            sig = signature(os.path.join(root, name))
            if sig is not None:
                lines.append(f"{os.path.relpath(os.path.join(root, name), directory)}|" + "|".join(map(str, sig)))
    return "\n".join(lines)


@functools.lru_cache(maxsize=1)
def _code() -> str:
    """The sitestack modules as :func:`_tree` lists them (read once per process)."""
    return _tree(str(PACKAGE_DIR), ".py")
