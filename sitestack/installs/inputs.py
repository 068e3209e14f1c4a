"""An install's inputs: everything its result depends on, as plain data, and their digest.

``build_inputs`` (source, patches, builder, its options, the resolved plan, the site toolchain)
is the build cache key; with ``install_inputs`` (where and how it installs, sanity paths, checks)
it makes the stamp's digest. :func:`explain_change` says in words what differs between two.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from sitestack.builders import symbolic
from sitestack.installs.target import Target, build_plan, check_commands, install_commands
from sitestack.installs.toolchain import Toolchain
from sitestack.model.site import plain_data


def build_inputs(target: Target, toolchain: Toolchain) -> dict[str, Any]:
    """Everything the artefact depends on (its digest is the build cache key)."""
    recipe = target.recipe
    plan = build_plan(target, symbolic(target.dest))
    # the recipe's tools and the builder's (not helpers like tar and patch)
    digested = {*target.tools(), *target.builder.optional_tools}
    return {
        "recipe": recipe.name,
        "version": target.version,
        "source": {"sha256": recipe.versions[target.version].sha256},
        "patches": [{"file": p.file, "sha256": p.sha256} for p in recipe.patches_for(target.version)],
        "builder": recipe.build,
        "options": plain_data(dataclasses.asdict(recipe.builder_options())),
        "plan": [c.as_dict() for c in plan],
        "toolchain": {
            "modules": list(target.facts.modules.load),
            "module_use": list(target.facts.modules.use),
            "tools": {k: v for k, v in sorted(toolchain.tools.items()) if k in digested},
            # the build interpreter as it reports itself (builds that use one: pip)
            **({"interpreter": dict(toolchain.interpreter)} if toolchain.interpreter else {}),
        },
    }


def install_inputs(target: Target) -> dict[str, Any]:
    """Where and how the artefact installs, and what is checked on it."""
    checks = check_commands(target, "$INSTALL")
    return {
        "dest": target.dest,
        "artefact": target.builder.artefact,
        "install": [c.as_dict() for c in install_commands(target, "$ARTEFACT", "$INSTALL")],
        "sanity": list(target.recipe.sanity),
        "checks": [{"name": n, "argv": a, "env": e, "expect": x} for n, a, e, x, _ in checks],
    }


def digest(data: Any) -> str:
    """sha256 of ``data`` as canonical JSON (sorted keys, no spaces)."""
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def recorded_paths(old: Mapping[str, Any]) -> list[str]:
    """The tool paths a stamp's inputs record (:func:`spelled_as_before` needs them resolved)."""
    return sorted({path for path, _ in _tool_lines(old).values() if path.startswith("/")})


def _tool_lines(inputs: Mapping[str, Any]) -> dict[str, tuple[str, str]]:
    tools = inputs.get("build", {}).get("toolchain", {}).get("tools", {})
    out: dict[str, tuple[str, str]] = {}
    for name, value in tools.items():
        path, sep, version = str(value).partition(" | ")
        if sep:
            out[name] = (path, version)
    return out


def spelled_as_before(old: Mapping[str, Any], new: Mapping[str, Any], real: Mapping[str, str]) -> dict[str, Any]:
    """``old`` (a stamp's inputs) with the same tools recorded as ``new`` records them. Stamps of sitestack
    before tool identities recorded each tool as ``PATH`` spelled it and the interpreter with its
    ``sys.executable``: a tool is the same when its old path, resolved now (``real``), or for the
    interpreter the old interpreter's real path, with the same ``--version`` line is its identity in
    ``new``, and the interpreter when its real path and full version are (its ABI, not recorded then,
    follows from those). Where that holds for every tool, the result's digest is ``new``'s, and the
    install is current without a rebuild; anything else keeps its old form and its digest differs."""
    ot, nt = old.get("build", {}).get("toolchain", {}), new["build"]["toolchain"]
    oi, ni = ot.get("interpreter", {}), nt.get("interpreter", {})
    same_interpreter = (oi.get("realpath"), oi.get("version")) == (ni.get("realpath"), ni.get("version"))
    if not (same_interpreter and bool(oi) == bool(ni)):
        return dict(old)
    tools = {}
    for name, (path, version) in _tool_lines(old).items():
        now = nt.get("tools", {}).get(name)
        same = {f"{real.get(path, path)} | {version}", *([f"{ni['realpath']} | {version}"] if ni else [])}
        tools[name] = now if now in same else f"{path} | {version}"
    toolchain = {**ot, "tools": {**ot.get("tools", {}), **tools}, **({"interpreter": dict(ni)} if ni else {})}
    return {**old, "build": {**old.get("build", {}), "toolchain": toolchain}}


def _plan_changes(oplan: list[Any], nplan: list[Any]) -> list[str]:
    oa = [a for c in oplan for a in c.get("argv", [])]
    na = [a for c in nplan for a in c.get("argv", [])]
    added = [a for a in na if a not in oa]
    removed = [a for a in oa if a not in na]
    out: list[str] = []
    if added or removed:
        out.append("build arguments changed: " + " ".join([*(f"+{a}" for a in added), *(f"-{a}" for a in removed)]))
    oe = {k: v for c in oplan for k, v in c.get("env", {}).items()}
    ne = {k: v for c in nplan for k, v in c.get("env", {}).items()}
    if oe != ne:
        keys = sorted(k for k in {*oe, *ne} if oe.get(k) != ne.get(k))
        out.append("build environment changed: " + ", ".join(keys))
    return out or ["build commands changed"]


def _patch_changes(ob: Mapping[str, Any], nb: Mapping[str, Any]) -> list[str]:
    op = {p["file"]: p["sha256"] for p in ob.get("patches", [])}
    np_ = {p["file"]: p["sha256"] for p in nb.get("patches", [])}
    out: list[str] = []
    for name in np_:
        if name not in op:
            out.append(f"patch {name} added")
        elif op[name] != np_[name]:
            out.append(f"patch {name} changed")
    out += [f"patch {name} removed" for name in op if name not in np_]
    if [p["file"] for p in ob.get("patches", [])] != [p["file"] for p in nb.get("patches", [])] and not out:
        out.append("patch order changed")
    return out


def explain_change(old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    """What differs between two stamps' inputs, in words (the first few differences)."""
    out: list[str] = []
    ob, nb = old.get("build", {}), new.get("build", {})
    if ob.get("source") != nb.get("source"):
        out.append("source tarball changed")
    out += _patch_changes(ob, nb)
    if ob.get("builder") != nb.get("builder") or ob.get("options") != nb.get("options"):
        out.append("builder options changed")
    if ob.get("plan", []) != nb.get("plan", []):
        out += _plan_changes(ob.get("plan", []), nb.get("plan", []))
    if ob.get("toolchain") != nb.get("toolchain"):
        ot, nt = ob.get("toolchain", {}), nb.get("toolchain", {})
        keys = [k for k in ("modules", "module_use", "interpreter") if ot.get(k) != nt.get(k)]
        tools = sorted(t for t in {*ot.get("tools", {}), *nt.get("tools", {})}
                       if ot.get("tools", {}).get(t) != nt.get("tools", {}).get(t))
        out.append("site toolchain changed: " + ", ".join([*keys, *tools]))
    oi, ni = old.get("install", {}), new.get("install", {})
    for key in ("dest", "artefact", "install", "sanity", "checks"):
        if oi.get(key) != ni.get(key):
            out.append(f"install {key} changed")
    if old.get("format") != new.get("format") and not out:
        out.append("stamp format changed")
    return "; ".join(out[:6]) or "inputs changed"
