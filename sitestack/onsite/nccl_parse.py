"""The reading half of ``nccl_log.py``: which network each host used, from the NCCL/RCCL
``NCCL_DEBUG=INFO`` messages :mod:`nccl_lines` reads (:func:`parse`, :func:`read_files`, re-exported
here; :func:`classify`; contract in :mod:`nccl_log`, which judges them).

Standard library only, and nothing of sitestack: installed on the site beside ``nccl_log.py``,
which imports it from its own directory. The messages matched here, and the public logs they come
from, are listed beside each pattern; ``tests/data/nccl-logs/`` holds those logs with their sources.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .nccl_lines import LINE_MAX, MESSAGES_MAX, NO_HOST, Line, Reader, open_regular, parse, read_files

__all__ = ["LINE_MAX", "MESSAGES_MAX", "NO_HOST", "HostReport", "Line", "Reader", "classify", "network_kind",
           "open_regular", "parse", "read_files"]

# The network chosen: "Using network AWS Libfabric|OFI|Libfabric|IB|IBext|Socket" (NCCL >= 2.5);
# NCCL 2.3/2.4: "Using internal Network Socket" (NVIDIA/nccl#162); NCCL >= 2.27: "Initialized NET
# plugin IB", "Assigned NET plugin IB to comm" (NVIDIA/nccl#1925).
# (The name runs to the line's last non-space; " to comm" is cut off by :func:`_network`: a lazy name
# before an optional suffix and trailing spaces would try each space of a long run again.)
_NETWORK = re.compile(r"^(?:Using (?:network|internal Network)|Initialized NET plugin|Assigned NET plugin) (?P<name>.*\S)")
# Channel lines: "... via NET/AWS Libfabric/0/GDRDMA", "via NET/IB/0", "via NET/Socket/1", "via P2P/IPC", "via SHM".
_VIA_NET = re.compile(r"\bvia NET/(?P<name>[^/]+)/\d+")
_VIA_LOCAL = re.compile(r"\bvia (?:P2P|SHM|direct shared memory|CollNet|NVLS)")
# Provider: "Selected Provider is cxi", "Selected Provider is efa (found 16 nics)",
# "Selected Provider is tcp;ofi_rxm" (NVIDIA/nccl#229), "Selected provider is cxi, fabric is cxi (found 4 nics)".
_PROVIDER = re.compile(r"NET/OFI Selected [Pp]rovider is (?P<p>[^\s,(]+)")
# The OFI plugin naming itself: "NET/OFI Using aws-ofi-nccl 1.3.0aws" (#161), "NET/OFI Initializing
# aws-ofi-nccl 1.14.2" (#889).
_OFI_NAME = re.compile(r"NET/OFI (?:Using|Initializing) (?P<name>aws-ofi-[rn]ccl)(?: (?P<version>\S+))?")
# Any external plugin NCCL loaded: "NET/Plugin: Loaded net plugin NCCL RDMA Plugin v6 (v6)" (NVIDIA/nccl#1357),
# "NET/Plugin: Loaded net plugin Libfabric (v10)" (NCCL 2.28, gpustack/gpustack#5553). NCCL's own
# transports say "Initialized NET plugin IB" (2.27, NVIDIA/nccl#1925): not an external plugin.
_LOADED = re.compile(r"NET/Plugin ?: ?Loaded net plugin (?P<name>.*\S)")  # " (vN)" cut off by _loaded
# A net plugin loaded at the newest interface its NCCL looks up is not named by NCCL <= 2.21 (only the
# older ones print "Loaded net plugin"); it then looks up the collective-network symbols, which it does
# only once a net plugin has loaded (NVIDIA/nccl v2.18.3-1 src/net.cc ncclNetPluginInit, seen with the
# 2.17-2.21 libraries of PyPI): "NET/Plugin: Failed to find ncclCollNetPlugin_v6 symbol."
_COLL_LOOKUP = re.compile(r"NET/Plugin ?: ?(?:Failed to find ncclCollNetPlugin|Loaded coll plugin)")
# The RDMA/SHARP plugin (HPC-X): "Plugin Path : /opt/hpcx/nccl_rdma_sharp_plugin/lib/libnccl-net.so",
# "P2P plugin IBext" (NVIDIA/nccl#952, #988, #1029).
_SHARP = re.compile(r"^(?:Plugin Path : \S*nccl_rdma_sharp\S*|P2P plugin (?P<p2p>\S+))")
# No plugin: "NET/Plugin : No plugin found (libnccl-net.so)." (NVIDIA/nccl#352), "Plugin load
# (libnccl-net.so) returned 2 : ..." (nccl-tests#188), "NET/Plugin : dlerror=..." (#1231),
# "NET/Plugin: Could not find: libnccl-net.so" (#1925), "Unable to load libnccl-net.so" (#162),
# RCCL "No plugin found (librccl-net.so)" (ROCm/rccl#419), NCCL >= 2.26 "NET/Plugin: libnccl-net.so: <dlerror>".
_NOT_FOUND = re.compile(r"No plugin found|Could not find: lib[nr]ccl-net|Plugin load (?:\(lib[nr]ccl-net[^()]*\) )?returned|"
                        r"Unable to load lib[nr]ccl-net|dlerror=lib[nr]ccl-net|Failed to load net plugin|"
                        r"NET/Plugin ?: ?lib[nr]ccl-net[^\s/]*\.so: ")
# The plugin is there but could not start: "NET/OFI aws-ofi-nccl initialization failed" (aws/aws-ofi-nccl#715),
# "Unable to find a protocol that worked.  Failing initialization." (gpustack/gpustack#5553), "Couldn't
# find any optimal provider" (NVIDIA/nccl#229); NCCL >= 2.26 "Failed to initialize NET plugin <name>"
# (src/plugin/net.cc; for IB or Socket that is NCCL's own transport, not a plugin); a library
# without a supported interface: "NET/Plugin: Failed to find ncclNetPlugin symbol (>= v5). ncclNetPlugin
# symbols v4 and lower are not supported." (NVIDIA/nccl#1267; the same for ncclCollNetPlugin is harmless).
# (The OFI messages count after "NET/OFI ", :func:`_init_failed`: "NET/OFI .*(...)" would scan the
# rest of the line again from each "NET/OFI ".)
_OFI_FAILED = re.compile(r"initiali[sz]ation failed|[Ff]ailing initiali[sz]ation|find any optimal provider|OFI NCCL failure")
_INIT_FAILED = re.compile(r"^Failed to initiali[sz]e NET plugin (?!IB\b|Socket\b)|NET/Plugin ?: ?Failed to find ncclNetPlugin symbol")
# A plugin library that exists but does not load (a missing symbol, a newer glibc): NCCL's
# "NET/Plugin : dlerror=<message>" or "Plugin load (...) returned N : <message>" without "No such file".
_MISSING = re.compile(r"No such file|No plugin found|Could not find|Unable to load")
# The environment NCCL reports (its "NAME set by environment to VALUE." lines, NVIDIA/nccl#1053):
# NCCL_NET forces a network; NCCL_IB_DISABLE=1 turns IB off; NCCL_IBEXT_DISABLE=1 the RDMA/SHARP
# plugin (NVIDIA/nccl#676); NCCL_NET_PLUGIN=none any external plugin.
_ENV = re.compile(r"^(?P<var>NCCL_NET|NCCL_IB_DISABLE|NCCL_IBEXT_DISABLE|NCCL_NET_PLUGIN) set by environment to (?P<v>.+)")


def _env(msg: str, var: str, value: str | None = None) -> str | None:
    """The value ``msg`` reports for ``var`` (only when it is ``value``, if given), else None."""
    m = _ENV.match(msg)
    if not m or m.group("var") != var:
        return None
    v = m.group("v").rstrip()
    v = (v[:-1] if len(v) > 1 and v.endswith(".") else v).strip().strip('"')  # the sentence's full stop
    return v if value is None or v == value else None


def _network(msg: str) -> str | None:
    """The network ``msg`` names ("Using network IB", "Assigned NET plugin IB to comm"), else None."""
    m = _NETWORK.match(msg)
    if not m:
        return None
    name = m.group("name")
    return name[:-len(" to comm")] if name.endswith(" to comm") and len(name) > len(" to comm") else name


def _loaded(msg: str) -> str | None:
    """The external plugin ``msg`` says NCCL loaded ("... Loaded net plugin Libfabric (v10)"), else None."""
    m = _LOADED.search(msg)
    if not m:
        return None
    head, sep, tail = m.group("name").rpartition(" (v")
    return head if sep and head and tail.endswith(")") and tail[:-1].isdigit() else m.group("name")


def _init_failed(msg: str) -> bool:
    """Whether ``msg`` says a network plugin was found but failed to start."""
    ofi = msg.find("NET/OFI ")
    return bool((ofi >= 0 and _OFI_FAILED.search(msg, ofi + len("NET/OFI "))) or _INIT_FAILED.search(msg))


# IB unusable: "Failed to open libibverbs.so[.1]" (NVIDIA/nccl#1817; a WARN in older NCCL, #766),
# "Failed to initialize NET plugin IB" (NCCL >= 2.26).
_NO_VERBS = re.compile(r"Failed to open libibverbs|^Failed to initiali[sz]e NET plugin IB\b")
# Warnings are kept as evidence and turn a PASS into a WARN ("NET/OFI Couldn't open AV", "NET/IB : Got
# completion ...", "socketProgress: Connection closed by remote peer", "[Proxy Service 11] Failed to
# execute operation Connect", NVIDIA/nccl#952), but for RCCL's advice on a healthy node ('Missing
# "iommu=pt" from kernel command line', ROCm/rccl#1026), NCCL's note on a node without IB ("Failed to
# open libibverbs.so[.1]", read above), its topology search's fallback ("Could not find a path for
# pattern 4, falling back to simple order", NVIDIA/nccl#487: a slower ring, not a fault of the
# network) and a missing network (its own cause).
_BENIGN_WARN = re.compile(r'Missing "|Failed to open libibverbs|Could not find a path for pattern|Error: network ')
_IB_USING = re.compile(r"^NET/IB ?: ?Using \[0\]\S+?/(?P<kind>IB|RoCE)(?P<sharp>/SHARP)?")
_IB_NONE = re.compile(r"^NET/IB ?: ?No device found")
_SOCKET_USING = re.compile(r"^NET/Socket ?: ?Using")
_BOOTSTRAP = re.compile(r"^Bootstrap ?: ?Using")
# "ib", "ibverbs", "ib_..." and "IB" followed by what is not a letter (a program's output glued after it).
_IB_NAME = re.compile(r"ib(?:verbs)?(?![a-z])")
# NCCL_NET names a network no loaded transport or plugin provides; NCCL then fails to initialise
# (ncclInvalidUsage): "net.cc:626 NCCL WARN Error: network AWS Libfabric not found." (NVIDIA/nccl
# src/net.cc ncclNetInit, as eth-cscs/cscs-docs PR #75 shows it; RCCL prints the same).
# (With NCCL_NET unset and no network at all the name is empty: "Error: network  not found.")
_NET_NOT_FOUND = re.compile(r"^Error: network (?P<name>.{0,200}?) ?not found\.?\s*$")
@dataclass
class HostReport:
    """What one host's NCCL processes chose for the network between nodes."""

    host: str
    transport: str = "unknown"  # ofi | ib | ibext | socket | intra-node | mixed | unknown
    selected: str = "unknown"  # the network NCCL chose between nodes (transport but for intra-node)
    transports: list[str] = field(default_factory=list)  # every process's choice
    network: str | None = None  # the name NCCL printed: "AWS Libfabric", "IB", "Socket"...
    provider: str | None = None  # libfabric provider, e.g. cxi, efa, tcp;ofi_rxm
    plugin: str | None = None  # e.g. "aws-ofi-nccl 1.3.0aws", "NCCL RDMA Plugin v6"
    plugin_state: str = "none"  # loaded | not-found | failed | disabled (NCCL_IBEXT_DISABLE=1, NCCL_NET_PLUGIN=none) | none
    plugin_message: str | None = None  # the line that says why it is not loaded
    forced: str | None = None  # NCCL_NET's value, where the environment set it
    missing_network: str | None = None  # the network NCCL_NET named and NCCL did not find ("Error: network X not found."; "": none usable)
    ib_disabled: bool = False  # NCCL_IB_DISABLE=1
    ib_devices: str | None = None  # "IB", "RoCE" or "IB/SHARP" from "NET/IB : Using [0]..."
    bootstrap_socket: bool = False  # a NET/Socket line that is NCCL < 2.4.8's bootstrap, not the data path
    intra_node_only: bool = False  # channel lines seen, none of them via NET
    ranks: list[int] = field(default_factory=list)  # its ranks in the largest communicator, where the log shows them
    peer_evidence: str | None = None  # a peer's channel line that showed this host's network (its own showed none)
    warnings: list[str] = field(default_factory=list)  # NCCL WARN messages of the network layers
    evidence: list[str] = field(default_factory=list)  # the lines that decided




