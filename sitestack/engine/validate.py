"""``invoke validate``: run the installed validation job on a host and read its verdict.

Every command and file goes through a :class:`~sitestack.core.host.Host`: this machine by
default, or ``--host NAME`` over SSH (connected as ``invoke provision`` connects). With Slurm
(the site's scheduler, when ``sbatch`` is on the host and the controller answers) the job is
submitted with ``sbatch --parsable``, waited for with ``squeue``, and its ``result.json`` read
from the results directory on the host. Without a scheduler (``--scheduler none``, or ``auto``
where none answers) the torchrun, mpiexec or horovodrun batch script runs on the host directly with
``bash``: the scripts work outside Slurm (one node, the job id is the shell's pid).
"""

from __future__ import annotations

import os
import posixpath
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sitestack.actions.validation_job import job_dir
from sitestack.core.bounded import read_bounded
from sitestack.core.errors import InputError, SitestackError
from sitestack.core.host import Host, local_host
from sitestack.core.report import Reporter
from sitestack.core.ssh import check_ssh_config
from sitestack.engine import host_fingerprint
from sitestack.engine.batchjob import FINISHED as FINISHED  # re-exported: imported from here too
from sitestack.engine.batchjob import RUN_TO_LOG as RUN_TO_LOG
from sitestack.engine.batchjob import (
    await_words,
    job_config,
    job_env,
    preflight,
    run_here,
    submit,
    wait_for,
)
from sitestack.engine.batchjob import check_imports as check_imports
from sitestack.engine.batchjob import check_launch_env as check_launch_env
from sitestack.engine.batchjob import slurm_exit_code as slurm_exit_code
from sitestack.engine.playbook import connect, select_hosts
from sitestack.model.context import RunOptions
from sitestack.model.options import ValidateOptions as ValidateOptions  # re-exported: the engine takes it from here
from sitestack.model.site import Facts, Site, expand
from sitestack.onsite.calibration import CALIBRATING
from sitestack.onsite.ddp_report import verdict_table
from sitestack.onsite.launchers import in_words, local_launchers
from sitestack.onsite.result_schema import MAX_BYTES, Result, exit_code, parse_result
from sitestack.validation.jobs import script_name, validation_of


@dataclass
class Outcome:
    """What a validation run gave: the exit code and where its files are (paths on the host)."""

    code: int
    job_id: str | None = None
    out_dir: Path | None = None
    log: Path | None = None
    result: Result | None = None
    regression: dict[str, Any] | None = None  # the run against the site's history (engine/regression.py)
    stacks: dict[str, Any] | None = None  # --all-stacks: each stack's run (engine/stack_validation.py)


def install_dir(site: Site, values: Mapping[str, str]) -> str:
    """Where the install-validation-job step of the stack ``site`` is for (``site.stack``; None: the
    playbook's own) puts the job (:func:`sitestack.actions.validation_job.job_dir`)."""
    for step in site.steps:
        if step.action == "install-validation-job" and step.stack == site.stack:
            return expand(job_dir(step.args, step.stack), values)
    return expand(job_dir({}, site.stack), values)


def slurm_answers(host: Host | None = None) -> bool:
    """Whether sbatch is on ``host`` (default: here) and a Slurm controller answers it."""
    host = host or local_host()
    if not host.probe(["sbatch", "--version"], timeout=15).ok:
        return False
    return host.probe(["squeue", "-h", "-o", "%i", "-u", host.user()], timeout=15).ok


def choose(facts: Facts, options: ValidateOptions, host: Host | None = None) -> tuple[str, str]:
    """(scheduler, launcher) for this run on ``host`` (default: here)."""
    v = validation_of(facts)
    scheduler = options.scheduler   # one of the three (ValidateOptions checks it)
    if scheduler == "auto":
        scheduler = "slurm" if facts.scheduler.kind == "slurm" and slurm_answers(host) else "none"
    if options.launcher:
        if options.launcher not in v.launchers:
            raise InputError("--launcher", f"the site installs jobs for {', '.join(v.launchers)}, not {options.launcher!r}")
        launcher = options.launcher
    elif scheduler == "slurm":
        launcher = v.launchers[0]
    else:
        launcher = next((name for name in v.launchers if name in local_launchers()), "")
    if scheduler == "none" and launcher not in local_launchers():
        raise InputError("--scheduler", f"without a scheduler the job runs with {in_words(local_launchers())}; this site installs "
                         f"{', '.join(v.launchers)} (no Slurm answered here)")
    if scheduler == "none" and options.nodes > 1:
        raise InputError("--nodes", "without a scheduler the job runs on this node only")
    return scheduler, launcher


