#!/usr/bin/env python3
"""Read NCCL/RCCL ``NCCL_DEBUG=INFO`` logs: which network each host used, and whether that is right.

Standard library only, and nothing of sitestack: this file and the reading half it imports from
its own directory (``nccl_parse.py``) are installed on the site beside ``ddp_check.py`` (whose
net-plugin check calls it) and runs on a log a user already has::

    python nccl_log.py FILE... [--expect-transport ofi] [--expect-provider cxi]
                       [--expect-plugin aws-ofi-rccl] [--multi-node | --single-node] [--json]

Contract:

- :func:`parse` reads every log format NCCL and RCCL have printed since NCCL 2.4: lines
  ``host:pid:tid [dev] NCCL INFO|WARN msg`` (also ``func:line NCCL WARN msg``) behind any prefix
  (Open MPI's ``[1,N]<stdout>:``, pdsh's ``host: ``, Ray's ``(pid=..)``, timestamps, CloudWatch
  ``| time | line | line`` columns), and lines with no host prefix at all (``[0] NCCL INFO ...``
  or ``NCCL INFO ...``: users strip it), which count under the host ``?``.
- :func:`classify` gives one :class:`HostReport` per host: the transport it used (``ofi``,
  ``ib``, ``ibext``, ``socket``, ``mixed`` when its processes differ, ``intra-node`` when its
  channels are all P2P/SHM, ``unknown`` when no line shows it), the network NCCL set up
  (``selected``), the libfabric provider, the external plugin and its state (``loaded``,
  ``not-found``, ``failed``, ``disabled``, or ``none`` when the log says nothing).
- :func:`judge` compares that with an :class:`Expectation` and returns a :class:`Verdict`:
  ``PASS``, ``FAIL`` or ``WARN`` with a one-line cause (plugin not found; plugin found but failed
  to initialise, quoting its message; wrong provider; wrong plugin; NCCL_NET forced; IB
  disabled) and notes (a pre-2.4.8 bootstrap ``NET/Socket : Using`` line, which is not a fallback).

The messages matched here, and the public logs they come from, are listed beside each pattern;
``tests/data/nccl-logs/`` holds those logs with their sources, and the tests run over all of them.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, field

try:  # imported as part of sitestack
    from .nccl_parse import NO_HOST, HostReport, Line, classify, network_kind, parse
except ImportError:  # run on its own, beside nccl_parse.py (the validation job's directory)
    from nccl_parse import NO_HOST, HostReport, Line, classify, network_kind, parse  # type: ignore[no-redef, import-not-found, unused-ignore]

PASS, FAIL, WARN = "PASS", "FAIL", "WARN"

__all__ = ["FAIL", "NO_HOST", "PASS", "WARN", "Expectation", "HostReport", "Line", "Verdict", "classify",
           "judge", "label", "main", "parse", "read", "render", "summary"]


@dataclass(frozen=True)
class Expectation:
    """What a site expects between nodes. ``transport``: ofi, ib, ibext, socket or None (any but
    sockets); ``strict``: the logs are complete (written by the validation job), so a host that
    shows no transport fails instead of warning."""

    transport: str | None = None
    provider: str | None = None
    plugin: str | None = None
    multi_node: bool | None = None  # None: more than one host in the log
    strict: bool = False


@dataclass
class Verdict:
    """The outcome: status, a one-line cause, notes, and the per-host reports."""

    status: str
    cause: str
    hosts: list[HostReport]
    notes: list[str] = field(default_factory=list)
    version: str | None = None  # e.g. "NCCL 2.4.6", "RCCL 2.21.5"

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def label(r: HostReport) -> str:
    """A host's transport in words, e.g. ``OFI (provider cxi, aws-ofi-rccl 1.4.0)``."""
    text = _NAMES.get(r.selected, r.selected)
    if r.selected == "mixed":
        text += " (" + ", ".join(_NAMES.get(t, t) for t in r.transports) + ")"
    extra = [f"provider {r.provider}"] if r.provider else []
    if r.ib_devices and r.selected in ("ib", "ibext") and r.ib_devices != "IB":
        extra.append(r.ib_devices)
    if r.plugin and r.plugin_state == "loaded" and r.selected in ("ofi", "ibext"):
        extra.append(r.plugin)
    if extra:
        text += " (" + ", ".join(extra) + ")"
    if r.intra_node_only:
        text = "intra-node only" + ("" if r.selected == "unknown" else f" (network set up: {text})")
    return text


