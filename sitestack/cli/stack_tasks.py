"""Tasks about the stack and what is installed: install-venv, install-modulefiles,
install-validation-job, validate, installed, uninstall, gc.

The engine is imported inside each task: a task's start pays only for what that task runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

from invoke.context import Context
from invoke.exceptions import Exit
from invoke.tasks import task

from sitestack.cli.common import (
    ACCOUNT_HELP,
    DATA_JSON_HELP,
    DEBUG_HELP,
    JSON_HELP,
    PLAYBOOK_HELP,
    PREFIX_HELP,
    SITE_HELP,
    VERBOSE_HELP,
)
from sitestack.core.errors import InputError as _InputError
from sitestack.core.errors import SitestackError
from sitestack.engine.task_glue import (
    SitestackTask,
    account_option,
    errors_to_exit,
    finish,
    int_option,
    playbook_path,
    reporter,
    run_options,
    setting,
    size_option,
)

if TYPE_CHECKING:
    from sitestack.core.report import HostRun

# -- the validation job ----------------------------------------------------------------------------

VALIDATION_PYTHON_HELP = "the Python that runs the checks (default: facts.python.executable; the job's $SITESTACK_PYTHON overrides)"


@task(klass=SitestackTask, auto_shortflags=False, iterable=["host"], help={
    "site": SITE_HELP, "check": "change nothing; report what would change", "diff": "show a diff of the files that change",
    "host": "install on this host (repeatable); default: the playbook's hosts", "prefix": PREFIX_HELP,
    "account": ACCOUNT_HELP, "python": VALIDATION_PYTHON_HELP, "playbook": PLAYBOOK_HELP,
    "accept-new-host-keys": "accept SSH host keys not yet in known_hosts (default: refuse)", "json": JSON_HELP,
    "verbose": VERBOSE_HELP, "debug": DEBUG_HELP})
def install_validation_job(c: Context, site: str | None = None, check: bool = False, diff: bool = False,
                           host: list[str] | None = None, prefix: str | None = None, account: str | None = None,
                           python: str | None = None, playbook: str | None = None, accept_new_host_keys: bool = False,
                           json: str | None = None, verbose: bool = False, debug: bool = False) -> None:
    """Install the validation DDP job (check program, batch scripts, README, MPI probe) into the site prefix."""
    from sitestack.engine import playbook as pb

    with errors_to_exit(debug):
        loaded = pb.load(site, playbook_path(playbook))
        step = next((s for s in loaded.steps if s.action == "install-validation-job"), None)
        if step is None:
            raise _InputError(loaded.path, "the playbook has no install-validation-job step")
        options = run_options(c, check=check, diff=diff, tags=(step.name,), hosts=tuple(host or ()), prefix=prefix,
                              account=account, accept_new_host_keys=accept_new_host_keys, python=python,
                              verbose=verbose)
        report = reporter(diff, debug, json)
        runs = pb.provision(loaded, options, report)
        finish("install-validation-job", runs, report, check=check, fail_on_change=False, json_target=json)


@task(klass=SitestackTask, auto_shortflags=False, help={
    "site": SITE_HELP, "nodes": "nodes to run on (default: 1)",
    "ranks-per-node": "ranks per node (default: the site's validation.ranks_per_node)",
    "launcher": "which installed batch script: srun, mpiexec, torchrun or horovodrun (default: the site's first)",
    "scheduler": "auto (Slurm when it answers on the host), slurm, or none (torchrun, mpiexec or horovodrun on the host, one node)",
    "wait": "wait for the job and print its verdict (--no-wait: submit and return)",
    "collect": "read the verdict of this earlier Slurm job id instead of submitting",
    "results": "directory for the job's log and results (default: ~/sitestack-validation/<site>)",
    "prefix": PREFIX_HELP, "account": ACCOUNT_HELP, "python": VALIDATION_PYTHON_HELP,
    "timeout": "seconds to wait for the job (default: 3600)", "playbook": PLAYBOOK_HELP, "debug": DEBUG_HELP,
    "host": "run on this host over SSH (a playbook host, an ssh-config alias or a host name); default: here",
    "json": JSON_HELP, "accept-new-host-keys": "accept SSH host keys not yet in known_hosts (default: refuse)"})
def validate(c: Context, site: str | None = None, nodes: str | None = None, ranks_per_node: str | None = None,
             launcher: str | None = None,
             scheduler: str = 'auto', wait: bool = True, collect: str | None = None, results: str | None = None,
             prefix: str | None = None, account: str | None = None, python: str | None = None, timeout: str | None = None,
             playbook: str | None = None, debug: bool = False, host: str | None = None,
             accept_new_host_keys: bool = False, json: str | None = None) -> None:
    """Run the site's validation job (sbatch, or torchrun/mpiexec; here or on --host), print the verdict and where the report is."""
    from sitestack.engine import playbook as pb
    from sitestack.engine import results as results_mod
    from sitestack.engine import validate as validation_mod

    with errors_to_exit(debug):
        loaded = pb.load(site, playbook_path(playbook))
        options = validation_mod.ValidateOptions(
            nodes=int_option("--nodes", nodes or 0, low=0, high=100000),
            ranks_per_node=int_option("--ranks-per-node", ranks_per_node or 0, low=0, high=1024), launcher=launcher, scheduler=scheduler, wait=wait,
            collect=collect, results=results, prefix=setting(c, "prefix", prefix),
            account=account_option(setting(c, "account", account)), python=python,
            timeout=float(int_option("--timeout", timeout or 3600, low=1, high=7 * 24 * 3600)), host=host, accept_new_host_keys=accept_new_host_keys)
        report = reporter(debug=debug, json_target=json)
        try:
            outcome = validation_mod.validate(loaded, options, report)
        except SitestackError as exc:  # the job's failure is an outcome too: the document says it
            results_mod.write(json, results_mod.validate_document(loaded.name, None, str(exc)))
            raise
        results_mod.write(json, results_mod.validate_document(loaded.name, outcome))
    if outcome.code:
        raise Exit(code=outcome.code)




