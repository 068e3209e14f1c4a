"""A built wheel kept in the host's build cache under a key, so another prefix installs it without a build.

Used for the validation job's MPI probe (:mod:`sitestack.actions.validation_job`): its wheel links
the site MPI, so the key is the digest of its sources and of the toolchain that built it
(:func:`toolchain_identity`: the site modules, what the compiler wrapper and the interpreter are,
whatever ``PATH`` calls them, the host's architecture). An entry is ``<cache>/<name>/<key>/`` holding the wheel
and an ``artefact.json`` (its sha256, checked on every use; ``invoke gc`` trims these entries like
the recipes' artefacts). Entries are stored whole with one rename, so a reader never sees half of one.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Sequence

from sitestack.core.host import Host
from sitestack.installs.inputs import digest
from sitestack.installs.toolchain import identities, probe_interpreter, probe_tools
from sitestack.model.site import Facts


def toolchain_identity(host: Host, facts: Facts, tools: Sequence[str], python: str) -> dict[str, object]:
    """The site modules, each tool's identity (the executable it is and its ``--version`` line, probed
    with the modules loaded: :func:`sitestack.installs.toolchain.identities`; ``python``, one of
    ``tools``, as the interpreter reports itself) and ``uname -m``: what a built binary depends on."""
    answer = probe_tools(host, facts, tools)
    interpreter = probe_interpreter(host, facts, python, "the MPI probe", answer.found[python]) if python in answer.found else {}
    found: dict[str, object] = {**dict.fromkeys(answer.missing, "missing"),
                                **identities(answer.found, python, interpreter)}
    arch = host.probe(["uname", "-m"])
    return {"modules": list(facts.modules.load), "module_use": list(facts.modules.use), "tools": found,
            **({"interpreter": interpreter} if interpreter else {}), "arch": arch.stdout.strip() if arch.ok else ""}


def entry_key(sources: str, identity: dict[str, object]) -> str:
    """The cache key of a wheel built from ``sources`` (their digest) with ``identity``."""
    return digest({"sources": sources, "toolchain": identity})


def cached_file(host: Host, entry: str) -> str | None:
    """The entry's file (wheel, tarred tree) when its sha256 is the recorded one; a damaged entry is removed."""
    manifest = host.read_json(f"{entry}/artefact.json")
    if manifest is None:
        if not host.exists(f"{entry}/artefact.json"):
            return None
        manifest = {}
    file = manifest.get("file")
    path = f"{entry}/{os.path.basename(file)}" if isinstance(file, str) and os.path.basename(file) else ""
    out = host.probe(["sha256sum", "--", path]) if path else None
    if out is not None and out.ok and out.stdout.split()[0] == manifest.get("sha256"):
        return path
    host.run(["rm", "-rf", "--", entry])
    return None


def store_wheel(host: Host, entry: str, wheel: str, identity: dict[str, object], *, replace: bool = False) -> str:
    """Store ``wheel`` as the entry (another run's equal entry is kept unless ``replace``); its path there."""
    parent, name = os.path.split(entry)
    tmp = f"{parent}/.{name}.tmp-{secrets.token_hex(4)}"
    host.run(["mkdir", "-p", tmp])
    file = os.path.basename(wheel)
    host.run(["cp", "--", wheel, f"{tmp}/{file}"])
    sha = host.probe(["sha256sum", "--", f"{tmp}/{file}"]).stdout.split()[0]
    manifest = {"kind": "wheel", "file": file, "sha256": sha, "toolchain": identity}
    host.write_text(f"{tmp}/artefact.json", json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    if replace:
        host.probe(["rm", "-rf", "--", entry])
    host.probe(["mv", "-T", "--", tmp, entry])   # fails when another run stored it first: keep theirs
    host.probe(["rm", "-rf", "--", tmp])
    return cached_file(host, entry) or wheel
