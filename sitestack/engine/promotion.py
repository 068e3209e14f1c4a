"""Promotion: a stack becomes what ``module load <dir>`` loads only after its validation passed.

Where "published but not yet promoted" lives: in the module directory's record
(:mod:`sitestack.installs.modulerc`). A stack whose modulefiles step claims the default while another
stack of the directory holds it is installed and published as any stack is (its environment, its
module file), but its entry *awaits* the default: hidden from ``module avail``, loadable by its full
name, and the old default stays. :func:`promote` moves the default (rewrites the directory's rc files);
it refuses unless the site's validation history (:mod:`sitestack.engine.site_history`) has a passing
run of that exact generation: the run's ``stack.module`` is the stack's module and its
``stack.digest`` the plan digest of the stack's current manifest (what
:func:`sitestack.onsite.stack_digest.stack_record` records). ``--force`` promotes without one
and says so in the generation's record (``promoted``) and in the promotion log
(``<install_root>/.sitestack/promotions.jsonl``), as every promotion is.

``invoke provision`` calls :func:`after_provision`: for each stack that awaits the default it runs
the stack's validation job and promotes it on PASS; a FAIL leaves the old default and says so in one
line naming the run and its report. ``--no-promote`` leaves awaiting stacks hidden; check mode says
which stack would be validated and promoted. Rollback (``invoke rollback``) is apart: it switches a
stack's generation, not the directory's default. A new generation of the default stack under the same
module name waits the same way, beside the current generation (:mod:`sitestack.engine.generation_promotion`).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sitestack.actions import ACTIONS
from sitestack.core.bounded import read_bounded
from sitestack.core.errors import InputError, SitestackError
from sitestack.core.host import Host
from sitestack.core.report import HostRun, Reporter
from sitestack.core.step import Result
from sitestack.engine import lifecycle, stack_validation
from sitestack.engine import site_history as history
from sitestack.engine import validate as validation
from sitestack.engine.select import select_hosts
from sitestack.installs import generations as gens
from sitestack.installs import modulerc
from sitestack.installs.venv_manifest import plan_digest
from sitestack.model.context import RunContext, RunOptions
from sitestack.model.options import ValidateOptions
from sitestack.model.site import Site

#: The promotion log, under the module install root: one JSON object a line, every promotion.
LOG = ".sitestack/promotions.jsonl"
#: The largest promotion log read back before a line is added (older lines are dropped beyond it).
LOG_MAX = 1 << 20


@dataclass(frozen=True)
class Candidate:
    """A stack of the playbook and its module directory's record (as on the host, or as its
    modulefiles step would leave it in check mode)."""

    step: Any                         # the stack's modulefiles step (sitestack.actions.modulefiles.ModuleFiles)
    key: str | None                   # the playbook stack it belongs to (a step's ``stack:``; None: the playbook's own)
    state: modulerc.State

    @property
    def name(self) -> str:
        return str(self.step.stack.name)

    @property
    def awaiting(self) -> bool:
        return self.name in modulerc.awaiting(self.state)

    @property
    def holder(self) -> str | None:
        """The stack that holds the default of this one's format now."""
        fmt = self.step.fmt
        return next((n for n, m in self.state.stacks.items() if m.default and m.format == fmt), None)


def candidates(host: Host, ctx: RunContext, *, planned: bool) -> list[Candidate]:
    """Every stack the playbook's modulefiles steps install, with its directory's record: read from the
    host, or (``planned``: check mode) as the step would write it."""
    out = []
    for spec in ctx.site.steps:
        if spec.action != "modulefiles":
            continue
        step: Any = ACTIONS["modulefiles"].from_spec(spec, ctx.for_step(spec))
        if planned:
            text = step.rc_plan(host).record_text
        else:
            text = step.read(host, modulerc.record_path(step.root, modulerc.module_dir(step.stack.name)))
        out.append(Candidate(step, spec.stack, modulerc.read_state(text)))
    return out


