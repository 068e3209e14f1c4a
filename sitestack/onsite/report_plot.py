"""The report's plot: allreduce bandwidth (busbw and algbw) against message size, log-log.

Drawn with matplotlib as ``bandwidth.png`` where the Python has it; otherwise the same figure is
written as ``bandwidth.svg`` with the standard library alone (:mod:`xml.etree.ElementTree`), so
the report of a stack without matplotlib has its plot too. Both show the collective's busbw and
algbw per message size, the site's reference bound and the deciding point where there is a
reference, the C MPI probe's point-to-point bandwidth on an axis of its own where it ran, and a
title naming the site, the ranks and the verdict.

Installed on the site beside ``ddp_report.py`` (which imports it; standard library only).
"""

from __future__ import annotations

import io
import math
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from typing import Any

BUSBW, ALGBW, REFERENCE, MPI = "#1f77b4", "#ff7f0e", "#d62728", "#2ca02c"
COLORS = {"busbw": BUSBW, "algbw": ALGBW, "reference": REFERENCE, "deciding": REFERENCE, "mpi": MPI}
#: The SVG's marker of each line (those of the PNG: o, open s, ^, *).
MARKERS = {"busbw": "circle", "algbw": "square", "mpi": "triangle", "deciding": "star"}


def human_bytes(n: float) -> str:
    """``134217728`` -> ``"128 MiB"``; a size that is not a whole number of KiB stays in bytes."""
    n = int(n)
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def render_plot(result: Mapping[str, Any]) -> tuple[str, bytes] | str:
    """The plot of ``result`` as (file name, content): ``bandwidth.png`` drawn by matplotlib, or
    ``bandwidth.svg`` where matplotlib cannot be imported; or why there is no plot (a string).
    Errors of the drawing itself propagate: the caller decides what a failed plot means."""
    rows = (result.get("bandwidth") or {}).get("rows") or []
    if not rows:
        return "no bandwidth was measured"
    try:
        import matplotlib  # type: ignore[import-not-found, unused-ignore]

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return "bandwidth.svg", svg_plot(result).encode("utf-8")
    return "bandwidth.png", _png(result, rows, plt)


def title(result: Mapping[str, Any]) -> str:
    bw = result.get("bandwidth") or {}
    return (f"{result.get('site', '?')}: {bw.get('op', 'allreduce')} bandwidth, {result.get('world_size')} ranks on "
            f"{result.get('nodes')} node(s), {result.get('backend')} on {result.get('device')} "
            f"({result.get('launcher')}) — {str(result.get('verdict', '?')).upper()}")


def labels(result: Mapping[str, Any]) -> dict[str, str]:
    """The legend's words for each line, the same in both drawings."""
    bw = result.get("bandwidth") or {}
    op = bw.get("op", "allreduce")
    out = {"busbw": f"{op} busbw = algbw × 2(n−1)/n",
           "algbw": f"{op} algbw = bytes / time" + (" (equal to busbw for 2 ranks)" if bw.get("ranks") == 2 else ""),
           "mpi": "MPI point-to-point (C probe)"}
    ref = bw.get("reference")
    if ref:
        at = human_bytes(ref["at_bytes"])
        out["reference"] = (f"accepted from {ref['minimum_gbs']:.3g} GB/s busbw at {at} "
                            f"(reference {ref['busbw_gbs']:.3g} GB/s)")
        out["deciding"] = f"measured {ref['measured_gbs']:.3g} GB/s at {at} (the deciding point)"
    return out


