"""sitestack's command line: ``invoke --list`` shows the tasks, ``invoke --help TASK`` their options.

Each task parses its options, calls one library function, prints through the reporter and
exits with the library's code. The work is in ``sitestack/``.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import yaml
from invoke.collection import Collection
from invoke.context import Context
from invoke.exceptions import Exit
from invoke.tasks import task

from sitestack.actions import ACTIONS
from sitestack.core.errors import InputError as _InputError
from sitestack.core.errors import SitestackError
from sitestack.core.host import local_host
from sitestack.core.report import HostRun
from sitestack.engine import buildtask, inventory, select
from sitestack.engine import playbook as pb
from sitestack.engine import results as results_mod
from sitestack.engine import validate as validation_mod
from sitestack.engine.cli import (
    SETTINGS,
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
    split_list,
)
from sitestack.installs import sources as sources_mod
from sitestack.model import recipe as recipe_mod
from sitestack.model.site import list_sites

#: Builds wait this long for another run's lock on the same install (builds take long).
BUILD_LOCK_WAIT = 6 * 3600.0

SITE_HELP = "site name: one of the playbooks in playbooks/ (see `invoke sites`)"
PLAYBOOK_HELP = "use this playbook file instead of playbooks/<site>.yml"
PREFIX_HELP = "install prefix (overrides the site's facts.prefix)"
ACCOUNT_HELP = "project/account for {account} in the site facts (default: $SITESTACK_ACCOUNT)"
DEBUG_HELP = "show tracebacks of errors"
JSON_HELP = "write the outcome as JSON to FILE ('-': to stdout, instead of the human lines); docs/cli.md"
NO_CACHE_HELP = "build from source instead of using the build cache (the new build replaces the cached one)"
VERBOSE_HELP = "stream the output of build commands to the console too (it always goes to the log)"


@task(klass=SitestackTask, auto_shortflags=False)
def sites(c: Context) -> None:
    """List the sites that have a playbook."""
    with errors_to_exit():
        for name in list_sites():
            site = pb.load(name)
            print(f"{name:<10} {site.facts.description}")


@task(klass=SitestackTask, auto_shortflags=False, help={"site": SITE_HELP, "playbook": PLAYBOOK_HELP, "prefix": PREFIX_HELP, "account": ACCOUNT_HELP,
            "format": "yaml (default) or json", "debug": DEBUG_HELP})
def show_site(c: Context, site: str | None = None, playbook: str | None = None, prefix: str | None = None,
              account: str | None = None, format: str = 'yaml', debug: bool = False) -> None:
    """Print a site's facts with placeholders resolved for this machine's user."""
    with errors_to_exit(debug):
        loaded = pb.load(site, playbook_path(playbook))
        here = local_host()
        values = loaded.placeholder_values(home=here.home(), user=here.user(),
                                           account=account_option(setting(c, "account", account)),
                                           prefix=setting(c, "prefix", prefix))
        data = {"site": loaded.name, "playbook": loaded.path,
                "hosts": [h.name for h in loaded.hosts], "facts": loaded.resolved_facts(values)}
        if format == "json":
            print(json.dumps(data, indent=2))
        elif format == "yaml":
            print(yaml.safe_dump(data, sort_keys=False, default_flow_style=False), end="")
        else:
            raise Exit("error: --format: must be yaml or json", code=1)


@task(
    klass=SitestackTask,
    auto_shortflags=False,
    iterable=["host"],
    help={
        "site": SITE_HELP,
        "check": "change nothing; report what would change",
        "diff": "show a diff of the files that change (or would change)",
        "tags": "run only steps with one of these tags (comma-separated; step names work too)",
        "skip-tags": "skip steps with one of these tags (comma-separated)",
        "fail-on-change": "with --check: exit 2 when anything would change",
        "host": "run on this host (repeatable; an ssh-config alias or host name); default: the playbook's hosts",
        "limit": "only the playbook's hosts matching these names or patterns (comma-separated, e.g. 'login*')",
        "forks": "run at most N hosts at once (default: sitestack.forks, else 16)",
        "start-at": "skip the steps before this one (a step name, as the step listing shows it)",
        "step": "ask before each step: (N)o/(y)es/(c)ontinue (answers from the terminal, or y/n/c lines on stdin)",
        "list-steps": "list the steps (name, action, tags, whether this run would run them) and exit",
        "list-tags": "list the tags and the steps that carry them, and exit",
        "rebuild": "build these recipes again from source though installed (comma-separated recipe names)",
        "no-cache": NO_CACHE_HELP,
        "prefix": PREFIX_HELP,
        "account": ACCOUNT_HELP,
        "accept-new-host-keys": "accept SSH host keys not yet in known_hosts (default: refuse)",
        "playbook": PLAYBOOK_HELP,
        "json": JSON_HELP,
        "verbose": VERBOSE_HELP,
        "debug": DEBUG_HELP,
    },
)
def provision(c: Context, site: str | None = None, check: bool = False, diff: bool = False, tags: str = '',
              skip_tags: str = '', fail_on_change: bool = False, host: list[str] | None = None,
              limit: str = '', forks: str | None = None, start_at: str | None = None, step: bool = False,
              list_steps: bool = False, list_tags: bool = False, rebuild: str = '', no_cache: bool = False,
              prefix: str | None = None,
              account: str | None = None, accept_new_host_keys: bool = False, playbook: str | None = None,
              json: str | None = None, verbose: bool = False, debug: bool = False) -> None:
    """Run a site's playbook: every step, idempotently, on each host; print a recap."""
    with errors_to_exit(debug):
        loaded = pb.load(site, playbook_path(playbook))
        options = run_options(c, check=check, diff=diff, tags=split_list(tags, "--tags"),
                              skip_tags=split_list(skip_tags, "--skip-tags"), hosts=tuple(host or ()),
                              limit=split_list(limit, "--limit"), forks=forks, start_at=start_at,
                              confirm_steps=step, verbose=verbose, rebuild=split_list(rebuild, "--rebuild"),
                              no_cache=no_cache, prefix=prefix, account=account,
                              accept_new_host_keys=accept_new_host_keys)
        if list_steps or list_tags:
            pb.check_tags(loaded, options)
            select.check_start_at(loaded, options)
            print("\n".join(select.list_steps(loaded, options) if list_steps else select.list_tags(loaded)))
            return
        report = reporter(diff, debug, json)
        runs = pb.provision(loaded, options, report)
        finish("provision", runs, report, check=check, fail_on_change=fail_on_change, json_target=json)