def network_kind(name: str) -> str:
    """The transport a network's name stands for (``IB``, ``IBext_v8``, ``AWS Libfabric``, ``Socket``),
    read from its start: output a program glued after NCCL's line (``Using network IB-1``) is not the name."""
    low = name.lower()
    if low.startswith("ibext") or "sharp" in low:
        return "ibext"
    if _IB_NAME.match(low):
        return "ib"
    if low.startswith("socket"):
        return "socket"
    if "libfabric" in low or low.startswith("ofi") or low.startswith("aws"):
        return "ofi"
    return low


def _process_transport(lines: list[Line], old_bootstrap: bool, host_ibext: bool = False) -> str:
    """One process's choice: its "Using network" line, else its channels, else NCCL's order
    (external plugin, then IB, then sockets: the first that initialises is used).

    ``old_bootstrap``: the log has no "Bootstrap : Using" line, so it may come from NCCL < 2.4.8,
    whose bootstrap printed "NET/Socket : Using" before the data path was chosen (2.4.8 renamed
    it, NVIDIA/nccl#352 vs Mellanox/nv_peer_memory#56): that line alone does not prove a socket
    fallback (a missing IB device, or no ibverbs, beside it does). ``host_ibext``: another process
    of the host shows the IBext plugin, which prints the same "NET/IB : Using" line as NCCL's IB.
    """
    named = [name for ln in lines if (name := _network(ln.msg))]
    if named:
        return network_kind(named[-1])
    via = [m.group("name") for ln in lines if (m := _VIA_NET.search(ln.msg))]
    if via:
        return network_kind(via[-1])
    msgs = [ln.msg for ln in lines]
    ibext_off = any(_env(m, "NCCL_IBEXT_DISABLE", "1") for m in msgs)
    if not ibext_off and any((m2 := _SHARP.match(m)) and (m2.group("p2p") or "").startswith("IBext") for m in msgs):
        return "ibext"
    plugin_failed = any(_init_failed(m) for m in msgs)
    if not plugin_failed and any(m.startswith("NET/OFI ") for m in msgs):
        return "ofi"  # the OFI plugin prints NET/OFI lines only once NCCL loaded it
    if any(_IB_USING.match(m) for m in msgs):
        return "ibext" if host_ibext and not ibext_off else "ib"
    no_ib = any(_IB_NONE.match(m) or _NO_VERBS.search(m) or _env(m, "NCCL_IB_DISABLE", "1") for m in msgs)
    if any(_SOCKET_USING.match(m) for m in msgs):
        return "socket" if (no_ib or not old_bootstrap) else "unknown"
    if no_ib and not any(_loaded(m) or _COLL_LOOKUP.search(m) or _SHARP.match(m) for m in msgs):
        return "socket"  # no plugin loaded and IB unusable: NCCL's last network, sockets, is what is left
    return "unknown"