def probe_rows(result: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The C MPI probe's bandwidth rows that have a value."""
    probe = (result.get("mpi") or {}).get("probe") or {}
    return [b for b in probe.get("bandwidth") or [] if b.get("mb_s")]


def size_ticks(result: Mapping[str, Any]) -> list[int]:
    """The message sizes labelled on the x axis: every size measured, about ten where there are more."""
    every = sorted({int(r["bytes"]) for r in result["bandwidth"]["rows"]} | {int(b["bytes"]) for b in probe_rows(result)})
    return every if len(every) <= 12 else every[:: max(1, len(every) // 10)]


# -- matplotlib ------------------------------------------------------------------------------------------

def _png(result: Mapping[str, Any], rows: list[dict[str, Any]], plt: Any) -> bytes:
    from matplotlib.ticker import FixedLocator, NullLocator  # type: ignore[import-not-found, unused-ignore]

    bw, words, probe = result["bandwidth"], labels(result), probe_rows(result)
    sizes = [r["bytes"] for r in rows]
    # MPI point-to-point gets its own axis below (another quantity, another scale), sharing the sizes
    fig, axes = plt.subplots(2 if probe else 1, 1, figsize=(9, 8 if probe else 5.5), dpi=110, sharex=True,
                             squeeze=False, gridspec_kw={"height_ratios": [3, 2]} if probe else None)
    column = [row[0] for row in axes]
    ax = column[0]
    ax.plot(sizes, [r["busbw_gbs"] for r in rows], marker="o", linewidth=2, color=BUSBW, label=words["busbw"])
    ax.plot(sizes, [r["algbw_gbs"] for r in rows], marker="s", markersize=9, markerfacecolor="none", linewidth=1.5,
            linestyle="--", color=ALGBW, label=words["algbw"])
    ref = bw.get("reference")
    if ref:  # the bound applies at one message size only: drawn there, not across the sweep
        at = ref["at_bytes"]
        ax.plot([at / 1.6, at * 1.6], [ref["minimum_gbs"]] * 2, color=REFERENCE, linewidth=2.5, label=words["reference"])
        ax.plot([at], [ref["measured_gbs"]], marker="*", markersize=14, color=REFERENCE, linestyle="none",
                label=words["deciding"])
    for axis in column:
        axis.set_xscale("log", base=2)
        axis.set_yscale("log")
        axis.grid(True, which="major", alpha=0.35)
    if probe:
        low = column[1]
        low.plot([b["bytes"] for b in probe], [b["mb_s"] for b in probe], marker="^", linestyle=":", color=MPI,
                 label=words["mpi"])
        low.set_ylabel("MPI bandwidth (MB/s)")
        low.legend(loc="upper center", bbox_to_anchor=(0.5, -0.3), fontsize=9, framealpha=0.9)
    ticks = size_ticks(result)
    bottom = column[-1]
    bottom.xaxis.set_major_locator(FixedLocator(ticks))
    bottom.xaxis.set_minor_locator(NullLocator())
    bottom.set_xticks(ticks)
    bottom.set_xticklabels([human_bytes(s) for s in ticks], rotation=30, ha="right")
    bottom.set_xlabel("message size")
    ax.set_ylabel("bandwidth (GB/s, 10⁹ bytes/s)")
    ax.set_title(title(result), fontsize=10)
    # the legend sits outside the axes, so it never hides the deciding point
    if probe:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, framealpha=0.9)
    else:
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), fontsize=9, framealpha=0.9, ncol=2)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


# -- SVG, standard library only --------------------------------------------------------------------------

WIDTH, LEFT, RIGHT, TOP = 900, 90, 30, 50
#: Heights of the bandwidth panel, the MPI panel, and the band under the bottom axis for its labels.
PANEL, LOW_PANEL, UNDER = 330, 170, 80


