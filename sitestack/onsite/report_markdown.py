"""``summary.md`` of a validation run, rendered from its ``result.json``: the verdict, the checks, the
start-up, the ranks, the collectives, the libraries, the bandwidth table and the evidence, each
section a function of the part of the result it shows (none where the result lacks it). Rendered in
memory; :mod:`.ddp_report` writes it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .ddpcheck.checks import COLLECTIVES, NET_PLUGIN
from .report_plot import human_bytes
from .visible import one_line

STATUS_MARK = {"passed": "PASS", "failed": "FAIL", "skipped": "skip"}
#: A latency whose maximum (or another measurement's mean) is this many times the median is noisy.
NOISE_FACTOR = 10.0


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


def markdown(result: Mapping[str, Any]) -> str:
    """``summary.md``: the verdict, the checks, the ranks, the bandwidth table and the evidence."""
    verdict = str(result.get("verdict", "?")).upper()
    out = [f"# sitestack validation: {result.get('site', '?')} — {verdict}", ""]
    out += [_facts_line(result), ""]
    out += _check_lines(result)
    out += startup_lines(result.get("startup"))
    out += _rank_lines(result.get("ranks") or [])
    out += _collective_lines(result)
    out += library_lines(result.get("ranks") or [])
    out += _bandwidth_lines(result.get("bandwidth") or {})
    artefacts = result.get("artefacts") or {}
    if artefacts.get("plot"):
        out += [f"![allreduce bandwidth vs message size]({artefacts['plot']})", ""]
    elif artefacts.get("plot_note"):
        out += [f"Plot skipped: {artefacts['plot_note']}.", ""]
    plugin = next((c for c in result.get("checks", []) if c["name"] == NET_PLUGIN.name), None)
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


def _facts_line(result: Mapping[str, Any]) -> str:
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


def _check_lines(result: Mapping[str, Any]) -> list[str]:
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


def library_lines(ranks: list[dict[str, Any]]) -> list[str]:
    """The libraries the ranks mapped (``ranks[].libraries``, ddpcheck/libraries.py): one row per file,
    with the ranks that mapped it (none where no rank recorded any)."""
    rows: dict[tuple[str, str, str, str], list[int]] = {}
    for r in ranks:
        for kind, entries in sorted((r.get("libraries") or {}).items()):
            for e in entries:
                path = str(e.get("path")) + (" (deleted)" if e.get("deleted") else "")
                key = (kind, path, _known(e.get("soname")), _known(e.get("version")))
                rows.setdefault(key, []).extend([r["rank"]] if isinstance(r.get("rank"), int) else [])
    if not rows:
        return []
    out = ["## Libraries", "", "| kind | path | soname | version | ranks |", "|---|---|---|---|---|"]
    out += [f"| {kind} | `{_cell(path)}` | {_cell(soname)} | {_cell(version)} | {cpu_list(who)} |"
            for (kind, path, soname, version), who in sorted(rows.items())]
    return out + [""]


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


def _collective_lines(result: Mapping[str, Any]) -> list[str]:
    """The collectives section (``ddpcheck/collectives.py``): per operation and dtype, exact, the wrong
    elements by rank and size, or not supported by the backend (none where the check did not run)."""
    details = next((c.get("details") or {} for c in result.get("checks", []) if c["name"] == COLLECTIVES.name), {})
    if not details.get("ops"):
        return []
    wrong, lacking = details.get("wrong") or {}, details.get("unsupported") or {}

    def cell(op: str, dtype: str) -> str:
        if dtype in lacking.get(op, {}):
            return f"not supported by {result.get('backend') or 'the backend'}"
        found = [f"rank {rank} at {human_bytes(int(size))}: {count}" for rank, ops in sorted(wrong.items(), key=lambda i: int(i[0]))
                 for size, count in ((ops.get(op) or {}).get(dtype) or {}).items()]
        return ("wrong: " + ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")) if found else "exact"

    out = ["## Collectives", "", f"| operation | {' | '.join(details['dtypes'])} |", "|---|" + "---|" * len(details["dtypes"])]
    out += [f"| {op} | {' | '.join(_cell(cell(op, dtype)) for dtype in details['dtypes'])} |" for op in details["ops"]]
    repeated = [f"{human_bytes(int(size))} {n} times" for size, n in (details.get("repeats") or {}).items() if n > 1]
    return out + ["", f"Sizes {', '.join(human_bytes(s) for s in details.get('sizes') or [])}"
                  f"{' (' + ', '.join(repeated) + ')' if repeated else ''}; wrong elements per rank, operation, dtype "
                  "and size: `checks[collectives].details.wrong` in result.json.", ""]


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



def startup_lines(startup: dict[str, Any] | None) -> list[str]:
    """The start-up section: how long the ranks took to meet; where the job measured it (startup.json), the
    time until every rank had imported torch from the shared prefix and from node-local storage."""
    if not startup or set(startup) <= {"ready_s"} and startup.get("ready_s") is None:
        return []
    def secs(value: Any) -> str:
        return f"{value:.2f} s" if isinstance(value, (int, float)) else "not measured"
    lines = ["## Start-up", ""]
    if isinstance(startup.get("ready_s"), (int, float)):
        lines.append(f"- every rank in the process group {secs(startup['ready_s'])} after the launcher started")
    if "shared_path" in startup or "staged_path" in startup:   # the job's import_probe.py ranks (facts.node.stage_env)
        ranks = f"all {startup['ranks']} ranks" if isinstance(startup.get("ranks"), int) else "every rank"
        stage = f", staging {secs(startup['stage_s'])} included" if isinstance(startup.get("stage_s"), (int, float)) else ""
        lines += [f"- `import torch` by {ranks} from the shared prefix ({startup.get('shared_path', '?')}): "
                  f"{secs(startup.get('shared_s'))} until the last had imported",
                  f"- the same from node-local storage ({startup.get('staged_path') or 'not staged'}): "
                  f"{secs(startup.get('staged_s'))}{stage}"]
    if startup.get("note"):
        lines.append(f"- {startup['note']}")
    return lines + [""]
