"""The communication libraries' settings, checked: a variable the stack's library does not read, or a setting
known to break its version, is refused where a playbook names it.

Misspelled variables load silently: NCCL reads only the names it knows, so ``NCCL_SOCKET_IFNAM=hsn0`` in a
module file leaves the interface to NCCL's own choice, and such names have shipped in sites' own material
(Lumi-supercomputer/LUMI-AI-Guide PR #108). The names each library version reads are
``sources/comm/variables.yml``, extracted from the upstream sources at their tags
(``scripts/comm_variables.py``); the settings known to break a version are ``known_issues`` in
``sources/comm/libraries.yml``, each with the public issue that says so.

Which names are judged: those with a prefix of :data:`FAMILIES` (NCCL_, RCCL_, OFI_NCCL_, FI_CXI_); others
(MIOPEN_, HSA_, other FI_ providers) are not, as their readers are not in the table. A name is known when a
version the stack may run reads it: the RCCL of the stack's ROCm release, or every NCCL version (facts
carry no NCCL version), plus the network plugins that read the family. Where the stack's version is newer
than every scanned one, every scanned version counts, so only names no version reads are refused.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sitestack.core import schema, versions
from sitestack.core.errors import SitestackError
from sitestack.core.paths import SOURCES_DIR
from sitestack.core.yamlfile import MarkedDict, display_path, load_yaml
from sitestack.model import comm_libraries
from sitestack.model.facts import Facts

VARIABLES = SOURCES_DIR / "comm" / "variables.yml"

#: Name prefixes judged, and which readers' names count for each (beside the stack's own library).
FAMILIES: Mapping[str, tuple[str, ...]] = {
    "NCCL_": ("aws-ofi-nccl", "aws-ofi-rccl"),
    "RCCL_": (),
    "OFI_NCCL_": ("aws-ofi-nccl", "aws-ofi-rccl"),
    "FI_CXI_": ("libfabric-cxi",),
}


@dataclass(frozen=True)
class Library:
    """The communication library a stack runs: ``nccl`` or ``rccl``, at versions ``spec`` (None: any)."""

    name: str
    spec: str | None
    label: str


def stack_library(collectives: str, rocm: str | None) -> Library | None:
    """The stack's library: RCCL of the ROCm release (its version range from the loader table), NCCL at
    any version; None for gloo or oneCCL."""
    if collectives == "rccl" and rocm:
        try:
            (row,) = comm_libraries.loaders("rccl", rocm=rocm)
        except SitestackError:   # a ROCm release the table does not know: any RCCL
            return Library("rccl", None, f"the RCCL of ROCm {rocm}")
        return Library("rccl", row.versions, f"the RCCL of ROCm {rocm}")
    if collectives in ("nccl", "rccl"):
        return Library(collectives, None, collectives.upper())
    return None


@functools.lru_cache(maxsize=2)
def _table(path: Path = VARIABLES) -> Mapping[str, Any]:
    """The variables table, parsed once (core.yamlfile keeps the parse in ~/.cache/sitestack)."""
    return load_yaml(path)


def _present(ranges: str | list[str], version: str) -> bool:
    return any(r == "*" or versions.matches(r, version) for r in ([ranges] if isinstance(ranges, str) else ranges))


def _names(reader: str, spec: str | None) -> set[str]:
    """The names ``reader`` reads at any scanned version within ``spec`` (every scanned version where
    none is within it)."""
    entry = _table().get(reader) or {}
    scanned = [str(v) for v in entry.get("scanned_versions") or []]
    chosen = [v for v in scanned if spec is None or versions.matches(spec, v)] or scanned
    return {name for name, ranges in (entry.get("variables") or {}).items() if any(_present(ranges, v) for v in chosen)}


@functools.lru_cache(maxsize=32)
def known_names(library: str | None, spec: str | None, family: str) -> frozenset[str]:
    """The names of ``family`` a stack of ``library`` (None: any) at ``spec`` may set."""
    readers = [library] if library else ["nccl", "rccl"]
    if library == "rccl" and spec is not None and not any(
            versions.matches(spec, str(v)) for v in _table()["rccl"]["scanned_versions"]):
        readers.append("nccl")   # a newer RCCL than any scanned: it follows NCCL's names
    names = set().union(*(_names(r, spec if r == library else None) for r in readers),
                        *(_names(r, None) for r in FAMILIES[family]))
    return frozenset(n for n in names if n.startswith(family))


def family_of(name: str) -> str | None:
    """The longest prefix of :data:`FAMILIES` that ``name`` has (OFI_NCCL_ before NCCL_)."""
    found = [f for f in FAMILIES if name.startswith(f)]
    return max(found, key=len) if found else None


def unknown_variable(name: str, library: Library | None) -> str | None:
    """Why ``name`` is not a setting the stack's library reads ("not a variable ... reads; did you mean
    ...?"), None when it is one, or of a family the table does not judge."""
    family = family_of(name)
    if family is None:
        return None
    known = known_names(library.name if library else None, library.spec if library else None, family)
    if name in known:
        return None
    near = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.8)
    who = library.label if library else "NCCL or RCCL"
    return (f"not a variable {who} reads" + (f"; did you mean {near[0]}?" if near else "")
            + f" (the names each version reads: sources/comm/{VARIABLES.name})")


