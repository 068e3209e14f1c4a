"""Keep secrets out of logs and messages.

:func:`redact` hides the values of variables whose names look secret (``*TOKEN*``,
``*PASSWORD*``, ``*SECRET*``, ``*_KEY``, ...) when written as ``NAME=value``, and the
password part of URLs (``https://user:pass@host`` -> ``https://user:***@host``). Everything
that writes a command line to a log or an error goes through it.
"""

from __future__ import annotations

import re

_SECRET_NAME = r"[A-Za-z_][A-Za-z0-9_]*(?:TOKEN|PASSWORD|PASSWD|SECRET|_KEY|APIKEY|CREDENTIALS?)[A-Za-z0-9_]*"
_ASSIGNMENT = re.compile(rf"(?i)(?<![A-Za-z0-9_])({_SECRET_NAME})=('[^']*'|\"[^\"]*\"|\S+)")
_URL_PASSWORD = re.compile(r"([a-z][a-z0-9+.-]*://[^\s:/@]+):([^\s@/]+)@", re.I)


def redact(text: str) -> str:
    """``text`` with secret values replaced by ``***``."""
    text = _ASSIGNMENT.sub(lambda m: f"{m.group(1)}=***", text)
    return _URL_PASSWORD.sub(r"\1:***@", text)