# -- the stack: venv, extend-venv-activate hook, module files ------------------------------------------

#: A stack entry point of :mod:`sitestack.engine.partial_run` (``install_venv``, ``install_modulefiles``).
StackRun = Callable[..., "list[HostRun]"]
STACK_HELP = {
    "site": SITE_HELP,
    "check": "change nothing; report what would change and why",
    "diff": "show diffs (the environment's plan, the hook, module files)",
    "fail-on-change": "with --check: exit 2 when anything would change",
    "host": "run on this host (repeatable); default: the playbook's hosts",
    "prefix": PREFIX_HELP,
    "account": ACCOUNT_HELP,
    "playbook": PLAYBOOK_HELP,
    "accept-new-host-keys": "accept SSH host keys not yet in known_hosts (default: refuse)",
    "json": JSON_HELP,
    "verbose": VERBOSE_HELP,
    "debug": DEBUG_HELP,
}


def _stack_steps(run: StackRun, site: str | None, check: bool, diff: bool, fail_on_change: bool, host: list[str] | None,
                 prefix: str | None, account: str | None, playbook: str | None, accept_new_host_keys: bool,
                 debug: bool, c: Context, command: str, json: str | None, verbose: bool) -> None:
    with errors_to_exit(debug):
        options = run_options(c, check=check, diff=diff, fail_on_change=fail_on_change,
                              hosts=tuple(host or ()), prefix=prefix, account=account,
                              accept_new_host_keys=accept_new_host_keys, verbose=verbose)
        report = reporter(diff, debug, json)
        runs = run(site=site, playbook=playbook_path(playbook), options=options, reporter=report)
        finish(command, runs, report, check=check, fail_on_change=fail_on_change, json_target=json)


@task(klass=SitestackTask, auto_shortflags=False, iterable=["host"], help=STACK_HELP)
def install_venv(c: Context, site: str | None = None, check: bool = False, diff: bool = False,
                 fail_on_change: bool = False, host: list[str] | None = None, prefix: str | None = None,
                 account: str | None = None, playbook: str | None = None, accept_new_host_keys: bool = False,
                 json: str | None = None, verbose: bool = False, debug: bool = False) -> None:
    """Install the site's stack environment (torch, extras, the wheels sitestack built) and extend-venv-activate."""
    from sitestack.engine import partial_run

    _stack_steps(partial_run.install_venv, site, check, diff, fail_on_change, host, prefix, account, playbook,
                 accept_new_host_keys, debug, c, "install-venv", json, verbose)


