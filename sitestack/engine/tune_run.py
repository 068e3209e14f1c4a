"""``invoke tune``: run the site's tuning sweep job, choose by measurement, keep the decision.

The sweep job (``<validation dir>/jobs/tune-<launcher>.sbatch``, installed by ``install-validation-job``
where the playbook has ``facts.tuning``) is submitted exactly as ``invoke validate`` submits its job
(:mod:`sitestack.engine.batchjob`: sbatch where Slurm answers, else ``bash`` on the host), waited for,
and its ``sweep.json`` read (bounded, checked). :mod:`sitestack.engine.tune_decision` decides;
``{prefix}/tuning/`` on the host receives ``tuning.json``, ``report.md`` and the plot (each written
atomically; the report and plot first, so a tuning.json always has its own beside it). ``provision``
then sets the chosen values in the stack's module (:mod:`sitestack.installs.tuned`). ``--check`` shows
the points the sweep would run and what the module sets now, and submits nothing.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sitestack.core.bounded import read_json
from sitestack.core.errors import CommandFailed, InputError, SitestackError
from sitestack.core.host import Host
from sitestack.core.report import Reporter
from sitestack.engine import site_history
from sitestack.engine.batchjob import (
    await_words,
    job_env,
    preflight,
    run_here,
    script_path,
    submit,
    wait_for,
)
from sitestack.engine.tune_decision import check_declared, check_sweep, decide
from sitestack.engine.tune_report import decision_lines, markdown, render_plot, table
from sitestack.engine.validate import RESULT_WAIT, ValidateOptions, choose, install_dir, open_host, results_root
from sitestack.installs.tuned import read_tuned, tuned_from, tuning_path
from sitestack.model.site import Facts, Site
from sitestack.onsite.ddpcheck.tuneplan import MAX_PLAN_BYTES, check_plan
from sitestack.onsite.launchers import tune_launchers
from sitestack.validation.jobs import validation_of
from sitestack.validation.results_dir import dir_check
from sitestack.validation.tune_jobs import PLAN, tune_plan, tune_script_name

#: The most a sweep.json may hold (a few KiB per point): a larger one is not read.
SWEEP_MAX = 16 << 20
#: The sweep job's last line (sitestack/onsite/ddpcheck/sweep.py): sweep.json is complete.
LAST_WORDS = re.compile(r"^sitestack tune: sweep written, exit code \d+", re.M)
PLOTS = ("busbw.png", "busbw.svg")


@dataclass
class TuneOutcome:
    """What ``invoke tune`` gave: the exit code, the job, where its files are (paths on the host), the decision."""

    code: int
    job_id: str | None = None
    out_dir: str | None = None
    log: str | None = None
    tuning: dict[str, Any] | None = None
    files: list[str] = field(default_factory=list)


def utc_now() -> str:
    """Now, in UTC, as tuning.json dates its decision (``2026-11-25T10:00:00Z``)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def tune(site: Site, options: ValidateOptions, reporter: Reporter, *, check: bool = False) -> TuneOutcome:
    """Run the site's sweep on its host (or, with ``check``, show what it would run) and keep the decision."""
    host = open_host(site, options)
    try:
        return _tune(site, options, reporter, host, check)
    finally:
        host.close()


def _tune(site: Site, options: ValidateOptions, reporter: Reporter, host: Host, check: bool) -> TuneOutcome:
    resolved = site.resolve(home=host.home(), user=host.user(), account=options.account, prefix=options.prefix)
    facts, prefix = resolved.facts, resolved.values["prefix"]
    if facts.tuning is None:
        raise InputError(site.path, f"site {site.name} declares nothing to tune (no facts.tuning)")
    if facts.tuning_problem():
        raise InputError(site.path, str(facts.tuning_problem()), "facts.tuning")
    directory = install_dir(site, resolved.values)
    scheduler, launcher = choose_for_tune(facts, options, host, check)
    if launcher not in tune_launchers():
        raise InputError("--scheduler", f"the sweep runs with {', '.join(tune_launchers())}, not {launcher}")
    script = script_path(directory, tune_script_name(launcher))
    if check:
        show_plan(site, facts, host, directory, script, f"{scheduler}, {launcher}", reporter)
        show_set_now(facts, host, prefix, reporter)
        return TuneOutcome(0)
    if not host.probe(["test", "-f", script]).ok:
        raise SitestackError(f"the tuning sweep is not installed ({script} missing on {host.name}): run "
                             f"`invoke install-validation-job --site {site.name}` first")
    root = results_root(site, options, host)
    preflight(host, directory, site.name, root, options.python)
    env = job_env(options.ranks_per_node, options.python)
    name = os.path.basename(script)
    if scheduler == "slurm":
        job_id = submit(host, script, root, env, nodes=options.nodes, ranks_per_node=options.ranks_per_node,
                        tasks_per_node=validation_of(facts).sbatch_tasks)
        out_dir, log = f"{root}/sitestack-tune-{job_id}", f"{root}/sitestack-tune-{job_id}.log"
        reporter.note(f"submitted {name} to Slurm as job {job_id}; results in {out_dir}/")
        rc = wait_for(host, job_id, reporter, f"its sweep is {out_dir}/sweep.json once it ends",
                      timeout=options.timeout, poll=options.poll)
    else:
        job_id = f"local-{os.getpid()}-{time.time_ns() // 1_000_000}"
        out_dir, log = f"{root}/sitestack-tune-{job_id}", f"{root}/sitestack-tune-{job_id}.log"
        env["SITESTACK_VALIDATION_OUT"] = out_dir
        reporter.note(f"running {name} on {host.name} without a scheduler ({launcher}); log {log}")
        rc = run_here(host, script, log, root, env, options.timeout)
    return conclude(site.name, facts, (prefix, directory), TuneOutcome(0, job_id, out_dir, log), rc, reporter, host)