class _Axis:
    """A log-scaled panel of the SVG: data (bytes, value) to pixels, with room around the data for the
    markers and the reference bound (drawn 1.6x either side of its size); x is the same in every panel."""

    def __init__(self, xs: list[float], ys: list[float], top: float, height: float) -> None:
        x0, x1 = math.log2(min(xs)), math.log2(max(xs))
        pad = max(0.05 * (x1 - x0), 0.8)
        self.x0, self.x1 = x0 - pad, x1 + pad
        y0, y1 = math.log10(min(ys)), math.log10(max(ys))
        if y1 - y0 < 1:  # at least a decade, so one grid line is labelled
            y0, y1 = (y0 + y1 - 1) / 2, (y0 + y1 + 1) / 2
        pad = 0.06 * (y1 - y0)
        self.y0, self.y1 = y0 - pad, y1 + pad
        self.top, self.height = top, height

    def decades(self) -> list[int]:
        """The powers of ten inside the panel (about six at most) for the grid and its labels."""
        first, last = math.ceil(self.y0), math.floor(self.y1)
        return list(range(first, last + 1, max(1, (last - first) // 6)))

    def x(self, size: float) -> float:
        return LEFT + (math.log2(size) - self.x0) / (self.x1 - self.x0) * (WIDTH - LEFT - RIGHT)

    def y(self, value: float) -> float:
        return self.top + self.height * (1 - (math.log10(value) - self.y0) / (self.y1 - self.y0))


def _add(parent: ET.Element, tag: str, text: str | None = None, **attrs: Any) -> ET.Element:
    element = ET.SubElement(parent, tag, {k.rstrip("_").replace("_", "-"): str(v) for k, v in attrs.items()})
    element.text = text
    return element


def _points(axis: _Axis, pairs: list[tuple[float, float]]) -> str:
    return " ".join(f"{axis.x(s):.1f},{axis.y(v):.1f}" for s, v in pairs)


def _marker(parent: ET.Element, shape: str, x: float, y: float, color: str) -> None:
    """A point: a filled circle (busbw), an open square (algbw), a triangle (MPI), a star (the deciding point)."""
    if shape == "circle":
        _add(parent, "circle", cx=f"{x:.1f}", cy=f"{y:.1f}", r=4, fill=color)
    elif shape == "square":
        _add(parent, "rect", x=f"{x - 5:.1f}", y=f"{y - 5:.1f}", width=10, height=10, fill="none", stroke=color,
             stroke_width=1.5)
    else:
        corners = 5 if shape == "star" else 3
        radii = (9.0, 3.8) if shape == "star" else (5.5, 5.5)
        steps = corners * 2 if shape == "star" else corners
        points = [(x + radii[i % 2] * math.sin(2 * math.pi * i / steps), y - radii[i % 2] * math.cos(2 * math.pi * i / steps))
                  for i in range(steps)]
        _add(parent, "polygon", points=" ".join(f"{px:.1f},{py:.1f}" for px, py in points), fill=color)


def _series(svg: ET.Element, axis: _Axis, name: str, pairs: list[tuple[float, float]], color: str, **line: Any) -> None:
    """One line of the plot: a polyline (class ``name``) and a marker at each measured point."""
    group = _add(svg, "g", class_=name)
    _add(group, "polyline", points=_points(axis, pairs), fill="none", stroke=color, **line)
    for size, value in pairs:
        _marker(group, MARKERS[name], axis.x(size), axis.y(value), color)


def _frame(svg: ET.Element, axis: _Axis, label: str, ticks: list[int], bottom: bool) -> None:
    """The panel's box, its decade grid and labels, and the size ticks (labelled on the bottom panel)."""
    _add(svg, "rect", x=LEFT, y=axis.top, width=WIDTH - LEFT - RIGHT, height=axis.height, fill="none", stroke="#444")
    for decade in axis.decades():
        y = axis.y(10.0 ** decade)
        _add(svg, "line", x1=LEFT, x2=WIDTH - RIGHT, y1=f"{y:.1f}", y2=f"{y:.1f}", stroke="#ddd")
        _add(svg, "text", f"{10.0 ** decade:g}", x=LEFT - 6, y=f"{y + 4:.1f}", text_anchor="end", font_size=11,
             class_="ytick")
    for size in ticks:
        x = axis.x(size)
        _add(svg, "line", x1=f"{x:.1f}", x2=f"{x:.1f}", y1=axis.top, y2=axis.top + axis.height, stroke="#eee")
        if bottom:
            y = axis.top + axis.height + 14
            _add(svg, "text", human_bytes(size), x=f"{x:.1f}", y=f"{y:.1f}", text_anchor="end", font_size=11,
                 transform=f"rotate(-30 {x:.1f} {y:.1f})", class_="xtick")
    middle = axis.top + axis.height / 2
    _add(svg, "text", label, x=22, y=f"{middle:.1f}", text_anchor="middle", font_size=12,
         transform=f"rotate(-90 22 {middle:.1f})", class_="ylabel")


def svg_plot(result: Mapping[str, Any]) -> str:
    """The plot as an SVG document, drawn like the PNG (``result`` has bandwidth rows)."""
    bw, words, probe = result["bandwidth"], labels(result), probe_rows(result)
    rows = [r for r in bw["rows"] if r["busbw_gbs"] > 0 and r["algbw_gbs"] > 0]
    ref = bw.get("reference")
    legend = ["busbw", "algbw"] + (["reference", "deciding"] if ref else []) + (["mpi"] if probe else [])
    height = TOP + PANEL + (LOW_PANEL + 20 if probe else 0) + UNDER + 20 * len(legend) + 10
    svg = ET.Element("svg", {"xmlns": "http://www.w3.org/2000/svg", "width": str(WIDTH), "height": str(height),
                             "viewBox": f"0 0 {WIDTH} {height}", "font-family": "sans-serif"})
    _add(svg, "rect", x=0, y=0, width=WIDTH, height=height, fill="white")
    _add(svg, "text", title(result), x=WIDTH / 2, y=28, text_anchor="middle", font_size=13, class_="title")
    sizes = [r["bytes"] for r in rows] + [b["bytes"] for b in probe]
    values = [v for r in rows for v in (r["busbw_gbs"], r["algbw_gbs"])]
    values += [ref["minimum_gbs"], ref["measured_gbs"]] if ref else []
    top = _Axis(sizes, [v for v in values if v > 0] or [1.0], TOP, PANEL)
    ticks = size_ticks(result)
    _frame(svg, top, "bandwidth (GB/s, 10⁹ bytes/s)", ticks, bottom=not probe)
    _series(svg, top, "busbw", [(r["bytes"], r["busbw_gbs"]) for r in rows], BUSBW, stroke_width=2)
    _series(svg, top, "algbw", [(r["bytes"], r["algbw_gbs"]) for r in rows], ALGBW, stroke_width=1.5,
            stroke_dasharray="6 4")
    if ref and ref["minimum_gbs"] > 0:  # the bound applies at one message size only: drawn there
        at, y = ref["at_bytes"], top.y(ref["minimum_gbs"])
        _add(svg, "line", x1=f"{top.x(at / 1.6):.1f}", x2=f"{top.x(at * 1.6):.1f}", y1=f"{y:.1f}", y2=f"{y:.1f}",
             stroke=REFERENCE, stroke_width=3, class_="reference")
    if ref and ref["measured_gbs"] > 0:
        _marker(_add(svg, "g", class_="deciding"), "star", top.x(ref["at_bytes"]), top.y(ref["measured_gbs"]), REFERENCE)
    below = TOP + PANEL
    if probe:
        low = _Axis(sizes, [b["mb_s"] for b in probe], below + 20, LOW_PANEL)  # the same sizes at the same places
        _frame(svg, low, "MPI bandwidth (MB/s)", ticks, bottom=True)
        _series(svg, low, "mpi", [(b["bytes"], b["mb_s"]) for b in probe], MPI, stroke_width=1.5,
                stroke_dasharray="2 3")
        below += 20 + LOW_PANEL
    _add(svg, "text", "message size", x=(LEFT + WIDTH - RIGHT) / 2, y=below + 62, text_anchor="middle", font_size=12,
         class_="xlabel")
    for i, name in enumerate(legend):
        y = below + UNDER + 20 * i
        if name != "deciding":
            _add(svg, "line", x1=LEFT, x2=LEFT + 30, y1=y, y2=y, stroke=COLORS[name], stroke_width=2)
        if name in MARKERS:
            _marker(svg, MARKERS[name], LEFT + 15, y, COLORS[name])
        _add(svg, "text", words[name], x=LEFT + 40, y=y + 4, font_size=12, class_="legend")
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(svg, encoding="unicode") + "\n"
