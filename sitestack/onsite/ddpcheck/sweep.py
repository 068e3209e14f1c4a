"""The tuning sweep's driver (``ddp_check.py --sweep PLAN --out OUT ... -- LAUNCHER ARGS...``): each point
of the plan in its own launcher call (its own job step under srun) under the validation job's guard,
then ``OUT/sweep.json`` rewritten (atomically) after every point, so a sweep cut short keeps what it
measured. A point that hangs, crashes or fails is recorded with the guard's or the watchdog's cause;
it never takes the sweep down.

For each point the driver starts from the job's environment, unsets every variable of the plan (the
default point is the true default even where the stack's module sets a tuned value), sets the point's
settings (in the environment it hands the guard: no shell reads them; inside the image too where the
ranks run in a container), and gives it its own ``MASTER_PORT`` and rendezvous (a free port of the
sweep's own range, 30000-32699, never one of this sweep's earlier points:
:mod:`sitestack.onsite.ddpcheck.pointenv`), its own directory ``OUT/points/<id>`` and its own
deadline (``point_seconds`` from its start, within the job's: a point that cannot fit is recorded as
not run). The guard runs in its own session: a guard stuck past its deadline is killed with its
process group and the launcher's session, so nothing of a point outlives it into the next.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from typing import Any

from ..fileio import private_dir, write_json
from ..result_schema import load_result
from . import envvalues, pointenv
from .guard import GUARD_GRACE
from .provenance import stack_record
from .rank_progress import deadline_from_env
from .tuneplan import load_plan, point_dir
from .verdicts import load_config

SCHEMA = "sitestack-sweep/1"
#: Seconds past a point's guard deadline after which the driver ends the guard itself.
DRIVER_GRACE = 30
#: The job directory's ddp_check.py, the launcher beside the onsite/ package this module is part of
#: (the guard is its --guard; sitestack.core.shipped installs both).
PROGRAM = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "ddp_check.py")


def sweep_main(argv: list[str]) -> int:
    """``PLAN --out OUT [--config C] --expect-world-size N [--nodes N] [--ranks-per-node R] -- LAUNCHER ...``:
    run every point of the plan; print one line per point and the last line; the exit code
    (0 when the sweep ran to its end, whatever its points did)."""
    p = argparse.ArgumentParser(prog="ddp_check.py --sweep PLAN")
    p.add_argument("--out", required=True)
    p.add_argument("--config")
    p.add_argument("--expect-world-size", type=int, required=True)
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--ranks-per-node", type=int, default=None)
    p.add_argument("--container-env", choices=pointenv.CONTAINER_PREFIXES, default=None,
                   help="the prefix by which the site's container runtime sets a variable inside its image")
    p.add_argument("command", nargs=argparse.REMAINDER)
    if not argv or argv[0].startswith("-"):
        p.error("the plan (tune-plan.json) comes first")
    args = p.parse_args(argv[1:])
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("no launcher command after --")
    plan = load_plan(argv[0])
    env = os.environ
    job_deadline = deadline_from_env(env, envvalues.seconds(env, "SITESTACK_TIME_LIMIT", 1) or 480)
    job_id = envvalues.whole(env, "SITESTACK_JOB_ID")
    job_id = os.getpid() if job_id is None else job_id
    used: set[int] = set()
    config = load_config(args.config) if args.config else {}
    sweep: dict[str, Any] = {
        "schema": SCHEMA, "site": config.get("site") or plan.get("site"),
        "job_id": env.get("SLURM_JOB_ID") or env.get("SITESTACK_JOB_ID"), "launcher": env.get("SITESTACK_LAUNCHER"),
        "nodes": args.nodes, "world_size": args.expect_world_size,
        "ranks_per_node": args.ranks_per_node or args.expect_world_size // max(1, args.nodes),
        "backend": None, "device": None, "started": round(time.time(), 3), "ended": None, "finished": False,
        "stack": stack_record(config), "plan": plan, "points": []}   # the stack as the validation records it
    os.makedirs(args.out, exist_ok=True)
    write_sweep(args.out, sweep)
    for index, point in enumerate(plan["points"]):
        port = pointenv.point_port(job_id, index, used)
        used.add(port)
        record, result = run_point(args, plan, point, port, job_deadline,
                                   pointenv.point_command(command, port, point["id"]))
        if record["status"] == "ok" and sweep["backend"] is None:
            sweep["backend"], sweep["device"] = result.get("backend"), result.get("device")
        sweep["points"].append(record)
        sweep["ended"] = round(time.time(), 3)
        write_sweep(args.out, sweep)
        cause = f": {record['cause']}" if record["cause"] else ""
        print(f"sitestack tune: {record['id']} {record['label']}: {record['status']} in {record['seconds']:.1f} s{cause}",
              flush=True)
    sweep["finished"] = True
    write_sweep(args.out, sweep)
    print(f"sitestack tune: sweep written to {os.path.join(args.out, 'sweep.json')}", flush=True)
    print("sitestack tune: sweep written, exit code 0", flush=True)
    return 0


def write_sweep(out: str, sweep: dict[str, Any]) -> None:
    """``OUT/sweep.json``, atomically (read whole or not at all)."""
    write_json(os.path.join(out, "sweep.json"), sweep)


def point_env(plan: dict[str, Any], point: dict[str, Any], port: int, deadline: float,
              container_env: str | None = None) -> dict[str, str]:
    """The point's environment: the job's, every plan variable unset (and its container variables:
    :func:`pointenv.container_settings`), the point's settings, its port, its id and its deadline."""
    env = dict(os.environ)
    for name in plan["variables"]:
        env.pop(name, None)
    env.update(point["settings"])
    pointenv.container_settings(env, plan["variables"], point["settings"], container_env)
    env.update({"MASTER_PORT": str(port), "SITESTACK_TUNE_POINT": point["id"], "SITESTACK_DEADLINE": f"{deadline:.3f}",
                "SITESTACK_TIME_LIMIT": str(plan["point_seconds"]),
                "SITESTACK_TIME_LIMIT_FROM": "the tuning plan's point_seconds",
                # a point is a measurement, not a validation run: the sweep is recorded once, as a tuning
                "SITESTACK_HISTORY": "off"})
    return env