@task(klass=SitestackTask, auto_shortflags=False)
def actions(c: Context) -> None:
    """List the actions a playbook step can name, with their arguments."""
    for name, cls in sorted(ACTIONS.items()):
        summary = " ".join((cls.__doc__ or "").strip().split("\n\n")[0].split())  # the whole first paragraph
        print(f"{name}: {summary}")
        for f in dataclasses.fields(cls.Args):
            doc = f.metadata.get("doc", "")
            shown = f.default is not dataclasses.MISSING and f.default is not None and "(default" not in doc
            print(f"    {f.name}: {doc}" + (f" (default {f.default!r})" if shown else ""))


@task(klass=SitestackTask, auto_shortflags=False, help={"name": "run only benchmarks/NAME.py (default: all)"})
def benchmark(c: Context, name: str | None = None) -> None:
    """Run the benchmarks in benchmarks/ (timings and targets; results in benchmarks/results/)."""
    here = Path(__file__).resolve().parent / "benchmarks"
    scripts = sorted(p for p in here.glob("*.py") if not p.name.startswith("_"))
    if name:
        scripts = [p for p in scripts if p.stem == name]
        if not scripts:
            known = ", ".join(p.stem for p in sorted(here.glob("[!_]*.py")))
            raise Exit(f"error: --name: no benchmark {name!r} (benchmarks: {known})", code=1)
    failed = 0
    for script in scripts:
        print(f"== {script.stem}")
        failed |= subprocess.run([sys.executable, str(script)], cwd=here).returncode
    if failed:
        raise Exit(code=1)


# -- builds from source: recipes in sources/ -------------------------------------------------