def chosen(found: Sequence[Candidate], stack: str | None) -> Candidate:
    """The candidate ``--stack`` names; without it, the one that awaits the default."""
    if stack is not None:
        match = [c for c in found if c.name == stack]
        if not match:
            names = ", ".join(c.name for c in found) or "none"
            raise InputError("--stack", f"the playbook installs no module {stack!r} (its stacks: {names})")
        return match[0]
    waiting = [c for c in found if c.awaiting]
    if len(waiting) != 1:
        which = ", ".join(c.name for c in waiting) if waiting else "no stack awaits the default"
        raise InputError("--stack", f"name the stack to promote ({which})")
    return waiting[0]


# -- the generation a run must have validated --------------------------------------------------------
def current_generation(host: Host, stack: Any) -> tuple[str | None, str | None]:
    """(the stack's current generation's name, the plan digest of its manifest); None where unreadable."""
    link = host.probe(["readlink", "-e", "--", stack.path]).stdout.strip()
    manifest = host.read_json(stack.manifest)
    plan = manifest.get("plan") if manifest else None
    return (os.path.basename(link) or None, plan_digest(plan) if isinstance(plan, dict) else None)


def passing_run(host: Host, ctx: RunContext, module: str, digest: str | None,
                key: str | None = None) -> dict[str, Any] | None:
    """The newest validation run that passed (its checks and the regression comparison) with ``module``
    at ``digest``, in the history the validation job of playbook stack ``key`` (None: the playbook's own)
    records to, read with that job's program; None where there is none."""
    if digest is None:
        return None
    directory = validation.install_dir(ctx.site.for_stack(key), ctx.values)
    _dir, runs, _warnings = history.list_runs(host, directory, ctx.values["prefix"], None)
    for run in reversed(runs):
        stack = run.get("stack") or {}
        regression = run.get("regression") if isinstance(run.get("regression"), dict) else {}
        if (run.get("kind") == "validation" and run.get("verdict") == "passed" and regression.get("status") != "fail"
                and stack.get("module") == module and stack.get("digest") == digest):
            return dict(run)
    return None


# -- moving the default ------------------------------------------------------------------------------
def switch_default(host: Host, cand: Candidate) -> None:
    """Rewrite the directory's rc files and record with ``cand`` as its default (:func:`modulerc.promoted`)."""
    step = cand.step
    directory = modulerc.module_dir(cand.name)
    stacks = modulerc.promoted(cand.state, cand.name)
    files = modulerc.rc_files(stacks, step.template_dirs())
    for rel, text in files.items():
        host.write_text(f"{step.root}/{rel}", text, 0o644)
    for rel in cand.state.files:
        if rel not in files:
            host.run(["rm", "-f", "--", f"{step.root}/{rel}"])
    host.write_text(modulerc.record_path(step.root, directory), modulerc.State(stacks, tuple(files)).text(), 0o644)


def read_log(host: Host, root: str) -> str:
    """The promotion log under the module install root ``root`` ("" where there is none); a link or an
    oversized file there is refused."""
    return read_bounded(host, f"{root}/{LOG}", LOG_MAX, "not the promotion log sitestack writes; move it "
                        "aside", follow=False) or ""


