"""Tasks about containers and packed environments: pack-env."""

from __future__ import annotations

from invoke.context import Context
from invoke.tasks import task

from sitestack.cli import common
from sitestack.engine.task_glue import SitestackTask, errors_to_exit, finish, playbook_path, reporter, run_options


@task(klass=SitestackTask, auto_shortflags=False, iterable=["host"], help={
    "site": common.SITE_HELP,
    "name": "the environment's name (default: the playbook's pack-env steps, all of them; with an env.yml: its name:)",
    "requirements": "a requirements.txt or a conda env.yml to pack (overrides the playbook step's)",
    "dest": "where it goes (default: <prefix>/envs/<name>); put <dest>/bin on PATH",
    "check": "change nothing; report whether it would pack and why",
    "diff": "show diffs where a step has them",
    "fail-on-change": "with --check: exit 2 when it would pack",
    "host": "run on this host (repeatable); default: the playbook's hosts",
    "prefix": common.PREFIX_HELP, "account": common.ACCOUNT_HELP, "playbook": common.PLAYBOOK_HELP,
    "accept-new-host-keys": "accept SSH host keys not yet in known_hosts (default: refuse)",
    "json": common.JSON_HELP, "verbose": common.VERBOSE_HELP, "debug": common.DEBUG_HELP})
def pack_env(c: Context, site: str | None = None, name: str | None = None, requirements: str | None = None,
             dest: str | None = None, check: bool = False, diff: bool = False, fail_on_change: bool = False,
             host: list[str] | None = None, prefix: str | None = None, account: str | None = None,
             playbook: str | None = None, accept_new_host_keys: bool = False, json: str | None = None,
             verbose: bool = False, debug: bool = False) -> None:
    """Pack a Python environment (a requirements.txt or a conda env.yml) into one squashfs image, wrappers in <dest>/bin."""
    from sitestack.engine import partial_run  # imported by the task that uses it: the CLI starts light

    with errors_to_exit(debug):
        options = run_options(c, check=check, diff=diff, fail_on_change=fail_on_change,
                              hosts=tuple(host or ()), prefix=prefix, account=account,
                              accept_new_host_keys=accept_new_host_keys, verbose=verbose)
        report = reporter(diff, debug, json)
        runs = partial_run.pack_env(site=site, playbook=playbook_path(playbook), name=name, requirements=requirements,
                                    dest=dest, options=options, reporter=report)
        finish("pack-env", runs, report, check=check, fail_on_change=fail_on_change, json_target=json)