BUILD_HELP = {
    "recipe": "recipe name: sources/<recipe>.yml (see `invoke recipes`)",
    "site": SITE_HELP,
    "version": "version to build (default: the recipe's default_version); must be listed in the recipe",
    "source": "use this source tarball instead of downloading (its sha256 must match the recipe)",
    "prefix": PREFIX_HELP + "; the package goes to <prefix>/<recipe>/<version>",
    "check": "change nothing; report whether it would build and why (which input changed)",
    "diff": "show diffs where a step has them",
    "fail-on-change": "with --check: exit 2 when it would build",
    "host": "run on this host (repeatable); default: the playbook's hosts",
    "account": ACCOUNT_HELP,
    "sources-dir": "read recipes from this directory (patches from patches/ beside it) instead of sources/",
    "mirror": "a directory of source tarballs to use before downloading (air-gapped sites)",
    "jobs": "parallel build jobs (default: facts.build_jobs, else the host's cores)",
    "rebuild": "build again from source though it is installed and up to date",
    "no-cache": NO_CACHE_HELP,
    "playbook": PLAYBOOK_HELP,
    "accept-new-host-keys": "accept SSH host keys not yet in known_hosts (default: refuse)",
    "json": JSON_HELP,
    "verbose": VERBOSE_HELP,
    "debug": DEBUG_HELP,
}


def jobs_option(jobs: str | None) -> int | None:
    return int_option("--jobs", jobs, low=1, high=4096) if jobs is not None else None


def _build(recipe: str, site: str | None, version: str | None, source: str | None, prefix: str | None, check: bool,
           diff: bool, fail_on_change: bool, host: list[str] | None, account: str | None, sources_dir: str | None,
           mirror: str | None, jobs: str | None, playbook: str | None, accept_new_host_keys: bool, debug: bool,
           c: Context, json: str | None, verbose: bool, rebuild: bool, no_cache: bool) -> None:
    with errors_to_exit(debug):
        options = run_options(c, check=check, diff=diff, hosts=tuple(host or ()), prefix=prefix, account=account,
                              accept_new_host_keys=accept_new_host_keys, lock_wait=BUILD_LOCK_WAIT, source=source,
                              sources_dir=sources_dir, mirror=mirror, verbose=verbose, jobs=jobs_option(jobs),
                              rebuild=(recipe,) if rebuild else (), no_cache=no_cache)
        report = reporter(diff, debug, json)
        runs = buildtask.build_recipe(recipe, site=site, playbook=playbook_path(playbook), version=version,
                                      options=options, reporter=report)
        finish(f"build-recipe {recipe}", runs, report, check=check, fail_on_change=fail_on_change, json_target=json)


@task(klass=SitestackTask, auto_shortflags=False, iterable=["host"], help=BUILD_HELP)
def build_recipe(c: Context, recipe: str, site: str | None = None, version: str | None = None,
                 source: str | None = None, prefix: str | None = None, check: bool = False, diff: bool = False,
                 fail_on_change: bool = False, host: list[str] | None = None, account: str | None = None,
                 sources_dir: str | None = None, mirror: str | None = None, jobs: str | None = None,
                 playbook: str | None = None, accept_new_host_keys: bool = False, json: str | None = None,
                 verbose: bool = False, rebuild: bool = False, no_cache: bool = False, debug: bool = False) -> None:
    """Build a recipe from its source against a site's toolchain; install it atomically (stamped, cached)."""
    _build(recipe, site, version, source, prefix, check, diff, fail_on_change, host, account, sources_dir, mirror,
           jobs, playbook, accept_new_host_keys, debug, c, json, verbose, rebuild, no_cache)


