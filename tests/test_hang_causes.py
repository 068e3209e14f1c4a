"""Hangs and their causes, named by rank, host and cause as soon as they are knowable: a second
process group (subgroups.py), an interface one rank's host lacks and an unreachable MASTER_ADDR
(reach.py, before the process group), clock skew and a late start (clocks.py, at the barrier; no
deadline compares wall clocks across ranks).

The functions are tested on real sockets, interfaces and clocks; the few end-to-end runs inject the
fault for real into one rank of the installed job (an overlay venv's .pth hook, the rank's own
environment, an LD_PRELOAD library that sets its wall clock ahead), as tests/test_faults.py does.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from sitestack.onsite.ddpcheck import clocks, faults, reach, subgroups, time_budget
from sitestack.onsite.ddpcheck.rank_progress import TRUSTED_LEFT, monotonic_deadline
from sitestack.onsite.ddpcheck.stacks import Frame
from tests.ports import free_port
from tests.test_fault_causes import patch_hook
from tests.test_faults import LIMIT, assert_fault, finish, job_env, overlay

HOST = socket.gethostname().split(".")[0]

#: An LD_PRELOAD library: CLOCK_REALTIME (time.time()) of the process reads SKEW_S seconds ahead; the
#: monotonic clock is left alone, as a host whose clock is off has it.
SKEW_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <time.h>
int clock_gettime(clockid_t id, struct timespec *ts) {
  static int (*real)(clockid_t, struct timespec *);
  if (!real) real = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
  int rc = real(id, ts);
  const char *skew = getenv("SKEW_S");
  if (rc == 0 && skew && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) ts->tv_sec += atol(skew);
  return rc;
}
"""


# -- the functions ------------------------------------------------------------------------------------------

def test_gloo_interfaces_must_all_exist_and_nccl_prefixes_match_any():
    present = ["eth0", "ib0", "lo"]
    assert reach.missing_interfaces("GLOO_SOCKET_IFNAME", "ib0", present) == []
    assert reach.missing_interfaces("GLOO_SOCKET_IFNAME", "ib0,hsn0", present) == ["hsn0"]
    assert reach.missing_interfaces("NCCL_SOCKET_IFNAME", "ib", present) == []
    assert reach.missing_interfaces("NCCL_SOCKET_IFNAME", "hsn,ib", present) == []
    assert reach.missing_interfaces("NCCL_SOCKET_IFNAME", "hsn", present) == ["hsn"]
    assert reach.missing_interfaces("NCCL_SOCKET_IFNAME", "=ib", present) == ["ib"]
    assert reach.missing_interfaces("NCCL_SOCKET_IFNAME", "^docker,lo", present) == []


def test_interface_fault_reads_this_hosts_interfaces():
    real = socket.if_nameindex()[0][1]
    assert reach.interface_fault({"GLOO_SOCKET_IFNAME": real}, "gloo", "vm") is None
    assert reach.interface_fault({"NCCL_SOCKET_IFNAME": "nosuch0"}, "gloo", "vm") is None  # not gloo's variable
    why = reach.interface_fault({"GLOO_SOCKET_IFNAME": "nosuch0"}, "gloo", "vm")
    assert why and why.startswith("GLOO_SOCKET_IFNAME=nosuch0 names an interface vm does not have (nosuch0;")
    assert real in why


def test_unreachable_tells_no_answer_from_a_refusal():
    port = free_port()
    assert reach.unreachable("127.0.0.1", port, timeout=2) is None  # refused: the host answered
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(0)
        assert reach.unreachable("127.0.0.1", server.getsockname()[1], timeout=2) is None
        # a full accept queue drops further SYNs (tcp_v4_syn_recv_sock): a connect gets no answer, as
        # from a host a firewall hides
        held = []
        with contextlib.suppress(TimeoutError):
            for _ in range(4):  # until the queue is full (listen(0): one or two)
                held.append(socket.create_connection(server.getsockname(), timeout=0.5))
        start = time.monotonic()
        why = reach.unreachable("127.0.0.1", server.getsockname()[1], timeout=1)
        for sock in held:
            sock.close()
    assert why == "no answer to a TCP connect in 1s" and time.monotonic() - start < 3, why


def test_master_addr_must_be_rank_zeros_own():
    assert reach.not_local("127.0.0.1") is None
    assert reach.not_local(socket.gethostname()) is None
    assert reach.not_local("10.255.255.1") == "this host does not hold 10.255.255.1"


def test_subgroup_layouts():
    assert subgroups.layouts(1) == []
    assert subgroups.layouts(2) == [("second", [0, 1])]
    assert subgroups.layouts(6) == [("even", [0, 2, 4]), ("odd", [1, 3, 5])]


