"""A new generation of a default stack is switched in only after its validation passed.

A change of a stack's pins, extras or built wheels makes its next generation
(:mod:`sitestack.actions.stack_venv`). Where the stack claims its module directory's default and the
playbook validates it (:func:`sitestack.actions.stack_venv.waits_for_validation`), the step records
the new generation *pending* beside the current one (:meth:`sitestack.installs.generations.History.pending`)
and leaves the stable link, which ``module load pytorch`` and ``module load pytorch/X`` resolve, on
the current one. The first generation switches in at once: there is nothing to protect.

``invoke provision`` then runs the validation job on the pending generation (:func:`after_provision`):
the job gets ``SITESTACK_PENDING_GENERATION`` (:data:`sitestack.onsite.stack_digest.PENDING_VAR`), which
the stack's module file loads instead of the link's target, so the job's record carries the pending
generation's digest (:func:`sitestack.onsite.stack_digest.loaded_manifest`) while users still load the
current one. On PASS the link is switched to it (one rename: :func:`sitestack.installs.generations.switch`);
the generation switched out is retired, so ``invoke rollback`` goes back to it. A FAIL leaves the current
generation and says so in one line. ``--no-promote`` leaves it pending; ``invoke promote`` switches it in
later (:func:`promote`), refused without a passing run of that generation's digest in the site's history
unless ``--force``; every switch is recorded as a promotion (:func:`sitestack.engine.promotion.record`).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

from sitestack.actions import ACTIONS
from sitestack.actions.stack_venv import waits_for_validation
from sitestack.core.errors import InputError, SitestackError
from sitestack.core.host import Host
from sitestack.core.report import HostRun, Reporter
from sitestack.core.step import Result
from sitestack.engine import lifecycle, promotion
from sitestack.installs import generations as gens
from sitestack.installs.venv_manifest import plan_digest
from sitestack.installs.venv_stack import module_root
from sitestack.model.context import RunContext, RunOptions
from sitestack.model.site import Site
from sitestack.onsite.stack_digest import PENDING_VAR


@dataclass(frozen=True)
class Pending:
    """A stack's generation that waits for its validation (check mode: one its step would build)."""

    step: Any             # the stack's stack-venv step (sitestack.actions.stack_venv.StackVenv)
    name: str | None      # the generation's directory beside the stack's link; None: not built yet (check mode)
    digest: str           # its plan digest, what the validation's record must carry
    current: str          # the generation the link points at, which users load until the switch
    key: str | None = None  # the playbook stack it belongs to (a step's ``stack:``; None: the playbook's own)

    @property
    def module(self) -> str:
        return str(self.step.stack.name)

    @property
    def label(self) -> str:
        return self.name or self.digest

    @property
    def path(self) -> str:
        return f"{os.path.dirname(self.step.stack.path)}/{self.name}"


def pending(host: Host, ctx: RunContext, *, planned: bool) -> list[Pending]:
    """The generations of the playbook's stacks that wait for their validation on ``host``; ``planned``
    (check mode): also the ones the stacks' steps would build now."""
    out = []
    for spec in ctx.site.steps:
        if spec.action != "stack-venv" or not waits_for_validation(ctx.site, spec.stack):
            continue
        step: Any = ACTIONS["stack-venv"].from_spec(spec, ctx.for_step(spec))
        current = gens.read_history(host, step.stack.path).current
        if current is None:
            continue  # the first generation switches in at once
        found = step.pending_for(host)
        if found is not None:
            out.append(Pending(step, found.name, found.digest, current, spec.stack))
        elif planned:
            digest = plan_digest(step.desired(host)[0])
            if digest != promotion.current_generation(host, step.stack)[1]:
                out.append(Pending(step, None, digest, current, spec.stack))
    return out


def switch_in(host: Host, ctx: RunContext, item: Pending, *, force: bool, check: bool) -> str:
    """Switch ``item`` in (``check``: only say so); the line that says what was done. Refused (a
    :class:`SitestackError`) without a passing run of its digest in the site's history, unless ``force``."""
    run = promotion.passing_run(host, ctx, item.module, item.digest, item.key)
    if run is None and not force:
        raise SitestackError(
            f"{item.module}: generation {item.label} (digest {item.digest}) has no passing validation run in the "
            f"site's history: `invoke provision --site {ctx.site.name}` validates it, or switch it in with --force "
            "(recorded)")
    what = f"generation {item.label} of {item.module} (instead of {item.current})"
    why = f"run {run['id']} passed" if run else "--force: no passing validation run of this generation"
    if check:
        return f"would switch in {what} ({why})"
    root = module_root(item.step.ctx)
    promotion.read_log(host, root)  # a log that cannot be written stops the switch before it happens
    history = gens.read_history(host, item.step.stack.path)
    entry = history.find(item.name or "")
    if entry is None or not entry.pending or item.name not in history.on_disk:
        raise SitestackError(f"{item.module}: generation {item.label} is no longer pending: provision again")
    gens.switch(host, history, entry)
    promotion.record(host, item.step.stack.path, root, {
        "at": time.time(), "user": host.user(), "stack": item.module, "generation": item.name,
        "digest": item.digest, "previous": item.current, "run": run["id"] if run else None,
        "forced": run is None, "why": why})
    return f"switched in {what} ({why})"


