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
from sitestack.installs.inputs import digest, explain_change, recorded_paths, spelled_as_before

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
    """Why the install at ``dest`` is needed for ``inputs`` (None: it is done). Read-only, but for a
    stamp of an older sitestack that names the same tools by their ``PATH`` spelling (:func:`restamped`):
    on a writable host (the caller holds the install lock) it is brought to the current form."""
    stamp = host.read_json(f"{dest}/{STAMP}")   # bounded, never waits on a FIFO; a bad one reads as missing
    if stamp is None:
        if host.exists(f"{dest}/{STAMP}"):
            return f"unreadable stamp {dest}/{STAMP}"
        return "not installed" if not host.exists(dest) else f"no stamp in {dest} (unfinished or foreign install)"
    if stamp.get("digest") != digest(inputs) and not restamped(host, dest, stamp, inputs):
        return "inputs changed: " + explain_change(stamp.get("inputs", {}), inputs)
    missing = sanity_missing(host, dest, sanity)
    if missing:
        return f"sanity paths missing in {dest}: {', '.join(missing)}"
    return None


def restamped(host: Host, dest: str, stamp: Mapping[str, Any], inputs: Mapping[str, Any]) -> bool:
    """Whether a stamp whose digest is not that of ``inputs`` differs only in how an older sitestack
    recorded the same tools (:func:`sitestack.installs.inputs.spelled_as_before`; its paths resolved on
    the host now). Then the install is current: upgrading sitestack rebuilds nothing, and the stamp gets
    the current digest and inputs where the host is writable (else the next writable run does it)."""
    old, build = stamp.get("inputs", {}), inputs.get("build", {})
    if not isinstance(old, dict) or "toolchain" not in build or old.get("build", {}).get("toolchain") == build["toolchain"]:
        return False
    bare = {**inputs, "build": {**build, "toolchain": old.get("build", {}).get("toolchain")}}
    if digest(old) != digest(bare):
        return False   # something besides the toolchain changed: no need to look closer
    paths = recorded_paths(old)
    out = host.probe(["sh", "-c", 'for p; do r=$(readlink -f -- "$p") || r=$p; printf "%s\\n" "$r"; done', "sh",
                      *paths])
    real = dict(zip(paths, out.stdout.splitlines())) if out.ok else {}
    if digest(spelled_as_before(old, inputs, real)) != digest(inputs):
        return False
    if not host.read_only:
        host.write_text(f"{dest}/{STAMP}", json.dumps({**stamp, "digest": digest(inputs), "inputs": inputs},
                                                      indent=2, sort_keys=True) + "\n")
    return True


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
