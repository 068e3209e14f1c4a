"""The tuning task: ``invoke tune`` (docs/tuning.md).

The engine is imported inside the task: its start pays only for what it runs.
"""

from __future__ import annotations

from typing import Any

from invoke.context import Context

from sitestack.cli.flags import VALIDATE, Jobs
from sitestack.engine.task_glue import job_task, options_task
from sitestack.model.options import ValidateOptions


@options_task(*VALIDATE, (ValidateOptions, "nodes ranks_per_node scheduler results timeout"), (Jobs, "sweep_check"))
def tune(c: Context, o: Any) -> None:
    """Run the site's tuning sweep (facts.tuning), choose the settings that beat the default beyond the
    noise, and keep the decision and its report in {prefix}/tuning for the stack's module."""
    from sitestack.engine import tune_run

    job_task(c, o, lambda site, options, report: tune_run.tune(site, options, report, check=o.sweep_check),
             tune_run.tune_document)
