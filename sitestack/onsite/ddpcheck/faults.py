"""A run that did not finish: its one-line cause (who, where, in which phase), fault.json, and the
result.json a watchdog or the guard writes in the ranks' place."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from dataclasses import asdict
from typing import Any

from .. import ddp_report
from ..fileio import private_dir, write_atomic, write_json
from ..result_schema import Result, build_result
from . import envvalues
from .checks import CHECKS, PHASE_CHECK
from .rank_progress import (
    CRASH_SIGNALS,
    PHASES,
    phase_words,
    read_progress,
    state_of,
    status_dir,
    waited,
    where,
)
from .resources import oom_words
from .stacks import Frame, odd_ones, where_words
from .time_budget import healthy_from_env, too_short
from .verdicts import FAILED, SKIPPED, Check, time_limit_record

#: Seconds a second reporter waits for the first to have written the result (report_fault).
WRITTEN_WAIT = 5.0
#: A check's failure that only says a peer went away: the symptom of another rank's fault, never its cause.
LOST_PEER = re.compile(r"closed by peer|reset by peer|broken pipe|connection closed|unexpected end|EOF", re.I)


#: The phases before the environment check, which names a rank's low limits itself once it runs.
BEFORE_ENVIRONMENT = ("startup", "MPI_Init", "import torch")


def describe_fault(kind: str, ranks: dict[int, dict[str, Any]], limit: float, expected: int | None,
                   culprit: int | None = None, rc: int | None = None, launcher: str = "the launcher",
                   stacks: dict[int, list[Frame]] | None = None) -> str:
    """:func:`_describe`, led by the low resource limits (``limit_problems`` of a rank's progress record,
    :mod:`.resources`) of each rank that ended before the environment check: a job short of open files
    dies or hangs inside MPI_Init or the process group, and says why only in the job log."""
    line = _describe(kind, ranks, limit, expected, culprit, rc, launcher, stacks)
    low = [f"{who(ranks, r)}: {p}" for r, d in sorted(ranks.items()) if d.get("phase") in BEFORE_ENVIRONMENT
           for p in (d.get("limit_problems") or [])[:1]]
    return "; ".join([*low[:2], line])


def _describe(kind: str, ranks: dict[int, dict[str, Any]], limit: float, expected: int | None,
              culprit: int | None = None, rc: int | None = None, launcher: str = "the launcher",
              stacks: dict[int, list[Frame]] | None = None) -> str:
    """The one-line cause of a run that did not finish: who (rank and host), where (phase and, at a
    hang, the frame its Python was in), and why."""
    size = max([expected or 0, *(int(d.get("world_size") or 0) for d in ranks.values()), len(ranks)])
    missing = [r for r in range(size) if r not in ranks]
    never = (f"; rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} never reached the check program "
             "(hung or died at start-up: the launcher, the Python start-up or a site hook)") if missing else ""
    if kind in ("killed", "rank exited") and culprit is not None:
        others = "; ".join([f"{who(ranks, r)} {state_of(ranks[r])}" for r in sorted(ranks) if r != culprit][:4])
        return f"{who(ranks, culprit)} {_ended(ranks[culprit], kind, rc)}" + (f"; {others}" if others else "") + never
    if kind == "exited":
        return _launcher_exited(ranks, rc, launcher) + never
    head = _timeout_head(ranks, limit)
    healthy = healthy_from_env(os.environ)
    short = too_short(limit, healthy, margin=1)
    if short and healthy is not None:
        if limit < healthy / 2 and ranks and not missing and not any(d.get("proc_state") in ("T", "t") for d in ranks.values()):
            # not a hang: the run had less than half of what a healthy one needs here
            return f"{short}: " + "; ".join(f"{who(ranks, r)} {state_of(d)}" for r, d in sorted(ranks.items())[:4])
        # it may be both: the ranks are named as for a hang, and the limit with them
        head += f" (a short limit: a healthy run of this stack took {healthy:.0f}s here)"
    if not ranks:
        return (f"{head} before any rank reached the check program: the job hung at start-up (the launcher, the "
                "Python start-up or a site hook)")
    stopped = [r for r, d in sorted(ranks.items()) if d.get("proc_state") in ("T", "t")]
    if stopped:
        rest = "; ".join([f"{who(ranks, r)} {waited(ranks[r])}" for r in sorted(ranks) if r not in stopped][:4])
        return (f"{head}: {', '.join(who(ranks, r) for r in stopped)} was frozen (stopped by SIGSTOP) "
                f"{where(ranks[stopped[0]])}" + (f"; {rest}" if rest else "") + never)
    if missing:
        return f"{head}:{never[1:]}; {', '.join(who(ranks, r) for r in sorted(ranks))} waited {phase_words(earliest(ranks))}"
    return f"{head}: {_hung(ranks, stacks or {})}"


def who(ranks: dict[int, dict[str, Any]], r: int) -> str:
    return f"rank {r} on {ranks[r].get('host', '?')}"


def _ended(d: dict[str, Any], kind: str, rc: int | None) -> str:
    """How a rank ended by itself: crashed, killed, or exited with its code, and where."""
    if kind == "rank exited":
        why = (" (exit code 0 before finishing: something in the stack or a site hook ended the process: sys.exit, "
               "os._exit or exit() in a library)") if rc == 0 else ""
        return f"exited with code {rc} {where(d)}{why}"
    sig = str(d.get("signal", "?"))
    verb = f"crashed with {sig} ({d.get('signal_text', '')})" if sig in CRASH_SIGNALS else f"was killed by {sig}"
    oom = oom_words(d.get("memory") or {}, d.get("pid")) if sig == "SIGKILL" else None  # the kernel's OOM killer sends SIGKILL
    return f"{verb} {where(d)}" + (f": {oom}" if oom else "")


def _launcher_exited(ranks: dict[int, dict[str, Any]], rc: int | None, launcher: str) -> str:
    """The launcher ended (by itself or by a signal) before any rank wrote a result."""
    how = f"exited with code {rc}"
    if rc is not None and rc > 128 and rc - 128 in signal.valid_signals():
        how = f"was killed by {signal.Signals(rc - 128).name} (exit code {rc})"
    head = f"{launcher} {how} before a result was written"
    if not ranks:
        return f"{head}: no rank reached the check program (it failed at start-up: see the job log)"
    states = "; ".join(f"{who(ranks, r)} was {d.get('state', 'running')} {where(d)}" for r, d in sorted(ranks.items())[:4])
    return f"{head}: {states}"


def _timeout_head(ranks: dict[int, dict[str, Any]], limit: float) -> str:
    """"the time limit of Ns passed", led by what the run had already found (not a lost peer: a symptom)."""
    head = f"the time limit of {limit:.0f}s passed"
    first = ranks.get(0) or {}
    found = next((c for c in first.get("checks") or [] if c.get("status") == FAILED
                  and not LOST_PEER.search(str(c.get("summary")))), None)
    if found:  # what the run had already found is the likelier cause: say it first
        head = f"{found['name']}: {found['summary']}; then {head}"
    throttled = [r for r, d in sorted(ranks.items()) if d.get("proc_state") == "throttled"]
    if throttled:
        head += (f" ({', '.join(who(ranks, r) for r in throttled)} was stopped and continued in turns: held to a "
                 "fraction of a CPU)")
    return head


def _hung(ranks: dict[int, dict[str, Any]], stacks: dict[int, list[Frame]]) -> str:
    """Which rank(s) held the others up: by their stacks where they tell (the odd ones out), else by
    how far each got (the ones behind); with the frame each was in."""
    def at(r: int) -> str:
        return f" {where_words(stacks[r])}" if r in stacks else ""

    order = {p: i for i, p in enumerate(PHASES)}

    def key(d: dict[str, Any]) -> tuple[int, int]:
        return order.get(d.get("phase", ""), 0), int(d.get("tick") or 0)

    odd = odd_ones(stacks)
    low = min(key(d) for d in ranks.values())
    behind = odd or [r for r, d in sorted(ranks.items()) if key(d) == low]
    rest = "; ".join([f"{who(ranks, r)} {waited(ranks[r])}{at(r)}" for r in sorted(ranks) if r not in behind][:4])
    if len(behind) == len(ranks):
        return (f"all {len(ranks)} ranks hung {where(ranks[behind[0]])}{at(behind[0])} "
                f"(ranks {', '.join(map(str, behind))}; their stacks do not tell one apart)")
    hung = "; ".join(f"{who(ranks, r)} hung {where(ranks[r])}{at(r)}" for r in behind[:4])
    return hung + (f"; {rest}" if rest else "")


def report_fault(out: str, fault: dict[str, Any]) -> bool:
    """Write ``fault.json``, result.json and summary.md for a run that did not finish; only the
    first caller writes (O_EXCL), so the first fault seen is the one reported. True when written.

    A later caller waits (at most :data:`WRITTEN_WAIT` s) until the first has written everything:
    it then exits, and a launcher that sees one process exit non-zero kills the rest (Hydra does),
    the first writer included."""
    done = os.path.join(status_dir(out), "fault.written")
    try:
        private_dir(status_dir(out))
        fd = os.open(os.path.join(status_dir(out), "fault.lock"), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except OSError:
        end = time.time() + WRITTEN_WAIT
        while not os.path.exists(done) and time.time() < end:
            time.sleep(0.05)
        return False
    os.close(fd)
    fault = {**fault, "at": round(time.time(), 3)}
    write_json(os.path.join(status_dir(out), "fault.json"), fault)
    with contextlib.suppress(OSError):
        result = fault_result(out, fault)
        write_json(os.path.join(out, "result.json"), result)
        write_atomic(os.path.join(out, "summary.md"), ddp_report.markdown(result))
    with contextlib.suppress(OSError):
        write_atomic(done, "")
    return True


def apply_fault(checks: list[dict[str, Any]], fault: dict[str, Any]) -> None:
    """Mark the check of the fault's phase failed with its cause, and the checks never run as such."""
    target = PHASE_CHECK.get(fault.get("phase", ""), fault.get("phase", ""))
    for check in checks:
        if check["name"] == target and check["status"] != FAILED:
            check.update(status=FAILED, summary=fault["cause"])
        elif check["summary"] == "not run" or (check["status"] == SKIPPED and check["summary"].startswith("not run")):
            check.update(status=SKIPPED, summary=f"not run: the run ended early ({fault['kind']})")


