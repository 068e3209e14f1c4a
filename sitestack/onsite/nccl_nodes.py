"""The third part of ``nccl_log.py``: how many nodes an NCCL/RCCL log shows, which rank ran on which
host, and what a host's peers saw of its network (:func:`nodes`, :func:`attribute`; contract in
:mod:`nccl_log`).

Standard library only, and nothing of sitestack: installed on the site beside ``nccl_log.py`` and
``nccl_parse.py``, imported from its own directory. A host name is weak evidence of a node:
containers are often all called ``ubuntu`` or ``algo-1`` (SageMaker), and NCCL_DEBUG_FILE=%h.%p
gives one file per process, so one file shows one host whatever the run spanned. What NCCL itself
prints about the communicator, its channels and its bootstrap address decides first.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
from dataclasses import dataclass, field

from .nccl_lines import unglue
from .nccl_parse import NO_HOST, HostReport, Line, network_kind

# A communicator and this process's rank in it. NCCL 2.4 to 2.19: "comm 0x7f6f04001cf0 rank 1 nranks 16
# cudaDev 1 nvmlDev 1 - Init COMPLETE" (NVIDIA/nccl#229); 2.18+: "ncclCommInitRank comm 0x.. rank 0
# nranks 2 cudaDev 0 nvmlDev 0 busId 1000 commId 0x.. - Init COMPLETE" (also "Init START",
# "ncclCommInitRankConfig", "ncclCommSplit ... parent 0x.. color 0 key 1"); RCCL adds "localSize N
# used N bytes" (ROCm/rccl src/init.cc: a size in bytes, not ranks). NCCL >= 2.20 (src/init.cc,
# initTransportsRank): "comm 0x.. rank 0 nRanks 2 nNodes 2 localRanks 1 localRank 0 MNNVL 0"
# (aws/aws-ofi-nccl#801, NVIDIA/nccl-tests#213). "nlocalranks N" is read as localRanks too.
# (Ranks and counts have at most 9 digits: what int() reads in bounded time, and no run is larger.)
_COMM = re.compile(r"\bcomm (?:0x)?[0-9a-fA-F]+ rank (?P<rank>\d{1,9}) n[Rr]anks (?P<nranks>\d{1,9})\b(?P<rest>.*)")
_NNODES = re.compile(r"\bnNodes (?P<n>\d{1,9})\b")
_LOCALS = re.compile(r"\bn?local ?ranks (?P<n>\d{1,9})\b", re.IGNORECASE)
# A channel (ring or tree edge) and its transport (src/transport/net.cc, p2p.cc, shm.cc): "Channel
# 00/0 : 7[7] -> 8[0] [send] via NET/IB/0", "Channel 02 : 6[b1000] -> 14[b1000] [receive] via
# NET/IB/0/GDRDMA", "Channel 05/1 : 6[6] -> 10[2] [send] via NET/AWS Libfabric/1(2)/GDRDMA/Shared"
# (PXN: proxied by rank 2), "Channel 00/0 : 3[3] -> 7[7] via P2P/CUMEM/read"; NCCL 2.4: "Ring 00 :
# 7 -> 8 [send] via NET/AWS Libfabric/0" (NVIDIA/nccl#229). A [receive] line is printed by its
# right-hand rank, every other line by its left-hand rank.
_CHANNEL = re.compile(r"^(?:Channel|Ring) \d+(?:/\d+)? : (?P<src>\d{1,9})(?:\[\w+\])? -> (?P<dst>\d{1,9})(?:\[\w+\])? "
                      r"(?:\[(?P<dir>send|receive)\] )?via (?P<via>\S.*)$")
_VIA_NET = re.compile(r"^NET/(?P<name>[^/]+)/\d+")
# This process's address: "Bootstrap : Using eth0:10.0.0.5<0>", "Bootstrap : Using [0]enp7s0:10.10.112.56<0>
# [1]virbr0:...", "Bootstrap: Using bond0:30.159.184.2<0>" (NCCL 2.26); before 2.4.8 the bootstrap
# printed "NET/Socket : Using [0]eth0:10.0.0.34<0>" (NVIDIA/nccl#352), read only in a log without
# any "Bootstrap" line (later, that line names the data path's interfaces, not the process).
_ADDRESS = re.compile(r"^(?P<kind>Bootstrap|NET/Socket) ?: ?Using (?:\[\d+\])?[\w.-]+:(?P<addr>[^<\s]+)<\d+>")

WHAT_SHOWS = ("nNodes/localRanks (NCCL >= 2.20's \"comm ... nRanks N nNodes K localRanks M\" line), a channel "
              "via NET, two bootstrap addresses or two host names")


@dataclass
class Nodes:
    """What a log shows of the run's nodes. ``multi``: True when a network between nodes shows,
    False when one node shows, None when the log cannot tell; ``how``: the line or count that
    decided, or what is missing."""

    multi: bool | None
    how: str
    by_nccl: bool = False  # NCCL's own lines decided (nNodes, localRanks, channels), not names or addresses
    count: int | None = None  # nNodes, or the number of hosts/addresses seen, where the log shows it
    nranks: int | None = None  # the largest communicator's size
    ranks: dict[str, list[int]] = field(default_factory=dict)  # host -> its ranks in that communicator


@dataclass(frozen=True)
class _Channel:
    process: tuple[str, str]
    local: int
    peer: int
    net: str | None  # the NET name ("IB", "AWS Libfabric") or None for P2P/SHM/...
    msg: str


def _channels(lines: list[Line]) -> list[_Channel]:
    out = []
    for ln in lines:
        if m := _CHANNEL.match(ln.msg):
            src, dst = int(m.group("src")), int(m.group("dst"))
            local, peer = (dst, src) if m.group("dir") == "receive" else (src, dst)
            net = _VIA_NET.match(m.group("via"))
            out.append(_Channel((ln.host, ln.pid), local, peer, net.group("name") if net else None, ln.msg))
    return out


def _addresses(lines: list[Line]) -> dict[tuple[str, str], str]:
    """Each process's first valid bootstrap address (redacted or mistyped ones are left out)."""
    found: dict[tuple[str, str], str] = {}
    matches = [(ln, m) for ln in lines if (m := _ADDRESS.match(ln.msg))]
    kind = "Bootstrap" if any(m.group("kind") == "Bootstrap" for _, m in matches) else "NET/Socket"
    for ln, m in matches:
        if (ln.host, ln.pid) not in found and m.group("kind") == kind:
            try:
                found[(ln.host, ln.pid)] = str(ipaddress.ip_address(m.group("addr").split("%")[0]))
            except ValueError:
                continue
    return found