def classify(lines: list[Line]) -> list[HostReport]:
    """One report per host, in the order hosts first appear."""
    by_host: dict[str, list[Line]] = {}
    for ln in lines:
        by_host.setdefault(ln.host, []).append(ln)
    old_bootstrap = not any(_BOOTSTRAP.match(ln.msg) for ln in lines)
    reports = [_host_report(host, host_lines, old_bootstrap) for host, host_lines in by_host.items()]
    if old_bootstrap:
        _old_socket_hosts(reports, by_host)
    return reports


def _old_socket_hosts(reports: list[HostReport], by_host: dict[str, list[Line]]) -> None:
    """In a log of NCCL < 2.4.8 (whose bootstrap prints "NET/Socket : Using" on every host, whatever
    the data path), a host that shows no network but that line or "No plugin found" used sockets too
    where other hosts show sockets and none shows another network: one run's hosts are one
    installation (NVIDIA/nccl#226: eighteen hosts, each excerpt cut after one or two of its lines)."""
    chosen = {r.selected for r in reports} - {"unknown"}
    if chosen != {"socket"}:
        return
    for r in reports:
        if r.selected == "unknown" and r.host != NO_HOST and (r.plugin_state == "not-found" or any(
                _SOCKET_USING.match(ln.msg) for ln in by_host[r.host])):
            r.selected, r.transports = "socket", ["socket"]
            r.transport = "intra-node" if r.intra_node_only else "socket"
            r.evidence.append(f"{r.host}: the run's other hosts used sockets, and its own lines show no other network")


