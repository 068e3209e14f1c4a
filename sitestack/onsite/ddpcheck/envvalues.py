"""The numbers the check program reads from its environment, checked for their form.

The batch script and the launchers set them (``SLURM_PROCID``, ``PMI_RANK``, ``SITESTACK_TIME_LIMIT``,
``SITESTACK_DEADLINE``, ...), and a user can too: each is read here, as ASCII digits only (Python's
``int`` would also take ``+1``, ``1_000``, ``-1`` and other scripts' digits; ``float`` takes ``nan``
and ``inf``, which would make a deadline that never comes), within a range, or refused with an
:class:`EnvError` whose message names the variable (the program prints it as one line, no traceback).
An unset or blank variable is None: the caller's default applies.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

_WHOLE = re.compile(r"[0-9]{1,10}")
_SECONDS = re.compile(r"[0-9]{1,12}(?:\.[0-9]{1,9})?")
#: The largest rank, size or count a variable may hold (Slurm's ids are 32-bit).
MAX_WHOLE = 4294967295


class EnvError(ValueError):
    """A variable of the environment whose value is not of its form (the message names it)."""


def whole(env: Mapping[str, str], name: str, lo: int = 0, hi: int = MAX_WHOLE) -> int | None:
    """``env[name]`` as a whole number from ``lo`` to ``hi``; None when unset or blank."""
    value = env.get(name)
    if value is None or not value.strip():
        return None
    text = value.strip()
    if not _WHOLE.fullmatch(text) or not lo <= int(text) <= hi:
        raise EnvError(f"{name} must be a whole number from {lo} to {hi} (digits only), not {_shown(value)}")
    return int(text)


def seconds(env: Mapping[str, str], name: str, lo: float = 0.0, hi: float = 1e12) -> float | None:
    """``env[name]`` as a number of seconds (``480``, ``1712345678.25``) from ``lo`` to ``hi``; None when
    unset or blank."""
    value = env.get(name)
    if value is None or not value.strip():
        return None
    text = value.strip()
    number = float(text) if _SECONDS.fullmatch(text) else math.nan
    if not lo <= number <= hi:  # nan fails every comparison
        raise EnvError(f"{name} must be a number of seconds from {lo:g} to {hi:g}, not {_shown(value)}")
    return number


def _shown(value: str) -> str:
    """The value for a message: escaped (one line), at most 40 characters."""
    return repr(value) if len(value) <= 40 else repr(value[:40]) + "..."
