"""The settings ``invoke tune`` chose, as the stack's module sets them.

``{prefix}/tuning/tuning.json`` (written by ``invoke tune``, docs/tuning.md) names a value for each
variable a measurement chose, with one line of evidence. The stack's module sets a chosen value only
while the playbook still declares the variable in ``facts.tuning`` with that value among its
candidates, and only as a default (where the environment has no value), like ``facts.env``'s. A
missing file sets nothing; a file that is not a tuning document, or an entry the playbook no longer
declares, is reported as a warning naming the file and ignored (for that variable).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sitestack.core.bounded import read_bounded
from sitestack.core.errors import InputError
from sitestack.core.hostbase import Host
from sitestack.installs.modulefile_text import message_problem
from sitestack.model.site import Facts
from sitestack.onsite.fileio import ReadError, parse_json

TUNING_SCHEMA = "sitestack-tuning/1"
#: The most a tuning.json may hold (``invoke tune`` writes a few KiB per point): a larger one is not read.
TUNING_MAX = 4 << 20


@dataclass(frozen=True)
class Tuned:
    """One chosen setting: the variable, its value and the evidence the module's comment cites."""

    name: str
    value: str
    evidence: str


def tuning_path(prefix: str) -> str:
    """Where ``invoke tune`` writes its decision for the prefix."""
    return f"{prefix.rstrip('/')}/tuning/tuning.json"


def read_tuned(host: Host, facts: Facts, prefix: str, stack: str | None = None) -> tuple[list[Tuned], list[str]]:
    """(the settings to set, warnings) from ``tuning.json`` under ``prefix`` on ``host`` for the module of
    ``stack`` (None: any stack)."""
    path = tuning_path(prefix)
    try:
        text = read_bounded(host, path, TUNING_MAX, "not a tuning document: ignored")
    except InputError as exc:
        return [], [str(exc)]
    return tuned_from(text, path, facts, stack) if text is not None else ([], [])


def tuned_from(text: str, path: str, facts: Facts, stack: str | None = None) -> tuple[list[Tuned], list[str]]:
    """(the settings to set, warnings) from the text of a tuning.json (``path`` names it in warnings) for
    the module of ``stack``: a decision measured with another stack's module (another torch, another
    NCCL) sets nothing in this one."""
    try:
        doc = parse_json(text, path)
    except ReadError as exc:
        return [], [f"{exc}: ignored"]
    problem = _document_problem(doc)
    if problem:
        return [], [f"{path}: {problem}: ignored"]
    measured = (doc.get("stack") or {}).get("module") if isinstance(doc.get("stack"), dict) else None
    if stack is not None and isinstance(measured, str) and measured != stack and doc["chosen"]:
        return [], [f"{path}: measured with {measured}, not {stack}: not set in its module "
                    "(`invoke tune` measures the stack the validation job runs)"]
    declared = facts.tuning.variables if facts.tuning is not None else {}
    out: list[Tuned] = []
    warnings: list[str] = []
    for name, value in doc["chosen"].items():
        why = doc["evidence"].get(name)
        if name not in declared:
            warnings.append(f"{path}: chosen {name}, which facts.tuning no longer declares: not set")
        elif value not in declared[name].candidates:
            warnings.append(f"{path}: chosen {name}={value}, not among its candidates in facts.tuning "
                            f"({', '.join(declared[name].candidates)}): not set")
        elif not isinstance(why, str) or message_problem(why):
            reason = message_problem(why) if isinstance(why, str) else "missing"
            warnings.append(f"{path}: the evidence of {name}: {reason}: not set")
        else:
            out.append(Tuned(name, value, why))
    return out, warnings


def _document_problem(doc: Any) -> str | None:
    if not isinstance(doc, dict):
        return "not a JSON object"
    if doc.get("schema") != TUNING_SCHEMA:
        return f"schema {doc.get('schema')!r} is not {TUNING_SCHEMA!r}"
    chosen, evidence = doc.get("chosen"), doc.get("evidence")
    if not isinstance(chosen, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in chosen.items()):
        return "chosen: not an object of names to strings"
    if not isinstance(evidence, Mapping):
        return "evidence: not an object"
    return None
