"""Can the wheel index be reached from this host? Exit 0 if so, else print why and exit 3.

Run by any python3 on the host (``python3 -c <this file's text> URL TIMEOUT``), before pip is
asked, so that an unreachable index is said plainly; standard library only, nothing of sitestack.
A ``file://`` index must be a directory; an HTTP index must answer ``<url>/torch/`` without a
server error (a 404 is an answer: the index is there).
"""

import os
import sys
import urllib.error
import urllib.request


def probe(url: str, timeout: float) -> "str | None":
    """None when the index at ``url`` answers, else the reason it does not."""
    try:
        if url.startswith("file://"):
            path = urllib.request.url2pathname(url[7:])
            if not os.path.isdir(path):
                raise OSError(f"no directory {path}")
        else:
            req = urllib.request.Request(url.rstrip("/") + "/torch/", headers={"User-Agent": "sitestack"})
            urllib.request.urlopen(req, timeout=timeout).close()
    except urllib.error.HTTPError as exc:
        if exc.code >= 500:
            return f"HTTP {exc.code} {exc.reason}"
    except Exception as exc:
        return str(getattr(exc, "reason", None) or exc)
    return None


if __name__ == "__main__":
    reason = probe(sys.argv[1], float(sys.argv[2]))
    if reason is not None:
        print(reason)
        sys.exit(3)
