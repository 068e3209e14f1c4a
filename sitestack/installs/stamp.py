"""An install's stamp (``<dest>/.sitestack/install.json``), its lock, and the question "is it done?".

The stamp is written last: it holds the digest of every input, so an install is done when the
stamp's digest is that of the current inputs and the recipe's sanity paths exist.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from sitestack.builders.pip import WHEEL_DIR
from sitestack.core.errors import SitestackError
from sitestack.core.host import Host
from sitestack.installs.inputs import digest, explain_change

STAMP = ".sitestack/install.json"
STAMP_FORMAT = 1


def read_stamp(host: Host, dest: str) -> dict[str, Any] | None:
    """The stamp of the install at ``dest``, or None."""
    return host.read_json(f"{dest}/{STAMP}")


def installed_wheel(host: Host, dest: str) -> str | None:
    """The wheel an install at ``dest`` came from (kept in the install), for installing it elsewhere."""
    stamp = read_stamp(host, dest)
    if not stamp or stamp.get("artefact", {}).get("kind") != "wheel":
        return None
    return f"{dest}/{WHEEL_DIR}/{stamp['artefact']['file']}"


def sanity_missing(host: Host, root: str, patterns: Sequence[str]) -> list[str]:
    """The sanity patterns with no match under ``root``."""
    script = ('cd "$1" 2>/dev/null || { echo "$1"; exit 0; }; shift; '
              'for p in "$@"; do compgen -G "$p" >/dev/null || echo "$p"; done')
    out = host.probe(["bash", "-c", script, "sitestack", root, *patterns])
    if out.rc != 0:
        raise SitestackError(f"cannot check {root}: {out.stderr.strip()}")
    return out.stdout.split()


def install_reason(host: Host, dest: str, inputs: Mapping[str, Any], sanity: Sequence[str]) -> str | None:
    """Why the install at ``dest`` is needed for ``inputs`` (None: it is done). Read-only."""
    text = host.read_text(f"{dest}/{STAMP}")
    if text is None:
        return "not installed" if not host.exists(dest) else f"no stamp in {dest} (unfinished or foreign install)"
    try:
        stamp = json.loads(text)
    except ValueError:
        return f"unreadable stamp {dest}/{STAMP}"
    if not isinstance(stamp, dict):
        return f"unreadable stamp {dest}/{STAMP}"
    if stamp.get("digest") != digest(inputs):
        return "inputs changed: " + explain_change(stamp.get("inputs", {}), inputs)
    missing = sanity_missing(host, dest, sanity)
    if missing:
        return f"sanity paths missing in {dest}: {', '.join(missing)}"
    return None


def lock_path(dest: str) -> str:
    """The install lock of ``dest``: a hidden file beside it (``dest`` itself is swapped)."""
    parent, base = os.path.split(dest)
    return f"{parent}/.{base}.lock"


@contextlib.contextmanager
def install_lock(host: Host, path: str, wait: float, report: Callable[[str], None] | None,
                 label: str) -> Iterator[None]:
    """Hold the install's lock; say who holds it when another run does, and wait up to ``wait`` seconds."""
    with host.lock(path, wait=wait, report=(lambda text: report(f"    {label}: waiting for the install lock ({text})"))
                   if report else None):
        yield
