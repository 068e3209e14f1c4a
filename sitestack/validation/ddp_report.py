#!/usr/bin/env python3
"""The report of a validation run: the verdict table, ``summary.md`` and ``bandwidth.png``.

Used by ``ddp_check.py`` on the site (installed beside it, standard library plus matplotlib
when present) and by sitestack on the controller. Run it on a ``result.json`` to render the
Markdown and the plot again: ``python ddp_report.py RESULT.json [OUTDIR]``.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable
from typing import Any

STATUS_MARK = {"passed": "PASS", "failed": "FAIL", "skipped": "skip"}
#: A latency whose maximum (or another measurement's mean) is this many times the median is noisy.
NOISE_FACTOR = 10.0


def human_bytes(n: float) -> str:
    n = int(n)
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def verdict_table(result: dict[str, Any]) -> str:
    """A plain-text table: one line per check (what the job log and `invoke validate` print)."""
    rows = [(c["name"], STATUS_MARK.get(c["status"], c["status"]), c["summary"]) for c in result.get("checks", [])]
    width = max((len(r[0]) for r in rows), default=5)
    head = (f"sitestack validation of {result.get('site', '?')}: {str(result.get('verdict', '?')).upper()} "
            f"({result.get('world_size', '?')} ranks on {result.get('nodes', '?')} node(s), "
            f"{result.get('launcher') or '?'}, {result.get('backend') or '?'})")
    lines = [head]
    for name, mark, summary in rows:
        lines.append(f"  {name:<{width}}  {mark:<4}  {summary}")
    return "\n".join(lines)


def _cell(text: Any) -> str:
    return one_line(text).replace("|", "\\|")


def latency_text(stats: dict[str, Any]) -> str:
    """``latency min 1.1 / median 1.3 / max 480 us (noisy: ...)`` from ddp_check.latency_stats."""
    if not stats:
        return "latency not measured"
    text = f"latency min {stats['min_us']:.3g} / median {stats['median_us']:.3g} / max {stats['max_us']:.3g} us"
    if stats.get("noisy"):
        text += (f" (noisy: the maximum is {stats['max_us'] / stats['median_us']:.0f}x the median; another process "
                 "shared the CPU or the network was busy: compare medians)")
    return text


def _known(value: Any) -> str:
    """A table cell: the value, or a dash where the run ended before it was known."""
    return "—" if value is None else str(value)


def one_line(text: Any) -> str:
    """``text`` with every run of whitespace (tabs, newlines: MPI libraries print both) as one space."""
    return " ".join(str(text).split())


def markdown(result: dict[str, Any]) -> str:
    """``summary.md``: the verdict, the checks, the ranks, the bandwidth table and the evidence."""
    verdict = str(result.get("verdict", "?")).upper()
    out = [f"# sitestack validation: {result.get('site', '?')} — {verdict}", ""]
    out += [_facts_line(result), ""]
    out += _check_lines(result)
    out += startup_lines(result.get("startup"))
    out += _rank_lines(result.get("ranks") or [])
    out += _bandwidth_lines(result.get("bandwidth") or {})
    artefacts = result.get("artefacts") or {}
    if artefacts.get("plot"):
        out += [f"![allreduce bandwidth vs message size]({artefacts['plot']})", ""]
    elif artefacts.get("plot_note"):
        out += [f"Plot skipped: {artefacts['plot_note']}.", ""]
    plugin = next((c for c in result.get("checks", []) if c["name"] == "net-plugin"), None)
    if plugin and plugin.get("details", {}).get("evidence"):
        out += ["## Network plugin evidence (NCCL_DEBUG=INFO)", "", "```"] + plugin["details"]["evidence"] + ["```", ""]
    out += _mpi_lines(result.get("mpi") or {})
    out += _environment_lines(result.get("job_environment") or {})
    out += ["## Files", "", f"- `{artefacts.get('json', 'result.json')}`: every number above, per check and per rank",
            f"- `{artefacts.get('markdown', 'summary.md')}`: this summary"]
    if artefacts.get("plot"):
        out.append(f"- `{artefacts['plot']}`: bandwidth vs message size")
    out.append("")
    return "\n".join(out)


def _facts_line(result: dict[str, Any]) -> str:
    """The run in one line, facts joined by `` · ``: job, launcher, backend, ranks and hosts, torch, time."""
    hosts = result.get("hosts") or []
    facts = [f"job {result['job_id']}" if result.get("job_id") else None,
             (f"launcher {result.get('launcher')}" if result.get("launcher") else "launcher unknown")
             + (f" (script: {result['job_launcher']})" if result.get("job_launcher") else ""),
             f"backend {result.get('backend')} on {result.get('device')}" if result.get("backend")
             else "backend not chosen (the run ended before torch picked a device)",
             f"{result.get('world_size')} ranks on {result.get('nodes')} node{'s' if result.get('nodes') != 1 else ''}"
             + (f" ({', '.join(hosts[:8])}{', ...' if len(hosts) > 8 else ''})" if hosts else ""),
             f"torch {result['torch']}" if result.get("torch") else None,
             f"{result.get('elapsed_s', 0):.1f} s"]
    return " · ".join(f for f in facts if f)


def _check_lines(result: dict[str, Any]) -> list[str]:
    """The checks' table, then the failed checks' problems beyond the first (which the table shows)."""
    out = ["| check | status | detail |", "|---|---|---|"]
    for check in result.get("checks", []):
        out.append(f"| {check['name']} | {STATUS_MARK.get(check['status'], check['status'])} | {_cell(check['summary'])} |")
    out.append("")
    problems = [(c["name"], p) for c in result.get("checks", []) if c["status"] == "failed"
                for p in c.get("details", {}).get("problems", [])[1:]]
    if problems:
        out += ["Further problems:", ""] + [f"- {name}: {p}" for name, p in problems] + [""]
    return out


def _rank_lines(ranks: list[dict[str, Any]]) -> list[str]:
    """The ranks' section, by rank: host, device, CPUs bound and expected (none without ranks)."""
    if not ranks:
        return []
    out = ["## Ranks", "", "| rank | local | host | device | CPUs | expected CPUs | threads |",
           "|---|---|---|---|---|---|---|"]
    for r in sorted(ranks, key=lambda r: r.get("rank", 0)):
        cpus = cpu_list(r.get("affinity") or [])
        # a rank a watchdog reported early may not know its local rank or device yet
        out.append(f"| {r.get('rank')} | {_known(r.get('local_rank'))} | {_known(r.get('host'))} | {_known(r.get('device'))}"
                   f"{' (' + r['device_name'] + ')' if r.get('device_name') else ''} | {cpus} | "
                   f"{r.get('expected_cpus') or '—'} | {_cell(threads_text(r.get('threads')))} |")
    out.append("")
    return out


