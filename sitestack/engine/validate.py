"""``invoke validate``: run the installed validation job and read its verdict.

With Slurm (the site's scheduler, when ``sbatch`` is here and the controller answers) the job is
submitted with ``sbatch --parsable``, waited for with ``squeue``, and its ``result.json`` read
from the results directory. Without a scheduler (``--scheduler none``, or ``auto`` where none
answers) the torchrun or mpiexec batch script runs here directly with ``bash``: the scripts
work outside Slurm (one node, the job id is the shell's pid).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sitestack.core.errors import InputError, SitestackError
from sitestack.core.host import local_host
from sitestack.core.report import Reporter
from sitestack.model.site import Facts, Site, expand
from sitestack.validation.ddp_report import verdict_table
from sitestack.validation.jobs import script_name, validation_of

LOCAL_LAUNCHERS = ("torchrun", "mpiexec")
FINISHED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL",
            "DEADLINE"}


@dataclass(frozen=True)
class ValidateOptions:
    """The options of ``invoke validate``."""

    nodes: int = 0
    ranks_per_node: int = 0
    launcher: str | None = None
    scheduler: str = "auto"  # auto | slurm | none
    wait: bool = True
    collect: str | None = None
    results: str | None = None
    prefix: str | None = None
    account: str | None = None
    python: str | None = None
    timeout: float = 3600.0
    poll: float = 2.0


@dataclass
class Outcome:
    """What a validation run gave: the exit code and where its files are."""

    code: int
    job_id: str | None = None
    out_dir: Path | None = None
    log: Path | None = None
    result: dict[str, Any] | None = None


def install_dir(site: Site, values: dict[str, str]) -> str:
    """Where the site's install-validation-job step puts the job."""
    for step in site.steps:
        if step.action == "install-validation-job":
            return expand(str(step.args.get("dir", "{prefix}/validation")), values)
    return f"{values['prefix']}/validation"


def slurm_answers(env: dict[str, str] | None = None) -> bool:
    """Whether sbatch is here and a Slurm controller answers."""
    if not shutil.which("sbatch") or not shutil.which("squeue"):
        return False
    try:
        out = subprocess.run(["squeue", "-h", "-o", "%i", "-u", os.environ.get("USER", "root")], capture_output=True,
                             text=True, timeout=15, env=env)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0


def choose(facts: Facts, options: ValidateOptions) -> tuple[str, str]:
    """(scheduler, launcher) for this run."""
    v = validation_of(facts)
    scheduler = options.scheduler
    if scheduler not in ("auto", "slurm", "none"):
        raise InputError("--scheduler", f"must be auto, slurm or none, not {scheduler!r}")
    if scheduler == "auto":
        scheduler = "slurm" if facts.scheduler.kind == "slurm" and slurm_answers() else "none"
    if options.launcher:
        if options.launcher not in v.launchers:
            raise InputError("--launcher", f"the site installs jobs for {', '.join(v.launchers)}, not {options.launcher!r}")
        launcher = options.launcher
    elif scheduler == "slurm":
        launcher = v.launchers[0]
    else:
        launcher = next((name for name in v.launchers if name in LOCAL_LAUNCHERS), "")
    if scheduler == "none" and launcher not in LOCAL_LAUNCHERS:
        raise InputError("--scheduler", f"without a scheduler the job runs with torchrun or mpiexec; this site installs "
                         f"{', '.join(v.launchers)} (no Slurm answered here)")
    if scheduler == "none" and options.nodes > 1:
        raise InputError("--nodes", "without a scheduler the job runs on this node only")
    return scheduler, launcher