def open_host(site: Site, options: ValidateOptions) -> Host:
    """This machine, or ``options.host`` connected as ``invoke provision`` would (playbook host or SSH alias)."""
    if not options.host:
        return local_host()
    spec = select_hosts(site, [options.host])[0]
    if spec.connection == "ssh":
        check_ssh_config(spec.address or spec.name)
    return connect(spec, RunOptions(accept_new_host_keys=options.accept_new_host_keys))


def results_root(site: Site, options: ValidateOptions, host: Host) -> str:
    """The absolute results directory on ``host`` (``~`` is the host's home)."""
    root = options.results or f"~/sitestack-validation/{site.name}"
    if root == "~" or root.startswith("~/"):
        root = host.home() + root[1:]
    return posixpath.normpath(root if root.startswith("/") else posixpath.join(host.home(), root))


def validate(site: Site, options: ValidateOptions, reporter: Reporter,
             job_env_extra: Mapping[str, str] | None = None) -> Outcome:
    """Run (or collect) the validation job of the playbook's own stack, of ``options.stack``, or with
    ``options.all_stacks`` of every stack in turn (:mod:`sitestack.engine.stack_validation`); report the
    verdict; return the outcome. ``job_env_extra``: variables the job gets besides :func:`job_env`'s (a
    generation pending validation: sitestack.engine.generation_promotion)."""
    from sitestack.engine import stack_validation

    if options.all_stacks:
        code, stacks = stack_validation.validate_all(site, options, reporter, validate_stack)
        return Outcome(code, stacks=stacks)
    return validate_stack(stack_validation.stack_site(site, options.stack), options, reporter,
                          job_env_extra=job_env_extra)


def validate_stack(site: Site, options: ValidateOptions, reporter: Reporter, *,
                   job_env_extra: Mapping[str, str] | None = None) -> Outcome:
    """Run (or collect) the validation job of the stack ``site`` is for (``site.stack``, its
    install-validation-job step's job) on its host; report the verdict; return the outcome."""
    host = open_host(site, options)
    try:
        resolved = site.resolve(home=host.home(), user=host.user(), account=options.account, prefix=options.prefix)
        # the job's check-config.json, read once: the checks before submitting and the history use it
        config = job_config(host, install_dir(site, resolved.values), site.name)
        run, reading = fingerprint_now(site, options, reporter, host, config)
        if not run:
            return Outcome(0)
        outcome = _validate(site, options, reporter, host, config, job_env_extra or {})
        return remember(site, options, outcome, reporter, host, config, reading)
    finally:
        host.close()


def fingerprint_now(site: Site, options: ValidateOptions, reporter: Reporter, host: Host,
                    config: Mapping[str, Any]) -> tuple[bool, host_fingerprint.Reading | None]:
    """(whether to run, the host's fingerprint read before the run: :mod:`.host_fingerprint`, kept with
    the run's record). Not to run only with ``--if-changed``, when the fingerprint is that of the last
    passing run of this stack generation (said in one line: nothing is submitted). ``--collect`` reads
    an earlier run: no fingerprint of now is its."""
    if options.if_changed and options.collect:
        raise InputError("--if-changed", "it decides whether to submit a new run; --collect reads an earlier one")
    if options.collect:
        return True, None
    if options.if_changed and not options.wait:
        raise InputError("--if-changed", "the run's record keeps the host's fingerprint: it waits for the job "
                         "(drop --no-wait)")
    resolved = site.resolve(home=host.home(), user=host.user(), account=options.account, prefix=options.prefix)
    directory = install_dir(site, resolved.values)
    reading = host_fingerprint.read(host, resolved.facts, resolved.values, directory, config)
    if not options.if_changed:
        return True, reading
    from sitestack.engine import site_history

    runs, _ = site_history.read_on(host, site_history.program_of(directory),
                                   site_history.history_dir_of(host, directory, resolved.values["prefix"], config))
    run, line = host_fingerprint.decide(reading, runs)
    reporter.note(line)
    return run, reading