def record(host: Host, path: str, root: str, entry: Mapping[str, Any]) -> None:
    """Note the promotion in the record of the current generation of stack path ``path`` (``promoted``) and
    a line of the promotion log under the module install root ``root``."""
    hist = gens.read_history(host, path)
    words = f"promoted {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(entry['at']))} by {entry['user']}: {entry['why']}"
    if hist.current is not None:
        mine = hist.find(hist.current) or gens.Generation(hist.current, 0.0, entry["digest"] or "")
        others = [g for g in hist.generations if g.name != mine.name]
        host.write_text(hist.record, replace(hist, generations=(*others, replace(mine, promoted=words))).to_json(),
                        0o644)
    log = f"{root}/{LOG}"
    before = read_log(host, root)
    if len(before.encode()) >= LOG_MAX // 2:
        before = "".join(before.splitlines(keepends=True)[len(before.splitlines()) // 2:])
    host.run(["mkdir", "-p", "--", os.path.dirname(log)])
    host.write_text(log, before + json.dumps(dict(entry), sort_keys=True) + "\n", 0o644)


def promote_on(host: Host, ctx: RunContext, cand: Candidate, *, force: bool, check: bool) -> str:
    """Promote ``cand`` on ``host`` (``check``: only say what would be done); the line that says what was.
    Refused (a :class:`SitestackError`) without a passing run of its current generation, unless ``force``."""
    holder = cand.holder
    if holder == cand.name:
        return f"{cand.name} is already the default of {modulerc.module_dir(cand.name)}/"
    if not cand.step.args.default:
        # promoted without its step's claim, the next provision would take the default back
        raise SitestackError(f"{cand.name}: its modulefiles step ({cand.step.name!r}) does not say `default: true`: "
                             "mark it, provision, then promote")
    generation, digest = current_generation(host, cand.step.stack)
    if generation is None:
        raise SitestackError(f"{cand.name}: its environment {cand.step.stack.path} is not installed: nothing to promote")
    run = passing_run(host, ctx, cand.name, digest, cand.key)
    if run is None and not force:
        raise SitestackError(
            f"{cand.name} ({generation}, digest {digest or 'unknown'}) has no passing validation run in the site's "
            f"history: run `invoke validate --site {ctx.site.name}{f' --stack {cand.key}' if cand.key else ''}` first, "
            "or promote with --force (recorded)")
    what = f"{cand.name} ({generation}) the default of {modulerc.module_dir(cand.name)}/" + (
        f" instead of {holder}" if holder else "")
    why = f"run {run['id']} passed" if run else "--force: no passing validation run of this generation"
    if check:
        return f"would make {what} ({why})"
    read_log(host, cand.step.root)  # a log that cannot be written stops the promotion before the default moves
    switch_default(host, cand)
    record(host, cand.step.stack.path, cand.step.root, {"at": time.time(), "user": host.user(), "stack": cand.name, "generation": generation,
                        "digest": digest, "previous": holder, "run": run["id"] if run else None,
                        "forced": run is None, "why": why})
    return f"made {what} ({why})"


def promote(site: Site, options: RunOptions, stack: str | None, *, force: bool,
            report: Reporter | None = None) -> str:
    """``invoke promote``: make ``stack`` (default: the one that awaits it) its directory's default."""
    with lifecycle.opened(site, options, read_only=options.check) as (host, ctx):
        cand = chosen(candidates(host, ctx, planned=False), stack)
        if options.check:
            return promote_on(host, ctx, cand, force=force, check=True)
        prefix = ctx.values["prefix"].rstrip("/")
        with lifecycle.locked(host, prefix, options, print if report is None else report.note):
            return promote_on(host, ctx, chosen(candidates(host, ctx, planned=False), cand.name), force=force,
                              check=False)


# -- after a provision -------------------------------------------------------------------------------
def stack_key(ctx: RunContext, name: str) -> str | None:
    """The playbook stack (a step's ``stack:``; None: the playbook's own) whose modulefiles step installs module ``name``."""
    for spec in ctx.site.steps:
        step: Any = ACTIONS["modulefiles"].from_spec(spec, ctx.for_step(spec)) if spec.action == "modulefiles" else None
        if step is not None and step.stack.name == name:
            return spec.stack
    raise InputError("--stack", f"the playbook installs no module {name!r}")


def validatable(site: Site, ctx: RunContext, name: str) -> bool:
    """Whether the playbook installs a validation job for the stack whose module is ``name``: an
    install-validation-job step of its playbook stack (:func:`stack_key`; ``invoke validate --stack KEY``)."""
    return stack_validation.has_job(site, stack_key(ctx, name))


def validate_stack(site: Site, options: RunOptions, name: str, reporter: Reporter,
                   key: str | None = None, job_env: Mapping[str, str] | None = None) -> validation.Outcome:
    """Run the validation job of the stack whose module is ``name``, of playbook stack ``key`` (None: the
    playbook's own; :func:`validatable`), on the site's first host, as ``invoke validate --stack KEY``
    does, and wait for its verdict (``job_env``: variables for the job)."""
    spec = select_hosts(site, options)[0]
    where = None if spec.connection == "local" else spec.name
    return validation.validate(site, ValidateOptions(prefix=options.prefix, account=options.account, host=where,
                                                     accept_new_host_keys=options.accept_new_host_keys, stack=key),
                               reporter, job_env)


def report_of(outcome: validation.Outcome) -> str:
    """The run's report (its markdown summary), else its results directory, else its log."""
    artefacts: Mapping[str, Any] = dict(outcome.result["artefacts"]) if outcome.result else {}
    if outcome.out_dir is not None and artefacts.get("markdown"):
        return f"{outcome.out_dir}/{artefacts['markdown']}"
    return str(outcome.out_dir or outcome.log or "none")


def validated(site: Site, options: RunOptions, ctx: RunContext, host: Host, cand: Candidate,
              reporter: Reporter) -> Result:
    """Validate ``cand`` and promote it on PASS; a FAIL (or a job that could not run) leaves the old default."""
    step = f"promote {cand.name}"
    try:
        outcome = validate_stack(site, options, cand.name, reporter, cand.key)
    except SitestackError as exc:
        return Result(step, "failed", f"not promoted: its validation did not run ({exc}); {cand.holder} stays the "
                                      "default")
    if outcome.code != 0:
        report = report_of(outcome)
        return Result(step, "failed", f"not promoted: validation run {outcome.job_id} failed (report {report}); "
                                      f"{cand.holder} stays the default")
    prefix = ctx.values["prefix"].rstrip("/")
    with lifecycle.locked(host, prefix, options, reporter.note):
        fresh = chosen(candidates(host, ctx, planned=False), cand.name)
        try:
            return Result(step, "changed", promote_on(host, ctx, fresh, force=False, check=False))
        except SitestackError as exc:
            return Result(step, "failed", f"not promoted: {exc}")


def hidden(site: Site, cand: Candidate, why: str) -> Result:
    """The result of leaving ``cand`` hidden, awaiting the default, and how to promote it later."""
    return Result(f"promote {cand.name}", "ok", f"left hidden ({why}); {cand.holder} stays the default: "
                                                f"`invoke promote --site {site.name} --stack {cand.name}` after validating it")


def after_provision(site: Site, options: RunOptions, runs: list[HostRun], reporter: Reporter) -> list[HostRun]:
    """Validate and promote each stack that awaits its directory's default, on the site's first host
    (``options.promote``; check mode: say so); each outcome is a result of that host's run."""
    if not runs or any(r.failed for r in runs):
        return runs  # a failed run promotes nothing: `invoke promote` does it later
    if not any(spec.action == "modulefiles" and spec.args.get("default") is True for spec in site.steps):
        return runs  # no stack claims a default: nothing can await one (and no second connection is opened)
    with lifecycle.opened(site, options, read_only=options.check or not options.promote) as (host, ctx):
        waiting = [c for c in candidates(host, ctx, planned=options.check) if c.awaiting]
        for cand in waiting:
            if not options.promote:
                result = hidden(site, cand, "--no-promote")
            elif not validatable(site, ctx, cand.name):
                result = hidden(site, cand, "the playbook has no validation job for it")
            elif options.check:
                result = Result(f"promote {cand.name}", "changed", f"would validate {cand.name} and make it the "
                                f"default on PASS ({cand.holder} until then)")
            else:
                result = validated(site, options, ctx, host, cand, reporter)
            runs[0].results.append(result)
            reporter.result(runs[0].host, result)
    return runs


__all__ = ["after_provision", "candidates", "promote", "promote_on"]