def _host_report(host: str, lines: list[Line], old_bootstrap: bool) -> HostReport:
    """What ``host``'s NCCL ``lines`` show: its transport (:func:`_choose_transport`), then what
    each line says of the network, the plugin and the environment, with at most eight lines of
    evidence (the first line to state each fact, every network warning)."""
    r = HostReport(host)
    _choose_transport(r, lines, old_bootstrap)
    names: dict[str, str] = {}  # plugin names seen: "ofi", "loaded", "sharp" -> its name
    ofi_warnings: list[str] = []
    coll_lookup = False   # a net plugin loaded (_COLL_LOOKUP), named or not
    for ln in lines:
        coll_lookup = coll_lookup or bool(_COLL_LOOKUP.search(ln.msg))
        keep = _note_network(r, ln.msg, names)
        keep = _note_plugin_state(r, ln.msg, ofi_warnings, keep)
        keep = _note_settings(r, ln, old_bootstrap, names, ofi_warnings, keep)
        if keep and len(r.evidence) < 8:
            r.evidence.append(f"{host}:{ln.pid} {ln.level} {ln.msg}" if ln.pid else f"{host} {ln.level} {ln.msg}")
    r.plugin = names.get("ofi") or names.get("loaded") or names.get("sharp")
    if r.selected in ("ofi", "ibext") and r.plugin_state in ("none", "not-found"):
        # a "No plugin found (librccl-net.so)" beside a plugin that then carried the data is harmless
        r.plugin_state = "loaded"
    elif r.plugin_state == "not-found" and (names.get("loaded") or coll_lookup):
        # NCCL >= 2.21 tries NCCL_NET_PLUGIN as given first: "No plugin found (ofi)", then loads
        # libnccl-net-ofi.so (seen with the 2.21.5 library of PyPI): the load that followed wins
        r.plugin_state = "loaded"
    elif (r.plugin or coll_lookup) and r.plugin_state == "none":
        r.plugin_state = "loaded"
    return r


