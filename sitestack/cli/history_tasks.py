"""The site's history: ``invoke history`` lists its validation and tuning runs (docs/history.md)."""

from __future__ import annotations

from invoke.context import Context
from invoke.tasks import task

from sitestack.cli.common import ACCOUNT_HELP, DATA_JSON_HELP, DEBUG_HELP, PLAYBOOK_HELP, PREFIX_HELP, SITE_HELP
from sitestack.engine.task_glue import SitestackTask, account_option, errors_to_exit, int_option, playbook_path, setting


@task(klass=SitestackTask, auto_shortflags=False, help={
    "site": SITE_HELP, "json": DATA_JSON_HELP, "prefix": PREFIX_HELP, "account": ACCOUNT_HELP, "playbook": PLAYBOOK_HELP,
    "host": "read the history on this host over SSH (a playbook host, an ssh-config alias or a host name); default: here",
    "last": "show only the last N runs (default: all)",
    "perflog": "also write the site's validation runs as a ReFrame perflog to FILE (- for stdout); see docs/history.md",
    "accept-new-host-keys": "accept SSH host keys not yet in known_hosts (default: refuse)", "debug": DEBUG_HELP})
def history(c: Context, site: str | None = None, json: str | None = None, host: str | None = None,
            prefix: str | None = None, last: str | None = None, account: str | None = None, playbook: str | None = None,
            perflog: str | None = None, accept_new_host_keys: bool = False, debug: bool = False) -> None:
    """List the site's validation and tuning runs: verdict, busbw, compute, start-up, stack digest, what changed."""
    import sys

    from sitestack.core import user_file
    from sitestack.core.errors import InputError
    from sitestack.engine import perflog as perflog_mod
    from sitestack.engine import playbook as pb
    from sitestack.engine import results as results_mod
    from sitestack.engine import site_history as history_mod
    from sitestack.engine import validate as validation_mod
    from sitestack.onsite.visible import one_line as printable

    with errors_to_exit(debug):
        results_mod.check_target(json)
        user_file.check("--perflog", perflog)
        if perflog == "-" and json == "-":
            raise InputError("--perflog", "- is stdout, where --json - writes too: give one of them a file")
        count = int_option("--last", last, low=1, high=1_000_000) if last is not None else None
        loaded = pb.load(site, playbook_path(playbook))
        options = validation_mod.ValidateOptions(prefix=setting(c, "prefix", prefix), account=account_option(
            setting(c, "account", account)), host=host, accept_new_host_keys=accept_new_host_keys)
        target = validation_mod.open_host(loaded, options)
        try:
            resolved = loaded.resolve(home=target.home(), user=target.user(), account=options.account, prefix=options.prefix)
            directory, runs, warnings = history_mod.list_runs(target, validation_mod.install_dir(loaded, resolved.values),
                                                              resolved.values["prefix"], count)
        finally:
            target.close()
        for warning in warnings:  # on stderr: the listing (and --json -) stays what it says
            print(f"warning: {printable(warning)}", file=sys.stderr)
        if perflog is not None:
            perflog_mod.write_perflog(runs, perflog, "--perflog")
        human = [history_mod.row_of(r) for r in runs] or [f"no runs in {directory} yet"]
        results_mod.emit(json, "history", {"site": loaded.name, "history_dir": directory, "runs": runs},
                         [f"history of {loaded.name}: {directory}", *human])
