"""Check results kept with a build-cache entry, so a cached install into another prefix need not
run its checks again when everything they depend on is the same.

A recipe's checks (``horovodrun --check-build``, 2-rank allreduces) test the artefact against the
host's MPI, interpreter and torch; they do not test the prefix. Their result is therefore kept
beside the artefact in the cache entry, under a key (:func:`check_key`) made of everything the
result depends on:

- the artefact's sha256 (the same bytes installed);
- the build inputs (:func:`sitestack.installs.inputs.build_inputs`): the site modules, the
  ``--version`` lines of the toolchain (the build interpreter, the MPI compiler wrapper), and the
  plan's environment, which Horovod's hooks make record the torch it was built against;
- the checks themselves, resolved (argv, environment, expected text; the interpreter by path);
- the MPI launcher the checks start and the host's machine architecture (``uname -m``).

Any difference gives another key, so the checks run again. ``--rebuild``/``--no-cache`` always run
them (and keep the new result). Only a run in which every check passed is kept (a check skipped
outside a Slurm allocation is not a pass). One file per key (``checks-<key>.json``, written
atomically), so concurrent installs into other prefixes never overwrite each other's result.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from sitestack.core.host import Host
from sitestack.installs.inputs import digest
from sitestack.installs.target import Target


def check_key(host: Host, target: Target, inputs: Mapping[str, Any], sha256: str) -> str:
    """The digest of everything the recipe's check results depend on (see the module)."""
    arch = host.probe(["uname", "-m"])
    return digest({
        "sha256": sha256,
        "build": inputs["build"],
        "checks": inputs["install"]["checks"],
        "launcher": target.facts.mpi.launcher,
        "arch": arch.stdout.strip() if arch.ok else "",
    })


def check_file(entry: str, key: str) -> str:
    """Where the result for ``key`` is kept in the cache entry ``entry``."""
    return f"{entry}/checks-{key[:32]}.json"


def vouched(host: Host, entry: str, key: str) -> list[dict[str, Any]] | None:
    """The kept results for ``key`` (each marked as vouched for by the cache), or None: run the checks."""
    path = check_file(entry, key)
    doc = host.read_json(path)
    if doc is None:
        return None
    try:
        results = doc["checks"]
        ok = doc["key"] == key and all(isinstance(r, dict) and r.get("ok") is True for r in results)
    except (ValueError, KeyError, TypeError):
        return None
    if not ok:
        return None
    return [{**r, "vouched": {"by": path, "checked": doc.get("checked", {})}} for r in results]


def keep(host: Host, entry: str, key: str, results: Sequence[Mapping[str, Any]], checked: Mapping[str, Any]) -> None:
    """Keep ``results`` for ``key`` when every check passed (``checked``: where and when they ran)."""
    if not results or not all(r.get("ok") is True and "vouched" not in r for r in results):
        return
    if not host.exists(entry):
        return
    doc = {"key": key, "checks": [dict(r) for r in results], "checked": dict(checked)}
    host.write_text(check_file(entry, key), json.dumps(doc, indent=2, sort_keys=True) + "\n")
