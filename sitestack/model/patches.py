"""Patches of a recipe: ``patches/<recipe>/*.patch``, each with a header saying where it comes
from (``Upstream:``), which versions it applies to (``Applies-to:``, a version range) and why
(``Why:``). The loader reads each listed file, checks its header against the recipe and records
its sha256 (it goes into the install's digest)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sitestack.core import schema, versions
from sitestack.core.errors import InputError
from sitestack.core.yamlfile import MarkedDict, display_path

PATCH_HEADER_KEYS = ("Upstream", "Applies-to", "Why")


def load_patches(patches: Sequence[Any], data: MarkedDict, shown: str, pdir: Path) -> None:
    """Fill each patch's ``sha256``, ``header`` and ``path`` from its file in ``pdir``.

    ``patches`` are the recipe's Patch entries, in the order of ``data["patches"]``; a missing
    file, a header without Upstream/Applies-to/Why, a ``versions`` that disagrees with the
    header or a bad range is an :class:`InputError` at the entry's line.
    """
    for i, patch in enumerate(patches):
        line = schema.line_of(data["patches"], i)
        where = f"{shown}:{line}"
        key = f"patches[{i}]"
        if "/" in patch.file or patch.file.startswith("."):
            raise InputError(where, f"a file name in {display_path(pdir)}, not a path: {patch.file!r}", key=f"{key}.file")
        file = pdir / patch.file
        if file.exists() and not file.is_file():   # a FIFO would block the read forever
            raise InputError(where, f"patch file {display_path(file)} is not a regular file", key=f"{key}.file")
        try:
            raw = file.read_bytes()
        except OSError:
            raise InputError(where, f"patch file {display_path(file)} not found", key=f"{key}.file") from None
        try:
            header = parse_patch_header(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise InputError(where, f"{display_path(file)}: {exc}", key=f"{key}.file") from None
        object.__setattr__(patch, "sha256", hashlib.sha256(raw).hexdigest())
        object.__setattr__(patch, "header", header)
        object.__setattr__(patch, "path", str(file))
        if patch.versions is not None and patch.versions != header["Applies-to"]:
            raise InputError(where, f"versions {patch.versions!r} disagrees with Applies-to {header['Applies-to']!r} "
                                    f"in {display_path(file)}", key=f"{key}.versions")
        if problem := versions.check_spec(patch.applies_to):
            raise InputError(where, f"Applies-to of {display_path(file)}: {problem}", key=f"{key}.versions")
    names = [p.file for p in patches]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise InputError(f"{shown}:{data.lines['patches']}", f"patch listed twice: {', '.join(dupes)}", key="patches")


def parse_patch_header(text: str) -> dict[str, str]:
    """The ``Key: value`` lines before the diff of a patch; Upstream, Applies-to and Why are required.

    A value continues on following lines indented by whitespace. The header ends at the first
    ``diff``, ``---``, ``Index:`` or ``From `` line.
    """
    header: dict[str, str] = {}
    last = None
    for line in text.splitlines():
        if line.startswith(("diff ", "--- ", "Index: ", "From ")) or line == "---":
            break
        if last and line[:1] in (" ", "\t") and line.strip():
            header[last] += " " + line.strip()
            continue
        m = re.match(r"^([A-Za-z][A-Za-z-]*):\s*(.*)$", line)
        if m:
            last = m.group(1)
            header[last] = m.group(2).strip()
        elif line.strip():
            last = None
    missing = [k for k in PATCH_HEADER_KEYS if not header.get(k)]
    if missing:
        raise ValueError(f"patch header lacks {', '.join(missing)} (every patch starts with "
                         "Upstream:, Applies-to: and Why: lines)")
    if "---" not in text and "diff " not in text:
        raise ValueError("no unified diff after the header")
    return header