def threads_text(threads: dict[str, Any] | None) -> str:
    """A rank's threads in one cell: ``1 torch (2 inter-op) · OMP_NUM_THREADS=1 · 2 ranks share its 2 CPUs``."""
    if not threads:
        return "—"
    parts = [f"{_known(threads.get('torch_threads'))} torch ({_known(threads.get('interop_threads'))} inter-op)"]
    parts += [f"{var}={value}" for var, value in (threads.get("env") or {}).items() if value is not None]
    if threads.get("cpus"):
        sharing = threads.get("ranks_sharing")
        parts.append(f"{sharing} ranks share its {threads['cpus']} CPUs" if sharing and sharing > 1
                     else f"{threads['cpus']} CPUs")
    if threads.get("quota"):
        parts.append(f"CPU quota {threads['quota'].get('cpus')}")
    return " · ".join(parts)


def _bandwidth_lines(bw: dict[str, Any]) -> list[str]:
    """The bandwidth section: one row per message size, the definition and the reference it was
    judged against (none without rows)."""
    rows = bw.get("rows") or []
    if not rows:
        return []
    out = [f"## Bandwidth: {bw.get('op', 'allreduce')} ({bw.get('dtype', 'float32')}, {bw.get('ranks')} ranks, "
           f"{bw.get('iters')} iterations per size)", "",
           "| size | time (us) | algbw (GB/s) | busbw (GB/s) |", "|---:|---:|---:|---:|"]
    for row in rows:
        out.append(f"| {human_bytes(row['bytes'])} | {row['time_us']:.1f} | {row['algbw_gbs']:.4g} | {row['busbw_gbs']:.4g} |")
    out += ["", f"{bw.get('definition', '')}.", ""]
    ref = bw.get("reference")
    if ref:
        out += [f"Reference ({ref.get('kind')}): {ref['busbw_gbs']:.4g} GB/s at {human_bytes(ref['message_bytes'])}, "
                f"accepted from {ref['minimum_gbs']:.4g} GB/s; measured {ref['measured_gbs']:.4g} GB/s at "
                f"{human_bytes(ref['at_bytes'])}." + (f" Source: {ref['source']}." if ref.get("source") else ""), ""]
    else:
        out += ["No reference for this node count in the site facts: measured only.", ""]
    return out


