#!/usr/bin/env python3
"""Read NCCL/RCCL ``NCCL_DEBUG=INFO`` logs: which network each host used, and whether that is right.

Standard library only, and nothing of sitestack: this file is installed on the site beside
``ddp_check.py`` (whose net-plugin check calls it) and runs on a log a user already has::

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
import re
import sys
from dataclasses import asdict, dataclass, field

PASS, FAIL, WARN = "PASS", "FAIL", "WARN"
NO_HOST = "?"

# A message head: anything before "host:pid:tid [dev]", then optional "func:line" (WARN lines:
# "create_nccl_ofi_component:459 NCCL WARN", aws/aws-ofi-nccl#24; "int nccl_net_ofi_create_plugin(
# nccl_net_ofi_plugin_t**):268 NCCL WARN", gpustack/gpustack#5553), then "NCCL INFO|WARN|TRACE".
# RCCL prints the same "NCCL INFO" prefix (ROCm/rccl#419). A physical line may hold several
# messages: CloudWatch exports repeat it in a second column (aws/aws-ofi-nccl#889), pastes join lines.
_HEAD = re.compile(r"(?<![^\s:|\[\]>)\"'])(?P<host>[^\s:|\[\]\"']+):(?P<pid>\d+):(?P<tid>\d+)\s+\[(?P<dev>\d+)\]\s+(?:[^\n]{0,200}?:\d+\s+)?"
                   r"NCCL\s+(?P<level>INFO|WARN|TRACE)\s+")
# No host prefix: "[0] NCCL INFO ..." or "NCCL INFO ..." at the start, after a timestamp or a tag
# (aws/aws-ofi-nccl#801, NVIDIA/nccl#1292).
_BARE = re.compile(r"^(?:.*?\s)?(?:\[(?P<dev>\d+)\]\s+)?(?:\S+:\d+\s+)?NCCL\s+(?P<level>INFO|WARN)\s+(?P<msg>.*)")
# ISO timestamps (CloudWatch, journald, Kubernetes) hold colons that would pass for host:pid:tid.
_STAMP = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?")
# Terminal colours (Ray, some launchers) around the prefix.
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_VERSION = re.compile(r"\b(?P<lib>NCCL|RCCL) version\s*:?\s*(?P<v>\d+\.\d+\.\d+)")

# The network chosen: "Using network AWS Libfabric|OFI|Libfabric|IB|IBext|Socket" (NCCL >= 2.5);
# NCCL 2.3/2.4: "Using internal Network Socket" (NVIDIA/nccl#162); NCCL >= 2.27: "Initialized NET
# plugin IB", "Assigned NET plugin IB to comm" (NVIDIA/nccl#1925).
_NETWORK = re.compile(r"^(?:Using (?:network|internal Network)|Initialized NET plugin|Assigned NET plugin) (?P<name>.+?)(?: to comm)?\s*$")
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
_LOADED = re.compile(r"NET/Plugin ?: ?Loaded net plugin (?P<name>.+?)(?: \(v\d+\))?\s*$")
# The RDMA/SHARP plugin (HPC-X): "Plugin Path : /opt/hpcx/nccl_rdma_sharp_plugin/lib/libnccl-net.so",
# "P2P plugin IBext" (NVIDIA/nccl#952, #988, #1029).
_SHARP = re.compile(r"^(?:Plugin Path : \S*nccl_rdma_sharp\S*|P2P plugin (?P<p2p>\S+))")
# No plugin: "NET/Plugin : No plugin found (libnccl-net.so)." (NVIDIA/nccl#352), "Plugin load
# (libnccl-net.so) returned 2 : ..." (nccl-tests#188), "NET/Plugin : dlerror=..." (#1231),
# "NET/Plugin: Could not find: libnccl-net.so" (#1925), "Unable to load libnccl-net.so" (#162),
# RCCL "No plugin found (librccl-net.so)" (ROCm/rccl#419), NCCL >= 2.26 "NET/Plugin: libnccl-net.so: <dlerror>".
_NOT_FOUND = re.compile(r"No plugin found|Could not find: lib[nr]ccl-net|Plugin load (?:\(lib[nr]ccl-net[^)]*\) )?returned|"
                        r"Unable to load lib[nr]ccl-net|dlerror=lib[nr]ccl-net|Failed to load net plugin|"
                        r"NET/Plugin ?: ?lib[nr]ccl-net\S*\.so: ")
# The plugin is there but could not start: "NET/OFI aws-ofi-nccl initialization failed" (aws/aws-ofi-nccl#715),
# "Unable to find a protocol that worked.  Failing initialization." (gpustack/gpustack#5553), "Couldn't
# find any optimal provider" (NVIDIA/nccl#229); NCCL >= 2.26 "Failed to initialize NET plugin <name>"
# (src/plugin/net.cc; for IB or Socket that is NCCL's own transport, not a plugin); a library
# without a supported interface: "NET/Plugin: Failed to find ncclNetPlugin symbol (>= v5). ncclNetPlugin
# symbols v4 and lower are not supported." (NVIDIA/nccl#1267; the same for ncclCollNetPlugin is harmless).
_INIT_FAILED = re.compile(r"NET/OFI .*(?:initiali[sz]ation failed|[Ff]ailing initiali[sz]ation|find any optimal provider|"
                          r"OFI NCCL failure)|^Failed to initiali[sz]e NET plugin (?!IB\b|Socket\b)|"
                          r"NET/Plugin ?: ?Failed to find ncclNetPlugin symbol")
# A plugin library that exists but does not load (a missing symbol, a newer glibc): NCCL's
# "NET/Plugin : dlerror=<message>" or "Plugin load (...) returned N : <message>" without "No such file".
_MISSING = re.compile(r"No such file|No plugin found|Could not find|Unable to load")
# The environment NCCL reports (its "NAME set by environment to VALUE." lines, NVIDIA/nccl#1053):
# NCCL_NET forces a network; NCCL_IB_DISABLE=1 turns IB off; NCCL_IBEXT_DISABLE=1 the RDMA/SHARP
# plugin (NVIDIA/nccl#676); NCCL_NET_PLUGIN=none any external plugin.
_ENV = re.compile(r"^(?P<var>NCCL_NET|NCCL_IB_DISABLE|NCCL_IBEXT_DISABLE|NCCL_NET_PLUGIN) set by environment to "
                  r"(?P<v>.+?)\.?\s*$")


def _env(msg: str, var: str, value: str | None = None) -> str | None:
    """The value ``msg`` reports for ``var`` (only when it is ``value``, if given), else None."""
    m = _ENV.match(msg)
    if not m or m.group("var") != var:
        return None
    v = m.group("v").strip().strip('"')
    return v if value is None or v == value else None


# IB unusable: "Failed to open libibverbs.so[.1]" (NVIDIA/nccl#1817; a WARN in older NCCL, #766),
# "Failed to initialize NET plugin IB" (NCCL >= 2.26).
_NO_VERBS = re.compile(r"Failed to open libibverbs|^Failed to initiali[sz]e NET plugin IB\b")
# Warnings of the network layers, kept as evidence ("NET/OFI Couldn't open AV", "NET/IB : Got completion ...").
_NET_WARN = re.compile(r"NET/|Call to ibv|socket", re.IGNORECASE)
_IB_USING = re.compile(r"^NET/IB ?: ?Using \[0\]\S+?/(?P<kind>IB|RoCE)(?P<sharp>/SHARP)?")
_IB_NONE = re.compile(r"^NET/IB ?: ?No device found")
_SOCKET_USING = re.compile(r"^NET/Socket ?: ?Using")
_BOOTSTRAP = re.compile(r"^Bootstrap ?: ?Using")


@dataclass(frozen=True)
class Line:
    """One NCCL line: where it came from and what it says."""

    host: str
    pid: str
    level: str
    msg: str
    lineno: int


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
    ib_disabled: bool = False  # NCCL_IB_DISABLE=1
    ib_devices: str | None = None  # "IB", "RoCE" or "IB/SHARP" from "NET/IB : Using [0]..."
    bootstrap_socket: bool = False  # a NET/Socket line that is NCCL < 2.4.8's bootstrap, not the data path
    intra_node_only: bool = False  # channel lines seen, none of them via NET
    warnings: list[str] = field(default_factory=list)  # NCCL WARN messages of the network layers
    evidence: list[str] = field(default_factory=list)  # the lines that decided


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


def parse(text: str) -> tuple[list[Line], str | None]:
    """The NCCL messages of a log, and the NCCL/RCCL version it states (None when it does not)."""
    lines: list[Line] = []
    version = None
    for number, raw in enumerate(text.splitlines(), 1):
        clean = _STAMP.sub(" ", _ANSI.sub(" ", raw) if "\x1b" in raw else raw)
        if version is None and (v := _VERSION.search(clean)):
            version = f"{v.group('lib')} {v.group('v')}"
        heads = list(_HEAD.finditer(clean)) if "NCCL" in clean else []
        for i, head in enumerate(heads):
            end = heads[i + 1].start() if i + 1 < len(heads) else len(clean)
            # a log kept as JSON strings ({"log": "...\\n"}) ends each message at its escaped newline
            msg = clean[head.end():end].split("\\n", 1)[0].strip().rstrip("|").strip()
            lines.append(Line(head.group("host"), head.group("pid"), head.group("level"), msg, number))
        if not heads and (bare := _BARE.match(clean)):
            lines.append(Line(NO_HOST, "", bare.group("level"), bare.group("msg").strip(), number))
    return lines, version


def _network_kind(name: str) -> str:
    low = name.lower()
    if low.startswith("ibext") or "sharp" in low:
        return "ibext"
    if low in ("ib", "ibverbs") or low.startswith("ib_"):
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
    named = [m.group("name") for ln in lines if (m := _NETWORK.match(ln.msg))]
    if named:
        return _network_kind(named[-1])
    via = [m.group("name") for ln in lines if (m := _VIA_NET.search(ln.msg))]
    if via:
        return _network_kind(via[-1])
    msgs = [ln.msg for ln in lines]
    ibext_off = any(_env(m, "NCCL_IBEXT_DISABLE", "1") for m in msgs)
    if not ibext_off and any((m2 := _SHARP.match(m)) and (m2.group("p2p") or "").startswith("IBext") for m in msgs):
        return "ibext"
    plugin_failed = any(_INIT_FAILED.search(m) for m in msgs)
    if not plugin_failed and any(m.startswith("NET/OFI ") for m in msgs):
        return "ofi"  # the OFI plugin prints NET/OFI lines only once NCCL loaded it
    if any(_IB_USING.match(m) for m in msgs):
        return "ibext" if host_ibext and not ibext_off else "ib"
    if any(_SOCKET_USING.match(m) for m in msgs):
        no_ib = any(_IB_NONE.match(m) or _NO_VERBS.search(m) or _env(m, "NCCL_IB_DISABLE", "1") for m in msgs)
        return "socket" if (no_ib or not old_bootstrap) else "unknown"
    return "unknown"


def classify(lines: list[Line]) -> list[HostReport]:
    """One report per host, in the order hosts first appear."""
    by_host: dict[str, list[Line]] = {}
    for ln in lines:
        by_host.setdefault(ln.host, []).append(ln)
    old_bootstrap = not any(_BOOTSTRAP.match(ln.msg) for ln in lines)
    return [_host_report(host, host_lines, old_bootstrap) for host, host_lines in by_host.items()]


def _host_report(host: str, lines: list[Line], old_bootstrap: bool) -> HostReport:
    r = HostReport(host)
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
    names: dict[str, str] = {}
    ofi_warnings: list[str] = []
    for ln in lines:
        msg = ln.msg
        keep = False
        if m := _NETWORK.match(msg):
            keep = r.network is None
            r.network = r.network or m.group("name")
        elif (m := _VIA_NET.search(msg)) and r.network is None:
            r.network = m.group("name")
        if m := _PROVIDER.search(msg):
            keep = r.provider is None
            r.provider = r.provider or m.group("p")
        if m := _OFI_NAME.search(msg):
            keep = keep or "ofi" not in names
            names.setdefault("ofi", " ".join(filter(None, (m.group("name"), m.group("version")))))
        elif m := _LOADED.search(msg):
            keep = keep or "loaded" not in names
            names.setdefault("loaded", m.group("name"))
        elif (m := _SHARP.match(msg)) and m.group("p2p") is None:
            keep = keep or "sharp" not in names
            names.setdefault("sharp", "nccl-rdma-sharp-plugins")
        if _INIT_FAILED.search(msg):
            if r.plugin_state != "failed":
                # quote the plugin's own reason where it warned first ("Only EFA provider is supported",
                # aws/deep-learning-containers#2675), else the failure line
                reason = next((w for w in ofi_warnings if w != msg), msg)
                r.plugin_state, r.plugin_message, keep = "failed", reason, True
        elif _NOT_FOUND.search(msg) and r.plugin_state == "none":
            r.plugin_state = "not-found" if _MISSING.search(msg) else "failed"
            r.plugin_message, keep = msg, True
        if forced := _env(msg, "NCCL_NET"):
            r.forced, keep = forced, True
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
        if ln.level == "WARN" and _NET_WARN.match(msg):
            r.warnings.append(msg)
            keep = True
        if keep and len(r.evidence) < 8:
            r.evidence.append(f"{host}:{ln.pid} {ln.level} {msg}" if ln.pid else f"{host} {ln.level} {msg}")
    r.plugin = names.get("ofi") or names.get("loaded") or names.get("sharp")
    if r.selected in ("ofi", "ibext") and r.plugin_state in ("none", "not-found"):
        # a "No plugin found (librccl-net.so)" beside a plugin that then carried the data is harmless
        r.plugin_state = "loaded"
    elif r.plugin and r.plugin_state == "none":
        r.plugin_state = "loaded"
    return r


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
    if r.forced and _network_kind(r.forced) != want:  # forcing the expected network only names it
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
