"""What ``invoke tune`` shows and writes beside tuning.json: the table, report.md and the plot (the SVG
drawn with the standard library where matplotlib cannot be imported)."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET

import pytest

from sitestack.engine.tune_report import decision_lines, markdown, render_plot, table
from tests.test_tune_decision import decided, point

SVG = "{http://www.w3.org/2000/svg}"


def sample() -> dict:
    return decided([point("p00", {}), point("p01", {"OMP_NUM_THREADS": "1"}, busbw=1.4, step=12.0, seed=3),
                    point("p02", {"OMP_NUM_THREADS": "2"}, busbw=0.5, step=40.0, seed=5),
                    point("p03", {"SITESTACK_CHECK_FAULT": "hang@1"}, status="hung", cause="rank 1 hung in bandwidth")])


def test_the_table_has_every_point_with_status_medians_spread_and_verdict():
    lines = table(sample()).splitlines()
    assert lines[0].split()[:3] == ["point", "setting", "status"] and "DDP step ms" in lines[0]
    rows = {line.split()[0]: line for line in lines[1:]}
    assert rows["p01"].endswith("beats (chosen)") and rows["p02"].endswith("worse")
    assert "hung" in rows["p03"] and rows["p03"].endswith("dropped") and rows["p03"].count(" - ") >= 3
    assert "±" in rows["p00"] and "12 ±" in rows["p01"]


def test_the_decision_lines_name_the_choice_the_evidence_and_each_dropped_point():
    lines = decision_lines(sample())
    assert lines[0].startswith("chosen: OMP_NUM_THREADS=1: ") and "job 123, 2026-11-25" in lines[0]
    assert lines[1] == "dropped: SITESTACK_CHECK_FAULT=hang@1 (hung): rank 1 hung in bandwidth"


def test_without_matplotlib_the_plot_is_an_svg_with_one_line_per_measured_point(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    plot = render_plot(sample())
    assert plot is not None and plot[0] == "busbw.svg"
    root = ET.fromstring(plot[1].decode())
    assert len(root.findall(f"{SVG}g[@class='point']")) == 3   # the hung point measured nothing
    legend = [t.text for t in root.iter(f"{SVG}text") if t.get("class") == "legend"]
    assert legend == ["p00 default", "p01 OMP_NUM_THREADS=1", "p02 OMP_NUM_THREADS=2"]
    assert [t.text for t in root.iter(f"{SVG}text") if t.get("class") == "xtick"] == ["64 KiB", "1 MiB", "4 MiB"]


def test_no_point_measured_no_plot_and_the_report_says_why_nothing_was_chosen():
    doc = decided([point("p00", {}, status="crashed", cause="x"), point("p01", {"A": "1"}, status="hung", cause="y")])
    assert render_plot(doc) is None
    text = markdown(doc, None)
    assert "nothing chosen: the default point p00 crashed" in text and "![" not in text


def test_the_report_holds_the_table_and_names_the_plot():
    text = markdown(sample(), "busbw.svg")
    assert text.startswith("# Tuning sweep of local: job 123, 2026-11-25T10:00:00Z")
    assert "| p03 | SITESTACK_CHECK_FAULT=hang@1 | hung |" in text and "](busbw.svg)" in text
    assert "at least 3%" in text and "Results of the sweep: /r/sitestack-tune-123" in text


@pytest.mark.parametrize("label", ["a|b", "<x>&"])
def test_labels_are_kept_as_text(label: str, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    doc = decided([point("p00", {}), point("p01", {"A": label})])
    assert f"| p01 | A={label.replace('|', chr(92) + '|')} |" in markdown(doc, None)
    plot = render_plot(doc)
    assert plot is not None and f"p01 A={label}" in [t.text for t in ET.fromstring(plot[1].decode()).iter(f"{SVG}text")]