def _mpi_lines(mpi: dict[str, Any]) -> list[str]:
    """The MPI section: the C probe's latency and bandwidth, mpi4py's ping-pong (none without either)."""
    probe, m4 = mpi.get("probe"), mpi.get("mpi4py")
    if not (probe or m4):
        return []
    out = ["## MPI", ""]
    stats = (m4 or {}).get("latency") or {}
    if probe:
        lib = str(probe.get("library", "")).strip().splitlines()
        mean = float(probe.get("latency_us") or 0)
        noisy = ""
        if stats.get("median_us") and mean > NOISE_FACTOR * stats["median_us"]:
            noisy = (f" (noisy: {mean / stats['median_us']:.0f}x mpi4py's median; a mean is pulled up by the "
                     "slowest round trips, as when the ranks share a busy CPU)")
        out.append(f"- C probe ({one_line(lib[0]) if lib else '?'}), {probe.get('size')} ranks on "
                   f"{', '.join(probe.get('hosts') or [])}: latency {mean:.3g} us (mean of 500 round trips){noisy}")
        for b in probe.get("bandwidth") or []:
            out.append(f"  - {human_bytes(b['bytes'])}: {b['mb_s']:.4g} MB/s")
    if m4:
        bwv = m4.get("bandwidth_mb_s")
        extra = f": ping-pong {latency_text(stats)}, {bwv:.4g} MB/s at 1 MiB" if stats and bwv is not None else ""
        out.append(f"- mpi4py ({one_line(m4.get('library'))}), {m4.get('size')} ranks{extra}")
    out.append("")
    return out


def _environment_lines(setting: dict[str, Any]) -> list[str]:
    """The job's environment: modules, the plugin directories on LD_LIBRARY_PATH, the variables set."""
    if not setting:
        return []
    out = ["## Environment", "", f"- modules: {', '.join(setting.get('modules') or []) or '(none loaded)'}",
           f"- network plugin on LD_LIBRARY_PATH: {', '.join(setting.get('plugin_library_path') or []) or '(none)'}"]
    return out + [f"- `{k}={one_line(v)}`" for k, v in (setting.get("variables") or {}).items()] + [""]


def cpu_list(cpus: Iterable[int], empty: str = "—") -> str:
    """``{0, 1, 2, 5}`` -> ``"0-2,5"`` (``empty`` for no CPUs)."""
    values = sorted(cpus)
    if not values:
        return empty
    runs, start, prev = [], values[0], values[0]
    for cpu in values[1:]:
        if cpu != prev + 1:
            runs.append(f"{start}-{prev}" if prev > start else str(start))
            start = cpu
        prev = cpu
    runs.append(f"{start}-{prev}" if prev > start else str(start))
    return ",".join(runs)


def write_json(result: dict[str, Any], path: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=2, sort_keys=False, default=str)
        handle.write("\n")
    os.replace(tmp, path)


def write_plot(result: dict[str, Any], path: str) -> str | None:
    """Draw bandwidth vs message size into ``path``; return why not when it cannot (None: drawn)."""
    rows = (result.get("bandwidth") or {}).get("rows") or []
    if not rows:
        return "no bandwidth was measured"
    try:
        import matplotlib  # type: ignore[import-not-found, unused-ignore]

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return "matplotlib is not installed in this Python"
    bw = result["bandwidth"]
    sizes = [r["bytes"] for r in rows]
    probe = (result.get("mpi") or {}).get("probe") or {}
    probe_rows = [b for b in probe.get("bandwidth") or [] if b.get("mb_s")]
    # MPI point-to-point gets its own axis below (another quantity, another scale), sharing the sizes
    fig, axes = plt.subplots(2 if probe_rows else 1, 1, figsize=(9, 8 if probe_rows else 5.5), dpi=110, sharex=True,
                             squeeze=False, gridspec_kw={"height_ratios": [3, 2]} if probe_rows else None)
    ax = axes[0][0]
    _plot_collective(ax, bw, rows)
    every = sorted(set(sizes) | {b["bytes"] for b in probe_rows})
    ticks = every if len(every) <= 12 else every[:: max(1, len(every) // 10)]
    _frame_axes([row[0] for row in axes], ticks, probe_rows)
    ax.set_ylabel("bandwidth (GB/s, 10⁹ bytes/s)")
    verdict = str(result.get("verdict", "?")).upper()
    ax.set_title(f"{result.get('site', '?')}: {bw.get('op', 'allreduce')} bandwidth, {result.get('world_size')} ranks on "
                 f"{result.get('nodes')} node(s), {result.get('backend')} on {result.get('device')} "
                 f"({result.get('launcher')}) — {verdict}", fontsize=10)
    # the legend sits outside the axes, so it never hides the deciding point
    if probe_rows:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, framealpha=0.9)
    else:
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), fontsize=9, framealpha=0.9, ncol=2)
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    return None


