#!/usr/bin/env python3
"""Read NCCL/RCCL ``NCCL_DEBUG=INFO`` logs: which network each host used, and whether that is right.

Standard library only, and nothing of sitestack: this file and the reading parts it imports
from its own directory (``nccl_lines.py``: the lines; ``nccl_parse.py``: each host's network;
``nccl_nodes.py``: the nodes and ranks they show; ``visible.py``: text made safe for a terminal) are
installed on the site beside ``ddp_check.py`` (whose net-plugin check calls it) and runs on a log a
user already has::

    python nccl_log.py FILE... [--expect-transport ofi] [--expect-provider cxi]
                       [--expect-plugin aws-ofi-rccl] [--nodes single|multi] [--json]

Contract:

- Bounded: :func:`read_logs` reads regular files only, line by line (a carriage return ends a line
  too), each line up to 16 KiB (``LINE_MAX``: the rest of a longer line is dropped as it is read)
  and at most 250 000 NCCL messages (``MESSAGES_MAX``: the rest of the logs is not read); the
  verdict notes either. Time is linear in
  the logs' size, memory bounded whatever it is; terminal escape sequences in a log become spaces
  and its other control characters visible escapes (``\\x1b``), so the report acts on no terminal.
- :func:`parse` reads every log format NCCL and RCCL have printed since NCCL 2.4: lines
  ``host:pid:tid [dev] NCCL INFO|WARN msg`` (also ``func:line NCCL WARN msg``) behind any prefix
  (Open MPI's ``[1,N]<stdout>:``, pdsh's ``host: ``, Ray's ``(pid=..)``, timestamps, CloudWatch
  ``| time | line | line`` columns), and lines with no host prefix at all (``[0] NCCL INFO ...``
  or ``NCCL INFO ...``: users strip it), which count under the host ``?``, as do lines stripped of
  the whole prefix that start as an NCCL message does (``NET/OFI Selected Provider is cxi``).
  A program's output glued before a host name (``-1nid001049:...``) is taken off it
  (:func:`nccl_lines.unglue`).
- :func:`nodes` says what the log shows of the run's nodes (:class:`Nodes`): several (nNodes > 1,
  localRanks below nRanks, a channel via NET, two host names or bootstrap addresses), one (nNodes 1,
  one rank, every rank's channels P2P/SHM), or ``None``: it cannot tell.
- :func:`classify` gives one :class:`HostReport` per host: the transport it used (``ofi``,
  ``ib``, ``ibext``, ``socket``, ``mixed`` when its processes differ, ``intra-node`` when its
  channels are all P2P/SHM, ``unknown`` when no line shows it), the network NCCL set up
  (``selected``), the libfabric provider, the external plugin and its state (``loaded``,
  ``not-found``, ``failed``, ``disabled``, or ``none`` when the log says nothing), its ranks, and,
  for a host whose own lines show no network, the one its peers' channel lines to its ranks show.
  Processes that share a host name at different bootstrap addresses are hosts of their own.
- :func:`judge` compares that with an :class:`Expectation` and returns a :class:`Verdict`:
  ``PASS``, ``FAIL`` or ``WARN`` with a one-line cause (plugin not found; plugin found but failed
  to initialise, quoting its message; wrong provider; wrong plugin; NCCL_NET forced; IB
  disabled; an NCCL warning), naming the host and its ranks, and notes (a pre-2.4.8 bootstrap ``NET/Socket : Using``
  line, which is not a fallback). The number of nodes is what the expectation states, else what the
  log shows; a log that cannot tell is WARN (``cannot tell: ...``), never PASS, unless it FAILs.
  Three faults FAIL whatever the expectation and the number of nodes: a network NCCL_NET names that
  NCCL did not find (``Error: network AWS Libfabric not found.``: NCCL does not start), no
  interface for NCCL's bootstrap (``Bootstrap : no socket interface found``: nor does it), and a
  net plugin loaded on some hosts and not on others; the cause names the hosts and their ranks.

The messages matched here, and the public logs they come from, are listed beside each pattern;
``tests/data/nccl-logs/`` holds those logs with their sources, and the tests run over all of them.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from .nccl_nodes import Nodes, attribute, from_peers, span
from .nccl_nodes import nodes as _nodes
from .nccl_parse import LINE_MAX, MESSAGES_MAX, NO_HOST, HostReport, Line, network_kind, parse, read_files
from .nccl_parse import classify as _classify
from .visible import printable

PASS, FAIL, WARN = "PASS", "FAIL", "WARN"

__all__ = ["FAIL", "NO_HOST", "PASS", "WARN", "Expectation", "HostReport", "Line", "Nodes", "Verdict", "classify",
           "judge", "label", "main", "nodes", "parse", "read", "read_files", "read_logs", "render", "summary"]


def classify(lines: list[Line]) -> list[HostReport]:
    """One report per host (:func:`nccl_parse.classify`), with a host name that processes share at
    different bootstrap addresses told apart (``ubuntu (10.0.0.6)``), each host's ranks, and a host
    whose own lines show no network given the one its peers' channel lines to its ranks show."""
    lines = attribute(lines)
    reports = _classify(lines)
    from_peers(reports, lines, _nodes(lines))
    return reports


