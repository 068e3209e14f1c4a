"""Tasks that build from source: build-recipe, build-mpi4py, checksum, recipes, build-horovod,
build-rccl-plugin, build-nccl-plugin.

The engine is imported inside each task: ``invoke --list`` and a task's start pay only for what
that task runs (benchmarks/README.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from invoke.context import Context
from invoke.tasks import task

from sitestack.cli.common import (
    ACCOUNT_HELP,
    BUILD_LOCK_WAIT,
    DATA_JSON_HELP,
    DEBUG_HELP,
    JSON_HELP,
    NO_CACHE_HELP,
    PLAYBOOK_HELP,
    PREFIX_HELP,
    SITE_HELP,
    VERBOSE_HELP,
)
from sitestack.engine.task_glue import (
    SitestackTask,
    errors_to_exit,
    finish,
    int_option,
    playbook_path,
    reporter,
    run_options,
)

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


def _build(c: Context, recipe: str, *, site: str | None, version: str | None, source: str | None, prefix: str | None,
           check: bool, diff: bool, fail_on_change: bool, host: list[str] | None, account: str | None,
           sources_dir: str | None, mirror: str | None, jobs: str | None, playbook: str | None,
           accept_new_host_keys: bool, json: str | None, verbose: bool, rebuild: bool, no_cache: bool,
           debug: bool) -> None:
    """build-recipe and build-mpi4py: one recipe-install step of ``recipe`` on the site's hosts;
    every option by name (they are the tasks' options)."""
    from sitestack.engine import partial_run

    with errors_to_exit(debug):
        options = run_options(c, check=check, diff=diff, fail_on_change=fail_on_change,
                              hosts=tuple(host or ()), prefix=prefix, account=account,
                              accept_new_host_keys=accept_new_host_keys, lock_wait=BUILD_LOCK_WAIT, source=source,
                              sources_dir=sources_dir, mirror=mirror, verbose=verbose, jobs=jobs_option(jobs),
                              rebuild=(recipe,) if rebuild else (), no_cache=no_cache)
        report = reporter(diff, debug, json)
        runs = partial_run.build_recipe(recipe, site=site, playbook=playbook_path(playbook), version=version,
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
    _build(c, recipe, site=site, version=version, source=source, prefix=prefix, check=check, diff=diff,
           fail_on_change=fail_on_change, host=host, account=account, sources_dir=sources_dir, mirror=mirror, jobs=jobs,
           playbook=playbook, accept_new_host_keys=accept_new_host_keys, json=json, verbose=verbose, rebuild=rebuild,
           no_cache=no_cache, debug=debug)


@task(klass=SitestackTask, auto_shortflags=False, iterable=["host"], help={k: v for k, v in BUILD_HELP.items() if k != "recipe"})
def build_mpi4py(c: Context, site: str | None = None, version: str | None = None, source: str | None = None,
                 prefix: str | None = None, check: bool = False, diff: bool = False, fail_on_change: bool = False,
                 host: list[str] | None = None, account: str | None = None, sources_dir: str | None = None,
                 mirror: str | None = None, jobs: str | None = None, playbook: str | None = None,
                 accept_new_host_keys: bool = False, json: str | None = None, verbose: bool = False,
                 rebuild: bool = False, no_cache: bool = False, debug: bool = False) -> None:
    """Build mpi4py from its sdist against the site's MPI (a cached wheel); install it into <prefix>/mpi4py/<version>."""
    _build(c, "mpi4py", site=site, version=version, source=source, prefix=prefix, check=check, diff=diff,
           fail_on_change=fail_on_change, host=host, account=account, sources_dir=sources_dir, mirror=mirror, jobs=jobs,
           playbook=playbook, accept_new_host_keys=accept_new_host_keys, json=json, verbose=verbose, rebuild=rebuild,
           no_cache=no_cache, debug=debug)


@task(klass=SitestackTask, auto_shortflags=False, help={"target": "a URL (https, http, file) or a local file",
                                                        "json": DATA_JSON_HELP, "debug": DEBUG_HELP})
def checksum(c: Context, target: str, json: str | None = None, debug: bool = False) -> None:
    """Print the sha256 of a source tarball (URL or file), as a recipe's versions entry wants it."""
    from sitestack.engine import results
    from sitestack.installs import sources as sources_mod

    with errors_to_exit(debug):
        results.check_target(json)
        sha, name, size = sources_mod.checksum(target)
        where = f"    url: {target}" if "://" in target else f"    filename: {name}"
        results.emit(json, "checksum", {"target": target, "filename": name, "size": size, "sha256": sha},
                     [f"{sha}  {name}  ({size} bytes)", where, f"    sha256: {sha}"])


@task(klass=SitestackTask, auto_shortflags=False, help={"sources-dir": "read recipes from this directory instead of sources/",
                                                        "json": DATA_JSON_HELP, "debug": DEBUG_HELP})
def recipes(c: Context, sources_dir: str | None = None, json: str | None = None, debug: bool = False) -> None:
    """List the recipes in sources/ with their build system and known versions."""
    from sitestack.engine import results
    from sitestack.model import recipe as recipe_mod

    with errors_to_exit(debug):
        results.check_target(json)
        directory = Path(sources_dir) if sources_dir else None
        rows, listed = [("recipe", "build", "versions (* default)", "description")], []
        for name in recipe_mod.list_recipes(directory):
            r = recipe_mod.load_recipe(name, directory)
            shown = ", ".join(f"{v}*" if v == r.default_version else v for v in r.known_versions())
            rows.append((name, r.build, shown, r.description))
            listed.append({"name": name, "build": r.build, "versions": list(r.known_versions()),
                           "default_version": r.default_version, "description": r.description})
        widths = [max(len(row[i]) for row in rows) for i in range(3)]
        results.emit(json, "recipes", {"recipes": listed},
                     ("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[3] for row in rows))


# -- Horovod and the RCCL/NCCL network plugin -----------------------------------------------------------

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
    from sitestack.engine import partial_run

    with errors_to_exit(debug):
        options = run_options(c, check=check, diff=diff, fail_on_change=fail_on_change,
                              hosts=tuple(host or ()), prefix=prefix, account=account,
                              accept_new_host_keys=accept_new_host_keys, lock_wait=BUILD_LOCK_WAIT, source=source,
                              sources_dir=sources_dir, mirror=mirror, jobs=jobs_option(jobs), python=python,
                              gpu_operations=gpu_operations, verbose=verbose, rebuild=("horovod",) if rebuild else (),
                              no_cache=no_cache)
        report = reporter(diff, debug, json)
        runs = partial_run.build_horovod(site=site, playbook=playbook_path(playbook), version=version, options=options,
                                         reporter=report)
        finish("build-horovod", runs, report, check=check, fail_on_change=fail_on_change, json_target=json)


_PLUGIN_HELP = {
    **_COMMON_BUILD_HELP,
    "source": "the plugin's source: a tarball or a directory (a checkout)",
    "libfabric": "libfabric prefix (default: pkg-config's; a system prefix is never passed)",
    "mpi-home": "MPI prefix for --with-mpi (default: $MPICH_DIR on Cray)",
    "tests": "build the plugin's MPI test programs too"}


def _build_plugin(c: Context, toolkit: str, *, site: str | None, playbook: str | None, check: bool, diff: bool,
                  fail_on_change: bool, host: list[str] | None, json: str | None, debug: bool, rebuild: bool,
                  jobs: str | None, **plugin: Any) -> None:
    """build-rccl-plugin and build-nccl-plugin: one plugin step for ``toolkit`` (rocm, cuda); ``plugin``: the
    other options by name, as RunOptions has them."""
    from sitestack.engine import partial_run

    with errors_to_exit(debug):
        options = run_options(c, check=check, diff=diff, fail_on_change=fail_on_change, hosts=tuple(host or ()),
                              lock_wait=BUILD_LOCK_WAIT, jobs=jobs_option(jobs),
                              rebuild=("aws-ofi-rccl",) if rebuild else (), **plugin)
        report = reporter(diff, debug, json)
        runs = partial_run.build_net_plugin("rocm" if toolkit == "rocm" else "cuda", site=site,
                                            playbook=playbook_path(playbook), options=options, reporter=report)
        task = "build-rccl-plugin" if toolkit == "rocm" else "build-nccl-plugin"
        finish(task, runs, report, check=check, fail_on_change=fail_on_change, json_target=json)


@task(klass=SitestackTask, auto_shortflags=False, iterable=["host"], help={
    **_PLUGIN_HELP,
    "site": SITE_HELP + " (default: local, this machine, when it has ROCm or --rocm-home is given)",
    "rocm": "ROCm release to build for, e.g. 5.7.1 (default: the site's facts.rocm.version)",
    "version": "plugin version (default: the fork for ROCm < 6, aws-ofi-nccl from ROCm 6)",
    "prefix": PREFIX_HELP + "; the plugin goes to <prefix>/aws-ofi-rccl/<version>-rocm-<rocm>",
    "rocm-home": "ROCm/HIP prefix (default: the site's facts.rocm.home for that release, else /opt/rocm-<rocm>)",
    "rccl-home": "prefix with include/rccl/rccl.h when RCCL is not the ROCm release's"})
def build_rccl_plugin(c: Context, rocm: str | None = None, site: str | None = None, version: str | None = None,
                      source: str | None = None, prefix: str | None = None, rocm_home: str | None = None,
                      rccl_home: str | None = None, libfabric: str | None = None, mpi_home: str | None = None,
                      tests: bool = False, check: bool = False, diff: bool = False, fail_on_change: bool = False,
                      host: list[str] | None = None, account: str | None = None, sources_dir: str | None = None,
                      mirror: str | None = None, jobs: str | None = None, playbook: str | None = None,
                      accept_new_host_keys: bool = False, json: str | None = None, verbose: bool = False,
                      rebuild: bool = False, no_cache: bool = False, debug: bool = False) -> None:
    """Build the RCCL libfabric plugin for a ROCm release (aws-ofi-rccl / aws-ofi-nccl) and its module file."""
    _build_plugin(c, "rocm", site=site, playbook=playbook, check=check, diff=diff, fail_on_change=fail_on_change,
                  host=host, json=json, debug=debug, rebuild=rebuild, jobs=jobs, prefix=prefix, account=account,
                  accept_new_host_keys=accept_new_host_keys, source=source, sources_dir=sources_dir, mirror=mirror,
                  rocm=rocm, rocm_home=rocm_home, rccl_home=rccl_home, libfabric=libfabric, mpi_home=mpi_home,
                  plugin_version=version, tests=tests, verbose=verbose, no_cache=no_cache)


@task(klass=SitestackTask, auto_shortflags=False, iterable=["host"], help={
    **_PLUGIN_HELP,
    "site": SITE_HELP + " (default: local, this machine, when it has CUDA or --cuda-home is given)",
    "cuda": "CUDA release to build for, e.g. 13.0 (default: the site's facts.cuda.version)",
    "version": "plugin version (default: aws-ofi-nccl 1.18.0; the ROCm fork is refused)",
    "prefix": PREFIX_HELP + "; the plugin goes to <prefix>/aws-ofi-rccl/<version>-cuda-<cuda>",
    "cuda-home": "CUDA prefix with include/cuda.h and lib64/ (default: the site's facts.cuda.home for that "
                 "release, else /usr/local/cuda-<cuda>)",
    "nccl": "the NCCL version the stack uses, e.g. 2.18.3: refused when it loads none of the plugin's API versions",
    "hwloc": "hwloc prefix (default: pkg-config's; a system prefix is never passed)"})
def build_nccl_plugin(c: Context, cuda: str | None = None, site: str | None = None, version: str | None = None,
                      source: str | None = None, prefix: str | None = None, cuda_home: str | None = None,
                      nccl: str | None = None, libfabric: str | None = None, hwloc: str | None = None,
                      mpi_home: str | None = None, tests: bool = False, check: bool = False, diff: bool = False,
                      fail_on_change: bool = False, host: list[str] | None = None, account: str | None = None,
                      sources_dir: str | None = None, mirror: str | None = None, jobs: str | None = None,
                      playbook: str | None = None, accept_new_host_keys: bool = False, json: str | None = None,
                      verbose: bool = False, rebuild: bool = False, no_cache: bool = False, debug: bool = False) -> None:
    """Build the NCCL libfabric plugin for a CUDA release (aws-ofi-nccl --with-cuda) and its module file."""
    _build_plugin(c, "cuda", site=site, playbook=playbook, check=check, diff=diff, fail_on_change=fail_on_change,
                  host=host, json=json, debug=debug, rebuild=rebuild, jobs=jobs, prefix=prefix, account=account,
                  accept_new_host_keys=accept_new_host_keys, source=source, sources_dir=sources_dir, mirror=mirror,
                  cuda=cuda, cuda_home=cuda_home, nccl=nccl, libfabric=libfabric, hwloc=hwloc, mpi_home=mpi_home,
                  plugin_version=version, tests=tests, verbose=verbose, no_cache=no_cache)
