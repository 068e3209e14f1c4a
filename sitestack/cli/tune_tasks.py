"""The tuning task: ``invoke tune`` (docs/tuning.md).

The engine is imported inside the task: its start pays only for what it runs.
"""

from __future__ import annotations

from typing import Any

from invoke.context import Context
from invoke.exceptions import Exit

from sitestack.cli.options import VALIDATE, Jobs
from sitestack.core.errors import SitestackError
from sitestack.engine.task_glue import errors_to_exit, options_of, options_task, playbook_path, reporter
from sitestack.model.options import ValidateOptions


@options_task(*VALIDATE, (ValidateOptions, "nodes ranks_per_node scheduler results timeout"), (Jobs, "sweep_check"))
def tune(c: Context, o: Any) -> None:
    """Run the site's tuning sweep (facts.tuning), choose the settings that beat the default beyond the
    noise, and keep the decision and its report in {prefix}/tuning for the stack's module."""
    from sitestack.engine import playbook as pb
    from sitestack.engine import results as results_mod
    from sitestack.engine import tune_run as tune_mod

    with errors_to_exit(o.debug):
        loaded = pb.load(o.site, playbook_path(o.playbook))
        options = options_of(ValidateOptions, c, o)
        report = reporter(debug=o.debug, json_target=o.json)
        try:
            outcome = tune_mod.tune(loaded, options, report, check=o.sweep_check)
        except SitestackError as exc:  # the document says what ended it
            results_mod.write(o.json, tune_mod.tune_document(loaded.name, None, str(exc)))
            raise
        results_mod.write(o.json, tune_mod.tune_document(loaded.name, outcome))
    if outcome.code:
        raise Exit(code=outcome.code)