def nodes(lines: list[Line]) -> Nodes:
    """What ``lines`` show of the run's nodes (:func:`nccl_nodes.nodes`): several, one, or cannot tell."""
    return _nodes(attribute(lines))


@dataclass(frozen=True)
class Expectation:
    """What a site expects between nodes. ``transport``: ofi, ib, ibext, socket or None (any but
    sockets); ``strict``: the logs are complete (written by the validation job), so a host that
    shows no transport fails instead of warning."""

    transport: str | None = None
    provider: str | None = None
    plugin: str | None = None
    multi_node: bool | None = None  # None: what the log shows (:func:`nodes`); False yields to a network the log shows
    strict: bool = False


@dataclass
class Verdict:
    """The outcome: status, a one-line cause, notes, and the per-host reports."""

    status: str
    cause: str
    hosts: list[HostReport]
    notes: list[str] = field(default_factory=list)
    version: str | None = None  # e.g. "NCCL 2.4.6", "RCCL 2.21.5"
    nodes: Nodes | None = None  # what the log showed of the nodes

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
    if r.peer_evidence:
        text += " (shown by a peer's channel line)"
    return text


def _at(r: HostReport) -> str:
    """A host and its ranks where the log shows them: ``algo-1 (ranks 8-15)``."""
    return f"{r.host} ({span(r.ranks)})" if r.ranks else r.host


# A warning of the network layers ("NET/OFI Couldn't open AV", "Call to ibv_modify_qp failed",
# "socketProgress: Connection closed by remote peer"), named so; any other is NCCL's.
_NET_WARNING = re.compile(r"NET/|Call to ibv|socket", re.IGNORECASE)
# NCCL found no interface for its bootstrap and stops (ncclInternalError / ncclInvalidUsage):
# "Bootstrap : no socket interface found" (NVIDIA/nccl src/bootstrap.cc bootstrapNetInit, as
# EasonXiao-888/MambaTree#14 quotes it), "Bootstrap : no NCCL_SOCKET_IFNAME interface found" (NVIDIA/nccl#1837).
_NO_INTERFACE = re.compile(r"Bootstrap ?: ?no (?:socket|NCCL_SOCKET_IFNAME) interface found")
_NAMES = {"ofi": "OFI", "ib": "IB", "ibext": "IBext", "socket": "Socket"}


def _used(r: HostReport) -> str:
    return f"it used {label(r)}" if r.selected != "unknown" else "no line shows which network it used"


