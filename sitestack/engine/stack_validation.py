"""``invoke validate --stack NAME`` and ``--all-stacks``: which stack's validation job runs.

A playbook's further stacks (``stacks:``, docs/playbooks.md "Several stacks") each have their own
install-validation-job step (``stack: NAME``), whose job is rendered with that stack's facts and
installed in its own directory (:func:`sitestack.actions.validation_job.job_dir`). ``--stack NAME``
runs that job, as :func:`sitestack.engine.validate.validate_stack` runs the playbook's own;
``--all-stacks`` runs every stack's in turn, the playbook's own first, and ends with one verdict line
per stack. Each run is recorded in the site's history with its stack's module and digest, and judged
against the earlier runs of that stack only (:mod:`sitestack.engine.regression`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from sitestack.core.errors import InputError, SitestackError
from sitestack.core.report import Reporter
from sitestack.model.options import ValidateOptions
from sitestack.model.site import Site


class Outcome(Protocol):
    """What this module reads of one run's :class:`sitestack.engine.validate.Outcome`."""

    @property
    def code(self) -> int: ...
    @property
    def job_id(self) -> str | None: ...
    @property
    def out_dir(self) -> object: ...
    @property
    def result(self) -> Mapping[str, object] | None: ...


#: What runs one stack's job (:func:`sitestack.engine.validate.validate_stack`), returning its outcome.
RunOne = Callable[[Site, ValidateOptions, Reporter], Outcome]


def has_job(site: Site, stack: str | None) -> bool:
    """Whether the playbook has an install-validation-job step for ``stack`` (None: its own stack)."""
    return any(s.action == "install-validation-job" and s.stack == stack for s in site.steps)


def stack_site(site: Site, stack: str | None) -> Site:
    """The playbook as the steps of ``stack`` see it (None: ``site`` itself); an :class:`InputError`
    naming ``--stack`` when the playbook has no such stack, or no validation job step for it."""
    if stack is None:
        return site
    if stack not in site.stacks:
        known = ", ".join(site.stacks) or "it has none"
        raise InputError("--stack", f"{stack!r} is not one of the stacks of {site.path} ({known})")
    if not has_job(site, stack):
        raise InputError("--stack", f"stack {stack} has no validation job: {site.path} has no install-validation-job "
                                    f"step with `stack: {stack}` (docs/validation.md)")
    return site.for_stack(stack)


def stack_label(stack: str | None) -> str:
    """How a verdict line names a stack: its key, or "(own)" for the playbook's own."""
    return stack if stack is not None else "(own)"


def verdict_line(stack: str | None, outcome: Outcome | None, error: str | None) -> str:
    """One stack's line of the ``--all-stacks`` summary: its key, its module (as its result says),
    PASSED/FAILED/submitted, the job; or the error that stopped its run."""
    label = stack_label(stack)
    if outcome is None:
        return f"  {label}: FAILED: {error}"
    result = outcome.result
    stack_part = result.get("stack") if result is not None else None
    module = str(stack_part.get("module") or "") if isinstance(stack_part, Mapping) else ""
    shown = f"{label} ({module})" if module else label
    job = f", job {outcome.job_id}" if outcome.job_id else ""
    if result is None:
        return f"  {shown}: {'submitted' if outcome.code == 0 else 'FAILED'}{job}"
    if outcome.code == 0:
        return f"  {shown}: PASSED{job}"
    # a job that passed fails the run on a regression against the stack's history (engine/regression.py)
    return f"  {shown}: FAILED (the job's verdict: {result['verdict']}){job}"


def validate_all(site: Site, options: ValidateOptions, reporter: Reporter,
                 run_one: RunOne) -> tuple[int, dict[str, Any]]:
    """Run every stack's job in turn (the playbook's own first, then ``stacks:`` in the playbook's order),
    each with ``options``; a stack whose run fails with an error does not stop the others. Ends with one
    verdict line per stack. Returns (1 when any stack failed, else 0; each stack's run as
    :func:`stack_document` gives it, by :func:`stack_label`). An :class:`InputError` before anything
    runs when a stack has no validation job step."""
    stacks: list[str | None] = [None, *site.stacks]
    missing = [s for s in stacks if not has_job(site, s)]
    if missing:
        raise InputError("--all-stacks", f"{site.path} has no install-validation-job step for stack "
                                         f"{', '.join(stack_label(s) for s in missing)}: add one with `stack: NAME` "
                                         "(docs/validation.md), or run the others with --stack")
    lines, failed = [], 0
    documents: dict[str, Any] = {}
    for stack in stacks:
        reporter.note(f"== stack {stack_label(stack)}")
        one = dataclasses.replace(options, stack=stack, all_stacks=False)
        try:
            outcome: Outcome | None = run_one(stack_site(site, stack), one, reporter)
            error = None
        except SitestackError as exc:   # InputError too: that stack's run only
            outcome, error = None, str(exc).splitlines()[0]
        failed += outcome is None or outcome.code != 0
        documents[stack_label(stack)] = stack_document(outcome, error)
        lines.append(verdict_line(stack, outcome, error))
    reporter.note(f"stacks: {len(stacks) - failed} of {len(stacks)} passed" + ("" if options.wait else " or submitted"))
    for line in lines:
        reporter.note(line)
    return (1 if failed else 0), documents


def stack_document(outcome: Outcome | None, error: str | None) -> dict[str, Any]:
    """One stack's part of ``invoke validate --all-stacks --json``: as the document of one run."""
    result = outcome.result if outcome is not None else None
    return {"job_id": outcome.job_id if outcome else None, "results_dir": outcome.out_dir if outcome else None,
            "verdict": result["verdict"] if result else None, "exit_code": outcome.code if outcome else 1,
            "error": error}
