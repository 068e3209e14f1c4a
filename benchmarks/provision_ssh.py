"""``provision --site local`` over SSH to real sshd servers on loopback: a remote no-op, and scale-out.

- Remote no-op: one host (an sshd whose sessions have their own home, kept in the bench directory)
  provisioned once with the whole local playbook (builds installed from this machine's build
  cache, ``SITESTACK_BUILD_CACHE``), then timed when nothing changes: the library call and the
  whole CLI process. The validation job step is left out: its MPI probe install fails in an SSH
  session whose ``python3`` is Debian's (pip's ``--prefix`` then installs into ``<prefix>/local``).
- Scale-out: 16 sshd servers (16 hosts, each its own home); the core steps (system, preflight,
  layout: the transport and the parallelism, not the builds) on 1 host and on all 16 at once, with
  the machine's CPU split into this process's and the rest's (the 16 sshd servers share this
  machine's cores: their CPU over the cores is a floor the 16-host time cannot go below here,
  where on a site they are 16 other machines), and the whole CLI process for 1 and 16 hosts.

Needs root and openssh-server. Targets: the remote no-op CLI process at most 2 s; 16 hosts at
most 2x the time of 1 host.
"""

from __future__ import annotations

import io
import os
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from _common import BENCH_DIR, ROOT, loadavg, sitestack_env, summary, target, timed, timed_process, write

from sitestack.core.report import Reporter
from sitestack.engine import playbook as pb
from tests import sshd

REPEAT = 5
HOSTS = 16
CORE = ("system", "preflight", "layout")
BUILD_CACHE = str(Path.home() / ".cache" / "sitestack" / "builds")


def remote_noop(site: pb.Site, tmp: Path) -> tuple[dict[str, object], list[dict[str, object]]] | None:
    home = BENCH_DIR / "ssh-home"
    pip_conf = Path.home() / ".config/pip/pip.conf"  # this machine's wheel sources, for the stack's pip
    if pip_conf.exists():
        (home / ".config/pip").mkdir(parents=True, exist_ok=True)
        shutil.copy2(pip_conf, home / ".config/pip/pip.conf")
    server = sshd.start_sshd(tmp / "srv-r1", "r1", home=home)
    try:
        options = pb.Options(hosts=("r1",), skip_tags=("validation",), log_root=tmp / "logs", build_cache=BUILD_CACHE)
        for _ in range(2):  # the first run may install; the second must change nothing
            runs = pb.provision(site, options, Reporter(io.StringIO()))
            if any(r.failed for r in runs):
                print(f"  remote provision failed: {[r.error or r.results for r in runs if r.failed]}")
                return None
        if any(r.changed for r in runs):
            print("  a second remote run still changed something")
            return None

        def library() -> None:
            runs = pb.provision(site, options, Reporter(io.StringIO()))
            assert not any(r.changed or r.failed for r in runs), "a remote no-op changed something"

        tool = summary(timed(library, REPEAT))
        argv = [sys.executable, "-m", "invoke", "provision", "--site", "local", "--host", "r1", "--skip-tags", "validation"]
        env = sitestack_env(SITESTACK_SSH_CONFIG=os.environ["SITESTACK_SSH_CONFIG"], SITESTACK_BUILD_CACHE=BUILD_CACHE,
                            SITESTACK_LOG_DIR=str(tmp / "logs"))
        walls, cpus = timed_process(argv, REPEAT, env=env)
    finally:
        server.stop()
    cli, cli_cpu = summary(walls), summary(cpus)
    print(f"remote no-op, 1 host, {len(site.steps) - 1} steps (median of {REPEAT})")
    print(f"  library call {tool['median_s']:.3f} s; whole CLI process wall {cli['median_s']:.3f} s, "
          f"cpu {cli_cpu['median_s']:.3f} s")
    return ({"library": tool, "cli_process": cli, "cli_cpu": cli_cpu},
            [target("remote no-op CLI process, wall (median)", cli["median_s"], 2.0)])


