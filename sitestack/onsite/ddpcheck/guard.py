"""The guard around the launcher (``ddp_check.py --guard``): the job step in its own session, killed at
the deadline (+GUARD_GRACE), with a result written when no rank wrote one."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from typing import Any

from .. import ddp_report, history
from ..result_schema import exit_code, load_result
from . import envvalues
from .faults import describe_fault, earliest, report_fault
from .procs import descendants, kill_all
from .provenance import LAUNCH_START
from .rank_progress import deadline_from_env, read_progress, status_dir
from .time_budget import HEALTHY_VAR, healthy_from_env, healthy_seconds, too_short
from .verdicts import load_config

#: Seconds between the ranks' deadline and the guard's: the ranks' watchdogs speak first.
GUARD_GRACE = 20.0


def guard_main(argv: list[str]) -> int:
    """``ddp_check.py --guard --out OUT [--config C] [--expect-world-size N] -- LAUNCHER ARGS...``:
    run the job step in its own session; at the deadline (+GUARD_GRACE) kill everything in it;
    write a result when no rank did; print the verdict and a last line that points at what exists."""
    p = argparse.ArgumentParser(prog="ddp_check.py --guard")
    p.add_argument("--out", required=True)
    p.add_argument("--config")
    p.add_argument("--expect-world-size", type=int, default=None)
    p.add_argument("--time-limit", type=float, default=envvalues.seconds(os.environ, "SITESTACK_TIME_LIMIT", 1) or 480)
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("no command to run after --")
    deadline = deadline_from_env(os.environ, args.time_limit) + GUARD_GRACE
    config = load_config(args.config) if args.config else {}
    start = time.time()
    timed_out = False
    try:
        # the ranks measure their start-up from here (result.json startup.ready_s, ddpcheck/provenance.py)
        os.environ.update(healthy_env(config))  # the guard's own cause at the deadline reads it too
        proc = subprocess.Popen(command, start_new_session=True, env={**os.environ, LAUNCH_START: f"{start:.3f}"})
    except OSError as exc:
        proc = None
        rc: int | None = 127
        print(f"sitestack: cannot start {command[0]}: {exc}", file=sys.stderr, flush=True)
    if proc is not None:
        rc, timed_out, deadline = _watch_step(proc, args.out, deadline)
    result_path = os.path.join(args.out, "result.json")
    if not os.path.exists(result_path):
        ranks = read_progress(args.out)
        limit = deadline - GUARD_GRACE - start
        kind = "timeout" if timed_out else "exited"
        cause = describe_fault(kind, ranks, limit, args.expect_world_size, rc=rc, launcher=os.path.basename(command[0]))
        report_fault(args.out, {"kind": kind, "cause": cause, "phase": earliest(ranks) if ranks else "startup",
                                "expected": args.expect_world_size, "site": config.get("site"),
                                "job_id": os.environ.get("SLURM_JOB_ID") or os.environ.get("SITESTACK_JOB_ID"),
                                "launcher_exit_code": rc})
    record_history(args.out, args.config)
    return _last_words(args.out, rc, timed_out, started=proc is not None)


def healthy_env(config: dict[str, Any]) -> dict[str, str]:
    """The seconds a healthy run took here (time_budget.HEALTHY_VAR) for the ranks' watchdogs, from the
    site's history (check-config.json ``history_dir``) unless the caller (``invoke validate``) gave it;
    {} without a history. Said on the job's log when the time limit is shorter than that."""
    given = healthy_from_env(os.environ)
    directory = config.get("history_dir")
    if given is None and isinstance(directory, str) and directory.startswith("/"):
        with contextlib.suppress(Exception):  # a history that cannot be read leaves the limit as it is
            given = healthy_seconds(history.read(directory))
    if given is None:
        return {}
    limit = envvalues.seconds(os.environ, "SITESTACK_TIME_LIMIT", 1)
    short = too_short(limit, given) if limit else None
    if short:
        print(f"sitestack: warning: {short}; a run that reaches it is named so", file=sys.stderr, flush=True)
    return {HEALTHY_VAR: f"{given:g}"}


def record_history(out: str, config: str | None) -> None:
    """The run in the site's history (check-config.json ``history_dir``; history.py beside this program),
    before the last words, so a user's own sbatch run counts. ``SITESTACK_HISTORY=off`` (set by ``invoke
    validate``, which records the run with its regression report) leaves it to the caller; a history this
    user cannot write is one line, never a failure of the job."""
    result = os.path.join(out, "result.json")
    if os.environ.get("SITESTACK_HISTORY") == "off" or not config or not os.path.exists(result):
        return
    try:
        history.main(["record", "--config", config, result])
    except Exception as exc:  # noqa: BLE001  (the verdict and the last words come first)
        print(f"sitestack history: not recorded: {type(exc).__name__}: {exc}"[:400], file=sys.stderr, flush=True)


def _watch_step(proc: subprocess.Popen[bytes], out: str, deadline: float) -> tuple[int, bool, float]:
    """Wait for the job step; at the deadline (or 5 s after a watchdog reported a fault) kill every
    process it started, orphans included. (exit code as a shell gives it, timed out, final deadline)."""
    seen: dict[int, str] = {}

    def stop(sig: int, _frame: Any) -> None:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, sig)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, stop)
    timed_out = False
    ended: float | None = None
    last_scan = 0.0
    while proc.poll() is None:
        now = time.time()
        if now - last_scan > 1.0:  # remember the step's processes: ranks a launcher orphans are found later
            seen.update(descendants(proc.pid))
            last_scan = now
        if ended is None and os.path.exists(os.path.join(status_dir(out), "fault.json")):
            # a rank's watchdog reported a rank killed or timed out: the others cannot finish
            # without it; give the launcher a few seconds to end them itself
            ended = now
            deadline = min(deadline, now + 5.0)
        if now >= deadline:
            timed_out = ended is None
            seen.update(descendants(proc.pid))
            kill_all(seen)
            break
        time.sleep(0.25)
    rc = proc.wait()
    kill_all(seen)  # whatever the launcher left running
    if rc < 0:  # the launcher ended by a signal: the shell's way of saying so
        rc = 128 - rc
    return rc, timed_out, deadline


def _last_words(out: str, rc: int | None, timed_out: bool, started: bool) -> int:
    """Print the verdict (where the ranks did not) and a last line naming what exists; the exit code."""
    result_path = os.path.join(out, "result.json")
    result, why = load_result(result_path) if os.path.exists(result_path) else (None, "")
    code = exit_code(result, rc, timed_out)
    if result is not None:
        if not started or rc or timed_out or result["fault"]:  # the ranks did not print the table themselves
            print(ddp_report.verdict_table(result), flush=True)
        summary = os.path.join(out, "summary.md")
        where = f"summary: {summary}" if os.path.exists(summary) else f"result: {result_path}"
        print(f"sitestack validation: {result['verdict'].upper()}, exit code {code}; {where}", flush=True)
    else:
        print(f"sitestack validation: no result was written (exit code {code}{'; ' + result_path + ': ' + why if why else ''}); "
              "see this log", flush=True)
    return code