def validated(site: Site, options: RunOptions, ctx: RunContext, host: Host, item: Pending,
              reporter: Reporter) -> Result:
    """Run the validation job on ``item`` (the module loads it: :data:`PENDING_VAR`) and switch it in on
    PASS; a FAIL (or a job that could not run) leaves the current generation."""
    step, stays = f"switch in {item.module}", f"{item.current} stays what {item.module} loads"
    try:
        outcome = promotion.validate_stack(site, options, item.module, reporter, item.key,
                                           {PENDING_VAR: item.path})
    except SitestackError as exc:
        return Result(step, "failed", f"not switched in: the validation of generation {item.label} did not run "
                                      f"({exc}); {stays}")
    if outcome.code != 0:
        return Result(step, "failed", f"not switched in: validation run {outcome.job_id} of generation {item.label} "
                                      f"failed (report {promotion.report_of(outcome)}); {stays}")
    with lifecycle.locked(host, ctx.values["prefix"].rstrip("/"), options, reporter.note):
        try:
            return Result(step, "changed", switch_in(host, ctx, item, force=False, check=False))
        except SitestackError as exc:
            return Result(step, "failed", f"not switched in: {exc}")


def outcome(site: Site, options: RunOptions, ctx: RunContext, host: Host, item: Pending,
            reporter: Reporter) -> Result:
    """What becomes of ``item`` after a provision (``--no-promote``, check mode, else its validation)."""
    if not options.promote:
        return Result(f"switch in {item.module}", "ok", f"generation {item.label} left pending (--no-promote); "
                      f"{item.current} stays: `invoke promote --site {site.name} --stack {item.module}` after it passed")
    if options.check:
        return Result(f"switch in {item.module}", "changed", f"would validate generation {item.label} of "
                      f"{item.module} and switch it in on PASS ({item.current} until then)")
    return validated(site, options, ctx, host, item, reporter)


def after_provision(site: Site, options: RunOptions, runs: list[HostRun], reporter: Reporter) -> list[HostRun]:
    """Validate each pending generation on the site's first host and switch it in on PASS; each outcome is a
    result of that host's run. A failed run switches nothing (``invoke promote`` does it later)."""
    if not runs or any(r.failed for r in runs):
        return runs
    if not any(s.action == "stack-venv" and waits_for_validation(site, s.stack) for s in site.steps):
        return runs  # no stack waits: no second connection is opened
    with lifecycle.opened(site, options, read_only=options.check or not options.promote) as (host, ctx):
        for item in pending(host, ctx, planned=options.check):
            result = outcome(site, options, ctx, host, item, reporter)
            runs[0].results.append(result)
            reporter.result(runs[0].host, result)
    return runs


def promote(site: Site, options: RunOptions, stack: str | None, *, force: bool,
            report: Reporter | None = None) -> str:
    """``invoke promote``: switch in the pending generation of ``stack`` (default: the one pending) where
    there is one, else make the stack its directory's default (:func:`sitestack.engine.promotion.promote`)."""
    with lifecycle.opened(site, options, read_only=True) as (host, ctx):
        found = [p for p in pending(host, ctx, planned=False) if stack is None or p.module == stack]
    if not found:
        return promotion.promote(site, options, stack, force=force, report=report)
    if len(found) > 1:
        raise InputError("--stack", f"name the stack to switch in ({', '.join(p.module for p in found)})")
    with lifecycle.opened(site, options, read_only=options.check) as (host, ctx):
        if options.check:
            return switch_in(host, ctx, found[0], force=force, check=True)
        with lifecycle.locked(host, ctx.values["prefix"].rstrip("/"), options, print if report is None else report.note):
            fresh = [p for p in pending(host, ctx, planned=False) if p.module == found[0].module]
            if not fresh:
                raise SitestackError(f"{found[0].module}: generation {found[0].label} is no longer pending")
            return switch_in(host, ctx, fresh[0], force=force, check=False)


__all__ = ["after_provision", "pending", "promote", "switch_in"]
