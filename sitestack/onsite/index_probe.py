"""Can the wheel index be reached from this host? Exit 0 if so, else print why and exit 3.

Run by any python3 on the host (``SITESTACK_INDEX_URL=URL python3 -c <this file's text> TIMEOUT``),
before pip is asked, so that an unreachable index is said plainly; standard library only, nothing
of sitestack. The URL comes in the environment, not on the command line: it may hold credentials
(``https://user:password@host/simple``), which ``ps`` would show every user; they are sent as
HTTP Basic authentication, as pip sends them, and never printed. A ``file://`` index must be a
directory; an HTTP index must answer ``<url>/torch/`` without a server error (a 404 is an answer:
the index is there). A bad URL or timeout is exit 2 with one line naming it.
"""

import base64
import os
import re
import sys
import urllib.error
import urllib.parse
import urllib.request

#: What the URL may be: http(s) or file, one line, bounded.
URL = re.compile(r"(https?|file)://[^\s'\"`$]{1,4096}")


def split_userinfo(url: str) -> "tuple[str, str | None]":
    """(the URL without its userinfo, an ``Authorization`` header value for it, or None)."""
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return url, None
    userinfo, _, host = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    token = f"{urllib.parse.unquote(user)}:{urllib.parse.unquote(password)}".encode()
    bare = urllib.parse.urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))
    return bare, "Basic " + base64.b64encode(token).decode()


def probe(url: str, timeout: float) -> "str | None":
    """None when the index at ``url`` answers, else the reason it does not (without the credentials)."""
    bare, auth = split_userinfo(url)
    try:
        if bare.startswith("file://"):
            path = urllib.request.url2pathname(bare[7:])
            if not os.path.isdir(path):
                raise OSError(f"no directory {path}")
        else:
            headers = {"User-Agent": "sitestack", **({"Authorization": auth} if auth else {})}
            req = urllib.request.Request(bare.rstrip("/") + "/torch/", headers=headers)
            urllib.request.urlopen(req, timeout=timeout).close()
    except urllib.error.HTTPError as exc:
        if exc.code >= 500:
            return f"HTTP {exc.code} {exc.reason}"
    except Exception as exc:
        return str(getattr(exc, "reason", None) or exc).replace(url, bare)
    return None


def main() -> int:
    url = os.environ.get("SITESTACK_INDEX_URL", "")
    if not URL.fullmatch(url):
        print("SITESTACK_INDEX_URL: must be one http(s) or file URL")
        return 2
    try:
        timeout = float(sys.argv[1]) if len(sys.argv) > 1 else 15.0
    except ValueError:
        timeout = -1.0
    if not 0 < timeout <= 3600:
        print("the timeout must be a number of seconds, 0 to 3600")
        return 2
    reason = probe(url, timeout)
    if reason is not None:
        print(reason)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