def _why_not(r: HostReport, want: str | None, wanted: str) -> str:
    """The cause of host ``r`` not using the expected network: what its log says stopped it."""
    site = f", the site expects {wanted}" if wanted else ""
    if r.forced and network_kind(r.forced) != want:  # forcing the expected network only names it
        return f"NCCL_NET forced to {r.forced!r} by the environment on {_at(r)}: {_used(r)}{site}"
    if r.plugin_state == "failed":
        return f"plugin found but failed to initialise on {_at(r)}: \"{r.plugin_message}\"; {_used(r)}{site}"
    if r.plugin_state == "disabled":
        return f"plugin {r.plugin or ''} disabled on {_at(r)} (\"{r.plugin_message}\"); {_used(r)}{site}".replace("  ", " ")
    if r.ib_disabled and (want in ("ib", "ibext") or r.plugin_state != "not-found"):
        return f"IB disabled by NCCL_IB_DISABLE=1 on {_at(r)}: {_used(r)}{site}"
    if r.plugin_state == "not-found" and want in ("ofi", "ibext", None):
        return f"plugin not found on {_at(r)} (\"{r.plugin_message}\"); {_used(r)}{site}"
    return f"{_at(r)}: {_used(r)}{site}"


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
        warned = f"; NCCL warned: \"{r.warnings[0]}\"" if r.warnings else ""
        return (FAIL if expect.strict else WARN), f"no line shows which network {_at(r)} used{warned}"
    if "socket" in r.transports and want != "socket":
        if want is None:
            why = _why_not(r, want, "").removeprefix(f"{_at(r)}: ")
            return WARN, f"fell back to TCP sockets between nodes on {_at(r)} (the site named no network): {why}"
        return FAIL, _why_not(r, want, wanted)
    if want == "ofi":
        if "ofi" not in r.transports and r.plugin_state == "loaded":
            return FAIL, f"wrong plugin on {_at(r)}: {label(r)} loaded, the site expects {wanted}"
        if r.transports != ["ofi"]:
            return FAIL, _why_not(r, want, wanted)
        if expect.provider and r.provider and r.provider.split(";")[0] != expect.provider:
            return FAIL, f"wrong provider on {_at(r)}: {r.provider}, the site expects {expect.provider}"
    elif want in ("ib", "ibext"):
        if "ofi" in r.transports:
            return FAIL, f"wrong plugin on {_at(r)}: {label(r)} loaded, the site expects {wanted}"
        if want == "ibext" and r.transports != ["ibext"]:
            return FAIL, _why_not(r, want, wanted)
    if r.warnings:
        who = "the network" if _NET_WARNING.match(r.warnings[0]) else "NCCL"
        return WARN, f"{_at(r)} used {label(r)}, but {who} warned: \"{r.warnings[0]}\""
    return PASS, f"{_at(r)}: {label(r)}"


def judge(hosts: list[HostReport], expect: Expectation, version: str | None = None,
          shown: Nodes | None = None) -> Verdict:
    """The verdict for a run whose hosts are ``hosts``; ``shown``: what its log showed of the nodes
    (:func:`nodes`; without it, only the host names count). Several nodes, or an expectation of
    several: each host is judged (:func:`_judge_host`). One node: PASS, the network between nodes
    is not used (WARN where the expected plugin failed). Cannot tell and no expectation: judged as
    several nodes, and what would pass is a WARN that names what is missing instead."""
    named = sorted({r.host for r in hosts if r.host != NO_HOST})
    if shown is None:
        shown = Nodes(True, f"{len(named)} hosts", count=len(named)) if len(named) > 1 else Nodes(None, "one host name")
    notes = []
    if any(r.bootstrap_socket for r in hosts):
        notes.append("the NET/Socket : Using line is NCCL < 2.4.8's bootstrap, not a socket fallback")
    multi = expect.multi_node
    if multi is False and shown.multi and shown.by_nccl:  # names and addresses yield to the user, NCCL's lines not
        notes.append(f"judged as several nodes although one was given: the log shows {shown.how}")
        multi = True
    if failed := _run_failures(hosts):
        return Verdict(FAIL, failed, hosts, notes, version, shown)
    if not hosts:
        status = FAIL if (multi and expect.strict) else WARN
        return Verdict(status, ("no NCCL_DEBUG=INFO lines found: cannot prove which network the hosts used "
                                "(is NCCL_DEBUG=INFO set, NCCL_DEBUG_FILE writable?)"), hosts, notes, version, shown)
    if multi is None:
        multi = shown.multi
    if multi is False:
        problems = [r for r in hosts if r.plugin_state == "failed" and expect.transport in ("ofi", "ibext")]
        where = ", ".join(f"{r.host}: {label(r)}" for r in hosts)
        how = f"one node ({shown.how})" if shown.multi is False and expect.multi_node is None else "one node"
        if problems:
            cause = _why_not(problems[0], expect.transport, "")
            return Verdict(WARN, f"{how}: the network between nodes is not used, but {cause}", hosts, notes, version, shown)
        return Verdict(PASS, f"{how}: the network between nodes is not used ({where})", hosts, notes, version, shown)
    status, cause = _judge_hosts(hosts, expect)
    if multi is None:
        missing = f"the log does not show whether the run spanned nodes: {shown.how}"
        if status == FAIL:
            notes.append(f"{missing}; judged as several nodes (--nodes single|multi decides)")
        else:
            status, cause = WARN, f"cannot tell: {missing}; --nodes single|multi decides (as several nodes: {status}: {cause})"
    return Verdict(status, cause, hosts, notes, version, shown)