def _rank_hosts(lines: list[Line], chans: list[_Channel], world: int | None) -> dict[int, str]:
    """rank -> host in the largest communicator: from its comm lines, then the ranks channel lines
    name as their own; a rank seen on two hosts (several communicators) is left out."""
    seen: dict[int, set[str]] = {}
    for ln in lines:
        if (m := _COMM.search(ln.msg)) and int(m.group("nranks")) == world:
            seen.setdefault(int(m.group("rank")), set()).add(ln.host)
    for c in chans:
        if world is None or c.local < world:
            seen.setdefault(c.local, set()).add(c.process[0])
    return {rank: next(iter(hosts)) for rank, hosts in seen.items() if len(hosts) == 1}


def attribute(lines: list[Line]) -> list[Line]:
    """``lines`` with program output glued before a host name taken off (:func:`nccl_lines.unglue`),
    and a host name that several processes share at different bootstrap addresses (containers all
    called ``ubuntu``) told apart: ``ubuntu (10.0.0.6)``."""
    lines = unglue(lines)
    addresses = _addresses(lines)
    per_host: dict[str, set[str]] = {}
    for (host, _pid), addr in addresses.items():
        per_host.setdefault(host, set()).add(addr)
    shared = {h for h, addrs in per_host.items() if len(addrs) > 1 and h != NO_HOST}
    if not shared:
        return lines
    return [dataclasses.replace(ln, host=f"{ln.host} ({addresses[(ln.host, ln.pid)]})")
            if ln.host in shared and (ln.host, ln.pid) in addresses else ln for ln in lines]


def nodes(lines: list[Line]) -> Nodes:
    """What ``lines`` show of the nodes: a network between nodes (nNodes > 1, localRanks below nRanks,
    a channel via NET, two host names, two bootstrap addresses), else one node (nNodes 1, one rank,
    localRanks equal to nRanks, or every rank's channels printed and none via NET), else None."""
    comms = [(ln, int(m.group("rank")), int(m.group("nranks")), m.group("rest")) for ln in lines if (m := _COMM.search(ln.msg))]
    world = max((n for _, _, n, _ in comms), default=None)
    chans = _channels(lines)
    rank_hosts = _rank_hosts(lines, chans, world)
    ranks: dict[str, list[int]] = {}
    for rank, host in sorted(rank_hosts.items()):
        ranks.setdefault(host, []).append(rank)
    shown = _multi(lines, comms, chans) or _single(comms, chans, world)
    multi, how, count, by_nccl = shown if shown else (None, _missing(comms, chans, world), None, False)
    return Nodes(multi, how, by_nccl, count, world, ranks)


