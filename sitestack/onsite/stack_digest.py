"""The stack a validation validates: its module and the plan digest of its manifest (the stack's
generation), read on the node: the job records it (:mod:`.ddpcheck.provenance`) and ``fingerprint.py
--config`` prints it beside the host's fingerprint (:mod:`.fingerprint`)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from .fileio import ReadError, read_json
from .visible import NOT_VERSION, short_line

#: The largest stack manifest read (a manifest of a few hundred packages is well under 1 MiB).
MANIFEST_MAX = 64 << 20


def stack_record(config: Mapping[str, Any]) -> dict[str, Any]:
    """The stack the run validated: its module from check-config.json, and the plan digest of the manifest
    check-config.json names, read now (null where it is not readable): the history compares what ran, and
    the installed job's files do not depend on whether the stack was made before them."""
    stack: dict[str, Any] = config["stack"] if isinstance(config.get("stack"), dict) else {}
    return {"module": short_line(stack.get("module"), 200, NOT_VERSION), "digest": manifest_digest(stack.get("manifest"))}


def manifest_digest(path: object) -> str | None:
    """The plan digest of the stack manifest at ``path`` (sitestack.installs.venv_manifest.plan_digest:
    sha256 of the plan as sorted, indented JSON, 16 hex digits); None when there is none to read."""
    if not isinstance(path, str) or not path.startswith("/"):
        return None
    try:
        plan = read_json(path, MANIFEST_MAX).get("plan")
    except ReadError:
        return None
    if isinstance(plan, dict):
        text = json.dumps(plan, indent=2, sort_keys=True) + "\n"
        return hashlib.sha256(text.encode()).hexdigest()[:16]
    return None
