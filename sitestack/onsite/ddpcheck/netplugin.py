"""The net-plugin check: with NCCL_DEBUG=INFO logs, every host loaded the network plugin the site
expects (on any node count) and used the network the site expects between nodes (read by nccl_log.py,
shipped beside the check program)."""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .. import nccl_log
from .checks import NET_PLUGIN
from .state import Run
from .verdicts import FAILED, PASSED, SKIPPED

if TYPE_CHECKING:
    from ..nccl_parse import HostReport, Reader


def judge_net_plugin(log: str | Reader, *, hosts: int, plugin: str | None, provider: str | None,
                     transport: str | None = None, names: Sequence[str] = ()) -> tuple[str, str, list[str]]:
    """(status, summary, evidence) from NCCL_DEBUG=INFO output of a run on ``hosts`` nodes.

    ``nccl_log`` names the network each host used and, against the site's expectation
    (``transport``: ofi, ib, ibext, socket or None; default ofi where a ``plugin`` is expected),
    the cause when it is not that one. The job writes the logs itself, so a host without
    evidence fails. One node (as the launcher and the log both show: the launcher's host names can
    be one for several containers, so a network between nodes the log shows counts) is judged by
    :func:`judge_one_node`. A TCP socket fallback fails whether or not the site names a network.
    ``log``: the logs' text, or what ``nccl_log.read_files`` read of their files (whose notes, lines
    cut or left unread, join the summary); ``names``: the NET names the expected plugin registers.
    """
    lines, version = nccl_log.parse(log) if isinstance(log, str) else (log.lines, log.version)
    reports = nccl_log.classify(lines)
    evidence = [e for r in reports for e in r.evidence[:3]]
    shown = nccl_log.nodes(lines)
    nodes = max(hosts, len([r for r in reports if r.host != nccl_log.NO_HOST]), 2 if shown.multi else 1)
    notes = "" if isinstance(log, str) else "".join(f" ({n})" for n in log.notes())
    if nodes < 2:
        status, summary = judge_one_node(reports, plugin, transport, names)
        return status, summary + notes, evidence
    expect = nccl_log.Expectation(transport or ("ofi" if plugin else None), provider, plugin, multi_node=True, strict=True)
    verdict = nccl_log.judge(reports, expect, version, shown)
    verdict.notes += [] if isinstance(log, str) else log.notes()
    sockets = any("socket" in r.transports for r in reports)
    status = FAILED if verdict.status == nccl_log.FAIL or (verdict.status == nccl_log.WARN and sockets) else PASSED
    notes = "".join(f" ({n})" for n in verdict.notes)
    return status, ("warning: " if verdict.status == nccl_log.WARN and status == PASSED else "") + verdict.cause + notes, evidence


def judge_one_node(reports: list[HostReport], plugin: str | None, transport: str | None,
                   names: Sequence[str] = ()) -> tuple[str, str]:
    """A one-node run: no network between nodes is used, but NCCL and RCCL open the net plugin on
    any node count, when the library initialises (NVIDIA/nccl v2.18.3-1 src/init.cc ncclInit ->
    ncclNetPluginInit; ROCm/rccl rocm-5.7.1 the same) or a communicator is made (NCCL >= 2.22), and
    say whether it loaded and which network they set up. So a site that expects a plugin (``plugin``,
    or ``transport`` ofi/ibext) gets it proven here: every host's log shows that plugin loaded (not
    another: :func:`_other_plugin`) and no other network chosen, or the check fails with NCCL's own
    reason ("No plugin found", the dlerror). A site that expects none: skipped."""
    want = transport or ("ofi" if plugin else None)
    seen = f"; the log shows {nccl_log.summary(reports)}" if reports else ""
    if want not in ("ofi", "ibext"):
        return SKIPPED, f"single-node run and no network plugin expected: the network is only used between nodes{seen}"
    name = plugin or "the network plugin"
    if not reports:
        return FAILED, f"single-node run: no NCCL/RCCL log line shows whether {name} loaded (NCCL_DEBUG=INFO logs are empty)"
    for r in reports:
        if r.plugin_state != "loaded":
            reason = (f"\"{r.plugin_message}\"" if r.plugin_message else "no line says it loaded") + (
                f"; it used {nccl_log.summary([r])}" if r.transports else "")
            return FAILED, (f"single-node run: {name} did not load on {r.host}: {reason}. NCCL/RCCL open it on any "
                            f"node count, so between nodes this stack would use {'sockets' if want == 'ofi' else 'its own transport'}")
        other = _other_plugin(r, plugin, names, want)
        if other:
            return FAILED, f"single-node run on {r.host}: {other}, the site expects {name}"
    return PASSED, f"single-node run: {name} loaded on every host ({nccl_log.summary(reports)})"


def _other_plugin(r: HostReport, plugin: str | None, names: Sequence[str], want: str) -> str | None:
    """What ``r`` shows instead of the expected plugin: another plugin by name (an HPC-X SHARP
    ``libnccl-net.so`` first on the path), or a network other than the plugin's (NCCL_NET forced,
    or a plugin that loaded but did not start); None when it shows nothing else."""
    expected = {n.lower() for n in (*names, *([plugin] if plugin else []))}
    ofi_family = bool(plugin and plugin.startswith("aws-ofi-"))
    if r.plugin and r.plugin.lower() not in expected and not (ofi_family and r.plugin.startswith("aws-ofi-")):
        return f"the plugin {r.plugin!r} loaded"
    network = r.forced or r.network
    if network and want == "ofi" and network.lower() not in expected and not any(
            w in network for w in ("Libfabric", "OFI")):
        return f"NCCL set up the network {network!r}" + (" (forced by NCCL_NET)" if r.forced else "")
    return None


def net_plugin_check(run: Run) -> None:
    """The net-plugin check once every rank is here (the logs of every rank's collectives are written)."""
    run.barrier()
    net_plugin(run)


def net_plugin(run: Run) -> None:
    """The net-plugin check over the job's NCCL logs (``--nccl-log``, default OUT/nccl/*.log)."""
    pattern = run.args.nccl_log or os.path.join(run.args.out, "nccl", "*.log")
    files = sorted(glob.glob(pattern))
    hosts = len({r["host"] for r in run.ranks}) if run.ranks else 1
    net = run.config.get("network") or {}
    if run.dev.backend != "nccl" and not run.args.nccl_log:
        run.set(NET_PLUGIN.name, SKIPPED, f"backend {run.dev.backend} does not use NCCL/RCCL network plugins")
        return
    # line by line, each cut at nccl_log's line bound, at most its number of messages; a file that
    # is not regular (a FIFO would block the check) or cannot be read is left out, as a missing one
    logs = nccl_log.read_files(files, unreadable=[])
    expect = net.get("nccl_expect") or {}
    names = net.get("nccl_net") or []
    status, summary, evidence = judge_net_plugin(logs, hosts=hosts, plugin=expect.get("plugin", net.get("net_plugin")),
                                                 provider=expect.get("provider", net.get("libfabric_provider")),
                                                 transport=expect.get("transport"),
                                                 names=[str(n) for n in (names if isinstance(names, list) else [names])])
    run.set(NET_PLUGIN.name, status, summary, evidence=evidence, logs=[os.path.relpath(f, run.args.out) for f in files])
