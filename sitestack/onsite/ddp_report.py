#!/usr/bin/env python3
"""The report of a validation run: the verdict table, ``summary.md`` (:mod:`.report_markdown`) and the
plot (:mod:`.report_plot`), written beside ``result.json``, each file atomically (:mod:`.fileio`).

Used by ``ddp_check.py`` on the site (standard library, plus matplotlib when present) and by
sitestack on the controller; the names of the Markdown sections its callers use are imported here. Run it on a ``result.json`` to
render the Markdown and the plot again, in the results directory or into OUTDIR:

    python ddp_report.py RESULT.json [OUTDIR]

Everything is rendered in memory before a file is replaced: a result that cannot be rendered leaves
the files as they were and says why (exit 1).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

from .fileio import ReadError, read_json, write_atomic, write_json
from .report_markdown import NOISE_FACTOR as NOISE_FACTOR
from .report_markdown import STATUS_MARK
from .report_markdown import cpu_list as cpu_list
from .report_markdown import latency_text as latency_text
from .report_markdown import library_lines as library_lines
from .report_markdown import markdown as markdown
from .report_markdown import startup_lines as startup_lines
from .report_markdown import threads_text as threads_text
from .report_plot import human_bytes as human_bytes
from .report_plot import render_plot
from .result_schema import MAX_BYTES, Result
from .visible import one_line as one_line


def verdict_table(result: Mapping[str, Any]) -> str:
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


def plot_artefact(result: Result | dict[str, Any], strict: bool = True) -> tuple[str, bytes] | None:
    """The plot of ``result`` rendered in memory, as (file name, content), and ``result["artefacts"]``
    set to name it (or to say why there is none: ``plot_note``). ``strict``: a drawing that fails
    raises (the redraw reports it); otherwise it becomes the note (the job still writes its result)."""
    artefacts = result.setdefault("artefacts", {"json": "result.json", "markdown": "summary.md"})
    try:
        plot = render_plot(result)
    except Exception as exc:  # matplotlib's errors are its own: any of them only costs the plot
        if strict:
            raise
        plot = f"the plot could not be drawn ({type(exc).__name__}: {one_line(exc)})"
    if isinstance(plot, str):
        artefacts.update(plot=None, plot_note=plot)
        return None
    artefacts["plot"] = plot[0]
    artefacts.pop("plot_note", None)
    return plot


def write_report(result: Result | dict[str, Any], out: str) -> None:
    """The job's report into ``out``: the plot, ``result.json``, ``summary.md``, each atomically, the
    plot first (result.json names it) and the Markdown last (a report that cannot be rendered still
    leaves its numbers). A plot that cannot be drawn is a note in the result, not an error."""
    plot = plot_artefact(result, strict=False)
    if plot:
        write_atomic(os.path.join(out, plot[0]), plot[1])
    write_json(os.path.join(out, "result.json"), result)
    write_atomic(os.path.join(out, "summary.md"), markdown(result))


def read_result(path: str) -> tuple[dict[str, Any] | None, str]:
    """The result in ``path``, or None and why it cannot be one (missing, larger than
    :data:`~.result_schema.MAX_BYTES`, the cap every reader of result.json keeps; not JSON, not a result)."""
    try:
        data = read_json(path, MAX_BYTES)
    except ReadError as exc:
        return None, str(exc)
    checks = data.get("checks")
    if "verdict" not in data or not isinstance(checks, list):
        return None, f"{path} is not a validation result (no \"verdict\" and \"checks\"; ddp_check.py writes result.json)"
    if not all(isinstance(c, dict) and {"name", "status", "summary"} <= set(c) for c in checks):
        return None, f"{path} is not a validation result (a check without its name, status and summary)"
    return data, ""


def main(argv: list[str]) -> int:
    """``ddp_report.py RESULT.json [OUTDIR]``: render summary.md and the plot again (OUTDIR: the
    result's directory). 0 when written; 1, with one line saying why, when the result cannot be
    read or rendered or the files cannot be written; the files already there are left whole."""
    if not argv or argv[0] in ("-h", "--help") or len(argv) > 2:
        print(__doc__)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    path = argv[0]
    out = argv[1] if len(argv) > 1 else os.path.dirname(os.path.abspath(path))
    result, problem = read_result(path)
    if result is None:
        print(f"ddp_report: {problem}", file=sys.stderr)
        return 1
    before = dict(result.get("artefacts") or {})
    try:  # everything in memory first: no file is touched until the whole report is rendered
        plot = plot_artefact(result)
        text, table = markdown(result), verdict_table(result)
    except Exception as exc:  # a value this report cannot show: say which; nothing was written
        print(f"ddp_report: cannot render {path} ({type(exc).__name__}: {one_line(exc)}); summary.md and the plot "
              "are left as they were", file=sys.stderr)
        return 1
    try:
        if plot:
            write_atomic(os.path.join(out, plot[0]), plot[1])
        if result["artefacts"] != before and os.path.samefile(out, os.path.dirname(os.path.abspath(path))):
            write_json(path, result)  # it names the plot drawn now (bandwidth.png or .svg)
        write_atomic(os.path.join(out, "summary.md"), text)
    except OSError as exc:
        print(f"ddp_report: cannot write into {out}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