_NAMES = {"ofi": "OFI", "ib": "IB", "ibext": "IBext", "socket": "Socket"}


def _used(r: HostReport) -> str:
    return f"it used {label(r)}" if r.selected != "unknown" else "no line shows which network it used"


def _why_not(r: HostReport, want: str | None, wanted: str) -> str:
    """The cause of host ``r`` not using the expected network: what its log says stopped it."""
    site = f", the site expects {wanted}" if wanted else ""
    if r.forced and network_kind(r.forced) != want:  # forcing the expected network only names it
        return f"NCCL_NET forced to {r.forced!r} by the environment on {r.host}: {_used(r)}{site}"
    if r.plugin_state == "failed":
        return f"plugin found but failed to initialise on {r.host}: \"{r.plugin_message}\"; {_used(r)}{site}"
    if r.plugin_state == "disabled":
        return f"plugin {r.plugin or ''} disabled on {r.host} (\"{r.plugin_message}\"); {_used(r)}{site}".replace("  ", " ")
    if r.ib_disabled and (want in ("ib", "ibext") or r.plugin_state != "not-found"):
        return f"IB disabled by NCCL_IB_DISABLE=1 on {r.host}: {_used(r)}{site}"
    if r.plugin_state == "not-found" and want in ("ofi", "ibext", None):
        return f"plugin not found on {r.host} (\"{r.plugin_message}\"); {_used(r)}{site}"
    return f"{r.host}: {_used(r)}{site}"


def _judge_host(r: HostReport, expect: Expectation) -> tuple[str, str]:
    want = expect.transport
    wanted = _NAMES.get(want or "", want or "")
    if expect.plugin:
        wanted += f" through {expect.plugin}"
    if expect.provider:
        wanted += f" with provider {expect.provider}"
    if r.selected == "unknown":
        if r.plugin_state in ("failed", "not-found", "disabled") and want in ("ofi", "ibext"):
            return FAIL, _why_not(r, want, wanted)
        return (FAIL if expect.strict else WARN), f"no line shows which network {r.host} used"
    if "socket" in r.transports and want != "socket":
        if want is None:
            why = _why_not(r, want, "").removeprefix(f"{r.host}: ")
            return WARN, f"fell back to TCP sockets between nodes on {r.host} (the site named no network): {why}"
        return FAIL, _why_not(r, want, wanted)
    if want == "ofi":
        if "ofi" not in r.transports and r.plugin_state == "loaded":
            return FAIL, f"wrong plugin on {r.host}: {label(r)} loaded, the site expects {wanted}"
        if r.transports != ["ofi"]:
            return FAIL, _why_not(r, want, wanted)
        if expect.provider and r.provider and r.provider.split(";")[0] != expect.provider:
            return FAIL, f"wrong provider on {r.host}: {r.provider}, the site expects {expect.provider}"
    elif want in ("ib", "ibext"):
        if "ofi" in r.transports:
            return FAIL, f"wrong plugin on {r.host}: {label(r)} loaded, the site expects {wanted}"
        if want == "ibext" and r.transports != ["ibext"]:
            return FAIL, _why_not(r, want, wanted)
    if r.warnings:
        return WARN, f"{r.host} used {label(r)}, but the network warned: \"{r.warnings[0]}\""
    return PASS, f"{r.host}: {label(r)}"


