"""Errors a user can act on.

Every expected failure is a :class:`SitestackError`: the CLI prints its message (one
line, naming the file, line and key where there is one) and exits 1 without a traceback.
Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class SitestackError(Exception):
    """An expected failure with a message meant for the user."""


class InputError(SitestackError):
    """Bad input in a data file or on the command line.

    ``where`` is ``file:line`` (or an option such as ``--site``); ``key`` is the dotted path
    of the offending key, when there is one.
    """

    def __init__(self, where: str, message: str, key: str | None = None) -> None:
        self.where = where
        self.key = key
        self.detail = message
        text = f"{where}: {key}: {message}" if key else f"{where}: {message}"
        super().__init__(text)


class MutationRefused(SitestackError):
    """A read-only host (check mode) was asked to change something."""


class CommandFailed(SitestackError):
    """A mutating command exited non-zero."""

    def __init__(self, argv: list[str], rc: int, output: str, log: str | None = None) -> None:
        self.argv = argv
        self.rc = rc
        self.output = output
        self.log = log
        from sitestack.core.redact import redact

        tail = "\n".join(output.rstrip().splitlines()[-20:])
        where = f" (full log: {log})" if log else ""
        super().__init__(redact(f"command failed with exit code {rc}: {' '.join(argv)}{where}\n{tail}".rstrip()))


class CannotProbe(SitestackError):
    """A step cannot tell whether it is needed on this host (a tool or module system is absent).

    In check mode this is reported as a would-change marked "not probed"; when applying it
    is a failure of that step.
    """


class ConnectionLost(SitestackError):
    """The SSH connection to a host dropped or cannot carry a command."""


class LockHeld(SitestackError):
    """Another run holds the lock of an install prefix."""
