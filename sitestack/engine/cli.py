"""Glue between ``tasks.py`` and the library: option parsing helpers and error handling.

Expected failures (:class:`~sitestack.errors.SitestackError`) become one line on stderr and
exit code 1; ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path

from invoke.exceptions import Exit

from sitestack.core.errors import InputError, SitestackError
from sitestack.model.context import RunOptions


def split_list(value: str | None, option: str = "") -> tuple[str, ...]:
    """``"a,b, c"`` -> ``("a", "b", "c")``; an empty item (``",,,"``, ``"a,,b"``) is an error naming
    ``option``: it would otherwise select nothing, or everything."""
    if not value:
        return ()
    items = tuple(v.strip() for v in value.split(","))
    if not all(items):
        raise InputError(option or "option", f"{value!r} has an empty item (a comma-separated list of names)")
    return items


def int_option(option: str, value: object, *, low: int, high: int) -> int:
    """An integer option within [low, high]; ``--jobs abc`` is an error naming the option."""
    text = str(value)
    if not re.fullmatch(r"-?[0-9]+", text):   # int() would take ' 3 ', '1_0' and other scripts' digits
        raise InputError(option, f"{value!r} is not a whole number")
    number = int(text)
    if not low <= number <= high:
        raise InputError(option, f"must be between {low} and {high}, not {number}")
    return number


def account_option(value: str | None) -> str | None:
    """--account, else $SITESTACK_ACCOUNT; checked as every run option is (:class:`RunOptions`)."""
    account = value if value is not None else (os.environ.get("SITESTACK_ACCOUNT") or None)
    RunOptions(account=account)
    return account


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