def _plot_collective(ax: Any, bw: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    """Draw the collective's busbw and algbw per message size on ``ax``, and the reference bound and
    the measured value at the one size the reference applies to, where there is a reference."""
    sizes = [r["bytes"] for r in rows]
    ax.plot(sizes, [r["busbw_gbs"] for r in rows], marker="o", linewidth=2, color="#1f77b4",
            label=f"{bw.get('op', 'allreduce')} busbw = algbw × 2(n−1)/n")
    same = " (equal to busbw for 2 ranks)" if bw.get("ranks") == 2 else ""
    ax.plot(sizes, [r["algbw_gbs"] for r in rows], marker="s", markersize=9, markerfacecolor="none", linewidth=1.5,
            linestyle="--", color="#ff7f0e", label=f"{bw.get('op', 'allreduce')} algbw = bytes / time{same}")
    ref = bw.get("reference")
    if ref:
        # the bound applies at one message size only: drawn there, not across the sweep
        at = ref["at_bytes"]
        ax.plot([at / 1.6, at * 1.6], [ref["minimum_gbs"]] * 2, color="#d62728", linestyle="-", linewidth=2.5,
                label=f"accepted from {ref['minimum_gbs']:.3g} GB/s busbw at {human_bytes(at)} "
                      f"(reference {ref['busbw_gbs']:.3g} GB/s)")
        ax.plot([at], [ref["measured_gbs"]], marker="*", markersize=14, color="#d62728", linestyle="none",
                label=f"measured {ref['measured_gbs']:.3g} GB/s at {human_bytes(at)} (the deciding point)")


def _frame_axes(column: list[Any], ticks: list[int], probe_rows: list[dict[str, Any]]) -> None:
    """Log scales and grids on every axis of ``column``; the MPI probe's bandwidth on the second axis
    where there is one; the message sizes ``ticks`` labelled on the bottom axis."""
    from matplotlib.ticker import FixedLocator, NullLocator  # type: ignore[import-not-found, unused-ignore]

    for axis in column:
        axis.set_xscale("log", base=2)
        axis.set_yscale("log")
        axis.grid(True, which="major", alpha=0.35)
    if probe_rows:
        low = column[1]
        low.plot([b["bytes"] for b in probe_rows], [b["mb_s"] for b in probe_rows], marker="^", linestyle=":",
                 color="#2ca02c", label="MPI point-to-point (C probe)")
        low.set_ylabel("MPI bandwidth (MB/s)")
        low.legend(loc="upper center", bbox_to_anchor=(0.5, -0.3), fontsize=9, framealpha=0.9)
    bottom = column[-1]
    bottom.xaxis.set_major_locator(FixedLocator(ticks))
    bottom.xaxis.set_minor_locator(NullLocator())
    bottom.set_xticks(ticks)
    bottom.set_xticklabels([human_bytes(s) for s in ticks], rotation=30, ha="right")
    bottom.set_xlabel("message size")


def startup_lines(startup: dict[str, Any] | None) -> list[str]:
    """The start-up section: `import torch` from the shared prefix and from node-local storage."""
    if not startup:
        return []
    def secs(value: Any) -> str:
        return f"{value:.2f} s" if isinstance(value, (int, float)) else "not measured"
    lines = ["## Start-up (`import torch`, slowest node)", "",
             f"- from the shared prefix ({startup.get('shared_path', '?')}): {secs(startup.get('shared_s'))}",
             f"- from node-local storage ({startup.get('staged_path') or 'not staged'}): {secs(startup.get('staged_s'))}"]
    if startup.get("note"):
        lines.append(f"- {startup['note']}")
    return lines + [""]


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    with open(argv[0], encoding="utf-8") as handle:
        result = json.load(handle)
    out = argv[1] if len(argv) > 1 else os.path.dirname(os.path.abspath(argv[0]))
    note = write_plot(result, os.path.join(out, "bandwidth.png"))
    if note:
        result.setdefault("artefacts", {})["plot"] = None
        result["artefacts"]["plot_note"] = note
    with open(os.path.join(out, "summary.md"), "w", encoding="utf-8") as handle:
        handle.write(markdown(result))
    print(verdict_table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
