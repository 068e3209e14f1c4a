"""Fill a fresh venv from a template venv:
``python -c <this file's text> TEMPLATE NEW OLD_ROOT MODE [OLD_WHEEL=NEW_WHEEL ...]``.

Run on the host by any Python 3 (standard library only; it imports nothing of sitestack).
``NEW`` was just made by ``python -m venv`` from the same base interpreter; ``TEMPLATE`` is a copy of
a complete environment that was built at ``OLD_ROOT``. Every file of the template that ``NEW`` does
not have yet is added:

- a script in ``bin/`` whose first line names ``OLD_ROOT`` (pip writes ``#!OLD_ROOT/bin/python``)
  is written anew with ``NEW`` in its place, and the RECORD line of each such script gets the new
  file's sha256 and size, as pip would have written them (the RECORD is a new file too);
- a ``direct_url.json`` naming ``file://OLD_WHEEL`` (a wheel sitestack built, installed from its
  install in another prefix) is written anew naming ``file://NEW_WHEEL``, the same wheel here (and
  its RECORD line too);
- any other file is hard-linked (``MODE`` ``link``; a copy where the file system refuses a link)
  or copied (``MODE`` ``copy``). Files are never written in place, so the template stays intact.

Bytecode comes along: Python fixes a cached module's file name when it loads it, so a ``.pyc``
does not name the template. Prints one line of JSON: counts of linked, copied and rewritten files;
or, exit code 3, why not: the template's ``pyvenv.cfg`` names another base interpreter.
"""

import base64
import glob
import hashlib
import json
import os
import shutil
import sys


def record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def rewrite_script(src: str, old: bytes, new: bytes) -> "bytes | None":
    """The script with its interpreter line pointing into NEW, or None when it does not name OLD."""
    with open(src, "rb") as handle:
        data = handle.read()
    first, sep, rest = data.partition(b"\n")
    if not first.startswith(b"#!") or old not in first:
        return None
    return first.replace(old, new) + sep + rest


#: The pyvenv.cfg keys that say which interpreter a venv is for: a template for another one is refused.
SAME = ("home", "version", "version_info", "include-system-site-packages")


def interpreter(root: str) -> "dict[str, str]":
    out = {}
    with open(os.path.join(root, "pyvenv.cfg"), encoding="utf-8") as handle:
        for line in handle:
            key, sep, value = line.partition("=")
            if sep and key.strip() in SAME:
                out[key.strip()] = value.strip()
    return out


#: A direct_url.json (PEP 610) is a few hundred bytes; a larger one is copied as it is, never parsed.
DIRECT_URL_MAX_BYTES = 1 << 16


def moved_url(src: str, moved: "dict[str, str]") -> "bytes | None":
    """A direct_url.json naming a moved wheel, naming it where it is now; None when it names none (or is
    no direct_url.json sitestack can read: too large, not JSON, not an object with a string url)."""
    with open(src, "rb") as handle:
        raw = handle.read(DIRECT_URL_MAX_BYTES + 1)
    try:
        data = json.loads(raw.decode("utf-8")) if len(raw) <= DIRECT_URL_MAX_BYTES else None
    except ValueError:  # UnicodeDecodeError is one
        return None
    if not isinstance(data, dict):
        return None
    url = data.get("url", "")
    for old, new in moved.items():
        if url == "file://" + old:
            data["url"] = "file://" + new
            return json.dumps(data, sort_keys=True).encode()
    return None


def clone(template: str, new: str, old_root: str, mode: str, moved: "dict[str, str]") -> "dict[str, int]":
    counts = {"linked": 0, "copied": 0, "rewritten": 0}
    rewritten: dict[str, bytes] = {}  # absolute path in NEW -> new content
    old, fresh = os.fsencode(old_root.rstrip("/")), os.fsencode(new.rstrip("/"))
    for root, dirs, files in os.walk(template):
        rel = os.path.relpath(root, template)
        target_dir = os.path.join(new, rel) if rel != "." else new
        os.makedirs(target_dir, exist_ok=True)
        for name in dirs:
            src = os.path.join(root, name)
            if os.path.islink(src):  # e.g. lib64 -> lib: venv made it already, or make the same link
                dst = os.path.join(target_dir, name)
                if not os.path.lexists(dst):
                    os.symlink(os.readlink(src), dst)
        for name in files:
            src, dst = os.path.join(root, name), os.path.join(target_dir, name)
            if os.path.lexists(dst):
                continue  # made by venv for this interpreter (pyvenv.cfg, bin/python, activate scripts)
            if os.path.islink(src):
                os.symlink(os.readlink(src), dst)
                continue
            data = None
            if rel == "bin":
                data = rewrite_script(src, old, fresh)
            elif name == "direct_url.json" and moved:
                data = moved_url(src, moved)
            if data is not None:  # a new file with the new content, the template's modes and times
                with open(dst, "wb") as handle:
                    handle.write(data)
                shutil.copystat(src, dst)
                rewritten[os.path.realpath(dst)] = data
                counts["rewritten"] += 1
                continue
            if mode == "link":
                try:
                    os.link(src, dst)
                    counts["linked"] += 1
                    continue
                except OSError:
                    pass  # another file system, or links refused: copy
            shutil.copy2(src, dst)
            counts["copied"] += 1
    fix_records(new, rewritten)
    return counts


def fix_records(new: str, rewritten: "dict[str, bytes]") -> None:
    """Point the RECORD lines of rewritten files at their new content (RECORD replaced, not edited)."""
    if not rewritten:
        return
    for root in glob.glob(os.path.join(new, "lib", "python*", "site-packages", "*.dist-info")):
        path = os.path.join(root, "RECORD")
        if not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().splitlines(keepends=True)
        changed = False
        for i, line in enumerate(lines):
            entry = line.rstrip("\n").rsplit(",", 2)
            if len(entry) != 3:
                continue
            target = os.path.realpath(os.path.join(os.path.dirname(root), entry[0]))
            if target in rewritten:
                data = rewritten[target]
                lines[i] = f"{entry[0]},{record_hash(data)},{len(data)}\n"
                changed = True
        if changed:
            tmp = path + ".sitestack-tmp"
            with open(tmp, "w", encoding="utf-8") as handle:
                handle.writelines(lines)
            shutil.copymode(path, tmp)
            os.replace(tmp, path)  # a new inode: the template's RECORD is untouched


if __name__ == "__main__":
    theirs, ours = interpreter(sys.argv[1]), interpreter(sys.argv[2])
    if theirs != ours:
        print(json.dumps({"refused": f"the template is for another interpreter: {theirs} (this venv: {ours})"}))
        sys.exit(3)
    pairs = dict(arg.split("=", 1) for arg in sys.argv[5:])
    print(json.dumps(clone(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], pairs)))
