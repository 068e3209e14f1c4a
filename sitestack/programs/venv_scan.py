"""List every distribution in one site-packages directory, as JSON on stdout.

Run by the stack environment's own interpreter (``python -c <this file's text> SITE_PACKAGES``),
so it uses the standard library only and imports nothing of sitestack. Output: one line,
``{"python": "3.11.7", "packages": [{"name", "version", "dist_info", "record_sha256"}, ...]}``;
the RECORD digest lets the manifest notice a distribution whose files were replaced in place.
"""

import hashlib
import json
import os
import sys


def read_name_version(meta: str) -> "tuple[str | None, str | None]":
    """Name and Version from the header of a METADATA/PKG-INFO file (None where absent or unreadable)."""
    name = version = None
    try:
        with open(meta, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("Name:") and name is None:
                    name = line.split(":", 1)[1].strip()
                elif line.startswith("Version:") and version is None:
                    version = line.split(":", 1)[1].strip()
                elif not line.strip():
                    break  # the header ends at the first blank line; the rest is the description
    except OSError:
        pass
    return name, version


def scan(sp: str) -> "list[dict[str, str | None]]":
    """One entry per ``*.dist-info``/``*.egg-info`` directory in ``sp``, sorted by directory name."""
    out: list[dict[str, str | None]] = []  # not evaluated: any Python 3 runs this
    names = sorted(n for n in os.listdir(sp) if n.endswith(".dist-info") or n.endswith(".egg-info"))
    for n in names:
        d = os.path.join(sp, n)
        meta = os.path.join(d, "METADATA") if n.endswith(".dist-info") else os.path.join(d, "PKG-INFO")
        name, version = read_name_version(meta)
        record = os.path.join(d, "RECORD")
        digest = None
        if os.path.isfile(record):
            with open(record, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
        out.append({"name": name or n.split("-")[0], "version": version, "dist_info": n, "record_sha256": digest})
    return out


if __name__ == "__main__":
    print(json.dumps({"python": "{}.{}.{}".format(*sys.version_info[:3]), "packages": scan(sys.argv[1])}))