@task(klass=SitestackTask, auto_shortflags=False, iterable=["host"], help={k: v for k, v in BUILD_HELP.items() if k != "recipe"})
def build_mpi4py(c: Context, site: str | None = None, version: str | None = None, source: str | None = None,
                 prefix: str | None = None, check: bool = False, diff: bool = False, fail_on_change: bool = False,
                 host: list[str] | None = None, account: str | None = None, sources_dir: str | None = None,
                 mirror: str | None = None, jobs: str | None = None, playbook: str | None = None,
                 accept_new_host_keys: bool = False, json: str | None = None, verbose: bool = False,
                 rebuild: bool = False, no_cache: bool = False, debug: bool = False) -> None:
    """Build mpi4py from its sdist against the site's MPI (a cached wheel); install it into <prefix>/mpi4py/<version>."""
    _build("mpi4py", site, version, source, prefix, check, diff, fail_on_change, host, account, sources_dir, mirror,
           jobs, playbook, accept_new_host_keys, debug, c, json, verbose, rebuild, no_cache)


@task(klass=SitestackTask, auto_shortflags=False, help={"target": "a URL (https, http, file) or a local file", "debug": DEBUG_HELP})
def checksum(c: Context, target: str, debug: bool = False) -> None:
    """Print the sha256 of a source tarball (URL or file), as a recipe's versions entry wants it."""
    with errors_to_exit(debug):
        sha, name, size = sources_mod.checksum(target)
    print(f"{sha}  {name}  ({size} bytes)")
    print(f"    url: {target}" if "://" in target else f"    filename: {name}")
    print(f"    sha256: {sha}")


@task(klass=SitestackTask, auto_shortflags=False, help={"sources-dir": "read recipes from this directory instead of sources/", "debug": DEBUG_HELP})
def recipes(c: Context, sources_dir: str | None = None, debug: bool = False) -> None:
    """List the recipes in sources/ with their build system and known versions."""
    with errors_to_exit(debug):
        directory = Path(sources_dir) if sources_dir else None
        rows = [("recipe", "build", "versions (* default)", "description")]
        for name in recipe_mod.list_recipes(directory):
            r = recipe_mod.load_recipe(name, directory)
            shown = ", ".join(f"{v}*" if v == r.default_version else v for v in r.known_versions())
            rows.append((name, r.build, shown, r.description))
        widths = [max(len(row[i]) for row in rows) for i in range(3)]
        for row in rows:
            print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[3])


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
    "scheduler": "auto (Slurm when it answers on the host), slurm, or none (torchrun/mpiexec on the host, one node)",
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


# -- Horovod and the RCCL network plugin -----------------------------------------------------------

_COMMON_BUILD_HELP = {k: v for k, v in BUILD_HELP.items() if k not in ("recipe", "prefix")}


@task(klass=SitestackTask, auto_shortflags=False, iterable=["host"], help={
    **_COMMON_BUILD_HELP,
    "prefix": PREFIX_HELP + "; Horovod goes to <prefix>/horovod/<version>",
    "python": "interpreter with the stack's torch that builds and runs Horovod (default: the site's facts.python.executable)",
    "gpu-operations": "HOROVOD_GPU_OPERATIONS: NCCL, MPI or none (default: NCCL where the site has NCCL/RCCL, else none)"})
def build_horovod(c: Context, site: str | None = None, version: str | None = None, python: str | None = None,
                  gpu_operations: str | None = None, source: str | None = None, prefix: str | None = None,
                  check: bool = False, diff: bool = False, fail_on_change: bool = False, host: list[str] | None = None,
                  account: str | None = None, sources_dir: str | None = None, mirror: str | None = None,
                  jobs: str | None = None, playbook: str | None = None, accept_new_host_keys: bool = False,
                  json: str | None = None, verbose: bool = False, rebuild: bool = False, no_cache: bool = False,
                  debug: bool = False) -> None:
    """Build Horovod from its sdist for a site (NCCL/RCCL/CPU from the facts); check --check-build and a 2-rank allreduce."""
    with errors_to_exit(debug):
        options = run_options(c, check=check, diff=diff, hosts=tuple(host or ()), prefix=prefix, account=account,
                              accept_new_host_keys=accept_new_host_keys, lock_wait=BUILD_LOCK_WAIT, source=source,
                              sources_dir=sources_dir, mirror=mirror, jobs=jobs_option(jobs), python=python,
                              gpu_operations=gpu_operations, verbose=verbose, rebuild=("horovod",) if rebuild else (),
                              no_cache=no_cache)
        report = reporter(diff, debug, json)
        runs = buildtask.build_horovod(site=site, playbook=playbook_path(playbook), version=version, options=options,
                                       reporter=report)
        finish("build-horovod", runs, report, check=check, fail_on_change=fail_on_change, json_target=json)