def issues_for(env: Mapping[str, str], library: Library | None, rocm: str | None,
               allowed: Iterable[str] = ()) -> list[tuple[str, str]]:
    """(variable, why) for each setting of ``env`` a known issue says breaks the stack's library version,
    unless its id is in ``allowed``."""
    found = []
    for issue in comm_libraries.table().known_issues:
        if issue.id in allowed or not issue.applies(library.name if library else None, rocm):
            continue
        for name, value in env.items():
            if issue.matches(name, value):
                found.append((name, f"{name}={value}: {issue.effect} ({issue.source}); {issue.workaround}. "
                                    f"If you know it does not apply here, say allow_known_issues: [{issue.id}]"))
    return found


def check_facts(facts: Facts, layers: Sequence[tuple[MarkedDict, str]], shown: str) -> None:
    """Refuse, naming file, line and key, a setting of ``facts`` (its ``env`` and ``tuning`` variables and
    candidates) that the stack's library does not read or that a known issue says breaks its version, and an
    ``allow_known_issues`` id the table does not have. ``layers``: the facts mappings the setting may come
    from, last wins (the playbook's facts, a stack's overlay), each with its dotted key."""
    rocm = facts.rocm.version if facts.rocm else None
    library = stack_library(facts.collectives, rocm)
    ids = {issue.id for issue in comm_libraries.table().known_issues}
    for name in facts.allow_known_issues:
        if name not in ids:
            raise _where(layers, shown, "allow_known_issues", None).error(
                f"{name!r} is not a known issue of {display_path(comm_libraries.TABLE)} (known: {', '.join(sorted(ids))})")
    settings = {**facts.env}
    candidates = [(name, value) for name, variable in (facts.tuning.variables.items() if facts.tuning else ())
                  for value in variable.candidates]
    for name in [*settings, *(n for n, _ in candidates)]:
        why = unknown_variable(name, library)
        if why:
            raise _where(layers, shown, "env" if name in settings else "tuning.variables", name).error(why)
    for name, why in issues_for({**dict(candidates), **settings}, library, rocm, facts.allow_known_issues):
        raise _where(layers, shown, "env" if name in settings else "tuning.variables", name).error(why)


def _where(layers: Sequence[tuple[MarkedDict, str]], shown: str, section: str, name: str | None) -> schema._Where:
    """Where ``section.name`` (``section`` alone where ``name`` is None) is set: the last layer that has it."""
    path = section.split(".")
    for node, key in reversed(layers):
        parent: Any = node
        for part in path[:-1]:
            parent = parent.get(part) if isinstance(parent, dict) else None
        holder = parent.get(path[-1]) if isinstance(parent, dict) else None
        if name is None and isinstance(parent, MarkedDict) and path[-1] in parent:
            return schema._Where(shown, parent.lines.get(path[-1], parent.line), f"{key}.{section}")
        if name is not None and isinstance(holder, MarkedDict) and name in holder:
            return schema._Where(shown, holder.lines.get(name, holder.line), f"{key}.{section}.{name}")
    node, key = layers[-1]
    return schema._Where(shown, node.line, f"{key}.{section}" + (f".{name}" if name else ""))


def job_settings(facts: Facts) -> dict[str, Any]:
    """What the validation job judges its own environment by (check-config.json's ``settings``,
    sitestack/validation/ddpcheck/comm_env.py): the names each family's readers know for the stack's
    library and the known issues of its version the playbook did not allow."""
    rocm = facts.rocm.version if facts.rocm else None
    library = stack_library(facts.collectives, rocm)
    name, spec = (library.name, library.spec) if library else (None, None)
    issues = [{"id": i.id, "variable": i.variable, "values": list(i.values), "effect": i.effect, "source": i.source}
              for i in comm_libraries.table().known_issues
              if i.id not in facts.allow_known_issues and i.applies(name, rocm)]
    return {"library": library.label if library else "NCCL or RCCL",
            "known": {family: sorted(known_names(name, spec, family)) for family in FAMILIES}, "issues": issues}