def run_point(args: argparse.Namespace, plan: dict[str, Any], point: dict[str, Any], port: int,
              job_deadline: float, command: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """One point under the guard (in its own session): its record for sweep.json and its result.json
    ({} without one)."""
    record: dict[str, Any] = {"id": point["id"], "label": point["label"], "settings": point["settings"],
                              "status": "skipped", "cause": None, "exit_code": None, "seconds": 0.0,
                              "result": None, "busbw_gbs": {}, "step_ms": []}
    start = time.time()
    seconds = plan["point_seconds"]
    if start + seconds > job_deadline:
        record["cause"] = (f"not run: {max(0.0, job_deadline - start):.0f}s of the job's time limit left, the point "
                           f"needs {seconds}s (its point_seconds)")
        return record, {}
    directory = point_dir(args.out, point["id"])
    try:   # OUT/points, then the point's own: neither a link nor a directory someone else made
        private_dir(os.path.dirname(directory))
        private_dir(directory)
    except OSError as exc:
        record["cause"] = f"not run: {exc}"
        return record, {}
    guard = [sys.executable, "-E", "-s", "-S", PROGRAM, "--guard", "--out", directory,
             *(["--config", args.config] if args.config else []), "--expect-world-size", str(args.expect_world_size),
             "--", *command]
    print(f"sitestack tune: {point['id']} {point['label']}: MASTER_PORT {port}, {seconds}s, in {directory}", flush=True)
    try:
        proc = subprocess.Popen(guard, env=point_env(plan, point, port, start + seconds, args.container_env),
                                start_new_session=True)
    except OSError as exc:
        record.update(status="failed", cause=f"cannot start the guard: {exc}")
        return record, {}
    try:
        rc = proc.wait(timeout=seconds + GUARD_GRACE + DRIVER_GRACE)
    except subprocess.TimeoutExpired:  # the guard itself is stuck: end it and all it started, the point is a hang
        pointenv.end_point(proc.pid)
        proc.kill()
        rc = proc.wait()
        record.update(status="hung", cause=f"the guard did not end {DRIVER_GRACE}s after its deadline: killed")
    result = read_result(os.path.join(directory, "result.json"))
    if record["status"] == "skipped":
        record["status"], record["cause"] = classify(result, rc, plan)
    record.update(exit_code=rc, seconds=round(time.time() - start, 2),
                  result=os.path.join("points", point["id"], "result.json") if result else None)
    if record["status"] == "ok":
        record.update(busbw_gbs=result["tune"]["busbw_gbs"], step_ms=result["tune"]["step_ms"])
        if result.get("verdict") != "passed" and result.get("cause"):
            record["note"] = str(result["cause"])
    return record, result


def read_result(path: str) -> dict[str, Any]:
    """A point's result.json ({} when it is missing, too large or no result: result_schema.load_result)."""
    result, _ = load_result(path)
    return dict(result) if result is not None else {}


def complete(result: dict[str, Any], plan: dict[str, Any]) -> bool:
    """Whether the result holds every sample the plan asked for (numbers, ``repeats`` of each)."""
    tune = result.get("tune")
    if not isinstance(tune, dict) or not isinstance(tune.get("busbw_gbs"), dict):
        return False

    def full(samples: Any) -> bool:
        return isinstance(samples, list) and len(samples) == plan["repeats"] and all(
            isinstance(s, (int, float)) and not isinstance(s, bool) and s > 0 for s in samples)

    return all(full(tune["busbw_gbs"].get(str(size))) for size in plan["sizes"]) and full(tune.get("step_ms"))


def classify(result: dict[str, Any], rc: int, plan: dict[str, Any]) -> tuple[str, str | None]:
    """(status, cause) of a point: ok (measured), hung (its time limit passed), crashed (a rank or the
    launcher ended by a signal), failed (an error: the process group did not start, a non-zero exit)."""
    fault = result.get("fault") if isinstance(result.get("fault"), dict) else None
    if fault is None and complete(result, plan):
        return "ok", None
    if fault is not None:
        kind, cause = fault.get("kind"), str(fault.get("cause") or "no cause recorded")
        if kind == "timeout":
            return "hung", cause
        code = fault.get("launcher_exit_code")
        if kind in ("crashed", "killed") or (kind == "exited" and isinstance(code, int) and code > 128):
            return "crashed", cause
        return "failed", cause
    if not result:
        return ("crashed" if rc > 128 else "failed"), f"no result.json was written (guard exit code {rc})"
    return "failed", str(result.get("cause") or f"the samples are incomplete (exit code {rc})")