def fault_result(out: str, fault: dict[str, Any]) -> Result:
    """result.json of a run a watchdog or the guard ended: rank 0's checks as far as they got, and what
    the ranks' progress records say of the run (the other sections stay empty: the ranks never wrote them)."""
    ranks = read_progress(out)
    first = ranks.get(0) or (next(iter(ranks.values())) if ranks else {})
    checks = [dict(c) for c in first.get("checks") or [asdict(Check(name)) for name in CHECKS]]
    apply_fault(checks, fault)
    started = first.get("started")
    return build_result(
        site=str(first.get("site") or fault.get("site") or "unknown"), job_id=first.get("job_id") or fault.get("job_id"),
        launcher=first.get("launcher"), job_launcher=first.get("job_launcher"),
        started=float(started) if isinstance(started, (int, float)) and not isinstance(started, bool) else None,
        backend=first.get("backend"), device=first.get("device"),
        world_size=max([int(d.get("world_size") or 0) for d in ranks.values()] + [fault.get("expected") or 0]),
        hosts=sorted({str(d.get("host")) for d in ranks.values()}), torch=first.get("torch"), verdict=FAILED,
        checks=checks, fault=fault, ranks=[{k: v for k, v in d.items() if k != "checks"} for _, d in sorted(ranks.items())],
        # the watchdogs and the guard run in the job's environment: the limit the batch script set
        time_limit=time_limit_record(_time_limit(fault.get("limit_s")), os.environ), plot_note="the run did not finish")


def earliest(ranks: dict[int, dict[str, Any]]) -> str:
    """The phase of the rank furthest behind (a stopped rank first): the phase a fault is filed under."""
    order = {p: i for i, p in enumerate(PHASES)}
    stopped = [d for d in ranks.values() if d.get("proc_state") in ("T", "t")]
    pool = stopped or list(ranks.values())
    return min((str(d.get("phase", "startup")) for d in pool), key=lambda p: order.get(p, 0), default="startup")


def _time_limit(measured: Any) -> float:
    """The limit the batch script set ($SITESTACK_TIME_LIMIT, where it is a number of seconds: a fault
    report is written whatever the environment holds), else the one measured."""
    with contextlib.suppress(envvalues.EnvError):
        limit = envvalues.seconds(os.environ, "SITESTACK_TIME_LIMIT")
        if limit is not None:
            return limit
    return float(measured or 0)