def machine_cpu() -> float:
    """CPU seconds this machine has spent busy, all cores together (``/proc/stat``: all but idle and
    iowait; the sshd servers run here too)."""
    ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def servers_cpu(servers: list[sshd.Sshd]) -> float:
    """CPU seconds the sshd servers and every session they served have spent (``/proc/PID/stat``:
    utime, stime and the reaped children's cutime, cstime), once each server has reaped its
    sessions (an ended connection's sshd exits a moment after the client closes it)."""
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline and any(
            Path(f"/proc/{s.process.pid}/task/{s.process.pid}/children").read_text().strip() for s in servers):
        time.sleep(0.01)
    ticks = 0
    for server in servers:
        fields = Path(f"/proc/{server.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks += sum(int(v) for v in fields[11:15])  # utime stime cutime cstime (fields 14-17 of proc(5))
    return ticks / os.sysconf("SC_CLK_TCK")


def cpu_split(fn: Callable[[], None], repeat: int, servers: list[sshd.Sshd]) -> dict[str, float]:
    """The median wall time of ``repeat`` calls of ``fn``, and the CPU per call (the mean over all
    calls: /proc counts in clock ticks): the machine's, this process's, the rest (the sshd servers
    and whatever else runs on the shared machine meanwhile), and the sshd servers' own."""
    machine, own, served = machine_cpu(), self_cpu(), servers_cpu(servers)
    walls = timed(fn, repeat)
    served = (servers_cpu(servers) - served) / repeat
    machine, own = (machine_cpu() - machine) / repeat, (self_cpu() - own) / repeat
    return {**summary(walls), "machine_cpu_s": machine, "self_cpu_s": own, "rest_cpu_s": max(machine - own, 0.0),
            "sshd_cpu_s": served}


def scale_out(site: pb.Site, tmp: Path) -> tuple[dict[str, object], list[dict[str, object]]]:
    names = [f"h{i}" for i in range(1, HOSTS + 1)]
    servers = [sshd.start_sshd(tmp / f"srv-{n}", n, home=tmp / f"home-{n}") for n in names]
    try:
        def run(hosts: list[str], first: bool = False) -> None:
            options = pb.Options(hosts=tuple(hosts), tags=CORE, log_root=tmp / "logs", forks=HOSTS)
            runs = pb.provision(site, options, Reporter(io.StringIO()))
            assert not any(r.failed for r in runs), [r.error or r.results for r in runs if r.failed]
            assert first or not any(r.changed for r in runs), "a no-op run changed something"

        run(names, first=True)  # makes each home's prefix; then every run is a no-op
        run(names)
        one = cpu_split(lambda: run(names[:1]), REPEAT, servers)
        many = cpu_split(lambda: run(names), REPEAT, servers)

        def cli(hosts: list[str]) -> dict[str, float]:
            argv = [sys.executable, "-m", "invoke", "provision", "--site", "local", "--tags", ",".join(CORE),
                    *(arg for host in hosts for arg in ("--host", host))]
            env = sitestack_env(SITESTACK_SSH_CONFIG=os.environ["SITESTACK_SSH_CONFIG"], SITESTACK_LOG_DIR=str(tmp / "logs"))
            return summary(timed_process(argv, REPEAT, env=env)[0])

        cli_one, cli_many = cli(names[:1]), cli(names)
    finally:
        for server in servers:
            server.stop()
    ratio = many["median_s"] / one["median_s"]
    cli_ratio = cli_many["median_s"] / cli_one["median_s"]
    cores = len(os.sched_getaffinity(0))
    floor = many["sshd_cpu_s"] / cores
    print(f"scale-out, core steps ({', '.join(CORE)}), no-op, median of {REPEAT}")
    print(f"  1 host {one['median_s']:.3f} s; {HOSTS} hosts {many['median_s']:.3f} s; ratio {ratio:.2f}")
    for label, figures in (("1 host", one), (f"{HOSTS} hosts", many)):
        print(f"  CPU per run, {label}: machine {figures['machine_cpu_s']:.3f} s = this process "
              f"{figures['self_cpu_s']:.3f} s + the rest {figures['rest_cpu_s']:.3f} s, of which the sshd servers "
              f"{figures['sshd_cpu_s']:.3f} s (the others: other work on this machine)")
    print(f"  floor: the servers' CPU of {HOSTS} hosts on this machine's {cores} cores {floor:.3f} s "
          f"(2x one host {2 * one['median_s']:.3f} s; on a site the servers are {HOSTS} other machines)")
    print(f"  whole CLI process: 1 host {cli_one['median_s']:.3f} s; {HOSTS} hosts {cli_many['median_s']:.3f} s; "
          f"ratio {cli_ratio:.2f} (info)")
    return ({"one_host": one, "hosts": HOSTS, "many_hosts": many, "ratio": ratio, "cores": cores,
             "servers_floor_s": floor, "two_x_one_host_s": 2 * one["median_s"],
             "cli_one_host": cli_one, "cli_many_hosts": cli_many, "cli_ratio": cli_ratio},
            [target(f"{HOSTS} hosts / 1 host (core steps, no-op)", ratio, 2.0, "x")])


def main() -> int:
    if not sshd.available():
        print("skipped: needs root and openssh-server")
        return 0
    load_before = loadavg()
    tmp = Path(tempfile.mkdtemp(prefix="sitestack-bench-ssh-"))
    os.environ["SITESTACK_SSH_CONFIG"] = str(tmp / "ssh_config")
    site = pb.load("local")
    data: dict[str, object] = {}
    targets: list[dict[str, object]] = []
    try:
        remote = remote_noop(site, tmp)
        if remote is None:
            return 1
        data["remote_noop"], found = remote
        targets += found
        data["scale_out"], found = scale_out(site, tmp)
        targets += found
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    path = write("provision_ssh", data, targets, load_before)
    print(f"  results: {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
