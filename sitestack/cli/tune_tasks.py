"""The tuning task: ``invoke tune`` (docs/tuning.md).

The engine is imported inside the task: its start pays only for what it runs.
"""

from __future__ import annotations

from invoke.context import Context
from invoke.exceptions import Exit
from invoke.tasks import task

from sitestack.cli.common import ACCOUNT_HELP, DEBUG_HELP, JSON_HELP, PLAYBOOK_HELP, PREFIX_HELP, SITE_HELP
from sitestack.core.errors import SitestackError
from sitestack.engine.task_glue import (
    SitestackTask,
    account_option,
    errors_to_exit,
    int_option,
    playbook_path,
    reporter,
    setting,
)

TUNE_HELP = {
    "site": SITE_HELP, "nodes": "nodes to run the sweep on (default: 1)",
    "ranks-per-node": "ranks per node (default: the site's validation.ranks_per_node)",
    "scheduler": "auto (Slurm when it answers on the host), slurm, or none (mpiexec or torchrun on the host, one node)",
    "host": "run on this host over SSH (a playbook host, an ssh-config alias or a host name); default: here",
    "results": "directory for the sweep's log and results (default: ~/sitestack-validation/<site>)",
    "check": "submit nothing: show the points the sweep would run and what the stack's module sets now",
    "timeout": "seconds to wait for the sweep job (default: 3600)",
    "prefix": PREFIX_HELP, "account": ACCOUNT_HELP, "playbook": PLAYBOOK_HELP, "json": JSON_HELP, "debug": DEBUG_HELP,
    "accept-new-host-keys": "accept SSH host keys not yet in known_hosts (default: refuse)",
}


@task(klass=SitestackTask, auto_shortflags=False, help=TUNE_HELP)
def tune(c: Context, site: str | None = None, nodes: str | None = None, ranks_per_node: str | None = None,
         scheduler: str = "auto", host: str | None = None, results: str | None = None, check: bool = False,
         timeout: str | None = None, prefix: str | None = None, account: str | None = None,
         playbook: str | None = None, json: str | None = None, accept_new_host_keys: bool = False,
         debug: bool = False) -> None:
    """Run the site's tuning sweep (facts.tuning), choose the settings that beat the default beyond the
    noise, and keep the decision and its report in {prefix}/tuning for the stack's module."""
    from sitestack.engine import playbook as pb
    from sitestack.engine import results as results_mod
    from sitestack.engine import tune_run as tune_mod
    from sitestack.engine.validate import ValidateOptions

    with errors_to_exit(debug):
        loaded = pb.load(site, playbook_path(playbook))
        options = ValidateOptions(
            nodes=int_option("--nodes", nodes or 0, low=0, high=100000),
            ranks_per_node=int_option("--ranks-per-node", ranks_per_node or 0, low=0, high=1024), scheduler=scheduler,
            results=results, prefix=setting(c, "prefix", prefix), account=account_option(setting(c, "account", account)),
            timeout=float(int_option("--timeout", timeout or 3600, low=1, high=7 * 24 * 3600)), host=host,
            accept_new_host_keys=accept_new_host_keys)
        report = reporter(debug=debug, json_target=json)
        try:
            outcome = tune_mod.tune(loaded, options, report, check=check)
        except SitestackError as exc:  # the document says what ended it
            results_mod.write(json, tune_mod.tune_document(loaded.name, None, str(exc)))
            raise
        results_mod.write(json, tune_mod.tune_document(loaded.name, outcome))
    if outcome.code:
        raise Exit(code=outcome.code)
