"""Tasks about logs a user already has: nccl-log."""

from __future__ import annotations

from invoke.context import Context
from invoke.exceptions import Exit
from invoke.tasks import task

from sitestack.cli.common import DATA_JSON_HELP, DEBUG_HELP, PLAYBOOK_HELP, SITE_HELP
from sitestack.engine.task_glue import SitestackTask, errors_to_exit, playbook_path, split_list
from sitestack.onsite.nccl_lines import LINE_MAX, MESSAGES_MAX


@task(klass=SitestackTask, auto_shortflags=False, positional=["files"], help={
    "files": "NCCL_DEBUG=INFO log files of one run: paths or quoted globs, comma-separated (e.g. 'out/nccl/*.log'); "
             f"read line by line, each line up to {LINE_MAX // 1024} KiB, at most {MESSAGES_MAX} NCCL messages in all "
             "(the verdict notes a cut)",
    "site": SITE_HELP + "; judge against what its facts expect (network plugin, libfabric provider, fabric)",
    "playbook": PLAYBOOK_HELP, "nodes": "multi (the run spanned nodes) or single; default: what the logs show (nNodes, local ranks, "
             "channels via NET, bootstrap addresses, host names), WARN when they cannot tell",
    "json": DATA_JSON_HELP, "debug": DEBUG_HELP})
def nccl_log(c: Context, files: str | None = None, site: str | None = None, playbook: str | None = None,
             nodes: str | None = None, json: str | None = None, debug: bool = False) -> None:
    """Name the network NCCL/RCCL used on each host of a run (OFI and its provider, IB, IBext, sockets) and, with --site, whether it is the right one."""
    from sitestack.engine import log_verdict  # lazy: the classifier is read only when this task runs
    from sitestack.engine import playbook as pb
    from sitestack.engine import results as results_mod
    from sitestack.onsite import nccl_log as reader

    with errors_to_exit(debug):
        if nodes not in (None, "multi", "single"):
            raise Exit("error: --nodes: must be multi or single", code=1)
        results_mod.check_target(json)
        loaded = pb.load(site, playbook_path(playbook)) if site or playbook else None
        verdict = log_verdict.read_logs(split_list(files, "FILE"), loaded, None if nodes is None else nodes == "multi")
        results_mod.emit(json, "nccl-log", {"site": loaded.name if loaded else None, **verdict.as_dict()},
                         reader.render(verdict).splitlines())
    if verdict.status == reader.FAIL:
        raise Exit(code=1)
