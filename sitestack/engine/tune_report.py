"""What ``invoke tune`` shows and leaves beside ``tuning.json``: the table of the points (status, the
medians with their spread, the verdict), ``report.md``, and the plot of each measured point's busbw
against the message size (``busbw.png`` drawn by matplotlib where the controller has it, else
``busbw.svg`` with the standard library, drawn like the validation report's bandwidth plot)."""

from __future__ import annotations

import io
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from typing import Any

from sitestack.onsite.report_plot import (
    LEFT,
    PANEL,
    RIGHT,
    TOP,
    UNDER,
    WIDTH,
    _add,
    _Axis,
    _frame,
    _marker,
    human_bytes,
)

#: One colour per point (matplotlib's tab10, the validation plot's palette), in the order of the points.
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
          "#17becf")


def _cell(stats: Mapping[str, float] | None, digits: str = ".3g") -> str:
    if not stats:
        return "-"
    return f"{stats['median']:{digits}} ±{stats['spread'] / 2:.0%}"


def sizes_of(doc: Mapping[str, Any]) -> list[str]:
    """The message sizes measured at any point, ascending (decimal strings, as tuning.json keys them)."""
    found = {s for p in doc["points"] for s in (p.get("summary") or {}).get("busbw_gbs") or {}}
    return sorted(found, key=int)


def rows(doc: Mapping[str, Any]) -> list[list[str]]:
    """The table's rows: a header, then per point id, label, status, busbw per size, DDP step, verdict."""
    sizes = sizes_of(doc)
    out = [["point", "setting", "status", *[f"busbw {human_bytes(int(s))} GB/s" for s in sizes], "DDP step ms", "verdict"]]
    for p in doc["points"]:
        summary = p.get("summary") or {}
        busbw = summary.get("busbw_gbs") or {}
        chosen = bool(_only(p)) and doc["chosen"].get(_only(p)) == _value(p)
        verdict = p["verdict"] + (" (chosen)" if chosen else "")
        out.append([p["id"], p["label"], p["status"], *[_cell(busbw.get(s)) for s in sizes],
                    _cell(summary.get("step_ms")), verdict])
    return out


def _only(point: Mapping[str, Any]) -> str:
    settings = point.get("settings") or {}
    return next(iter(settings)) if len(settings) == 1 else ""


def _value(point: Mapping[str, Any]) -> str | None:
    return (point.get("settings") or {}).get(_only(point))