def validate(site: Site, options: ValidateOptions, reporter: Reporter) -> Outcome:
    """Run (or collect) the site's validation job; report the verdict; return the outcome."""
    host = local_host()
    values = site.placeholder_values(home=host.home(), user=host.user(), account=options.account, prefix=options.prefix)
    from sitestack.core import schema

    facts = schema.build(Facts, site.resolved_facts(values), site.path, line=0, key="facts")
    directory = install_dir(site, values)
    root = Path(options.results or Path.home() / "sitestack-validation" / site.name).expanduser().resolve()
    if options.collect:
        return collect(site, options.collect, root, options, reporter)
    scheduler, launcher = choose(facts, options)
    script = Path(directory) / "jobs" / script_name(launcher)
    if not script.is_file():
        raise SitestackError(f"the validation job is not installed ({script} missing): run "
                             f"`invoke install-validation-job --site {site.name}` first")
    root.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    if options.ranks_per_node:
        env["SITESTACK_RANKS_PER_NODE"] = str(options.ranks_per_node)
    if options.python:
        env["SITESTACK_PYTHON"] = options.python
    if scheduler == "slurm":
        argv = ["sbatch", "--parsable", f"--chdir={root}"]
        if options.nodes:
            argv.append(f"--nodes={options.nodes}")
        if options.ranks_per_node and validation_of(facts).sbatch_tasks:
            argv.append(f"--ntasks-per-node={options.ranks_per_node}")
        argv.append(str(script))
        out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
        if out.returncode != 0:
            raise SitestackError(f"sbatch refused the job: {(out.stderr or out.stdout).strip()}")
        job_id = out.stdout.strip().split(";")[0]
        reporter.note(f"submitted {script.name} to Slurm as job {job_id}; results in {root}/sitestack-validation-{job_id}/")
        if not options.wait:
            reporter.note(f"not waiting: `invoke validate --site {site.name} --collect {job_id}"
                          f"{' --results ' + str(root) if options.results else ''}` reads the verdict later")
            return Outcome(0, job_id, root / f"sitestack-validation-{job_id}", root / f"sitestack-validation-{job_id}.log")
        return collect(site, job_id, root, options, reporter)
    run_id = f"local-{os.getpid()}-{int(time.time())}"
    out_dir = root / f"sitestack-validation-{run_id}"
    log = root / f"sitestack-validation-{run_id}.log"
    env["SITESTACK_VALIDATION_OUT"] = str(out_dir)
    reporter.note(f"running {script.name} here without a scheduler ({launcher}); log {log}")
    with open(log, "w", encoding="utf-8") as handle:
        try:
            proc = subprocess.run(["bash", str(script)], cwd=root, env=env, stdout=handle, stderr=subprocess.STDOUT,
                                  timeout=options.timeout)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            rc = 124
    return finish(site, run_id, out_dir, log, rc, reporter)


def collect(site: Site, job_id: str, root: Path, options: ValidateOptions, reporter: Reporter) -> Outcome:
    """Wait for Slurm job ``job_id`` to end, then read its result."""
    if not re.fullmatch(r"\d+(_\d+)?", job_id):
        raise InputError("--collect", f"{job_id!r} is not a Slurm job id")
    deadline = time.monotonic() + options.timeout
    state = None
    while True:
        out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True, timeout=60)
        current = out.stdout.strip()
        if out.returncode != 0 or not current or current in FINISHED:
            break
        if current != state:
            reporter.note(f"job {job_id}: {current}")
            state = current
        if time.monotonic() > deadline:
            raise SitestackError(f"job {job_id} still {current} after {options.timeout:.0f}s (it keeps running; "
                                 f"`invoke validate --site {site.name} --collect {job_id}` reads it later)")
        time.sleep(options.poll)
    rc = slurm_exit_code(job_id)
    return finish(site, job_id, root / f"sitestack-validation-{job_id}", root / f"sitestack-validation-{job_id}.log", rc,
                  reporter)


def slurm_exit_code(job_id: str) -> int | None:
    """The batch script's exit code from ``scontrol show job`` (None once Slurm forgot the job)."""
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, timeout=60)
    match = re.search(r"\bExitCode=(\d+):(\d+)", out.stdout)
    return int(match.group(1)) if match else None


def finish(site: Site, job_id: str, out_dir: Path, log: Path, rc: int | None, reporter: Reporter) -> Outcome:
    path = out_dir / "result.json"
    if not path.is_file():
        tail = ""
        if log.is_file():
            tail = "\n".join(log.read_text(errors="replace").rstrip().splitlines()[-15:])
        raise SitestackError(f"job {job_id} left no result ({path} missing; exit code {rc}); log {log}:\n{tail}".rstrip())
    result = json.loads(path.read_text())
    reporter.note(verdict_table(result))
    artefacts = result.get("artefacts") or {}
    files = [str(out_dir / artefacts[k]) for k in ("markdown", "json", "plot") if artefacts.get(k)]
    reporter.note("report: " + ", ".join(files) + (f" (plot skipped: {artefacts['plot_note']})" if artefacts.get("plot_note") else ""))
    code = 0 if result.get("verdict") == "passed" and (rc in (0, None)) else 1
    return Outcome(code, job_id, out_dir, log, result)
