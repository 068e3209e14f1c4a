"""No-op `provision --site local`: how long the tool takes when nothing needs to change.

Provisions a scratch prefix once, then times (a) the library call in-process (the tool's own
time: load the playbook, probe every step, recap) and (b) the whole `invoke provision` process
(adds Python and Invoke start-up). Target: (a) well under one second.
"""

from __future__ import annotations

import io
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import ROOT, summary, timed, write

from sitestack.core.report import Reporter
from sitestack.engine import playbook as pb

REPEAT = 5


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        prefix = str(Path(tmp) / "prefix")
        options = pb.Options(prefix=prefix, log_root=Path(tmp) / "logs")
        site = pb.load("local")
        first = pb.provision(site, options, Reporter(io.StringIO()))
        if pb.exit_code(first, check=False, fail_on_change=False):
            print("the first (real) run failed; run `invoke provision --site local` to see why")
            return 1

        def in_process():
            runs = pb.provision(pb.load("local"), options, Reporter(io.StringIO()))
            assert not any(r.changed or r.failed for r in runs), "a no-op run changed something"

        def whole_cli():
            subprocess.run([sys.executable, "-m", "invoke", "provision", "--site", "local", "--prefix", prefix],
                           cwd=ROOT, check=True, capture_output=True)

        tool = summary(timed(in_process, REPEAT))
        cli = summary(timed(whole_cli, 3))
    steps = len(site.steps)
    print(f"no-op provision --site local ({steps} steps), {REPEAT} runs")
    print(f"  tool's own time   median {tool['median_s'] * 1000:7.1f} ms  (min {tool['min_s'] * 1000:.1f}, max {tool['max_s'] * 1000:.1f})")
    print(f"  whole CLI process median {cli['median_s'] * 1000:7.1f} ms")
    verdict = "met" if tool["median_s"] < 1.0 else "MISSED"
    print(f"  target: tool's own time < 1 s: {verdict}")
    path = write("provision_noop", {"steps": steps, "tool_own_time": tool, "cli_process": cli,
                                    "target_s": 1.0, "target_met": tool["median_s"] < 1.0})
    print(f"  results: {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