def choose_for_tune(facts: Facts, options: ValidateOptions, host: Host, check: bool) -> tuple[str, str]:
    """(scheduler, launcher) as ``invoke validate`` chooses them; with ``check`` on a host where no Slurm
    answers and the site has no launcher without one, the site's first sweep launcher on its Slurm."""
    try:
        return choose(facts, options, host)
    except InputError:
        launchers = [name for name in validation_of(facts).launchers if name in tune_launchers()]
        if not check or options.scheduler != "auto" or not launchers:
            raise
        return f"slurm (not answering on {host.name})", launchers[0]


def read_sweep(host: Host, out_dir: str, log: str, job_id: str, rc: int | None) -> dict[str, Any]:
    """The checked ``sweep.json`` of the job, once its log has the last words (at most RESULT_WAIT s)."""
    await_words(host, log, LAST_WORDS, RESULT_WAIT)
    path = f"{out_dir}/sweep.json"
    doc = read_json(host, path, SWEEP_MAX, "not a sweep of the tuning job")
    if doc is None:
        tail = "\n".join((host.read_tail(log) or "").rstrip().splitlines()[-15:])
        raise SitestackError(f"job {job_id} left no sweep ({path} missing; exit code {rc}); log {log}:\n{tail}".rstrip())
    return check_sweep(doc, path)


def conclude(site_name: str, facts: Facts, where: tuple[str, str], outcome: TuneOutcome, rc: int | None,
             reporter: Reporter, host: Host) -> TuneOutcome:
    """Read the sweep, decide, record the decision in the site's history and report it; publish it into
    ``{prefix}/tuning`` (``where``: the prefix and the validation job's directory) only when the sweep was
    whole (:func:`unpublished`), else keep it in the sweep's results directory and exit 1."""
    prefix, directory = where
    out_dir, log = str(outcome.out_dir), str(outcome.log)
    # the job id that names the results directory (a run without a scheduler knows only its shell's pid)
    sweep = {**read_sweep(host, out_dir, log, str(outcome.job_id), rc), "job_id": str(outcome.job_id)}
    check_declared(sweep, f"{out_dir}/sweep.json")
    tuning = decide(sweep, date=utc_now(), results=out_dir)
    why = unpublished(sweep, tuning, rc)
    tuning.update(published=why is None, unpublished=why)
    target = os.path.dirname(tuning_path(prefix)) if why is None else f"{out_dir}/decision"
    outcome.files = write_decision(host, target, tuning, private=why is not None)
    outcome.tuning = tuning
    remember(host, tuning, directory, prefix, reporter)
    reporter.note(table(tuning))
    for line in decision_lines(tuning):
        reporter.note(line)
    reporter.note("written: " + ", ".join(outcome.files))
    if why is not None:
        reporter.note(f"{os.path.dirname(tuning_path(prefix))} unchanged (the stack's module keeps what it sets): "
                      f"{why}; log {log}")
        outcome.code = 1
        return outcome
    tuned, warnings = tuned_from(json.dumps(tuning), outcome.files[-1], facts)
    for warning in warnings:
        reporter.note(f"warning: {warning}")
    settings = ", ".join(f"{t.name}={t.value}" for t in tuned) or "no tuned setting (every tuning variable unset)"
    # the stack the sweep ran (a site's other stacks keep what they set: installs/tuned.py)
    module = (tuning.get("stack") or {}).get("module") or "the stack"
    reporter.note(f"provision will now set in {module}'s module: {settings} (`invoke install-modulefiles --site "
                  f"{site_name}` writes it)")
    outcome.code = 0
    return outcome


def unpublished(sweep: dict[str, Any], tuning: dict[str, Any], rc: int | None) -> str | None:
    """Why this decision must not replace the published one, or None. A sweep that measured part of its
    plan (cut at the job's time limit, points skipped for want of time, no default) would unset, in the
    stack's module, settings an earlier whole sweep measured; a hung, crashed or failed candidate is a
    result, not a reason."""
    if tuning.get("problem"):
        return str(tuning["problem"])
    skipped = [p["label"] for p in sweep["points"] if p["status"] == "skipped"]
    if skipped:
        return f"{len(skipped)} point(s) not run for want of time ({', '.join(skipped[:3])}): give the job more time"
    if not sweep.get("finished", True):
        return "the sweep job ended before its last point"
    if rc not in (0, None):
        return f"the sweep job ended with exit code {rc}"
    return None