def _choose_transport(r: HostReport, lines: list[Line], old_bootstrap: bool) -> None:
    """Set ``r.transports`` (every process's known choice), ``r.selected`` (the one choice,
    "mixed" or "unknown"), ``r.intra_node_only`` and ``r.transport`` from ``lines``."""
    by_pid: dict[str, list[Line]] = {}
    for ln in lines:
        by_pid.setdefault(ln.pid, []).append(ln)
    choices = {pid: _process_transport(pl, old_bootstrap) for pid, pl in by_pid.items()}
    if "ibext" in choices.values():
        choices = {pid: _process_transport(pl, old_bootstrap, host_ibext=True) for pid, pl in by_pid.items()}
    known = sorted({c for c in choices.values() if c != "unknown"})
    r.transports = known
    r.selected = known[0] if len(known) == 1 else ("mixed" if known else "unknown")
    channels = [ln for ln in lines if _VIA_NET.search(ln.msg) or _VIA_LOCAL.search(ln.msg)]
    r.intra_node_only = bool(channels) and not any(_VIA_NET.search(ln.msg) for ln in channels)
    # data that never left the node (channels via P2P/SHM only): the transport used is intra-node,
    # whatever network NCCL set up for other nodes
    r.transport = "intra-node" if r.intra_node_only else r.selected


