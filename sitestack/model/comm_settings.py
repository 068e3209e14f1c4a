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

import dataclasses
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


@dataclass(frozen=True)
class Family:
    """Names judged by one prefix: the readers whose names count beside the stack's own library (``own``:
    whether the stack's NCCL/RCCL reads them), and who reads them, in words."""

    readers: tuple[str, ...]
    own: bool
    who: str = ""


#: The prefixes judged, longest first where one holds another (OFI_NCCL_ before NCCL_).
FAMILIES: Mapping[str, Family] = {
    "OFI_NCCL_": Family(("aws-ofi-nccl", "aws-ofi-rccl"), own=False, who="the aws-ofi-nccl/aws-ofi-rccl plugin"),
    "NCCL_": Family(("aws-ofi-nccl", "aws-ofi-rccl", "torch"), own=True),
    "RCCL_": Family((), own=True),
    "FI_CXI_": Family(("libfabric-cxi",), own=False, who="libfabric's cxi provider"),
}


@dataclass(frozen=True)
class Library:
    """The communication library a stack runs: ``nccl`` or ``rccl``, at versions ``spec`` (None: any)."""

    name: str
    spec: str | None
    label: str
    rocm: str | None = None   # RCCL: the ROCm release it is of


@dataclass(frozen=True)
class Reader:
    """One reader's names (``variables``: name -> the scanned versions that read it, a PEP 440 range or *)."""

    scanned_versions: tuple[str, ...]
    variables: Mapping[str, str]
    rocm_of_version: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def check(self) -> str | None:
        for version in self.scanned_versions:
            if versions.check_version(version):
                return f"scanned_versions: {version!r}: {versions.check_version(version)}"
        for name, spec in self.variables.items():
            if spec != "*" and versions.check_spec(spec):
                return f"variables.{name}: {versions.check_spec(spec)}"
        return None


def library_of(facts: Facts) -> Library | None:
    """The communication library of the stack ``facts`` describe (:func:`stack_library`)."""
    return stack_library(facts.collectives, facts.rocm.version if facts.rocm else None)


def stack_library(collectives: str, rocm: str | None) -> Library | None:
    """The stack's library: RCCL of the ROCm release (its version range from the loader table), NCCL at
    any version; None for gloo or oneCCL."""
    if collectives == "rccl" and rocm:
        try:
            rows = comm_libraries.loaders("rccl", rocm=rocm)
        except SitestackError:   # a ROCm release the table does not know: any RCCL
            return Library("rccl", None, f"the RCCL of ROCm {rocm}", rocm)
        return Library("rccl", rows[0].versions, f"the RCCL of ROCm {rocm}", rocm)
    if collectives in ("nccl", "rccl"):
        return Library(collectives, None, collectives.upper())
    return None


@functools.lru_cache(maxsize=2)
def _table(path: Path = VARIABLES) -> Mapping[str, Reader]:
    """The variables table, checked (an error names file, line and key); core.yamlfile keeps its parse."""
    data = load_yaml(path)
    shown = display_path(path)
    for reader in ("nccl", "rccl"):
        if reader not in data:
            raise schema._Where(shown, data.line, reader).error("missing: the names this library reads")
    return {str(k): schema.build(Reader, v, shown, line=data.lines.get(k), key=str(k)) for k, v in data.items()}


def _scanned(reader: str, spec: str | None) -> list[str]:
    """The scanned versions of ``reader`` within ``spec`` (all where ``spec`` is None)."""
    entry = _table().get(reader)
    return [v for v in (entry.scanned_versions if entry else ()) if spec is None or versions.matches(spec, v)]


def _names(reader: str, spec: str | None) -> set[str]:
    """The names ``reader`` reads at any scanned version within ``spec`` (every scanned version where
    none is within it)."""
    entry = _table().get(reader)
    if entry is None:
        return set()
    chosen = _scanned(reader, spec) or list(entry.scanned_versions)
    return {name for name, spec_ in entry.variables.items()
            if any(spec_ == "*" or versions.matches(spec_, v) for v in chosen)}


@functools.lru_cache(maxsize=32)
def known_names(library: str | None, spec: str | None, family: str) -> frozenset[str] | None:
    """The names of ``family`` a stack of ``library`` (None: any) at ``spec`` may set; None where the family
    is not judged for it: a library version newer than every scanned one may read names no scan saw
    (RCCL_* of ROCm 7), so its own families are taken as they are."""
    rule = FAMILIES[family]
    readers = list(rule.readers)
    if rule.own:
        if library and spec is not None and not _scanned(library, spec):
            if family != "NCCL_" or library == "nccl":
                return None
            readers += ["nccl", "rccl"]   # a newer RCCL: NCCL's names of every scanned release, then its own
        else:
            readers += [library] if library else ["nccl", "rccl"]
    names = set().union(*(_names(r, spec if r == library else None) for r in readers))
    return frozenset(n for n in names if n.startswith(family))