def test_skew_and_late_start_are_named_by_rank_and_host():
    rows = [{"rank": 0, "host": "a", "wall": 1000.0, "age": 40.0}, {"rank": 1, "host": "b", "wall": 1084.2, "age": 9.5},
            {"rank": 2, "host": "c", "wall": 1000.4, "age": 39.0}]
    assert clocks.skewed(rows) == [clocks.skewed(rows)[0]] and "rank 1 on b's clock is 84.2s ahead of rank 0's on a" in \
        clocks.skewed(rows)[0]
    late = clocks.late(rows)
    assert len(late) == 1 and "rank 1 on b started 30.5s after the first rank" in late[0]


def test_a_clock_ahead_does_not_bring_the_deadline_forward():
    limit = 90.0
    ahead = monotonic_deadline(time.time() - 84 + limit, limit) - time.monotonic()  # this clock 84 s ahead
    assert min(limit, TRUSTED_LEFT) - 1 <= ahead <= limit
    right = monotonic_deadline(time.time() + 80, limit) - time.monotonic()
    assert 79 <= right <= 80
    behind = monotonic_deadline(time.time() + 500, limit) - time.monotonic()
    assert behind <= limit


# -- end to end: one run per cause --------------------------------------------------------------------------

def run_ranks(job: dict, tmp_path: Path, python: str, prefixes: tuple[str, ...], limit: float = LIMIT,
              **env: str) -> SimpleNamespace:
    """Ranks started by hand (RANK/WORLD_SIZE) under the job's guard, rank R's command line led by
    ``prefixes[R]`` (its own variables, a delay)."""
    out = tmp_path / "sitestack-validation-fault"
    program = job["dir"] / "ddp_check.py"
    world = len(prefixes)
    starts = " ".join(
        f"( {prefix} RANK={r} LOCAL_RANK={r} WORLD_SIZE={world} {python} -u {program} --config "
        f"{job['dir'] / 'check-config.json'} --out {out} --steps 8 ) &" for r, prefix in enumerate(prefixes))
    argv = [job["python"], "-E", "-s", "-S", str(program), "--guard", "--out", str(out), "--expect-world-size",
            str(world), "--", "bash", "-c", f"{starts} wait"]
    start = time.monotonic()
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "SITESTACK_TIME_LIMIT": str(int(limit)),
           "SITESTACK_DEADLINE": str(time.time() + limit), **env}
    proc = subprocess.Popen(argv, env=job_env(job, out, **env), cwd=tmp_path, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    return finish(proc, out, start, limit + 60)


def test_a_hang_in_the_second_group_names_the_group_and_rank(installed_local_job, tmp_path):
    hook = patch_hook("torch.distributed.distributed_c10d", "all_reduce",
                      'if kwargs.get("group") is not None: time.sleep(3600)')
    python = overlay(installed_local_job, tmp_path / "venv", hook)
    run = run_ranks(installed_local_job, tmp_path, python, ("", ""))
    assert_fault(run, "time limit", f"rank 1 on {HOST} hung during process-group (subgroup second of ranks [0, 1]: "
                 "all_reduce)", "fault_hook.py")


def test_an_interface_one_rank_lacks_is_that_ranks_error_at_once(installed_local_job, tmp_path):
    run = run_ranks(installed_local_job, tmp_path, installed_local_job["python"],
                    ("GLOO_SOCKET_IFNAME=lo", "GLOO_SOCKET_IFNAME=nosuch0"))
    cause = assert_fault(run, f"process-group: rank 1 on {HOST}: GLOO_SOCKET_IFNAME=nosuch0 names an interface "
                         f"{HOST} does not have")
    assert run.result["fault"]["kind"] == "failed" and run.seconds < LIMIT, f"not at once ({run.seconds:.0f}s): {cause}"


def test_an_unreachable_master_addr_is_named_with_its_port(installed_local_job, tmp_path):
    run = run_ranks(installed_local_job, tmp_path, installed_local_job["python"], ("", ""), MASTER_ADDR="10.255.255.1")
    cause = assert_fault(run, f"rank 0 on {HOST}: MASTER_ADDR 10.255.255.1 (port ", f"is not an address of {HOST}")
    assert run.result["fault"]["kind"] == "failed" and run.seconds < LIMIT, f"not at once ({run.seconds:.0f}s): {cause}"


@pytest.fixture(scope="module")
def skew_library(tmp_path_factory) -> Path:
    if not shutil.which("gcc"):
        pytest.skip("no gcc to build the clock library")
    root = tmp_path_factory.mktemp("skew")
    (root / "skew.c").write_text(SKEW_C)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(root / "skew.so"), str(root / "skew.c"), "-ldl"], check=True)
    return root / "skew.so"