@task(klass=SitestackTask, auto_shortflags=False, iterable=["host"], help={
    **_COMMON_BUILD_HELP,
    "site": SITE_HELP + " (default: local, this machine)",
    "rocm": "ROCm release to build for, e.g. 5.7.1 (default: the site's facts.rocm.version)",
    "version": "plugin version (default: the fork for ROCm < 6, aws-ofi-nccl from ROCm 6)",
    "source": "the plugin's source: a tarball or a directory (a checkout)",
    "prefix": PREFIX_HELP + "; the plugin goes to <prefix>/aws-ofi-rccl/<version>-rocm-<rocm>",
    "rocm-home": "ROCm/HIP prefix (default: the site's facts.rocm.home for that release, else /opt/rocm-<rocm>)",
    "rccl-home": "prefix with include/rccl/rccl.h when RCCL is not the ROCm release's",
    "libfabric": "libfabric prefix (default: pkg-config's; a system prefix is never passed)",
    "mpi-home": "MPI prefix for --with-mpi (default: $MPICH_DIR on Cray)",
    "tests": "build the plugin's MPI test programs too"})
def build_rccl_plugin(c: Context, rocm: str | None = None, site: str | None = None, version: str | None = None,
                      source: str | None = None, prefix: str | None = None, rocm_home: str | None = None,
                      rccl_home: str | None = None, libfabric: str | None = None, mpi_home: str | None = None,
                      tests: bool = False, check: bool = False, diff: bool = False, fail_on_change: bool = False,
                      host: list[str] | None = None, account: str | None = None, sources_dir: str | None = None,
                      mirror: str | None = None, jobs: str | None = None, playbook: str | None = None,
                      accept_new_host_keys: bool = False, json: str | None = None, verbose: bool = False,
                      rebuild: bool = False, no_cache: bool = False, debug: bool = False) -> None:
    """Build the RCCL libfabric plugin for a ROCm release (aws-ofi-rccl / aws-ofi-nccl) and its module file."""
    with errors_to_exit(debug):
        options = run_options(c, check=check, diff=diff, hosts=tuple(host or ()), prefix=prefix, account=account,
                              accept_new_host_keys=accept_new_host_keys, lock_wait=BUILD_LOCK_WAIT, source=source,
                              sources_dir=sources_dir, mirror=mirror, jobs=jobs_option(jobs), rocm=rocm,
                              rocm_home=rocm_home, rccl_home=rccl_home, libfabric=libfabric, mpi_home=mpi_home,
                              plugin_version=version, tests=tests, verbose=verbose,
                              rebuild=("aws-ofi-rccl",) if rebuild else (), no_cache=no_cache)
        report = reporter(diff, debug, json)
        runs = buildtask.build_rccl_plugin(site=site, playbook=playbook_path(playbook), options=options, reporter=report)
        finish("build-rccl-plugin", runs, report, check=check, fail_on_change=fail_on_change, json_target=json)


# -- the stack: venv, extend-venv-activate hook, module files ------------------------------------------

