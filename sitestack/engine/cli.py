"""Glue between ``tasks.py`` and the library: option parsing helpers and error handling.

Expected failures (:class:`~sitestack.errors.SitestackError`) become one line on stderr and
exit code 1; ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path

from invoke.exceptions import Exit

from sitestack.core.errors import SitestackError


def split_list(value: str | None) -> tuple[str, ...]:
    """``"a,b, c"`` -> ``("a", "b", "c")``."""
    return tuple(v.strip() for v in (value or "").split(",") if v.strip())


def account_option(value: str | None) -> str | None:
    return value or os.environ.get("SITESTACK_ACCOUNT") or None


def playbook_path(value: str | None) -> Path | None:
    return Path(value) if value else None


@contextlib.contextmanager
def errors_to_exit(debug: bool = False) -> Iterator[None]:
    """Turn a SitestackError into ``Exit(code=1)`` with its message (no traceback)."""
    try:
        yield
    except SitestackError as exc:
        if debug:
            traceback.print_exc()
        raise Exit(f"error: {exc}", code=1) from None
    except KeyboardInterrupt:
        raise Exit("interrupted", code=130) from None


def eprint(text: str) -> None:
    print(text, file=sys.stderr)