def family_of(name: str) -> str | None:
    """The prefix of :data:`FAMILIES` that ``name`` has (the longest: OFI_NCCL_ before NCCL_)."""
    found = [f for f in FAMILIES if name.startswith(f)]
    return max(found, key=len) if found else None


def unknown_variable(name: str, library: Library | None) -> str | None:
    """Why ``name`` is not a setting the stack's readers know ("not a variable ... reads; did you mean
    ...?"), None when it is one, or of a family not judged for this library."""
    family = family_of(name)
    if family is None:
        return None
    known = known_names(library.name if library else None, library.spec if library else None, family)
    if known is None or name in known:
        return None
    near = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.8)
    who = FAMILIES[family].who or (library.label if library else "NCCL or RCCL")
    return (f"not a variable {who} reads" + (f"; did you mean {near[0]}?" if near else "")
            + f" (the names each version reads: sources/comm/{VARIABLES.name})")


def plugin_value(value: str, library: Library | None) -> str | None:
    """Why ``NCCL_NET_PLUGIN=value`` loads no plugin with some version of the stack's library (a path, or
    a file name, where a loader takes the value only as a suffix: ``lib...-net-/path.so.so``), else None."""
    if library is None or value.lower() == "none":
        return None
    # a ROCm release the loader table does not know (no spec): every RCCL row
    rows = comm_libraries.loaders(library.name, rocm=library.rocm if library.spec else None)
    suffix_only = [r for r in rows if not r.path_first]
    if not suffix_only or not ("/" in value or value.endswith(".so")):
        return None
    row = suffix_only[0]
    return (f"{library.label} opens lib...-net-<value>.so for it ({row.suffix_name.replace('%s', value)}), which "
            f"loads nothing ({row.source}): give the suffix (ofi for {row.suffix_name.replace('%s', 'ofi')}) and "
            "put the plugin's directory on LD_LIBRARY_PATH")


def issues_for(env: Mapping[str, str], library: Library | None, allowed: Iterable[str] = ()) -> list[tuple[str, str]]:
    """(variable, why) for each setting of ``env`` a known issue says breaks the stack's library version,
    unless its id is in ``allowed``."""
    found = []
    for issue in comm_libraries.table().known_issues:
        if issue.id in allowed or not issue.applies(*_of(library)):
            continue
        for name, value in env.items():
            if issue.matches(name, value):
                found.append((name, f"{name}={value}: {issue.effect} ({issue.source}); {issue.workaround}. "
                                    f"If you know it does not apply here, say allow_known_issues: [{issue.id}]"))
    return found


def _of(library: Library | None) -> tuple[str | None, str | None]:
    """(name, ROCm release) of ``library``, as :meth:`KnownIssue.applies` takes them."""
    return (library.name, library.rocm) if library else (None, None)


def check_facts(facts: Facts, layers: Sequence[tuple[MarkedDict, str]], shown: str) -> None:
    """Refuse, naming file, line and key, a setting of ``facts`` (its ``env`` and ``tuning`` variables and
    candidates) that the stack's library does not read or that a known issue says breaks its version, and an
    ``allow_known_issues`` id the table does not have. ``layers``: the facts mappings the setting may come
    from, last wins (the playbook's facts, a stack's overlay), each with its dotted key."""
    library = library_of(facts)
    ids = {issue.id for issue in comm_libraries.table().known_issues}
    for name in facts.allow_known_issues:
        if name not in ids:
            raise _where(layers, shown, "allow_known_issues", None).error(
                f"{name!r} is not a known issue of {display_path(comm_libraries.TABLE)} (known: {', '.join(sorted(ids))})")
    settings = {**facts.env}
    candidates = [(name, value) for name, variable in (facts.tuning.variables.items() if facts.tuning else ())
                  for value in variable.candidates]
    for name in [*settings, *(n for n, _ in candidates)]:
        why = unknown_variable(name, library) or (
            plugin_value(settings[name], library) if name == comm_libraries.PLUGIN_VARIABLE and name in settings else None)
        if why:
            raise _where(layers, shown, "env" if name in settings else "tuning.variables", name).error(why)
    for name, why in issues_for({**dict(candidates), **settings}, library, facts.allow_known_issues):
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
    sitestack/onsite/ddpcheck/comm_env.py): the names each family's readers know for the stack's
    library and the known issues of its version the playbook did not allow."""
    library = library_of(facts)
    name, spec = (library.name, library.spec) if library else (None, None)
    issues = [{"id": i.id, "variable": i.variable, "values": list(i.values), "effect": i.effect, "source": i.source}
              for i in comm_libraries.table().known_issues
              if i.id not in facts.allow_known_issues and i.applies(*_of(library))]
    known = {family: known_names(name, spec, family) for family in FAMILIES}
    return {"library": library.label if library else "NCCL or RCCL",
            "readers": {family: rule.who for family, rule in FAMILIES.items() if rule.who},
            "known": {family: sorted(names) for family, names in known.items() if names is not None}, "issues": issues}