def remember(site: Site, options: ValidateOptions, outcome: Outcome, reporter: Reporter, host: Host,
             config: Mapping[str, Any], reading: host_fingerprint.Reading | None = None) -> Outcome:
    """The run compared with the site's history and recorded there (docs/history.md): a FAIL exits 1."""
    if outcome.result is None or outcome.out_dir is None:
        return outcome  # not waited for: the job records itself
    from sitestack.engine import site_history as history  # lazy: only a run that was read is compared

    resolved = site.resolve(home=host.home(), user=host.user(), account=options.account, prefix=options.prefix)
    outcome.regression = history.after_validation(
        host, install_dir(site, resolved.values), resolved.values["prefix"], outcome.result, str(outcome.out_dir),
        validation_of(resolved.facts).regression, reporter, config, reading.fingerprint if reading else None)
    from sitestack.engine import site_calibration

    site_calibration.after_validation(
        host, history.history_dir_of(host, install_dir(site, resolved.values), resolved.values["prefix"], config),
        outcome.result, config, str(outcome.result.get("job_id") or outcome.out_dir), options.calibrate, reporter)
    if outcome.regression["status"] == "fail":
        outcome.code = 1
    return outcome


def _validate(site: Site, options: ValidateOptions, reporter: Reporter, host: Host,
              config: Mapping[str, Any], extra: Mapping[str, str]) -> Outcome:
    resolved = site.resolve(home=host.home(), user=host.user(), account=options.account, prefix=options.prefix)
    facts = resolved.facts
    directory = install_dir(site, resolved.values)
    root = results_root(site, options, host)
    if options.collect:
        return collect(site, options.collect, root, options, reporter, host)
    scheduler, launcher = choose(facts, options, host)
    script = f"{directory}/jobs/{script_name(launcher)}"
    if not host.probe(["test", "-f", script]).ok:
        raise SitestackError(f"the validation job is not installed ({script} missing on {host.name}): run "
                             f"{install_command(site)} first")
    preflight(host, directory, site.name, root, options.python, config)
    env = {**job_env(options.ranks_per_node, options.python), **extra}
    if options.calibrate and not options.wait:
        raise InputError("--calibrate", "a calibration is stored from the run's result: it waits for the job (drop --no-wait)")
    if options.calibrate:
        env[CALIBRATING] = "1"  # judged rank against rank only: the stored figures do not judge their successor
    limit_against_history(host, directory, resolved.values["prefix"], facts, config, env, reporter)
    if options.wait:
        env["SITESTACK_HISTORY"] = "off"  # recorded here, with its regression report (remember)
    name = posixpath.basename(script)
    if scheduler == "slurm":
        job_id = submit(host, script, root, env, nodes=options.nodes, ranks_per_node=options.ranks_per_node,
                        tasks_per_node=validation_of(facts).sbatch_tasks)
        reporter.note(f"submitted {name} to Slurm as job {job_id}; results in {root}/sitestack-validation-{job_id}/")
        if not options.wait:
            reporter.note(f"not waiting: `invoke validate --site {site.name} --collect {job_id}"
                          f"{' --results ' + root if options.results else ''}"
                          f"{' --host ' + options.host if options.host else ''}` reads the verdict later")
            return Outcome(0, job_id, Path(root, f"sitestack-validation-{job_id}"),
                           Path(root, f"sitestack-validation-{job_id}.log"))
        return collect(site, job_id, root, options, reporter, host)
    run_id = f"local-{os.getpid()}-{time.time_ns() // 1_000_000}"  # ms: two runs of one process differ
    out_dir = f"{root}/sitestack-validation-{run_id}"
    log = f"{root}/sitestack-validation-{run_id}.log"
    env["SITESTACK_VALIDATION_OUT"] = out_dir
    reporter.note(f"running {name} on {host.name} without a scheduler ({launcher}); log {log}")
    rc = run_here(host, script, log, root, env, options.timeout)
    return finish(site, run_id, out_dir, log, rc, reporter, host)


def install_command(site: Site) -> str:
    """The command that installs the job of the stack ``site`` is for: the task for the playbook's own,
    the provision of its step (by its name, a tag of its own) for a further stack's."""
    if site.stack is None:
        return f"`invoke install-validation-job --site {site.name}`"
    step = next((s.name for s in site.steps if s.action == "install-validation-job" and s.stack == site.stack), "")
    return f"`invoke provision --site {site.name} --tags {step}`"