def remember(host: Host, tuning: dict[str, Any], directory: str, prefix: str, reporter: Reporter) -> None:
    """Record the tuning in the site's history (docs/history.md); a history that cannot be written is a
    warning: the decision is already kept in its files."""
    try:
        run_id = site_history.record_tuning(host, site_history.history_dir_of(host, directory, prefix), tuning, directory)
    except SitestackError as exc:
        reporter.note(f"warning: the tuning is not in the site's history: {exc}")
        return
    reporter.note(f"recorded in the site's history as {run_id}")


def write_decision(host: Host, directory: str, tuning: dict[str, Any], *, private: bool = False) -> list[str]:
    """Write the plot, ``report.md`` and ``tuning.json`` (last) into ``directory`` on ``host`` (``{prefix}/tuning``,
    or the sweep's own ``decision/``, ``private``), each atomically; a plot of the other kind left by an earlier
    run goes. The paths written, tuning.json last; a directory another user owns or others can write is a
    :class:`SitestackError` (one line) before anything is written."""
    path = f"{directory}/tuning.json"
    # made (private: the sweep's decision/; readable by all: {prefix}/tuning, which the module reads) or
    # taken only when the user's own and writable by no one else: another's could hold links a write follows
    try:
        host.run(dir_check(directory, private=private, what="decision directory"))
    except CommandFailed as exc:
        raise SitestackError(exc.output.strip().splitlines()[-1] if exc.output.strip() else str(exc)) from None
    written = []
    plot = render_plot(tuning)
    if plot is not None:
        name, content = plot
        with tempfile.TemporaryDirectory() as tmp:
            local = Path(tmp, name)
            local.write_bytes(content)
            host.put_file(local, f"{directory}/{name}", 0o644)
        written.append(f"{directory}/{name}")
    stale = [f"{directory}/{p}" for p in PLOTS if plot is None or p != plot[0]]
    host.run(["rm", "-f", "--", *stale])
    host.write_text(f"{directory}/report.md", markdown(tuning, plot[0] if plot else None), 0o644)
    host.write_text(path, json.dumps(tuning, indent=2) + "\n", 0o644)
    return [*written, f"{directory}/report.md", path]


def show_plan(site: Site, facts: Facts, host: Host, directory: str, script: str, how: str, reporter: Reporter) -> None:
    """The points the sweep would run: the installed plan's (checked as the sweep job checks it), else the
    playbook's, saying why (not installed yet, or the installed one is not a plan)."""
    source = f"{directory}/{PLAN}"
    plan: dict[str, Any] | None = None
    try:
        doc = read_json(host, source, MAX_PLAN_BYTES, "not a tuning plan")
        plan = check_plan(doc, source) if doc is not None else None
    except (InputError, ValueError) as exc:   # PlanError is a ValueError
        reporter.note(f"warning: {source} is not a tuning plan ({exc}): `invoke install-validation-job --site "
                      f"{site.name}` installs it again")
    if plan is None:
        plan = tune_plan(site.name, facts) or {"points": []}
        source = (f"the playbook's facts.tuning (the sweep is not installed on {host.name} as the playbook has it: "
                  f"`invoke install-validation-job --site {site.name}`)")
    sizes = ", ".join(str(s) for s in plan.get("sizes") or [])
    reporter.note(f"would run {script} ({how}): {len(plan['points'])} points from {source}; {plan.get('repeats')} "
                  f"samples at each of {sizes} bytes and of the DDP step, {plan.get('point_seconds')} s per point at most")
    for point in plan["points"]:
        if isinstance(point, dict):
            reporter.note(f"  {point.get('id')}  {point.get('label')}")


def show_set_now(facts: Facts, host: Host, prefix: str, reporter: Reporter) -> None:
    """What the stack's module sets by measurement now (``{prefix}/tuning/tuning.json``)."""
    tuned, warnings = read_tuned(host, facts, prefix)
    for warning in warnings:
        reporter.note(f"warning: {warning}")
    for t in tuned:
        reporter.note(f"set now: {t.name}={t.value} ({t.evidence})")
    if not tuned:
        names = ", ".join(facts.tuning.variables) if facts.tuning else ""
        reporter.note(f"set now: nothing by measurement ({names} unset; {tuning_path(prefix)}"
                      f"{' has no choice' if host.exists(tuning_path(prefix)) else ' does not exist'})")


def tune_document(site: str, outcome: TuneOutcome | None, error: str | None = None) -> dict[str, Any]:
    """The ``--json`` document of ``invoke tune`` (docs/cli.md)."""
    from sitestack.engine.results import SCHEMA_VERSION

    return {"schema_version": SCHEMA_VERSION, "command": "tune", "site": site,
            "job_id": outcome.job_id if outcome else None, "results_dir": outcome.out_dir if outcome else None,
            "log": outcome.log if outcome else None, "files": outcome.files if outcome else [],
            "tuning": outcome.tuning if outcome else None, "error": error,
            "exit_code": outcome.code if outcome else 1}