def _hosts_at(reports: list[HostReport], most: int = 4) -> str:
    """Hosts with their ranks, the first ``most`` of them: ``a (ranks 0-3), b (ranks 4-7) and 2 more``."""
    named = ", ".join(_at(r) for r in reports[:most])
    return named + (f" and {len(reports) - most} more" if len(reports) > most else "")


def _run_failures(hosts: list[HostReport]) -> str | None:
    """The cause of a run that failed whatever the site expects, else None: NCCL_NET named a
    network NCCL did not find (NCCL fails to initialise: ncclInvalidUsage, NVIDIA/nccl src/net.cc),
    or a net plugin loaded on some hosts and not on others (their ranks use different networks,
    or none: one run's nodes are one installation)."""
    missing = [r for r in hosts if r.missing_network is not None]
    if missing:
        name, why = missing[0].missing_network, missing[0]
        reason = f": {why.plugin_message}" if why.plugin_state in ("not-found", "failed") and why.plugin_message else \
            " (is the plugin that provides it on the library path, its module loaded?)"
        if not name:  # NCCL_NET unset: no transport came up at all
            return f"NCCL found no network it could use on {_hosts_at(missing)}: \"Error: network  not found.\"; NCCL stops there"
        return (f"NCCL_NET names the network {name!r}, which NCCL did not find on {_hosts_at(missing)}: "
                f"\"Error: network {name} not found.\"; NCCL stops there{reason}")
    no_interface = [r for r in hosts if any(_NO_INTERFACE.match(w) for w in r.warnings)]
    if no_interface:
        line = next(w for w in no_interface[0].warnings if _NO_INTERFACE.match(w))
        return (f"no network interface for NCCL's bootstrap on {_hosts_at(no_interface)}: \"{line}\"; NCCL stops there "
                "(does NCCL_SOCKET_IFNAME name an interface these hosts have?)")
    named = [r for r in hosts if r.host != NO_HOST]
    loaded = [r for r in named if r.plugin_state == "loaded"]
    lacking = [r for r in named if r.plugin_state in ("not-found", "failed")]
    if loaded and lacking:
        plugin = next((f" ({r.plugin})" for r in loaded if r.plugin), "")
        how = "not found" if lacking[0].plugin_state == "not-found" else "found but failed to initialise"
        used = "" if lacking[0].selected == "unknown" else f"; {lacking[0].host} used {label(lacking[0])}"
        return (f"plugin {how} on {_hosts_at(lacking)} (\"{lacking[0].plugin_message}\"), but loaded on "
                f"{_hosts_at(loaded)}{plugin}: the run's hosts differ{used}")
    return None


def _judge_hosts(hosts: list[HostReport], expect: Expectation) -> tuple[str, str]:
    """(status, cause) of hosts that used the network between nodes: the first FAIL, else the first
    WARN, else PASS with what they used."""
    ordered = sorted(hosts, key=lambda r: r.selected == "unknown")  # a host that shows its network names the cause best
    results = [(r, *_judge_host(r, expect)) for r in ordered]
    for status in (FAIL, WARN):
        # a cause that names why (a plugin message, a variable, a wrong provider) first
        bad = sorted(((r, cause) for r, s, cause in results if s == status),
                     key=lambda rc: rc[1].startswith((f"{_at(rc[0])}:", "no line shows")))
        if bad:
            others = [r for r, _ in bad[1:]]
            more = (f"; {len(others)} more host{'s' if len(others) > 1 else ''} with a {status}: "
                    f"{_hosts_at(others, 3)}") if others else ""
            return status, bad[0][1] + more
    if len(hosts) == 1:  # one host name for several nodes (containers), or one host's log
        return PASS, f"{_at(hosts[0])} used {summary(hosts)} between nodes"
    return PASS, f"{len(hosts)} hosts used {summary(hosts)}"