def _multi(lines: list[Line], comms: list[tuple[Line, int, int, str]],
           chans: list[_Channel]) -> tuple[bool, str, int | None, bool] | None:
    """(True, how, count, by NCCL's own lines) when the log shows a network between nodes, else None."""
    for ln, _rank, nranks, rest in comms:
        if (m := _NNODES.search(rest)) and int(m.group("n")) > 1:
            return True, f"nNodes {m.group('n')} (\"{ln.msg}\" on {ln.host})", int(m.group("n")), True
        if (m := _LOCALS.search(rest)) and int(m.group("n")) < nranks:
            return True, f"localRanks {m.group('n')} of nRanks {nranks} (\"{ln.msg}\" on {ln.host})", None, True
    net = next((c for c in chans if c.net), None)
    if net:
        return True, f"a channel via NET (\"{net.msg}\" on {net.process[0]})", None, True
    hosts = sorted({ln.host for ln in lines if ln.host != NO_HOST})
    if len(hosts) > 1:
        return True, f"{len(hosts)} hosts ({', '.join(hosts[:4])}{', ...' if len(hosts) > 4 else ''})", len(hosts), False
    addrs = sorted(set(_addresses(lines).values()))
    if len(addrs) > 1:
        return True, f"{len(addrs)} bootstrap addresses ({', '.join(addrs[:4])}{', ...' if len(addrs) > 4 else ''})", len(addrs), False
    return None


def _single(comms: list[tuple[Line, int, int, str]], chans: list[_Channel],
            world: int | None) -> tuple[bool, str, int | None, bool] | None:
    """(False, how, 1, True) when the log shows one node and no network between nodes, else None."""
    if world == 1:
        return False, "one rank (nranks 1)", 1, True
    for ln, _rank, nranks, rest in comms:
        if nranks == world and (m := _NNODES.search(rest)) and m.group("n") == "1":
            return False, f"nNodes 1 (\"{ln.msg}\" on {ln.host})", 1, True
        if nranks == world and (m := _LOCALS.search(rest)) and int(m.group("n")) == nranks:
            return False, f"localRanks {nranks} of nRanks {nranks} (\"{ln.msg}\" on {ln.host})", 1, True
    printed = {c.local for c in chans}
    # the count first: a log's "nranks 999999999" must not make a set of a billion ranks
    if world and len(printed) >= world and printed >= set(range(world)):
        return False, f"every one of the {world} ranks printed its channels, none via NET", 1, True
    return None


def _missing(comms: list[tuple[Line, int, int, str]], chans: list[_Channel], world: int | None) -> str:
    seen = sorted({rank for _, rank, nranks, _ in comms if nranks == world} | {c.local for c in chans})
    ranks = f"; ranks seen: {_span(seen)} of {world}" if world and seen else ""
    return f"the log shows none of {WHAT_SHOWS}{ranks}"


def _span(ranks: list[int]) -> str:
    """``0-3, 8`` for [0, 1, 2, 3, 8]."""
    parts: list[str] = []
    for r in ranks:
        if parts and r == int(parts[-1].split("-")[-1]) + 1:
            parts[-1] = f"{parts[-1].split('-')[0]}-{r}"
        else:
            parts.append(str(r))
    return ", ".join(parts)


def from_peers(reports: list[HostReport], lines: list[Line], shown: Nodes) -> None:
    """Give each host its ranks, and to a host whose own lines show no network the one its peers'
    channel lines to its ranks went through (``-> 3[..] via NET/IB/0`` on another host: rank 3's
    host talked over IB). Only where one communicator size shows: with several, rank numbers of
    one communicator would be read against another's hosts."""
    for r in reports:
        r.ranks = shown.ranks.get(r.host, [])
    sizes = {int(m.group("nranks")) for ln in lines if (m := _COMM.search(ln.msg))}
    if len(sizes) > 1:
        return
    rank_host = {rank: host for host, ranks in shown.ranks.items() for rank in ranks}
    by_host = {r.host: r for r in reports}
    for c in _channels(lines):
        peer_host = rank_host.get(c.peer)
        target = by_host.get(peer_host or "")
        if c.net is None or target is None or peer_host == c.process[0] or target.selected != "unknown":
            continue
        kind = network_kind(c.net)
        target.selected, target.transport, target.transports, target.network = kind, kind, [kind], c.net
        target.intra_node_only = False
        target.peer_evidence = f"{c.process[0]} {c.msg}"
        target.evidence.append(f"{c.process[0]} (a peer of rank {c.peer}) INFO {c.msg}")


def span(ranks: list[int]) -> str:
    """Ranks in words: ``rank 3``, ``ranks 0-7``."""
    return ("rank " if len(ranks) == 1 else "ranks ") + _span(ranks)
