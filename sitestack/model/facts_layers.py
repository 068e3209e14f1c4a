"""The layers a site's facts are made of: the playbook's ``facts:``, a stack's overlay (the playbook's
``stacks: KEY: facts:``), then the site-local files named by ``$SITESTACK_FACTS``, each merged over the
one before (mappings key by key, anything else replaced).

The site-local files come last on purpose: they say what a site's own machines differ in from the
shipped playbook (a partition name, a smaller login node), and that holds for every stack.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sitestack.core import envvars
from sitestack.core.errors import InputError
from sitestack.core.yamlfile import MarkedDict, display_path, load_yaml

#: Site-local facts: YAML files (``os.pathsep``-separated absolute paths) whose ``facts:`` mapping is
#: merged over every playbook's facts. For what a site's own machines differ in from the shipped
#: playbook (a partition name, a smaller login node) without editing it (docs/cli.md).
LOCAL_FACTS = "SITESTACK_FACTS"

#: Facts a stack may not set for itself: where the site installs and which machines it is are one per site.
SITE_WIDE = ("prefix", "marker", "description")


def local_layers() -> list[MarkedDict]:
    """The ``facts:`` mappings of the files ``$SITESTACK_FACTS`` names, in order."""
    layers = []
    for name in envvars.get(LOCAL_FACTS) or ():   # absolute paths, or an error naming the variable
        extra = load_yaml(Path(name))
        where = display_path(Path(name))
        for key in extra:
            if key != "facts":
                raise InputError(f"{where}:{extra.lines.get(key, extra.line)}",
                                 "a site-local facts file holds only a 'facts:' mapping", key=str(key))
        if not isinstance(extra.get("facts"), dict):
            raise InputError(f"{where}:{extra.line}", "expected a 'facts:' mapping", key="facts")
        layers.append(extra["facts"])
    return layers


def layered(base: Any, *layers: Mapping[str, Any]) -> Any:
    """``base`` (the playbook's facts) with each layer merged over it; ``base`` itself is never changed
    (the parse cache holds it)."""
    facts = base
    for layer in layers:
        if isinstance(facts, MarkedDict):
            facts = merged(facts, layer)
    return facts


def with_local_facts(data: MarkedDict, layers: Sequence[Mapping[str, Any]]) -> MarkedDict:
    """``data`` (a playbook) with the site-local facts (:func:`local_layers`) merged into its ``facts:``."""
    if not layers:
        return data
    out = MarkedDict(data)
    out.line, out.lines = data.line, data.lines
    out["facts"] = layered(data.get("facts"), *layers)
    return out


def merged(base: MarkedDict, new: Mapping[str, Any]) -> MarkedDict:
    """A copy of ``base`` with ``new`` merged in (line numbers kept where the key was)."""
    out = MarkedDict(base)
    out.line, out.lines = base.line, dict(base.lines)
    for key, value in new.items():
        old = base.get(key)
        out[key] = merged(old, value) if isinstance(old, MarkedDict) and isinstance(value, dict) and value else value
        out.lines.setdefault(key, out.line)
    return out


def stack_overlays(data: MarkedDict, shown: str) -> dict[str, MarkedDict]:
    """The playbook's ``stacks:``: key -> that stack's facts overlay (checked for shape only; the merged
    facts are checked as facts by the loader)."""
    raw = data.get("stacks")
    if raw is None:
        return {}
    where = f"{shown}:{data.lines.get('stacks', data.line)}"
    if not isinstance(raw, MarkedDict) or not raw:
        raise InputError(where, "expected a mapping of stack names to {facts: ...}", key="stacks")
    out: dict[str, MarkedDict] = {}
    for key, spec in raw.items():
        line = f"{shown}:{raw.lines.get(key, raw.line)}"
        if not isinstance(key, str) or not key.replace("-", "").replace("_", "").isalnum() or not key[0].isalpha():
            raise InputError(line, f"{key!r} is not a stack name (letters, digits, - and _)", key="stacks")
        if not isinstance(spec, MarkedDict) or set(spec) - {"facts", "description"} or \
                not isinstance(spec.get("facts"), MarkedDict):
            raise InputError(line, "a stack is {facts: {...}, description: ...} (its facts merged over the playbook's)",
                             key=f"stacks.{key}")
        for name in SITE_WIDE:
            if name in spec["facts"]:
                raise InputError(f"{shown}:{spec['facts'].lines.get(name, spec.line)}",
                                 f"{name} is the site's, not a stack's", key=f"stacks.{key}.facts.{name}")
        out[key] = spec["facts"]
    return out


__all__ = ["LOCAL_FACTS", "layered", "local_layers", "merged", "stack_overlays", "with_local_facts"]


def check_stack_keys(specs: Sequence[Any], stacks: Mapping[str, Any], actions: Mapping[str, Any] | None,
                     shown: str) -> None:
    """Each step's ``stack:`` (``specs``: the playbook's steps and handlers) names one of the playbook's
    ``stacks``, on a step whose action runs with it (not one that serves the playbook's own stack,
    ``own_stack``); an :class:`InputError` naming the file, the step's line and the key otherwise."""
    for spec in specs:
        if spec.stack is not None and spec.stack not in stacks:
            raise InputError(f"{shown}:{spec.line}", f"stack {spec.stack!r} is not one of the playbook's stacks "
                             f"({', '.join(sorted(stacks)) or 'it has none'})", key="stack")
        if spec.stack is not None and getattr((actions or {}).get(spec.action), "own_stack", False):
            raise InputError(f"{shown}:{spec.line}", f"step {spec.name!r}: {spec.action} uses the playbook's own stack "
                             "whatever its `stack:`, which would do nothing: remove it", key="stack")
