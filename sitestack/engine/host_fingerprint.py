"""The submitting host's fingerprint for ``invoke validate``: read before each run, kept with the run's
record, and compared by ``invoke validate --if-changed`` with the last passing run of the same stack
generation (docs/validation.md, "Re-validating when the host changes").

The fingerprint is read by the shipped :mod:`sitestack.onsite.fingerprint` (``fingerprint.py`` in the
validation job's directory), run through the Host on the machine the job is submitted from, with the
site's modules and the stack's module loaded as the job loads them: no job is needed to read it. What it
compares is like with like: the submitting host now against the submitting host at the last passing run
(a login node reads no GPU driver, so its driver field is null on both sides; the compute node's own
toolchain is in the job's ``result.json`` and is compared after the run, :mod:`.regression`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sitestack.core.bounded import output_bounded
from sitestack.core.host import Host
from sitestack.core.quoting import sh
from sitestack.model.site import Facts, expand
from sitestack.model.siteenv import prelude
from sitestack.onsite.fileio import ReadError, parse_json
from sitestack.onsite.fingerprint import KEYS
from sitestack.onsite.history import normalise, toolchain_changes
from sitestack.onsite.history_record import host_facts
from sitestack.onsite.visible import escaped

#: The program in the job's directory (:data:`sitestack.onsite.ENTRY_POINTS`).
PROGRAM = "fingerprint.py"
#: The most bytes of its output read (a fingerprint is a few KiB: 100 modules and their files at most).
OUTPUT_MAX = 1 << 20
#: Seconds the reading may take: loading modules, then a few commands of 5 s each at most.
TIMEOUT = 120.0


@dataclass(frozen=True)
class Reading:
    """The fingerprint read now (None: not readable, ``why`` says why) and the stack digest it goes with."""

    fingerprint: dict[str, Any] | None
    digest: str | None
    why: str = ""


def script(facts: Facts, values: Mapping[str, str], stack_module: object) -> str:
    """The bash text that loads the site's modules and the stack's (as the job does) and runs
    ``fingerprint.py`` ($0) with the job's configuration ($1), on the Python found before any module
    changed PATH (a container stack's ``python3`` may be a wrapper of the image)."""
    lines = ['PY=$(command -v python3) || { echo "no python3 on PATH" >&2; exit 127; }', prelude(facts)]
    if isinstance(stack_module, str) and stack_module and facts.modules.system != "none":
        root = expand(facts.modules.install_root, dict(values)).rstrip("/")
        lines.append(f"module use {sh(root)} && module load {sh(stack_module)} || "
                     f"{{ echo {sh('cannot load module ' + stack_module)} >&2; exit 1; }}")
    lines.append('exec "$PY" -E -s -S "$0" --config "$1"')
    return "\n".join(line for line in lines if line)


def read(host: Host, facts: Facts, values: Mapping[str, str], directory: str, config: Mapping[str, Any]) -> Reading:
    """The fingerprint of ``host`` as the job's ``fingerprint.py`` reads it there; never raises: a job
    installed before the program existed, a module that does not load or output that is no fingerprint
    is a :class:`Reading` without one, saying why."""
    stack = config.get("stack") if isinstance(config.get("stack"), dict) else {}
    argv = ["bash", "-c", script(facts, values, (stack or {}).get("module")), f"{directory}/{PROGRAM}",
            f"{directory}/check-config.json"]
    if not host.probe(["test", "-f", f"{directory}/{PROGRAM}"]).ok:
        return Reading(None, None, f"{directory}/{PROGRAM} is not installed (`invoke install-validation-job`)")
    out = output_bounded(host, argv, OUTPUT_MAX, timeout=TIMEOUT)
    if not out.ok or len(out.stdout) > OUTPUT_MAX:
        said = (out.stderr.strip().splitlines() or [f"exit {out.rc}"])[-1]
        return Reading(None, None, f"{PROGRAM} on {host.name}: {escaped(said[:400])}")
    try:
        data = parse_json(out.stdout, PROGRAM)
    except ReadError as exc:
        return Reading(None, None, f"{PROGRAM} on {host.name}: {escaped(exc.reason[:200])}")
    if not isinstance(data, dict) or not isinstance(data.get("fingerprint"), dict):
        return Reading(None, None, f"{PROGRAM} on {host.name} printed no fingerprint")
    digest = (data.get("stack") or {}).get("digest") if isinstance(data.get("stack"), dict) else None
    return Reading(host_facts(data["fingerprint"], KEYS), digest if isinstance(digest, str) else None)


def last_passing(runs: Sequence[Mapping[str, Any]], digest: str | None) -> Mapping[str, Any] | None:
    """The last passed validation of the stack generation ``digest`` whose record holds a fingerprint."""
    records = [r for r in (normalise(run) for run in runs) if r is not None]
    passed = [r for r in records if r["kind"] == "validation" and r["verdict"] == "passed"
              and r["stack"]["digest"] == digest and r.get("fingerprint")]
    return max(passed, key=lambda r: (r["started"], r["id"]), default=None)


def decide(reading: Reading, runs: Sequence[Mapping[str, Any]]) -> tuple[bool, str]:
    """(whether to run the validation, the one line that says why) for ``--if-changed``."""
    if reading.fingerprint is None:
        return True, f"validating: the host's fingerprint cannot be read ({reading.why})"
    stack = f"stack {str(reading.digest)[:8]}" if reading.digest else "this stack (no manifest digest)"
    last = last_passing(runs, reading.digest)
    if last is None:
        return True, f"validating: no passing run of {stack} with a host fingerprint in the history"
    changes = toolchain_changes(last["fingerprint"], reading.fingerprint, KEYS)
    if not changes:
        return False, (f"unchanged: the host's fingerprint is that of the last passing run {last['id']} of {stack}; "
                       "nothing submitted")
    return True, f"re-validating: the host changed since the last passing run {last['id']}: " + "; ".join(changes)
