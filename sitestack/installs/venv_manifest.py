"""The stack environment's plan (everything its content depends on) and its manifest (every
distribution in it, with where it came from): pure functions of the stack, the facts, the built
packages and pip's reports, so a re-run compares plans without running pip.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
import urllib.parse
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sitestack.core.host import Host
from sitestack.core.redact import fingerprint, redact
from sitestack.installs.venv_stack import Built, Stack, normalize
from sitestack.model.site import Facts

MANIFEST_FORMAT = 1


def plan_for(stack: Stack, facts: Facts, built: Sequence[Built],
             libraries: Mapping[str, Sequence[str]] | None = None) -> dict[str, Any]:
    """Everything the environment's content depends on (what the manifest records as its plan).
    ``libraries``: kind -> directories of the libraries the stack builds beside the environment
    (:func:`sitestack.installs.site_stack.stack_libraries`, the network plugin's), which the manifest's
    ``libraries`` names; a plan without them has no key, as plans written before there was one."""
    base: dict[str, Any] = {"source": stack.source, "python": stack.python_version,
                            "executable": facts.python.executable,
                            "system_site_packages": stack.system_site_packages}
    if stack.source in ("module", "conda"):
        base["module"] = facts.python.module
        base["modules"] = list(facts.modules.load)
    if stack.source == "container" and facts.container:
        base["image"] = facts.container.image
    # the manifest is world-readable: an index's credentials are *** there, and a fingerprint that a
    # changed password changes (so the plan, and what update() installs again, follows them)
    secret = fingerprint([stack.index_url]) if stack.index_url else None
    return {
        **({"index_credentials": secret} if secret else {}),
        "base": base,
        "compile": stack.compile,
        "index_url": redact(stack.index_url) if stack.index_url else None,
        "requirements": list(stack.requirements),
        "extras": list(stack.extras),
        "checks": list(stack.checks),
        "built": {b.recipe: {"version": b.version, "wheel": os.path.basename(b.wheel or ""),
                             "sha256": b.wheel_sha256, "install": b.dest}
                  for b in built if b.wheel},
        **({"libraries": {kind: list(dirs) for kind, dirs in sorted(libraries.items())}} if libraries else {}),
    }


def requirement_name(req: str) -> str:
    return normalize(re.split(r"[\s<>=!~;\[@(]", req.strip(), maxsplit=1)[0])


def explain(old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    """What differs between two plans, in words."""
    parts = []
    if old.get("base") != new.get("base"):
        parts.append("base Python changed")
    if old.get("compile") != new.get("compile"):
        parts.append("bytecode compilation changed")
    if old.get("index_url") != new.get("index_url"):
        parts.append(f"index {old.get('index_url')} -> {new.get('index_url')}")
    elif old.get("index_credentials") != new.get("index_credentials"):
        parts.append(f"index {new.get('index_url')}: credentials changed")
    for key in ("requirements", "extras", "checks"):
        added = [r for r in new.get(key, []) if r not in old.get(key, [])]
        gone = [r for r in old.get(key, []) if r not in new.get(key, [])]
        if added or gone:
            parts.append(f"{key}: " + ", ".join([f"+{r}" for r in added] + [f"-{r}" for r in gone]))
    ol, nl = old.get("libraries", {}), new.get("libraries", {})
    for kind in sorted(set(ol) | set(nl)):
        if ol.get(kind) != nl.get(kind):
            parts.append(f"{kind} libraries {' '.join(ol.get(kind, [])) or '(none)'} -> "
                         f"{' '.join(nl.get(kind, [])) or '(none)'}")
    ob, nb = old.get("built", {}), new.get("built", {})
    for recipe in sorted(set(ob) | set(nb)):
        if recipe not in ob:
            parts.append(f"+{recipe} {nb[recipe]['version']} (built)")
        elif recipe not in nb:
            parts.append(f"-{recipe} (no longer built)")
        elif ob[recipe] != nb[recipe]:
            parts.append(f"{recipe} {ob[recipe]['version']} -> {nb[recipe]['version']} (rebuilt)")
    return "; ".join(parts) or "plan changed"


def plan_digest(plan: Mapping[str, Any]) -> str:
    """A short digest of a plan: what identifies a generation's intended content."""
    return hashlib.sha256(dump(dict(plan)).encode()).hexdigest()[:16]


def needs_new_generation(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    return old.get("base") != new.get("base") or old.get("compile") != new.get("compile")


def read_manifest(host: Host, stack: Stack) -> dict[str, Any] | None:
    data = host.read_json(stack.manifest)
    return data if data is not None and data.get("format") == MANIFEST_FORMAT else None


def by_wheel(built: Sequence[Built]) -> dict[str, Built]:
    """The packages sitestack built, by their wheel's file name."""
    return {os.path.basename(b.wheel): b for b in built if b.wheel}


def built_origin(url: str, wheels: Mapping[str, Built]) -> dict[str, Any] | None:
    """The origin of a distribution installed from ``url`` when that is the wheel of a package
    sitestack built (:func:`by_wheel`), else None."""
    b = wheels.get(os.path.basename(urllib.parse.unquote(url.split("#", 1)[0])))
    if b is None:
        return None
    return {"kind": "built", "recipe": b.recipe, "install": b.dest, "wheel": b.wheel, "sha256": b.wheel_sha256,
            "requested": True}


def origins_from_report(text: str | None, built: Sequence[Built]) -> dict[str, dict[str, Any]]:
    """name -> where pip took it from, from a ``pip install --report`` file."""
    out: dict[str, dict[str, Any]] = {}
    if not text:
        return out
    try:
        report = json.loads(text)
    except ValueError:
        return out
    wheels = by_wheel(built)
    for item in report.get("install", []):
        meta = item.get("metadata", {})
        info = item.get("download_info", {})
        url = info.get("url", "")
        sha = (info.get("archive_info", {}).get("hashes") or {}).get("sha256") or \
            (info.get("archive_info", {}).get("hash", "").partition("=")[2] or None)
        out[normalize(meta.get("name", ""))] = built_origin(url, wheels) or \
            {"kind": "index", "url": redact(url), "sha256": sha, "requested": bool(item.get("requested"))}
    return out


#: What the scan says of each distribution besides what the manifest lists: it becomes the origin.
METADATA_KEYS = ("installer", "direct_url")


def origin_from_metadata(p: Mapping[str, Any], stack: Stack, wheels: Mapping[str, Built],
                         asked: set[str]) -> dict[str, Any]:
    """Where one scanned distribution came from, from its installed metadata alone (PEP 610's
    direct_url.json, INSTALLER): what uv leaves, which writes no report. ``requested`` is whether
    the plan names it (``asked``), not the REQUESTED file: uv writes one for every package it
    installs, dependencies too (astral-sh/uv#13278)."""
    installer = p.get("installer")
    requested = normalize(str(p.get("name", ""))) in asked
    direct = p.get("direct_url") or {}
    url = str(direct.get("url") or "")
    if url:
        built = built_origin(url, wheels)
        if built is not None:
            return {**built, "installer": installer}
        return {"kind": "url", "url": redact(url), "sha256": direct.get("sha256"), "requested": requested,
                "installer": installer}
    if installer in ("pip", "uv"):
        # pip and uv record neither the index nor the file's hash in the metadata
        return {"kind": "index", "index_url": redact(stack.index_url or "") or None, "requested": requested,
                "installer": installer}
    return {"kind": "environment", "detail": "created with the environment", "installer": installer}


def manifest_for(stack: Stack, plan: Mapping[str, Any], scan: Mapping[str, Any], origins: Mapping[str, Any],
                 previous: Mapping[str, Any] | None, generation: str, built: Sequence[Built] = (),
                 copied: Collection[str] = (),
                 created: Collection[str] = ()) -> dict[str, Any]:
    """The manifest: the plan, and every distribution in the environment with its origin.

    The origin of a distribution is, first, what this run's pip report says (``origins``: the index
    URL and the wheel's sha256); else the previous manifest's, where the distribution is the same
    (dist-info and RECORD digest); else, for a dist-info in ``created`` (there once the environment
    was made, before anything was installed), the environment's creation; else its installed metadata
    (:func:`origin_from_metadata`). ``copied``: the distributions (normalised names) this environment took
    unchanged from the previous manifest's generation (:meth:`StackVenv`'s next generation is a copy):
    the same dist-info is the same distribution there, though the copy rewrote its scripts' RECORD lines."""
    before = {p.get("dist_info"): p for p in (previous or {}).get("packages", [])}
    wheels = by_wheel(built)
    asked = {requirement_name(r) for key in ("requirements", "extras", "checks") for r in plan.get(key, [])}
    packages = []
    for p in scan["packages"]:
        key = normalize(p["name"])
        old = before.get(p.get("dist_info"))
        same = old is not None and old.get("source") and (old.get("record_sha256") == p.get("record_sha256")
                                                          or key in copied)
        source = origins.get(key) or (old["source"] if same and old else None)
        if source is None and p.get("dist_info") in created:
            source = {"kind": "environment", "detail": "created with the environment"}
        source = source or origin_from_metadata(p, stack, wheels, asked)
        if p.get("installer") and "installer" not in source:
            source = {**source, "installer": p["installer"]}
        packages.append({**{k: v for k, v in p.items() if k not in METADATA_KEYS}, "source": source})
    return {
        "format": MANIFEST_FORMAT,
        "site": stack.site,
        "name": stack.name,
        "path": stack.path,
        "generation": generation,
        "python": scan["python"],
        "site_packages": stack.site_packages,
        "plan": dict(plan),
        "packages": sorted(packages, key=lambda p: normalize(p["name"])),
        # what the interpreter sees from outside the environment (a container's or a system Python's
        # torch, with --system-site-packages): the validation job's imports may come from there
        "base_packages": sorted(scan.get("base", []), key=lambda p: normalize(p["name"])),
        "libraries": {**expected_libraries(stack.site_packages, scan), **plan.get("libraries", {})},
    }


#: The Python distributions whose shared libraries the validation job judges by place: each is a kind of
#: library there (``ddpcheck/libraries.py``, ``LIBRARIES``: torch's ``libtorch*``/``libc10*``, the
#: others' extension modules), expected in the package's own directory.
LIBRARY_PACKAGES = ("horovod", "mpi4py", "numpy", "torch")


@dataclass(frozen=True)
class Bundled:
    """A communication library a distribution of the environment ships: ``kind`` (of ``ddpcheck/libraries.py``
    ``LIBRARIES``), the distributions that ship it (``dists``, a glob of normalised names) and its files (``files``,
    a glob relative to site-packages, which the scan is asked for: ``onsite/venv_scan.py``)."""

    kind: str
    dists: str
    files: str


#: The copies of NCCL/RCCL the stack's own torch uses, where the environment installed them.
BUNDLED: tuple[Bundled, ...] = (
    # torch's CUDA wheels depend on NVIDIA's NCCL wheel (pytorch/pytorch .github/scripts/
    # generate_binary_build_matrix.py, PYTORCH_EXTRA_INSTALL_REQUIREMENTS: nvidia-nccl-cu12), and torch
    # loads it from there (torch/__init__.py, _load_global_deps: cuda_libs "nccl": nvidia/nccl/lib/libnccl.so.*)
    Bundled("nccl", "nvidia-nccl-cu*", "nvidia/nccl/lib/libnccl.so*"),
    # torch's ROCm wheels carry RCCL in torch/lib (pytorch/pytorch .ci/manywheel/build_rocm.sh: librccl.so),
    # the copy that bypassed a container's own RCCL in lumi-ai-factory/laifs-container-recipes#18
    Bundled("nccl", "torch", "torch/lib/librccl.so*"),
    Bundled("nccl", "torch", "torch/lib/libnccl.so*"),
)
#: What the scan is asked to find (each :attr:`Bundled.files`, once).
BUNDLED_FILES = tuple(dict.fromkeys(b.files for b in BUNDLED))


def expected_libraries(site_packages: str, scan: Mapping[str, Any]) -> dict[str, list[str]]:
    """Kind -> the directories the stack's copies of it live in, as the environment's scan shows them (the
    manifest's ``libraries``, which the validation job compares each rank's mapped libraries with; the
    libraries the stack builds beside the environment come from its plan: :func:`plan_for`):

    - a distribution of :data:`LIBRARY_PACKAGES` the environment holds, in its package directory under
      ``site_packages``; one the base Python provides (a container's torch), in that directory under the
      ``location`` the scan found it in;
    - a library of :data:`BUNDLED` the scan found (``files``) in the environment, where one of its
      distributions is the environment's, in that file's directory. One the base Python provides is not
      named: a container's or module's NCCL/RCCL is the site's, whose place no fact says.

    A library in none of these is not named: the job records it without judging where it is."""
    packages, base = scan.get("packages", []), scan.get("base", [])
    inside = {normalize(str(p.get("name", ""))) for p in packages}
    out: dict[str, list[str]] = {}
    for name in LIBRARY_PACKAGES:
        where = site_packages if name in inside else next(
            (str(p["location"]) for p in base if normalize(str(p.get("name", ""))) == name
             and isinstance(p.get("location"), str)), None)
        if where:
            out[name] = [f"{where.rstrip('/')}/{name}"]
    files = [f for f in scan.get("files", []) if isinstance(f, str) and not f.startswith("/") and ".." not in f.split("/")]
    for b in BUNDLED:
        if any(fnmatch.fnmatchcase(d, b.dists) for d in inside):
            for f in files:
                if fnmatch.fnmatchcase(f, b.files):
                    where = f"{site_packages.rstrip('/')}/{os.path.dirname(f)}"
                    if where not in out.setdefault(b.kind, []):
                        out[b.kind].append(where)
    return {kind: dirs for kind, dirs in out.items() if dirs}


def dump(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=True) + "\n"