@task(klass=SitestackTask, auto_shortflags=False, iterable=["host"], help=STACK_HELP)
def install_modulefiles(c: Context, site: str | None = None, check: bool = False, diff: bool = False,
                        fail_on_change: bool = False, host: list[str] | None = None, prefix: str | None = None,
                        account: str | None = None, playbook: str | None = None, accept_new_host_keys: bool = False,
                        json: str | None = None, verbose: bool = False, debug: bool = False) -> None:
    """Install the module files (Lua or Tcl, as the site uses) of the stack and the packages sitestack built."""
    from sitestack.engine import partial_run

    _stack_steps(partial_run.install_modulefiles, site, check, diff, fail_on_change, host, prefix, account,
                 playbook, accept_new_host_keys, debug, c, "install-modulefiles", json, verbose)




# -- what is installed (like spack find / spack uninstall / spack gc) --------------------------------

INVENTORY_HELP = {"site": SITE_HELP, "prefix": PREFIX_HELP, "account": ACCOUNT_HELP, "playbook": PLAYBOOK_HELP,
                  "host": "look on this host (a playbook host, an ssh-config alias or a host name); default: the site's first",
                  "accept-new-host-keys": "accept SSH host keys not yet in known_hosts (default: refuse)",
                  "debug": DEBUG_HELP}


@task(klass=SitestackTask, auto_shortflags=False, help={**INVENTORY_HELP, "json": DATA_JSON_HELP})
def installed(c: Context, site: str | None = None, prefix: str | None = None, account: str | None = None,
              playbook: str | None = None, host: str | None = None, accept_new_host_keys: bool = False,
              json: str | None = None, debug: bool = False) -> None:
    """List what is installed in a site's prefix: recipe installs (from their stamps), stack environments, module files."""
    from sitestack.engine import inventory
    from sitestack.engine import playbook as pb
    from sitestack.engine import results as results_mod

    with errors_to_exit(debug):
        loaded = pb.load(site, playbook_path(playbook))
        results_mod.check_target(json)
        options = run_options(c, prefix=prefix, account=account, hosts=(host,) if host else (),
                              accept_new_host_keys=accept_new_host_keys)
        found = inventory.installed(loaded, options)
        results_mod.emit(json, "installed", {"site": loaded.name, **dataclasses.asdict(found)},
                         inventory.inventory_lines(found))


@task(klass=SitestackTask, auto_shortflags=False, help={**INVENTORY_HELP, "spec": "what to remove: NAME or NAME@VERSION (see `invoke installed`)"})
def uninstall(c: Context, spec: str, site: str | None = None, prefix: str | None = None, account: str | None = None,
              playbook: str | None = None, host: str | None = None, accept_new_host_keys: bool = False,
              debug: bool = False) -> None:
    """Remove one recipe install from a site's prefix, under its lock (module files: run install-modulefiles after)."""
    from sitestack.engine import inventory
    from sitestack.engine import playbook as pb

    with errors_to_exit(debug):
        loaded = pb.load(site, playbook_path(playbook))
        options = run_options(c, prefix=prefix, account=account, hosts=(host,) if host else (),
                              accept_new_host_keys=accept_new_host_keys)
        removed = inventory.remove(loaded, options, spec, print)
        print(f"removed {removed}")


@task(klass=SitestackTask, auto_shortflags=False, help={
    "site": SITE_HELP + " (default: local; the cache is the host's, shared by every site)", "playbook": PLAYBOOK_HELP,
    "host": "trim the cache on this host; default: the site's first", "debug": DEBUG_HELP,
    "max-size": "keep at most this much (e.g. 500M, 20G); the oldest artefacts go first",
    "max-age": "remove artefacts stored more than this many days ago",
    "dry-run": "list what would be removed, remove nothing", "json": DATA_JSON_HELP,
    "prefix": PREFIX_HELP, "account": ACCOUNT_HELP,
    "accept-new-host-keys": "accept SSH host keys not yet in known_hosts (default: refuse)"})