def summary(hosts: list[HostReport]) -> str:
    """What a set of hosts used, in words: ``OFI (provider cxi, aws-ofi-rccl 1.4.0)``."""
    kinds = sorted({_NAMES.get(t, t) for r in hosts for t in r.transports}) or ["unknown"]
    extra = sorted({f"provider {r.provider}" for r in hosts if r.provider}
                   | {r.plugin for r in hosts if r.plugin and r.plugin_state == "loaded"})
    return "/".join(kinds) + (f" ({', '.join(extra)})" if extra else "")


def read(text: str, expect: Expectation | None = None) -> Verdict:
    """Parse, classify and judge one log's text."""
    lines, version = parse(text)
    return judge(classify(lines), expect or Expectation(), version, nodes(lines))


def read_logs(paths: Sequence[str], expect: Expectation | None = None) -> Verdict:
    """Parse, classify and judge the log files ``paths`` together, as one run's: read line by line
    within :func:`nccl_lines.read_files`'s bounds, whose notes (lines cut, messages left unread)
    join the verdict's. An unreadable file (or one that is not a regular file) raises OSError."""
    reader = read_files(paths)
    verdict = judge(classify(reader.lines), expect or Expectation(), reader.version, nodes(reader.lines))
    verdict.notes += reader.notes()
    return verdict


def render(verdict: Verdict) -> str:
    """The human report: one line per host, then the verdict; safe to print on a terminal
    (control characters a log held are shown as escapes, :func:`visible.printable`)."""
    out = [f"{r.host:<24} {label(r)}" + (f"  [plugin {r.plugin_state}]" if r.plugin_state != "none" else "")
           for r in verdict.hosts]
    if verdict.version:
        out.append(f"version: {verdict.version}")
    if verdict.nodes:
        n = verdict.nodes
        kind = {True: "several", False: "one", None: "cannot tell"}[n.multi] + (f" ({n.count})" if n.count and n.multi else "")
        out.append(f"nodes: {kind}: {n.how}")
    out += [f"note: {n}" for n in verdict.notes]
    out.append(f"{verdict.status}: {verdict.cause}")
    return printable("\n".join(out)) + "\n"


def main(argv: list[str] | None = None) -> int:
    """``nccl_log.py FILE...``: exit 0 on PASS or WARN, 1 on FAIL, 2 on unreadable input."""
    p = argparse.ArgumentParser(description="Which network did NCCL/RCCL use? Reads NCCL_DEBUG=INFO logs.",
                                epilog=f"Bounds: each line is read up to {LINE_MAX // 1024} KiB (the rest of a longer "
                                f"line is dropped); at most {MESSAGES_MAX} NCCL messages are kept from all the files "
                                "(the rest is not read); the verdict notes either.")
    p.add_argument("files", nargs="+", metavar="FILE", help="log files, regular files only (their lines are read together)")
    p.add_argument("--expect-transport", choices=("ofi", "ib", "ibext", "socket"), help="the network the site expects")
    p.add_argument("--expect-provider", help="libfabric provider the site expects, e.g. cxi")
    p.add_argument("--expect-plugin", help="network plugin the site expects, e.g. aws-ofi-rccl")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--multi-node", dest="multi", action="store_const", const=True, help="the run spanned nodes")
    group.add_argument("--single-node", dest="multi", action="store_const", const=False, help="the run used one node")
    group.add_argument("--nodes", dest="multi", choices=("single", "multi"), help="the same: single or multi "
                       "(default: what the log shows; WARN when it cannot tell)")
    p.add_argument("--json", action="store_true", help="print the verdict as JSON")
    args = p.parse_args(argv)
    multi = {"multi": True, "single": False}.get(args.multi, args.multi)
    expect = Expectation(args.expect_transport, args.expect_provider, args.expect_plugin, multi)
    try:
        verdict = read_logs(args.files, expect)
    except OSError as exc:
        print(printable(f"error: {exc.filename or '?'}: {exc.strerror or exc}"), file=sys.stderr)
        return 2
    print(json.dumps(verdict.as_dict(), indent=2) if args.json else render(verdict), end="" if not args.json else "\n")
    return 1 if verdict.status == FAIL else 0


if __name__ == "__main__":
    sys.exit(main())