#: A stack entry point of :mod:`sitestack.engine.buildtask` (``install_venv``, ``install_modulefiles``).
StackRun = Callable[..., list[HostRun]]
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
        options = run_options(c, check=check, diff=diff, hosts=tuple(host or ()), prefix=prefix, account=account,
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
    _stack_steps(buildtask.install_venv, site, check, diff, fail_on_change, host, prefix, account, playbook,
                 accept_new_host_keys, debug, c, "install-venv", json, verbose)


@task(klass=SitestackTask, auto_shortflags=False, iterable=["host"], help=STACK_HELP)
def install_modulefiles(c: Context, site: str | None = None, check: bool = False, diff: bool = False,
                        fail_on_change: bool = False, host: list[str] | None = None, prefix: str | None = None,
                        account: str | None = None, playbook: str | None = None, accept_new_host_keys: bool = False,
                        json: str | None = None, verbose: bool = False, debug: bool = False) -> None:
    """Install the module files (Lua or Tcl, as the site uses) of the stack and the packages sitestack built."""
    _stack_steps(buildtask.install_modulefiles, site, check, diff, fail_on_change, host, prefix, account,
                 playbook, accept_new_host_keys, debug, c, "install-modulefiles", json, verbose)


# -- what is installed (like spack find / spack uninstall / spack gc) --------------------------------

INVENTORY_HELP = {"site": SITE_HELP, "prefix": PREFIX_HELP, "account": ACCOUNT_HELP, "playbook": PLAYBOOK_HELP,
                  "host": "look on this host (a playbook host, an ssh-config alias or a host name); default: the site's first",
                  "accept-new-host-keys": "accept SSH host keys not yet in known_hosts (default: refuse)",
                  "debug": DEBUG_HELP}


@task(klass=SitestackTask, auto_shortflags=False, help={**INVENTORY_HELP, "json": "print the listing as JSON to FILE ('-': stdout)"})
def installed(c: Context, site: str | None = None, prefix: str | None = None, account: str | None = None,
              playbook: str | None = None, host: str | None = None, accept_new_host_keys: bool = False,
              json: str | None = None, debug: bool = False) -> None:
    """List what is installed in a site's prefix: recipe installs (from their stamps), stack environments, module files."""
    with errors_to_exit(debug):
        loaded = pb.load(site, playbook_path(playbook))
        results_mod.check_target(json)
        options = run_options(c, prefix=prefix, account=account, hosts=(host,) if host else (),
                              accept_new_host_keys=accept_new_host_keys)
        found = inventory.installed(loaded, options)
        if json is None or json != "-":
            print("\n".join(inventory.inventory_lines(found)))
        results_mod.write(json, {"schema_version": results_mod.SCHEMA_VERSION, "command": "installed",
                                 "site": loaded.name, **dataclasses.asdict(found)})


@task(klass=SitestackTask, auto_shortflags=False, help={**INVENTORY_HELP, "spec": "what to remove: NAME or NAME@VERSION (see `invoke installed`)"})
def uninstall(c: Context, spec: str, site: str | None = None, prefix: str | None = None, account: str | None = None,
              playbook: str | None = None, host: str | None = None, accept_new_host_keys: bool = False,
              debug: bool = False) -> None:
    """Remove one recipe install from a site's prefix, under its lock (module files: run install-modulefiles after)."""
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
    "dry-run": "list what would be removed, remove nothing",
    "accept-new-host-keys": "accept SSH host keys not yet in known_hosts (default: refuse)"})
def gc(c: Context, max_size: str | None = None, max_age: str | None = None, dry_run: bool = False,
       site: str | None = None, playbook: str | None = None, host: str | None = None,
       accept_new_host_keys: bool = False, debug: bool = False) -> None:
    """Trim the build cache (built artefacts; source tarballs are kept) by age and total size."""
    with errors_to_exit(debug):
        if max_size is None and max_age is None:
            raise _InputError("--max-size", "give --max-size and/or --max-age")
        limit = size_option("--max-size", max_size) if max_size is not None else None
        days = float(int_option("--max-age", max_age, low=0, high=100000)) if max_age is not None else None
        loaded = pb.load(site or "local", playbook_path(playbook))
        options = run_options(c, hosts=(host,) if host else (), accept_new_host_keys=accept_new_host_keys)
        gone = inventory.gc(loaded, options, max_age_days=days, max_bytes=limit, dry_run=dry_run)
        for path, size in gone:
            print(f"{'would remove' if dry_run else 'removed'} {path} ({size} bytes)")
        print(f"{len(gone)} artefact(s), {sum(s for _, s in gone)} bytes{' (dry run)' if dry_run else ''}")


#: The root namespace: every task above, with the ``sitestack:`` settings declared so Invoke reads them
#: from its configuration files and INVOKE_SITESTACK_* variables (docs/cli.md).
ns = Collection.from_module(sys.modules[__name__], config={"sitestack": SETTINGS})