def judge(hosts: list[HostReport], expect: Expectation, version: str | None = None) -> Verdict:
    """The verdict for a run whose hosts are ``hosts``."""
    named = [r for r in hosts if r.host != NO_HOST]
    multi = expect.multi_node if expect.multi_node is not None else len(named) > 1
    notes = []
    if any(r.bootstrap_socket for r in hosts):
        notes.append("the NET/Socket : Using line is NCCL < 2.4.8's bootstrap, not a socket fallback")
    if not hosts:
        status = FAIL if (multi and expect.strict) else WARN
        return Verdict(status, ("no NCCL_DEBUG=INFO lines found: cannot prove which network the hosts used "
                                     "(is NCCL_DEBUG=INFO set, NCCL_DEBUG_FILE writable?)"),
                       hosts, notes, version)
    if not multi:
        problems = [r for r in hosts if r.plugin_state == "failed" and expect.transport in ("ofi", "ibext")]
        where = ", ".join(f"{r.host}: {label(r)}" for r in hosts)
        if problems:
            cause = _why_not(problems[0], expect.transport, "")
            return Verdict(WARN, f"one node (the network between nodes is not used), but {cause}", hosts, notes, version)
        return Verdict(PASS, f"one node: the network between nodes is not used ({where})", hosts, notes, version)
    ordered = sorted(hosts, key=lambda r: r.selected == "unknown")  # a host that shows its network names the cause best
    results = [(r, *_judge_host(r, expect)) for r in ordered]
    for status in (FAIL, WARN):
        # a cause that names why (a plugin message, a variable, a wrong provider) first
        bad = sorted(((r, cause) for r, s, cause in results if s == status),
                     key=lambda rc: rc[1].startswith((f"{rc[0].host}:", "no line shows")))
        if bad:
            more = f"; {len(bad) - 1} more host{'s' if len(bad) > 2 else ''} with a {status}" if len(bad) > 1 else ""
            return Verdict(status, bad[0][1] + more, hosts, notes, version)
    return Verdict(PASS, f"{len(hosts)} host{'s' if len(hosts) > 1 else ''} used {summary(hosts)}", hosts, notes, version)


def summary(hosts: list[HostReport]) -> str:
    """What a set of hosts used, in words: ``OFI (provider cxi, aws-ofi-rccl 1.4.0)``."""
    kinds = sorted({_NAMES.get(t, t) for r in hosts for t in r.transports}) or ["unknown"]
    extra = sorted({f"provider {r.provider}" for r in hosts if r.provider}
                   | {r.plugin for r in hosts if r.plugin and r.plugin_state == "loaded"})
    return "/".join(kinds) + (f" ({', '.join(extra)})" if extra else "")


def read(text: str, expect: Expectation | None = None) -> Verdict:
    """Parse, classify and judge one log's text."""
    lines, version = parse(text)
    return judge(classify(lines), expect or Expectation(), version)


def render(verdict: Verdict) -> str:
    """The human report: one line per host, then the verdict."""
    out = [f"{r.host:<24} {label(r)}" + (f"  [plugin {r.plugin_state}]" if r.plugin_state != "none" else "")
           for r in verdict.hosts]
    if verdict.version:
        out.append(f"version: {verdict.version}")
    out += [f"note: {n}" for n in verdict.notes]
    out.append(f"{verdict.status}: {verdict.cause}")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    """``nccl_log.py FILE...``: exit 0 on PASS or WARN, 1 on FAIL, 2 on unreadable input."""
    p = argparse.ArgumentParser(description="Which network did NCCL/RCCL use? Reads NCCL_DEBUG=INFO logs.")
    p.add_argument("files", nargs="+", metavar="FILE", help="log files (their lines are read together)")
    p.add_argument("--expect-transport", choices=("ofi", "ib", "ibext", "socket"), help="the network the site expects")
    p.add_argument("--expect-provider", help="libfabric provider the site expects, e.g. cxi")
    p.add_argument("--expect-plugin", help="network plugin the site expects, e.g. aws-ofi-rccl")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--multi-node", dest="multi", action="store_const", const=True, help="the run spanned nodes")
    group.add_argument("--single-node", dest="multi", action="store_const", const=False, help="the run used one node")
    p.add_argument("--json", action="store_true", help="print the verdict as JSON")
    args = p.parse_args(argv)
    texts = []
    for path in args.files:
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                texts.append(handle.read())
        except OSError as exc:
            print(f"error: {path}: {exc.strerror or exc}", file=sys.stderr)
            return 2
    expect = Expectation(args.expect_transport, args.expect_provider, args.expect_plugin, args.multi)
    verdict = read("\n".join(texts), expect)
    print(json.dumps(verdict.as_dict(), indent=2) if args.json else render(verdict), end="" if not args.json else "\n")
    return 1 if verdict.status == FAIL else 0


if __name__ == "__main__":
    sys.exit(main())
