"""Tasks about logs a user already has: nccl-log."""

from __future__ import annotations

from typing import Any

from invoke.context import Context
from invoke.exceptions import Exit

from sitestack.cli.flags import Data, Jobs, Task
from sitestack.engine.task_glue import errors_to_exit, options_task, playbook_path
from sitestack.model.options import split_list


@options_task((Task, "playbook debug"), (Jobs, "files log_site log_nodes"), Data)
def nccl_log(c: Context, o: Any) -> None:
    """Name the network NCCL/RCCL used on each host of a run (OFI and its provider, IB, IBext, sockets) and, with --site, whether it is the right one."""
    from sitestack.engine import log_verdict  # lazy: the classifier is read only when this task runs
    from sitestack.engine import playbook as pb
    from sitestack.engine import results as results_mod
    from sitestack.onsite import nccl_log as reader

    with errors_to_exit(o.debug):
        if o.log_nodes not in (None, "multi", "single"):
            raise Exit("error: --nodes: must be multi or single", code=1)
        results_mod.check_target(o.json)
        loaded = pb.load(o.log_site, playbook_path(o.playbook)) if o.log_site or o.playbook else None
        files = () if o.files is None else split_list("FILE", o.files)
        verdict = log_verdict.read_logs(files, loaded, None if o.log_nodes is None else o.log_nodes == "multi")
        results_mod.emit(o.json, "nccl-log", {"site": loaded.name if loaded else None, **verdict.as_dict()},
                         reader.render(verdict).splitlines())
    if verdict.status == reader.FAIL:
        raise Exit(code=1)
