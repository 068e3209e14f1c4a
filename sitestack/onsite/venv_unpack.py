"""Fix up a venv unpacked from a sitestack pack at a new place (the venv's ``conda-unpack``).

Shipped inside the pack as ``.sitestack-unpack.py`` and run on each node by the unpacked
environment's own interpreter: ``<new>/bin/python <new>/.sitestack-unpack.py``. It imports
nothing of sitestack (it runs with the stack's Python on a compute node).

A venv's interpreter finds its prefix from the ``pyvenv.cfg`` beside ``bin/python``, wherever the
tree lies, so ``import torch`` works from the copy as it is. What names the old prefix, and is
rewritten here: the ``#!`` line of scripts in ``bin/`` (pip writes the interpreter's absolute
path), the activate scripts (``VIRTUAL_ENV=...``), and ``.pth`` files in site-packages. The old
prefixes come from ``.sitestack-pack.json`` beside this file. Binary files are left alone (a
compiled extension never embeds the venv's path; conda-unpack has binary placeholders because
conda packages do). Exit 0 when done, 1 with a message when the tree is not a sitestack pack.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile

#: The pack's own files, at its top level beside the environment: this program and the record of the
#: prefixes it replaces (both written by the controller's packer, sitestack/installs/staging.py).
PROGRAM = ".sitestack-unpack.py"
RECORD = ".sitestack-pack.json"
#: The fix-up conda-pack puts into its packs instead, relative to an unpacked copy
#: (https://conda.github.io/conda-pack/, "conda-unpack").
CONDA_UNPACK = "bin/conda-unpack"
#: The record names a few prefixes: one larger than this was not written by the packer.
RECORD_MAX_BYTES = 1 << 20


def old_prefixes(root: str) -> list[str]:
    """The absolute prefixes the record beside ``root`` names; a :class:`ValueError` saying what is wrong
    with a record that is too large, not JSON, or names anything else (it is read back from a shared
    file system: nothing in it is rewritten into files unchecked)."""
    path = os.path.join(root, RECORD)
    with open(path, "rb") as handle:
        data = handle.read(RECORD_MAX_BYTES + 1)
    if len(data) > RECORD_MAX_BYTES:
        raise ValueError(f"{path}: larger than {RECORD_MAX_BYTES} bytes")
    try:
        record = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"{path}: not JSON ({e})") from None
    prefixes = record.get("prefixes") if isinstance(record, dict) else None
    if not (isinstance(prefixes, list) and prefixes
            and all(isinstance(p, str) and p.startswith("/") and "\0" not in p and len(p) < 4096 for p in prefixes)):
        raise ValueError(f"{path}: \"prefixes\" must be a non-empty list of absolute paths")
    return prefixes


def rewrite(path: str, old: list[str], new: str, *, first_line_only: bool) -> bool:
    """Replace each old prefix by ``new`` in a text file (only its first line for scripts); True if changed."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError:
        return False
    if b"\0" in data[:1024]:
        return False  # a binary
    head, sep, tail = data.partition(b"\n") if first_line_only else (data, b"", b"")
    if first_line_only and not head.startswith(b"#!"):
        return False
    changed = head
    for prefix in old:
        # Longest first (the caller sorts them), so a prefix of another prefix cannot cut it.
        changed = changed.replace(prefix.encode(), new.encode())
    if changed == head:
        return False
    replace_file(path, changed + sep + tail, os.stat(path).st_mode & 0o7777)
    return True


def replace_file(path: str, data: bytes, mode: int) -> None:
    """``path`` replaced by ``data`` with ``mode``, atomically: a new temporary file of a unique name in
    the same directory (every node of a job may run this over one shared tree at once), renamed over
    it, and removed on any failure. This program ships as one file and cannot import the on-site
    package's writer (``sitestack/onsite/fileio.py``), so it keeps this one; no fsync: a node that
    crashes runs the fix-up again."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            os.fchmod(handle.fileno(), mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def fix_up(root: str) -> int:
    """Rewrite the old prefixes under ``root``; the number of files changed."""
    old = sorted((p for p in old_prefixes(root) if p != root), key=len, reverse=True)
    if not old:
        return 0
    count = 0
    bindir = os.path.join(root, "bin")
    for name in sorted(os.listdir(bindir)):
        path = os.path.join(bindir, name)
        if os.path.islink(path) or not os.path.isfile(path):
            continue  # bin/python links to the base interpreter, which stays where it is
        whole = name.startswith("activate") or name == "Activate.ps1"
        count += rewrite(path, old, root, first_line_only=not whole)
    lib = os.path.join(root, "lib")
    for dirpath, _dirs, files in os.walk(lib):
        if os.path.basename(dirpath) != "site-packages":
            continue
        for name in files:
            if name.endswith(".pth"):
                count += rewrite(os.path.join(dirpath, name), old, root, first_line_only=False)
    return count


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    root = os.path.realpath(args[0] if args else os.path.dirname(os.path.abspath(__file__)))
    if not os.path.isfile(os.path.join(root, RECORD)):
        print(f"sitestack-unpack: {root} is not an unpacked sitestack pack (no {RECORD})", file=sys.stderr)
        return 1
    try:
        changed = fix_up(root)
    except (OSError, ValueError) as e:
        print(f"sitestack-unpack: {e}", file=sys.stderr)
        return 1
    print(f"sitestack-unpack: {root}: {changed} files point at the new prefix")
    return 0


if __name__ == "__main__":
    sys.exit(main())
