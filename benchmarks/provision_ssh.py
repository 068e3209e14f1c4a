"""`provision --site local` over SSH: 1 host against 4 hosts in parallel.

Starts four real sshd servers on loopback (each a host with its own home, as in the remote
tests), then times a short real run (fresh homes: every step changes) and a no-op run
(everything in place), on 1 host and on 4 hosts at once. Needs root and openssh-server.
Target: 4 hosts take at most 1.5x the time of 1 host.
"""

from __future__ import annotations

import io
import os
import shutil
import sys
import tempfile
from pathlib import Path

from _common import ROOT, summary, timed, write

from sitestack.core.report import Reporter
from sitestack.engine import playbook as pb
from tests import sshd

REPEAT = 3


def main() -> int:
    if not sshd.available():
        print("skipped: needs root and openssh-server")
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="sitestack-bench-"))
    os.environ["SITESTACK_SSH_CONFIG"] = str(tmp / "ssh_config")
    names = [f"b{i}" for i in range(1, 5)]
    servers = [sshd.start_sshd(tmp / f"srv-{n}", n, home=tmp / f"home-{n}") for n in names]
    site = pb.load("local")
    try:
        def run(hosts: list[str], fresh: bool) -> None:
            if fresh:
                for n in hosts:
                    shutil.rmtree(tmp / f"home-{n}" / "sitestack", ignore_errors=True)
            # The core steps: this measures the transport and the parallelism, not the builds.
            options = pb.Options(hosts=tuple(hosts), tags=("system", "preflight", "layout"), log_root=tmp / "logs")
            runs = pb.provision(site, options, Reporter(io.StringIO()))
            assert not any(r.failed for r in runs), [r.error or r.results for r in runs if r.failed]
            if not fresh:
                assert not any(r.changed for r in runs), "a no-op run changed something"

        results = {}
        for label, fresh in (("real", True), ("noop", False)):
            run(names, fresh=True)  # warm up: connections, page cache, and a provisioned state for noop
            one = summary(timed(lambda fresh=fresh: run(names[:1], fresh), REPEAT))
            four = summary(timed(lambda fresh=fresh: run(names, fresh), REPEAT))
            results[label] = {"one_host": one, "four_hosts": four, "ratio": four["median_s"] / one["median_s"]}
    finally:
        for server in servers:
            server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"provision --site local over SSH ({len(site.steps)} steps), median of {REPEAT}")
    for label, row in results.items():
        verdict = "met" if row["ratio"] <= 1.5 else "MISSED"
        print(f"  {label:<5} 1 host {row['one_host']['median_s'] * 1000:7.0f} ms   4 hosts "
              f"{row['four_hosts']['median_s'] * 1000:7.0f} ms   ratio {row['ratio']:.2f} (target <= 1.5: {verdict})")
    path = write("provision_ssh", {"steps": len(site.steps), **results, "target_ratio": 1.5})
    print(f"  results: {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