def _note_network(r: HostReport, msg: str, names: dict[str, str]) -> bool:
    """Record the network name, the provider and a plugin's name ``msg`` states (the first of
    each wins); return whether ``msg`` is evidence so far."""
    keep = False
    if name := _network(msg):
        keep = r.network is None
        r.network = r.network or name
    elif (m := _VIA_NET.search(msg)) and r.network is None:
        r.network = m.group("name")
    if m := _PROVIDER.search(msg):
        keep = r.provider is None
        r.provider = r.provider or m.group("p")
    if m := _OFI_NAME.search(msg):
        keep = keep or "ofi" not in names
        names.setdefault("ofi", " ".join(filter(None, (m.group("name"), m.group("version")))))
    elif loaded := _loaded(msg):
        keep = keep or "loaded" not in names
        names.setdefault("loaded", loaded)
    elif (m := _SHARP.match(msg)) and m.group("p2p") is None:
        keep = keep or "sharp" not in names
        names.setdefault("sharp", "nccl-rdma-sharp-plugins")
    return keep


def _note_plugin_state(r: HostReport, msg: str, ofi_warnings: list[str], keep: bool) -> bool:
    """Record a plugin that failed to start or was not found (the first such line decides; a failure
    quotes the plugin's own earlier warning where there is one); return ``keep``, or True when
    ``msg`` decided."""
    if _init_failed(msg):
        if r.plugin_state != "failed":
            # quote the plugin's own reason where it warned first ("Only EFA provider is supported",
            # aws/deep-learning-containers#2675), else the failure line
            reason = next((w for w in ofi_warnings if w != msg), msg)
            r.plugin_state, r.plugin_message, keep = "failed", reason, True
    elif _NOT_FOUND.search(msg) and r.plugin_state == "none":
        r.plugin_state = "not-found" if _MISSING.search(msg) else "failed"
        r.plugin_message, keep = msg, True
    return keep


def _note_settings(r: HostReport, ln: Line, old_bootstrap: bool, names: dict[str, str], ofi_warnings: list[str],
                   keep: bool) -> bool:
    """Record what ``ln`` says of the environment (NCCL_NET, NCCL_IB_DISABLE, a disabled plugin), the
    IB devices, an old bootstrap's socket line and network warnings (OFI warnings also go to
    ``ofi_warnings``); return whether ``ln`` is evidence, given ``keep`` so far."""
    msg = ln.msg
    if forced := _env(msg, "NCCL_NET"):
        r.forced, keep = forced, True
    if (m := _NET_NOT_FOUND.match(msg)) and r.missing_network is None:
        r.missing_network, keep = m.group("name").strip(), True
    if _env(msg, "NCCL_IB_DISABLE", "1"):
        r.ib_disabled, keep = True, True
    if (_env(msg, "NCCL_IBEXT_DISABLE", "1") and names.get("sharp")) or _env(msg, "NCCL_NET_PLUGIN", "none"):
        r.plugin_state, r.plugin_message, keep = "disabled", msg, True
    if (m := _IB_USING.match(msg)) and r.ib_devices is None:
        r.ib_devices, keep = m.group("kind") + (m.group("sharp") or ""), True
    if _SOCKET_USING.match(msg) and old_bootstrap and r.selected in ("ofi", "ib", "ibext"):
        r.bootstrap_socket, keep = True, not r.bootstrap_socket
    if ln.level == "WARN" and msg.startswith("NET/OFI"):
        ofi_warnings.append(msg)
    if ln.level == "WARN" and not _BENIGN_WARN.match(msg) and len(r.warnings) < 8:
        r.warnings.append(msg)
        keep = True
    return keep
