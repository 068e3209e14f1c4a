#!/usr/bin/env python3
"""Where a test run's time went, per test file, from pytest's JUnit XML (``--junitxml``).

    scripts/test_times.py [JUNIT_XML] [--top N]

prints the N (default 15) test files that took the most seconds, with their number of tests and share,
then the total. A test's seconds are its setup, call and teardown (pytest's ``junit_duration_report``
default, "total"), so a session fixture's set-up (a Slurm cluster, a build, a site twin) counts for
the first test that asks for it. Standard library only: it runs with any python3.

Exit status 0; 1 with one line on stderr when the file is missing or not a JUnit report.
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT = REPO / "build" / "test-results" / "junit.xml"


def test_file(classname: str, root: Path = REPO) -> str:
    """The file a JUnit ``classname`` (``tests.test_x`` or ``tests.test_x.TestClass``) names: the longest
    dotted prefix that is a ``.py`` file under ``root``; the classname itself when none is."""
    parts = classname.split(".")
    for end in range(len(parts), 0, -1):
        path = "/".join(parts[:end]) + ".py"
        if (root / path).is_file():
            return path
    return classname or "(no file)"


def per_file(report: Path, root: Path = REPO) -> tuple[dict[str, tuple[float, int]], float]:
    """{file: (seconds, tests)} and the run's wall seconds (the testsuites' ``time``) from ``report``."""
    tree = ET.parse(report)
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for case in tree.iter("testcase"):
        entry = totals[test_file(case.get("classname", ""), root)]
        entry[0] += float(case.get("time") or 0.0)
        entry[1] += 1
    wall = sum(float(suite.get("time") or 0.0) for suite in tree.iter("testsuite"))
    return {name: (seconds, int(count)) for name, (seconds, count) in totals.items()}, wall


def table(files: dict[str, tuple[float, int]], wall: float, top: int) -> str:
    """The ``top`` slowest files (seconds, minutes, tests, share of the tests' sum), then the totals."""
    total = sum(seconds for seconds, _ in files.values()) or 1e-9
    ranked = sorted(files.items(), key=lambda item: -item[1][0])
    width = max([len(name) for name, _ in ranked[:top]] + [4])
    lines = [f"{'file':<{width}}  {'seconds':>8}  {'min':>5}  {'tests':>5}  share"]
    for name, (seconds, count) in ranked[:top]:
        lines.append(f"{name:<{width}}  {seconds:8.1f}  {seconds / 60:5.1f}  {count:5d}  {seconds / total:5.1%}")
    rest = ranked[top:]
    if rest:
        seconds = sum(s for _, (s, _) in rest)
        lines.append(f"{f'({len(rest)} more files)':<{width}}  {seconds:8.1f}  {seconds / 60:5.1f}  "
                     f"{sum(c for _, (_, c) in rest):5d}  {seconds / total:5.1%}")
    tests = sum(count for _, count in files.values())
    lines.append(f"total: {total:.0f} s ({total / 60:.1f} min) in {tests} tests of {len(files)} files; "
                 f"pytest's wall time {wall:.0f} s ({wall / 60:.1f} min)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", nargs="?", type=Path, default=DEFAULT, help=f"JUnit XML (default {DEFAULT})")
    parser.add_argument("--top", type=int, default=15, help="how many files to list (default 15)")
    args = parser.parse_args(argv)
    try:
        files, wall = per_file(args.report)
    except (OSError, ET.ParseError) as exc:
        print(f"scripts/test_times.py: {args.report}: not a JUnit report ({exc})", file=sys.stderr)
        return 1
    print(f"where the time went ({args.report}):")
    print(table(files, wall, max(args.top, 1)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
