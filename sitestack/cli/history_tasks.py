"""The site's history: ``invoke history`` lists its validation and tuning runs (docs/history.md)."""

from __future__ import annotations

from typing import Any

from invoke.context import Context

from sitestack.cli.options import VALIDATE, Data, Listing
from sitestack.engine.task_glue import errors_to_exit, options_of, options_task, playbook_path
from sitestack.model.options import ValidateOptions, int_option


@options_task(*VALIDATE, Data, (Listing, "last perflog"))
def history(c: Context, o: Any) -> None:
    """List the site's validation and tuning runs: verdict, busbw, compute, start-up, stack digest, what changed."""
    import sys

    from sitestack.core import user_file
    from sitestack.core.errors import InputError
    from sitestack.core.quoting import printable
    from sitestack.engine import perflog as perflog_mod
    from sitestack.engine import playbook as pb
    from sitestack.engine import results as results_mod
    from sitestack.engine import site_history as history_mod
    from sitestack.engine import validate as validation_mod

    with errors_to_exit(o.debug):
        results_mod.check_target(o.json)
        user_file.check("--perflog", o.perflog)
        if o.perflog == "-" and o.json == "-":
            raise InputError("--perflog", "- is stdout, where --json - writes too: give one of them a file")
        count = int_option("--last", o.last, low=1, high=1_000_000) if o.last is not None else None
        loaded = pb.load(o.site, playbook_path(o.playbook))
        options = options_of(ValidateOptions, c, o)
        target = validation_mod.open_host(loaded, options)
        try:
            resolved = loaded.resolve(home=target.home(), user=target.user(), account=options.account, prefix=options.prefix)
            directory, runs, warnings = history_mod.list_runs(target, validation_mod.install_dir(loaded, resolved.values),
                                                              resolved.values["prefix"], count)
        finally:
            target.close()
        for warning in warnings:  # on stderr: the listing (and --json -) stays what it says
            print(f"warning: {printable(warning)}", file=sys.stderr)
        if o.perflog is not None:
            perflog_mod.write_perflog(runs, o.perflog, "--perflog")
        human = [history_mod.row_of(r) for r in runs] or [f"no runs in {directory} yet"]
        results_mod.emit(o.json, "history", {"site": loaded.name, "history_dir": directory, "runs": runs},
                         [f"history of {loaded.name}: {directory}", *human])
