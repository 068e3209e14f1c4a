"""Keep secrets out of logs and messages.

:func:`redact` hides the values of variables whose names look secret (``*TOKEN*``,
``*PASSWORD*``, ``*SECRET*``, ``*_KEY``, ...) when written as ``NAME=value``, and the
password part of URLs (``https://user:pass@host`` -> ``https://user:***@host``). Everything
that writes a command line to a log or an error goes through it.
"""

from __future__ import annotations

import re

_SECRET_NAME = r"[A-Za-z_][A-Za-z0-9_]*(?:TOKEN|PASSWORD|PASSWD|SECRET|_KEY|APIKEY|CREDENTIALS?)[A-Za-z0-9_]*"
# Linear in the text: a name is matched whole (one try per run of name characters, then "="), and
# whether it looks secret is asked of that name alone (the secret pattern over a run of name
# characters would be tried again at each split of the run); a URL's password is found from its
# "://" (after a scheme character), not from each character of a long run that might be a scheme.
_ASSIGNMENT = re.compile(r"(?<![A-Za-z0-9_])([A-Za-z_][A-Za-z0-9_]*)=('[^']*'|\"[^\"]*\"|\S+)")
_SECRET = re.compile(rf"(?i){_SECRET_NAME}")
_URL_PASSWORD = re.compile(r"(?<=[a-z0-9+.-])(://[^\s:/@]+):([^\s@/]+)@", re.I)


def _hide(match: re.Match[str]) -> str:
    return f"{match.group(1)}=***" if _SECRET.fullmatch(match.group(1)) else match.group()


def redact(text: str) -> str:
    """``text`` with secret values replaced by ``***``."""
    text = _ASSIGNMENT.sub(_hide, text)
    return _URL_PASSWORD.sub(r"\1:***@", text)
