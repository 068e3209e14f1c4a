"""Keep secrets out of everything sitestack writes or prints: the one implementation.

- :func:`redact` hides, in any text (a log line, a message, a command line, a command's output):
  the values of variables whose names look secret (``*TOKEN*``, ``*PASSWORD*``, ``*SECRET*``,
  ``*_KEY``, ...) written as ``NAME=value``; the whole userinfo of a URL, whether ``user:password@``
  or a bare ``token@`` (``https://user:pw@host/simple`` -> ``https://***@host/simple``: the scheme,
  host and path stay, so the reader still sees which index); the values of query parameters whose
  names look secret (``?token=``, ``&X-Amz-Signature=``); and anaconda.org's path tokens
  (``/t/TOKEN/``). A URL's ``git@`` user is no secret and stays (as pip's own redaction keeps it:
  https://packaging.python.org/en/latest/specifications/direct-url/#specification).
- :func:`redact_data` does the same to every string of a JSON-like document (``--json``, stamps,
  manifests).
- :func:`fingerprint` is what a stamp keeps instead of the secrets, so that a changed password
  still changes the stamp's digest: a salted, slow hash (PBKDF2), never the secret itself.
- :func:`split_credentials` takes the userinfo out of a URL, for passing it to pip by environment
  (:mod:`sitestack.core.pip_auth`) rather than on a command line or in a file.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Iterable
from typing import Any

MASK = "***"

#: ``NAME=value`` (a name is matched whole, once per run of name characters) and the words that make
#: a name secret, asked of that name alone: a pattern with the words between two runs of name
#: characters would try each split of a long run again, quadratic in its length.
#: A URL's query parameter (after ``?``, ``&`` or ``;``) is :data:`_QUERY`'s, which stops at the next ``&``.
_ASSIGNMENT = re.compile(r"(?<![A-Za-z0-9_?&;])([A-Za-z_][A-Za-z0-9_]*)=('[^']*'|\"[^\"]*\"|\S+)")
_SECRET_WORD = re.compile(r"TOKEN|PASSWORD|PASSWD|SECRET|_KEY|APIKEY|CREDENTIAL", re.I)
#: ``scheme://USERINFO@`` (or ``scheme:/``, as a path option normalised it): userinfo is everything up to the last ``@`` before the host's first ``/``,
#: ``?`` or ``#`` (RFC 3986 3.2.1; a password may hold ``@`` only percent-encoded, but a careless one
#: is still hidden whole). Bounded character classes, no nesting: linear time on any input.
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]{0,30}:/{1,3})([^\s/?#@'\"<>]{1,2048}(?:@[^\s/?#@'\"<>]{1,2048})*)@")
#: Query parameters whose names look secret (a signed URL's signature, an index's ``?token=``).
_QUERY = re.compile(r"(?i)([?&;](?:[a-z0-9_.-]{0,40}(?:token|passw(?:or)?d|pwd|secret|signature|sig|apikey|api_key"
                    r"|access_key|credential|auth)[a-z0-9_.-]{0,40})=)([^&#\s'\"]+)")
#: anaconda.org's channel tokens: ``https://conda.anaconda.org/t/TOKEN/channel``.
_PATH_TOKEN = re.compile(r"(?i)(://[^\s/]{1,255}/t/)([^\s/]+)")
#: The userinfo of a URL that is not a secret (PEP 610 keeps it).
_PUBLIC_USERS = ("git",)


def _userinfo(match: re.Match[str]) -> str:
    return match.group(0) if match.group(2) in _PUBLIC_USERS else f"{match.group(1)}{MASK}@"


def _assignment(match: re.Match[str]) -> str:
    return f"{match.group(1)}={MASK}" if _SECRET_WORD.search(match.group(1)) else match.group(0)


def redact(text: str) -> str:
    """``text`` with secret values replaced by ``***`` (see the module's docstring)."""
    if not text:
        return text
    text = _ASSIGNMENT.sub(_assignment, text)
    if ":/" in text:   # a path normalised by os.path keeps one slash of ://
        text = _USERINFO.sub(_userinfo, text)
        text = _PATH_TOKEN.sub(rf"\1{MASK}", text)
    if "=" in text:
        text = _QUERY.sub(rf"\1{MASK}", text)
    return text


def redact_data(data: Any) -> Any:
    """``data`` (dicts, lists, tuples, strings, numbers) with every string, keys included, redacted."""
    if isinstance(data, str):
        return redact(data)
    if isinstance(data, dict):
        return {redact(k) if isinstance(k, str) else k: redact_data(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [redact_data(v) for v in data]
    return data


def has_secret(text: str) -> bool:
    """Whether :func:`redact` would hide anything in ``text``."""
    return redact(text) != text


def split_credentials(url: str) -> tuple[str, str | None]:
    """``(url without its userinfo, the userinfo)``; the userinfo is None where the URL has none
    (or only a public one such as ``git@``). ``https://u:p@h/s`` -> ``("https://h/s", "u:p")``."""
    match = _USERINFO.match(url)
    if match is None or match.group(2) in _PUBLIC_USERS:
        return url, None
    return match.group(1) + url[match.end():], match.group(2)


#: PBKDF2 rounds of :func:`fingerprint`: a stamp is readable by every user of a shared prefix, so a
#: weak password must not be cheap to guess from it (OWASP's password storage cheat sheet,
#: https://cheatsheetseries.owasp.org/cheatsheets/Password_Storage_Cheat_Sheet.html). ~0.1 s per run.
ROUNDS = 200_000


def secrets_in(texts: Iterable[str]) -> list[str]:
    """The secret parts of ``texts`` (userinfo, secret query values, path tokens, secret assignments),
    in order, as :func:`redact` would hide them."""
    found: list[str] = []
    for text in texts:
        found += [m.group(2) for m in _ASSIGNMENT.finditer(text) if _SECRET_WORD.search(m.group(1))]
        found += [m.group(2) for m in _USERINFO.finditer(text) if m.group(2) not in _PUBLIC_USERS]
        found += [m.group(2) for m in _QUERY.finditer(text)]
        found += [m.group(2) for m in _PATH_TOKEN.finditer(text)]
    return found


def redact_known(text: str, sources: Iterable[str]) -> str:
    """:func:`redact` ``text``, and hide in it, wherever they appear, the secrets of ``sources`` and
    each part of a userinfo (a library's message may quote a password alone: urllib's "nonnumeric
    port: 'PASSWORD@host'")."""
    parts = {p for s in secrets_in(sources) for p in (s, *s.split(":")[1:]) if len(p) >= 3}   # not the user name
    for part in sorted(parts, key=len, reverse=True):
        text = text.replace(part, MASK)
    return redact(text)


def fingerprint(texts: Iterable[str]) -> str | None:
    """A digest of the secrets in ``texts`` (None: there are none) for a stamp to keep in their place:
    it changes when a secret changes, and it does not give the secret away (PBKDF2-SHA256, salted with
    the redacted texts, :data:`ROUNDS` rounds)."""
    return _fingerprint(tuple(texts))


@functools.lru_cache(maxsize=64)
def _fingerprint(texts: tuple[str, ...]) -> str | None:
    found = secrets_in(texts)
    if not found:
        return None
    salt = ("sitestack\0" + "\0".join(redact(t) for t in texts)).encode()
    key = hashlib.pbkdf2_hmac("sha256", "\0".join(found).encode(), salt, ROUNDS)
    return "pbkdf2-sha256:" + key.hex()[:32]
