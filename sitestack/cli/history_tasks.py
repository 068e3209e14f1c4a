"""The site's history: ``invoke history`` lists its validation and tuning runs (docs/history.md)."""

from __future__ import annotations

from typing import Any

from invoke.context import Context

from sitestack.cli.flags import VALIDATE, Data, Listing
from sitestack.core.errors import InputError
from sitestack.engine.task_glue import emit_data, options_of, options_task, playbook_path
from sitestack.model.options import ValidateOptions, int_option


@options_task(*VALIDATE, Data, (Listing, "last perflog"))
def history(c: Context, o: Any) -> None:
    """List the site's validation and tuning runs: verdict, busbw, compute, start-up, stack digest, what changed."""
    from sitestack.core import user_file
    from sitestack.engine import listings
    from sitestack.engine import playbook as pb

    def listing() -> tuple[dict[str, Any], list[str]]:
        user_file.check("--perflog", o.perflog)
        if o.perflog == "-" and o.json == "-":
            raise InputError("--perflog", "- is stdout, where --json - writes too: give one of them a file")
        count = int_option("--last", o.last, low=1, high=1_000_000) if o.last is not None else None
        loaded = pb.load(o.site, playbook_path(o.playbook))
        return listings.history(loaded, options_of(ValidateOptions, c, o), count, o.perflog)
    emit_data(o, "history", listing)