def test_a_rank_84s_ahead_and_12s_late_is_named_and_not_timed_out(installed_local_job, tmp_path, skew_library):
    run = run_ranks(installed_local_job, tmp_path, installed_local_job["python"],
                    ("", f"sleep 12; SKEW_S=84 LD_PRELOAD={skew_library}"), limit=60)
    assert run.result is not None and run.result["fault"] is None, run.log[-3000:]
    assert not run.left, run.left
    group = next(c for c in run.result["checks"] if c["name"] == "process-group")
    assert f"clock skew: rank 1 on {HOST}'s clock is 84." in group["summary"], group["summary"]
    assert f"late start: rank 1 on {HOST} started 1" in group["summary"], group["summary"]
    assert group["status"] == "passed", group["summary"]


# -- a time limit shorter than a healthy run ----------------------------------------------------------------

def _passed(started: float, seconds: float, verdict: str = "passed") -> dict:
    return {"kind": "validation", "verdict": verdict, "started": started, "ended": started + seconds}


def test_healthy_seconds_is_the_median_of_passed_runs_and_short_limits_are_named():
    records = [_passed(0, 20), _passed(100, 30), _passed(200, 25), _passed(300, 400, "failed")]
    assert time_budget.healthy_seconds(records) == 25
    assert time_budget.healthy_seconds([_passed(0, 9, "failed")]) is None
    assert time_budget.too_short(8, 25).startswith("time limit too short: 8s is less than 1.5x the 25s")
    assert time_budget.too_short(40, 25) is None and time_budget.too_short(8, None) is None


def test_invoke_validate_refuses_a_limit_below_a_healthy_run_and_warns_of_one_without_history():
    from sitestack.core.errors import SitestackError
    from sitestack.engine.time_limit_check import check_time_limit
    from sitestack.model.site import load_site

    facts = load_site("local").facts
    notes: list[str] = []
    reporter = SimpleNamespace(note=notes.append)
    env: dict[str, str] = {}
    with pytest.raises(SitestackError, match="time limit too short: 8s is less than the 25s a healthy run"):
        check_time_limit([_passed(0, 25)], facts, env, reporter, {"SITESTACK_TIME_LIMIT": "8"})
    assert env == {"SITESTACK_HEALTHY_S": "25"}
    check_time_limit([_passed(0, 25)], facts, env, reporter, {"SITESTACK_TIME_LIMIT": "30"})
    assert notes and "time limit too short: 30s" in notes[-1]
    check_time_limit([], facts, {}, reporter, {"SITESTACK_TIME_LIMIT": "8"})
    assert "a time limit of 8s (SITESTACK_TIME_LIMIT) is below the 60s" in notes[-1]
    notes.clear()
    check_time_limit([_passed(0, 25)], facts, {}, reporter, {})  # the site's own limit: ample
    assert not notes


def test_a_run_that_reaches_a_limit_too_short_is_named_so_not_a_hang(monkeypatch):
    ranks = {0: {"rank": 0, "host": "a", "phase": "compute", "world_size": 2},
             1: {"rank": 1, "host": "a", "phase": "compute", "world_size": 2}}
    monkeypatch.setenv(time_budget.HEALTHY_VAR, "25")
    cause = faults.describe_fault("timeout", ranks, 8, 2)
    assert cause.startswith("time limit too short: 8s is less than the 25s") and "rank 1 on a was in the compute check" in cause
    assert "hung" not in cause
    # above a healthy run, or above half of one where the stacks single a rank out, it is a hang, named as one
    monkeypatch.setenv(time_budget.HEALTHY_VAR, "6")
    assert "short" not in faults.describe_fault("timeout", ranks, 8, 2)
    held = {0: [Frame("/x/torch/distributed/distributed_c10d.py", 3151, "broadcast")],
            1: [Frame("/x/fault_hook.py", 21, "patched")]}
    monkeypatch.setenv(time_budget.HEALTHY_VAR, "12")
    cause = faults.describe_fault("timeout", ranks, 8, 2, stacks=held)
    assert cause.startswith("the time limit of 8s passed (a short limit: a healthy run of this stack took 12s here): "
                            "rank 1 on a hung during compute in patched"), cause


def test_a_job_given_8s_where_a_healthy_run_takes_25s_says_so(installed_local_job, tmp_path):
    """A stack whose healthy run takes 25 s here (each collective made a second slower, so the run cannot
    end within the limit on a fast machine either) given 8 s: named 'time limit too short', not a hang."""
    hook = patch_hook("torch.distributed.distributed_c10d", "all_reduce", "time.sleep(1)")
    python = overlay(installed_local_job, tmp_path / "venv", hook)
    run = run_ranks(installed_local_job, tmp_path, python, ("", ""), limit=8, SITESTACK_HEALTHY_S="25")
    cause = assert_fault(run, "time limit too short: 8s is less than the 25s", f"rank 0 on {HOST}")
    assert "hung" not in cause, cause
