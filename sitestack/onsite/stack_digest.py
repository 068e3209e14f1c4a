"""The stack a validation validates: its module and the plan digest of its manifest (the stack's
generation), read on the node: the job records it (:mod:`.ddpcheck.provenance`) and ``fingerprint.py
--config`` prints it beside the host's fingerprint (:mod:`.fingerprint`)."""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from typing import Any

from .fileio import ReadError, read_json
from .visible import NOT_VERSION, short_line

#: The manifest's name inside each generation of a stack (``<path>.manifest.json`` links to the current one's).
MANIFEST = ".sitestack-manifest.json"
#: Names a generation of a stack still pending validation (a directory beside the stack's stable link) for
#: the validation job to load: the stack's module file loads it instead of the link's target
#: (modulefiles/base.lua.j2, base.tcl.j2); any other value is ignored there.
PENDING_VAR = "SITESTACK_PENDING_GENERATION"

#: The largest stack manifest read (a manifest of a few hundred packages is well under 1 MiB).
MANIFEST_MAX = 64 << 20


def stack_record(config: Mapping[str, Any]) -> dict[str, Any]:
    """The stack the run validated: its module from check-config.json, and the plan digest of the manifest
    check-config.json names, read now (null where it is not readable): the history compares what ran, and
    the installed job's files do not depend on whether the stack was made before them."""
    stack: dict[str, Any] = config["stack"] if isinstance(config.get("stack"), dict) else {}
    return {"module": short_line(stack.get("module"), 200, NOT_VERSION),
            "digest": manifest_digest(loaded_manifest(stack, os.environ))}


def generation_var(module: str) -> str:
    """The variable in which a stack's module, once loaded, keeps the real path of the generation it loaded
    (``__SITESTACK_GENERATION_PYTORCH`` for ``pytorch/...``): the family with every character that may not
    be in a variable name made ``_``, upper-cased."""
    return "__SITESTACK_GENERATION_" + re.sub(r"[^A-Za-z0-9_]", "_", module.split("/", 1)[0]).upper()


def loaded_manifest(stack: Mapping[str, Any], environ: Mapping[str, str]) -> object:
    """The manifest of the generation the stack's loaded module resolved (:func:`generation_var`), where that
    is a generation of the stack's own path (a job run on a generation pending validation records that one),
    else the stack's stable manifest (``<path>.manifest.json``) as check-config.json names it."""
    manifest, module = stack.get("manifest"), stack.get("module")
    if not (isinstance(manifest, str) and manifest.endswith(".manifest.json") and isinstance(module, str)):
        return manifest
    parent, leaf = os.path.split(manifest[:-len(".manifest.json")])
    root = environ.get(generation_var(module), "")
    if os.path.dirname(root) == parent and os.path.basename(root).startswith(f".{leaf}.gen-"):
        return f"{root}/{MANIFEST}"
    return manifest


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
