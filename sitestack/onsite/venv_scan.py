"""List every distribution in one site-packages directory, as JSON on stdout.

Run by the stack environment's own interpreter (``python -c <this file's text> SITE_PACKAGES [GLOB...]``),
so it uses the standard library only and imports nothing of sitestack. Output: one line,
``{"python": "3.11.7", "packages": [{"name", "version", "dist_info", "record_sha256", "installer",
"direct_url"}, ...], "base": [{"name", "version", "location"}, ...], "files": [...]}``; ``files``: the
paths, relative to SITE_PACKAGES, of the files each GLOB (relative to it too) matches there (the
communication libraries a distribution ships: ``venv_manifest.BUNDLED``). The RECORD digest lets the manifest
notice a distribution whose files were replaced in place. ``installer`` (the INSTALLER file: pip,
uv, conda) and ``direct_url`` (``{"url", "sha256"}`` from direct_url.json, PEP 610: installed from
a file or URL, not an index) are the installed metadata the manifest's origins come from (not the
REQUESTED file: uv writes one for dependencies too, astral-sh/uv#13278). ``base`` lists what the interpreter sees from outside the
environment (its other ``sys.path`` directories): a container stack's torch and numpy come from the
image (``--system-site-packages``), and the validation job imports them all the same.
"""

import glob
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


def scan(sp: str) -> "list[dict[str, object]]":
    """One entry per ``*.dist-info``/``*.egg-info`` directory in ``sp``, sorted by directory name."""
    out: list[dict[str, object]] = []  # not evaluated: any Python 3 runs this
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
        out.append({"name": name or n.split("-")[0], "version": version, "dist_info": n, "record_sha256": digest,
                    "installer": read_first_line(os.path.join(d, "INSTALLER")), "direct_url": direct_url(d)})
    return out


def read_first_line(path: str) -> "str | None":
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.readline().strip() or None
    except OSError:
        return None


#: The most of a direct_url.json that is read.
DIRECT_URL_MAX_BYTES = 1 << 16


def direct_url(d: str) -> "dict[str, str | None] | None":
    """``{"url", "sha256"}`` of the dist-info's direct_url.json (PEP 610), or None."""
    try:
        with open(os.path.join(d, "direct_url.json"), "rb") as f:
            raw = f.read(DIRECT_URL_MAX_BYTES + 1)
        # a few hundred bytes (PEP 610); a larger one is not read as one
        data = json.loads(raw.decode("utf-8")) if len(raw) <= DIRECT_URL_MAX_BYTES else None
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("url"), str):
        return None
    archive = data.get("archive_info")
    archive = archive if isinstance(archive, dict) else {}
    hashes = archive.get("hashes")
    hashes = hashes if isinstance(hashes, dict) else {}
    sha = hashes.get("sha256") or (str(archive.get("hash", "")).partition("=")[2] or None)
    return {"url": data["url"], "sha256": sha}


def base(sp: str) -> "list[dict[str, str | None]]":
    """Name, version and location (the ``sys.path`` entry) of each distribution in the ``sys.path`` directories other than ``sp``
    (the first found of a name wins, as for imports)."""
    seen: dict[str, dict[str, str | None]] = {}  # not evaluated: any Python 3 runs this
    for entry in sys.path:
        if not entry or not os.path.isdir(entry) or os.path.realpath(entry) == os.path.realpath(sp):
            continue
        for n in sorted(os.listdir(entry)):
            if n.endswith(".dist-info") or n.endswith(".egg-info"):
                d = os.path.join(entry, n)
                name, version = read_name_version(os.path.join(d, "METADATA" if n.endswith(".dist-info") else "PKG-INFO"))
                seen.setdefault((name or n.split("-")[0]).lower(), {"name": name or n.split("-")[0], "version": version,
                                                                    "location": entry})
    return [seen[k] for k in sorted(seen)]


def files(sp: str, patterns: "list[str]") -> "list[str]":
    """The files under ``sp`` that ``patterns`` (relative globs) match, relative to ``sp``, sorted, once each."""
    found: set[str] = set()  # not evaluated: any Python 3 runs this
    for pattern in patterns:
        found.update(os.path.relpath(path, sp) for path in glob.glob(os.path.join(glob.escape(sp), pattern))
                     if os.path.isfile(path))
    return sorted(found)


if __name__ == "__main__":
    print(json.dumps({"python": "{}.{}.{}".format(*sys.version_info[:3]), "packages": scan(sys.argv[1]),
                      "base": base(sys.argv[1]), "files": files(sys.argv[1], sys.argv[2:])}))