def gc(c: Context, max_size: str | None = None, max_age: str | None = None, dry_run: bool = False,
       site: str | None = None, playbook: str | None = None, host: str | None = None, prefix: str | None = None,
       account: str | None = None, accept_new_host_keys: bool = False, json: str | None = None,
       debug: bool = False) -> None:
    """Remove the site's retired stack generations nothing can use any more; with --max-size/--max-age, trim
    the build cache too (built artefacts; source tarballs are kept)."""
    from sitestack.engine import inventory, lifecycle, results
    from sitestack.engine import playbook as pb
    from sitestack.onsite.visible import one_line as printable

    with errors_to_exit(debug):
        limit = size_option("--max-size", max_size) if max_size is not None else None
        days = float(int_option("--max-age", max_age, low=0, high=100000)) if max_age is not None else None
        loaded = pb.load(site or "local", playbook_path(playbook))
        options = run_options(c, hosts=(host,) if host else (), prefix=prefix, account=account,
                              accept_new_host_keys=accept_new_host_keys)
        results.check_target(json)
        gone: list[tuple[str, int]] = []
        if limit is not None or days is not None:   # first: a cache that is not sitestack's stops gc before any removal
            gone = inventory.gc(loaded, options, max_age_days=days, max_bytes=limit, dry_run=dry_run)
        fates = lifecycle.collect(loaded, options, dry_run=dry_run, report=print)
        lines = [f"{printable(v.path)}: {'would be ' + v.why if dry_run and v.removed else v.why}" for v in fates]
        lines += [f"{'would remove' if dry_run else 'removed'} {printable(path)} ({size} bytes)" for path, size in gone]
        lines.append(f"{sum(v.removed for v in fates)} retired generation(s) {'to remove' if dry_run else 'removed'}, "
                     f"{sum(not v.removed for v in fates)} kept; {len(gone)} artefact(s), "
                     f"{sum(s for _, s in gone)} bytes{' (dry run)' if dry_run else ''}")
        document = {"dry_run": dry_run, "removed": [{"path": str(path), "bytes": size} for path, size in gone],
                    "bytes": sum(size for _, size in gone),
                    "generations": [{"path": v.path, "removed": v.removed, "why": v.why} for v in fates]}
        results.emit(json, "gc", document, lines)


# -- generations of the stacks: list, roll back --------------------------------------------------------

@task(klass=SitestackTask, auto_shortflags=False, help={
    **INVENTORY_HELP, "json": DATA_JSON_HELP, "stack": "only this stack (its module name, e.g. pytorch/2.13.0-cpu)"})
def generations(c: Context, site: str | None = None, stack: str | None = None, prefix: str | None = None,
                account: str | None = None, playbook: str | None = None, host: str | None = None,
                accept_new_host_keys: bool = False, json: str | None = None, debug: bool = False) -> None:
    """List each stack's generations: when made, digest, what changed, current or retired, in use, and what gc would do."""
    from sitestack.engine import lifecycle as gens
    from sitestack.engine import playbook as pb
    from sitestack.engine import results as results_mod

    with errors_to_exit(debug):
        loaded = pb.load(site, playbook_path(playbook))
        results_mod.check_target(json)
        options = run_options(c, prefix=prefix, account=account, hosts=(host,) if host else (),
                              accept_new_host_keys=accept_new_host_keys)
        found = gens.list_generations(loaded, options, stack)
        results_mod.emit(json, "generations", {"site": loaded.name, "stacks": found}, gens.lines(found))


@task(klass=SitestackTask, auto_shortflags=False, help={
    **INVENTORY_HELP, "stack": "the stack to switch back (its module name); needed where the site has several"})
def rollback(c: Context, site: str | None = None, stack: str | None = None, prefix: str | None = None,
             account: str | None = None, playbook: str | None = None, host: str | None = None,
             accept_new_host_keys: bool = False, debug: bool = False) -> None:
    """Switch a stack back to its previous generation (one rename; run it again to undo)."""
    from sitestack.engine import lifecycle as gens
    from sitestack.engine import playbook as pb

    with errors_to_exit(debug):
        loaded = pb.load(site, playbook_path(playbook))
        options = run_options(c, prefix=prefix, account=account, hosts=(host,) if host else (),
                              accept_new_host_keys=accept_new_host_keys)
        for line in gens.rollback(loaded, options, stack, print):
            print(f"rolled back {line}")
