"""Reading what a host holds, bounded: the one way the controller reads a file whose size it does not
control (a job's result, a sweep, a tuning document, check-config.json, a state file), and the
output of a program on the host it does not control (:func:`output_bounded`).

A file is read through :meth:`~sitestack.core.hostbase.Host.read_tail` with one byte more than the
limit, so a file of any size costs at most ``limit + 1`` bytes to refuse, a FIFO is never waited on
and, unless ``follow``, a symbolic link is refused (``Host.read_tail``'s contract).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from sitestack.core.completed import Completed
from sitestack.core.errors import InputError
from sitestack.onsite.fileio import ReadError, parse_json


class Host(Protocol):
    """What of :class:`sitestack.core.hostbase.Host` is used here (which reads its files through this
    module: the host classes are not imported)."""

    def read_tail(self, path: str, limit: int = ..., *, follow: bool = ...) -> str | None: ...

    def probe(self, argv: Sequence[str], *, timeout: float | None = ...) -> Completed: ...

#: The most bytes of a program's standard error :func:`output_bounded` keeps (its last: the error is there).
STDERR_MAX = 4096
#: Runs ``$@`` with its standard output cut after ``$1`` bytes (head(1) exits there: the program gets
#: SIGPIPE or EPIPE and stops) and its standard error to its last STDERR_MAX bytes, then a line
#: ``exit N`` of its own: a pipeline's status is its last command's (POSIX sh has no pipefail), so
#: the program's travels on standard error.
_BOUNDED = ('n=$1; e=$2; shift 2; { { "$@"; printf "\\nexit %s\\n" "$?" >&2; } 2>&1 >&3 3>&- | tail -c "$e" >&2; } '
            '3>&1 | head -c "$n"')


def read_bounded(host: Host, path: str, limit: int, what: str, *, follow: bool = True) -> str | None:
    """The text of ``path`` on ``host`` (None where it is missing); larger than ``limit`` bytes: an
    :class:`InputError` naming the file and ending in ``what`` (what it should have been, what to do)."""
    text = host.read_tail(path, limit + 1, follow=follow)
    if text is not None and len(text) > limit:
        raise InputError(path, f"larger than {_size(limit)}: {what}")
    return text


def read_json(host: Host, path: str, limit: int, what: str, *, follow: bool = True) -> Any:
    """The JSON document at ``path`` on ``host``, read with :func:`read_bounded`; None where the file
    is missing or empty. Larger, or not JSON with finite numbers nested a bounded depth
    (:func:`sitestack.onsite.fileio.parse_json`): an :class:`InputError` naming the file and ending in ``what``."""
    text = read_bounded(host, path, limit, what, follow=follow)
    if not text:
        return None
    try:
        return parse_json(text, path)
    except ReadError as exc:
        raise InputError(path, f"{exc.reason}: {what}") from None


def output_bounded(host: Host, argv: list[str], limit: int, *, timeout: float = 120) -> Completed:
    """``argv`` run on ``host`` as a probe, with its exit status; its standard output at most ``limit`` + 1
    bytes (more than ``limit``: it printed more), its standard error the last :data:`STDERR_MAX`
    bytes, so a program that prints without end costs the controller that much, never more. A status
    that did not come back (the shell killed, the probe timed out) is the probe's, else 125."""
    out = host.probe(["sh", "-c", _BOUNDED, "sitestack", str(limit + 1), str(STDERR_MAX), *argv], timeout=timeout)
    lines = out.stderr.rstrip("\n").split("\n")
    status = lines[-1][5:] if lines[-1].startswith("exit ") else ""
    if status.isdigit():
        return Completed(int(status), out.stdout, "\n".join(lines[:-1]).strip("\n"))
    return Completed(out.rc or 125, out.stdout, out.stderr)


def _size(limit: int) -> str:
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if limit >= 1 << shift and limit % (1 << shift) == 0:
            return f"{limit >> shift} {unit}"
    return f"{limit} bytes"
