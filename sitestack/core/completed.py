"""The outcome of a command run on a host (:class:`Completed`), on its own so that what reads a host's
output (:mod:`sitestack.core.bounded`) needs nothing of the host classes that use it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Completed:
    """The outcome of a command: exit code and captured output."""

    rc: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.rc == 0
