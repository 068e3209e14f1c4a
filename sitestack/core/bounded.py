"""Reading what a host holds, bounded: the one way the controller reads a file whose size it does not
control (a job's result, a sweep, a tuning document, check-config.json, a state file).

A file is read through :meth:`~sitestack.core.hostbase.Host.read_tail` with one byte more than the
limit, so a file of any size costs at most ``limit + 1`` bytes to refuse, a FIFO is never waited on
and, unless ``follow``, a symbolic link is refused (``Host.read_tail``'s contract).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from sitestack.core.errors import InputError

if TYPE_CHECKING:
    from sitestack.core.hostbase import Host


def read_bounded(host: Host, path: str, limit: int, what: str, *, follow: bool = True) -> str | None:
    """The text of ``path`` on ``host`` (None where it is missing); larger than ``limit`` bytes: an
    :class:`InputError` naming the file and ending in ``what`` (what it should have been, what to do)."""
    text = host.read_tail(path, limit + 1, follow=follow)
    if text is not None and len(text) > limit:
        raise InputError(path, f"larger than {_size(limit)}: {what}")
    return text


def read_json(host: Host, path: str, limit: int, what: str, *, follow: bool = True) -> Any:
    """The JSON document at ``path`` on ``host``, read with :func:`read_bounded`; None where the file
    is missing or empty. Larger, or not JSON: an :class:`InputError` naming the file and ending in ``what``."""
    text = read_bounded(host, path, limit, what, follow=follow)
    if not text:
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise InputError(path, f"not JSON ({str(exc)[:200]}): {what}") from None


def _size(limit: int) -> str:
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if limit >= 1 << shift and limit % (1 << shift) == 0:
            return f"{limit >> shift} {unit}"
    return f"{limit} bytes"
