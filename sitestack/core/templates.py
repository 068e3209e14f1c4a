"""The one way sitestack makes a Jinja2 environment (module files, the validation job).

Rendered files are compared with what is installed before anything is written, so the
environment is strict and reproducible: an undefined variable is an error (``StrictUndefined``),
never an empty string; nothing is escaped (the output is Lua, Tcl, shell and Markdown, not
HTML); block tags leave no stray blank lines or indentation; a template's final newline is kept.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jinja2


def environment(search_path: Sequence[str | Path],
                filters: Mapping[str, Callable[..., Any]] | None = None) -> jinja2.Environment:
    """A strict environment loading templates from ``search_path`` (first match wins), with ``filters``."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader([str(d) for d in search_path]),
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True,
        autoescape=False)
    env.filters.update(filters or {})
    return env
