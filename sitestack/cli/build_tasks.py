"""Tasks that build from source: build-recipe, build-mpi4py, checksum, recipes, build-horovod,
build-rccl-plugin, build-nccl-plugin.

The engine is imported inside each task: ``invoke --list`` and a task's start pay only for what
that task runs (benchmarks/README.md).
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any, Literal

from invoke.context import Context

from sitestack.cli import options as opts
from sitestack.engine.task_glue import errors_to_exit, options_task, playbook_path, run_task
from sitestack.model.options import RunOptions


def _build(c: Context, o: Any, recipe: str) -> None:
    """build-recipe and build-mpi4py: one recipe-install step of ``recipe`` on the site's hosts."""
    from sitestack.engine import partial_run

    run_task(c, o, f"build-recipe {recipe}", lambda options, report: partial_run.build_recipe(
        recipe, site=o.site, playbook=playbook_path(o.playbook), version=o.version, options=options, reporter=report),
             lock_wait=opts.BUILD_LOCK_WAIT, rebuild=(recipe,) if o.rebuild_it else ())


@options_task(*opts.BUILD, (opts.Build, "recipe"))
def build_recipe(c: Context, o: Any) -> None:
    """Build a recipe from its source against a site's toolchain; install it atomically (stamped, cached)."""
    _build(c, o, o.recipe)


@options_task(*opts.BUILD)
def build_mpi4py(c: Context, o: Any) -> None:
    """Build mpi4py from its sdist against the site's MPI (a cached wheel); install it into <prefix>/mpi4py/<version>."""
    _build(c, o, "mpi4py")


@options_task((opts.Listing, "target"), opts.Data, (opts.Task, "debug"))
def checksum(c: Context, o: Any) -> None:
    """Print the sha256 of a source tarball (URL or file), as a recipe's versions entry wants it."""
    from sitestack.engine import results
    from sitestack.installs import sources as sources_mod

    with errors_to_exit(o.debug):
        results.check_target(o.json)
        sha, name, size = sources_mod.checksum(o.target)
        where = f"    url: {o.target}" if "://" in o.target else f"    filename: {name}"
        results.emit(o.json, "checksum", {"target": o.target, "filename": name, "size": size, "sha256": sha},
                     [f"{sha}  {name}  ({size} bytes)", where, f"    sha256: {sha}"])


@options_task((RunOptions, "sources_dir"), opts.Data, (opts.Task, "debug"))
def recipes(c: Context, o: Any) -> None:
    """List the recipes in sources/ with their build system and known versions."""
    from sitestack.engine import results
    from sitestack.model import recipe as recipe_mod

    with errors_to_exit(o.debug):
        results.check_target(o.json)
        directory = Path(o.sources_dir) if o.sources_dir else None
        rows, listed = [("recipe", "build", "versions (* default)", "description")], []
        for name in recipe_mod.list_recipes(directory):
            r = recipe_mod.load_recipe(name, directory)
            shown = ", ".join(f"{v}*" if v == r.default_version else v for v in r.known_versions())
            rows.append((name, r.build, shown, r.description))
            listed.append({"name": name, "build": r.build, "versions": list(r.known_versions()),
                           "default_version": r.default_version, "description": r.description})
        widths = [max(len(row[i]) for row in rows) for i in range(3)]
        results.emit(o.json, "recipes", {"recipes": listed},
                     ("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[3] for row in rows))


# -- Horovod and the RCCL/NCCL network plugin: their own options are their steps' package: arguments ---------------

def _package(o: Any, args: Any) -> dict[str, Any]:
    """The ``package:`` arguments of the step a build task makes: those of ``args`` the task was given."""
    return {f.name: getattr(o, f.name) for f in fields(args) if getattr(o, f.name, None) not in (None, False)}


@options_task(*opts.BUILD, (opts.Build, "python"), opts.HOROVOD_ARGS)
def build_horovod(c: Context, o: Any) -> None:
    """Build Horovod from its sdist for a site (NCCL/RCCL/CPU from the facts); check --check-build and a 2-rank allreduce."""
    from sitestack.engine import partial_run

    run_task(c, o, "build-horovod", lambda options, report: partial_run.build_horovod(
        site=o.site, playbook=playbook_path(o.playbook), version=o.version, package=_package(o, opts.HOROVOD_ARGS[0]),
        options=options, reporter=report), lock_wait=opts.BUILD_LOCK_WAIT, rebuild=("horovod",) if o.rebuild_it else ())


def _build_plugin(c: Context, o: Any, kit: Literal["rocm", "cuda"], version: str | None) -> None:
    """build-rccl-plugin and build-nccl-plugin: one plugin step for toolkit ``kit``."""
    from sitestack.engine import partial_run

    run_task(c, o, f"build-{'rccl' if kit == 'rocm' else 'nccl'}-plugin", lambda options, report: partial_run.build_net_plugin(
        kit, site=o.site, playbook=playbook_path(o.playbook), version=version, package=_package(o, opts.PLUGIN_ARGS[kit][0]),
        options=options, reporter=report), lock_wait=opts.BUILD_LOCK_WAIT, rebuild=("aws-ofi-rccl",) if o.rebuild_it else ())


@options_task(*opts.PLUGIN, (opts.Plugin, "rccl_version"), opts.PLUGIN_ARGS["rocm"])
def build_rccl_plugin(c: Context, o: Any) -> None:
    """Build the RCCL libfabric plugin for a ROCm release (aws-ofi-rccl / aws-ofi-nccl) and its module file."""
    _build_plugin(c, o, "rocm", o.rccl_version)


@options_task(*opts.PLUGIN, (opts.Plugin, "nccl_version"), opts.PLUGIN_ARGS["cuda"])
def build_nccl_plugin(c: Context, o: Any) -> None:
    """Build the NCCL libfabric plugin for a CUDA release (aws-ofi-nccl --with-cuda) and its module file."""
    _build_plugin(c, o, "cuda", o.nccl_version)