def table(doc: Mapping[str, Any]) -> str:
    """The points as aligned text (medians with ± half their spread)."""
    table_rows = rows(doc)
    widths = [max(len(r[i]) for r in table_rows) for i in range(len(table_rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in table_rows)


def decision_lines(doc: Mapping[str, Any]) -> list[str]:
    """The chosen settings with their evidence, the dropped points with their causes, or why nothing was chosen."""
    lines = [f"chosen: {name}={value}: {doc['evidence'][name]}" for name, value in doc["chosen"].items()]
    if doc.get("problem"):
        lines.append(f"nothing chosen: {doc['problem']}")
    elif not doc["chosen"]:
        lines.append("nothing chosen: no candidate beat the default beyond the noise; every variable stays unset")
    lines += [f"dropped: {d['label']} ({d['status']}): {d.get('cause') or 'no cause recorded'}" for d in doc["dropped"]]
    return lines


def markdown(doc: Mapping[str, Any], plot: str | None) -> str:
    """``report.md``: the job, the stack, the rule, the table, the decision, the plot."""
    stack = doc.get("stack") or {}
    table_rows = rows(doc)
    out = [f"# Tuning sweep of {doc.get('site')}: job {doc.get('job_id')}, {doc.get('date')}", "",
           f"{doc.get('world_size')} ranks on {doc.get('nodes')} node(s) via {doc.get('launcher')}, "
           f"{doc.get('backend')} on {doc.get('device')}; stack {stack.get('module') or '-'} "
           f"(digest {stack.get('digest') or '-'}); {doc.get('repeats')} samples per metric at each point.", "",
           f"A candidate is chosen when it beats the default (every variable unset) by at least "
           f"{doc['min_gain']:.0%} on a metric with no sample overlapping the default's, and is worse on none "
           "(docs/tuning.md). Cells: median ± half the spread (max - min) of the samples.", "",
           "| " + " | ".join(table_rows[0]) + " |", "|" + "---|" * len(table_rows[0])]
    out += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in table_rows[1:]]
    out += ["", *[f"- {line}" for line in decision_lines(doc)]]
    if plot:
        out += ["", f"![busbw against message size at each point]({plot})"]
    out += ["", f"Results of the sweep: {doc.get('results') or '-'}"]
    return "\n".join(out) + "\n"


def series(doc: Mapping[str, Any]) -> list[tuple[str, list[tuple[int, float]]]]:
    """(label, [(size, median busbw)]) of each point with a measured busbw."""
    out = []
    for p in doc["points"]:
        busbw = (p.get("summary") or {}).get("busbw_gbs") or {}
        pairs = [(int(s), busbw[s]["median"]) for s in sorted(busbw, key=int) if busbw[s]["median"] > 0]
        if pairs:
            out.append((f"{p['id']} {p['label']}", pairs))
    return out


def title(doc: Mapping[str, Any]) -> str:
    """The plot's title: the site and the tuning job."""
    return (f"{doc.get('site')}: allreduce busbw at each point of tuning job {doc.get('job_id')}, "
            f"{doc.get('world_size')} ranks, {doc.get('backend')} on {doc.get('device')}")


def render_plot(doc: Mapping[str, Any]) -> tuple[str, bytes] | None:
    """(file name, content) of the plot, or None where no point measured a busbw."""
    lines = series(doc)
    if not lines:
        return None
    try:
        import matplotlib  # type: ignore[import-not-found, unused-ignore]

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return "busbw.svg", svg_plot(doc, lines).encode("utf-8")
    return "busbw.png", _png(doc, lines, plt)


def _png(doc: Mapping[str, Any], lines: Sequence[tuple[str, list[tuple[int, float]]]], plt: Any) -> bytes:
    from matplotlib.ticker import NullLocator  # type: ignore[import-not-found, unused-ignore]

    fig, ax = plt.subplots(figsize=(9, 5.5), dpi=110)
    for i, (label, pairs) in enumerate(lines):
        ax.plot([s for s, _ in pairs], [v for _, v in pairs], marker="o", color=COLORS[i % len(COLORS)], label=label)
    sizes = sorted({s for _, pairs in lines for s, _ in pairs})
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(sizes)
    ax.set_xticklabels([human_bytes(s) for s in sizes], rotation=30, ha="right")
    ax.xaxis.set_minor_locator(NullLocator())   # the sizes measured are the ticks; busbw keeps its minor labels
    ax.grid(True, which="major", alpha=0.35)
    ax.set_xlabel("message size")
    ax.set_ylabel("busbw (GB/s, median of the samples)")
    ax.set_title(title(doc), fontsize=10)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), fontsize=9, ncol=2)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


def svg_plot(doc: Mapping[str, Any], lines: Sequence[tuple[str, list[tuple[int, float]]]]) -> str:
    """The plot as an SVG document (standard library only), one line per measured point."""
    height = TOP + PANEL + UNDER + 20 * len(lines) + 10
    svg = ET.Element("svg", {"xmlns": "http://www.w3.org/2000/svg", "width": str(WIDTH), "height": str(height),
                             "viewBox": f"0 0 {WIDTH} {height}", "font-family": "sans-serif"})
    _add(svg, "rect", x=0, y=0, width=WIDTH, height=height, fill="white")
    _add(svg, "text", title(doc), x=WIDTH / 2, y=28, text_anchor="middle", font_size=13, class_="title")
    sizes = sorted({s for _, pairs in lines for s, _ in pairs})
    axis = _Axis([float(s) for s in sizes], [v for _, pairs in lines for _, v in pairs], TOP, PANEL)
    _frame(svg, axis, "busbw (GB/s, median of the samples)", sizes, bottom=True)
    for i, (label, pairs) in enumerate(lines):
        color = COLORS[i % len(COLORS)]
        group = _add(svg, "g", class_="point")
        _add(group, "polyline", points=" ".join(f"{axis.x(s):.1f},{axis.y(v):.1f}" for s, v in pairs), fill="none",
             stroke=color, stroke_width=2)
        for s, v in pairs:
            _marker(group, "circle", axis.x(s), axis.y(v), color)
        y = TOP + PANEL + UNDER + 20 * i
        _add(svg, "line", x1=LEFT, x2=LEFT + 30, y1=y, y2=y, stroke=color, stroke_width=2)
        _add(svg, "text", label, x=LEFT + 40, y=y + 4, font_size=12, class_="legend")
    _add(svg, "text", "message size", x=(LEFT + WIDTH - RIGHT) / 2, y=TOP + PANEL + 62, text_anchor="middle",
         font_size=12, class_="xlabel")
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(svg, encoding="unicode") + "\n"