def limit_against_history(host: Host, directory: str, prefix: str, facts: Facts, config: Mapping[str, Any],
                          env: dict[str, str], reporter: Reporter) -> None:
    """The checks' time limit against the healthy runs of the site's history (time_limit_check.py); a
    history that cannot be read leaves the limit unchecked (the run's record says why, later)."""
    from sitestack.engine import site_history
    from sitestack.engine.time_limit_check import check_time_limit

    try:
        runs, _ = site_history.read_on(host, site_history.program_of(directory),
                                       site_history.history_dir_of(host, directory, prefix, config))
    except SitestackError:
        return
    check_time_limit(runs, facts, env, reporter)


def collect(site: Site, job_id: str, root: str, options: ValidateOptions, reporter: Reporter,
            host: Host | None = None) -> Outcome:
    """Wait for Slurm job ``job_id`` on ``host`` (default: here) to end, then read its result."""
    host = host or local_host()
    if not re.fullmatch(r"\d+(_\d+)?", job_id):
        raise InputError("--collect", f"{job_id!r} is not a Slurm job id")
    rc = wait_for(host, job_id, reporter, f"`invoke validate --site {site.name} --collect {job_id}` reads it later",
                  timeout=options.timeout, poll=options.poll)
    return finish(site, job_id, f"{root}/sitestack-validation-{job_id}", f"{root}/sitestack-validation-{job_id}.log",
                  rc, reporter, host)


#: The job's last words: the guard's closing line, rank 0's verdict line (no guard), or the batch script's
#: own line when nothing was written (validation/templates/job.sbatch.j2, ddpcheck/guard.py, runner.py).
LAST_WORDS = re.compile(r"^sitestack validation(: (PASSED|FAILED|\?), exit code |: no (result|summary) was written| "
                        r"(PASSED|FAILED): )", re.M)
#: Seconds to wait for the job's last words after Slurm says it ended: at a time limit Slurm signals
#: every process of the job, squeue forgets it, and the guard is still writing the result (it ends the
#: job step first, then writes); Slurm's KillWait (default 30 s) bounds how long that can take.
RESULT_WAIT = 45.0
#: The most a result.json may hold (the job's is a few KiB): a larger one is not read.
RESULT_MAX = MAX_BYTES


def await_result(host: Host, path: str, log: str, wait: float = RESULT_WAIT) -> str | None:
    """``path``'s text once the job has said its last words (:data:`LAST_WORDS` in ``log``), waiting
    at most ``wait`` seconds for them; what is there then (None: no result)."""
    await_words(host, log, LAST_WORDS, wait)
    return read_bounded(host, path, RESULT_MAX, "not a result of the validation job")


def report_result(text: str, path: str, out_dir: str, reporter: Reporter) -> Result:
    """The result in ``text`` (``path``'s), its verdict table and report files reported; a
    :class:`SitestackError` naming ``path`` when it is no :class:`~sitestack.onsite.result_schema.Result`
    (the job writes it, but a user's edit, a full disk, another program or another version of the job
    may have left anything there)."""
    result, why = parse_result(text)
    if result is None:
        raise SitestackError(f"{path} is not a result of the validation job ({why})")
    artefacts = result["artefacts"]
    files = [f"{out_dir}/{artefacts[k]}" for k in ("markdown", "json", "plot") if artefacts.get(k)]
    skipped = f" (plot skipped: {artefacts['plot_note']})" if artefacts.get("plot_note") else ""
    reporter.note(verdict_table(result))
    reporter.note("report: " + ", ".join(str(f) for f in files) + skipped)
    return result


def finish(site: Site, job_id: str, out_dir: str, log: str, rc: int | None, reporter: Reporter,
           host: Host | None = None) -> Outcome:
    """Read ``out_dir/result.json`` on ``host``, report its verdict; 0 only when it passed and the job exited 0."""
    host = host or local_host()
    path = f"{out_dir}/result.json"
    text = await_result(host, path, log)
    if text is None:
        tail = "\n".join((host.read_tail(log) or "").rstrip().splitlines()[-15:])
        raise SitestackError(f"job {job_id} left no result ({path} missing; exit code {rc}); log {log}:\n{tail}".rstrip())
    result = report_result(text, path, out_dir, reporter)
    return Outcome(1 if exit_code(result, rc) else 0, job_id, Path(out_dir), Path(log), result)
