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

from sitestack.cli import flags
from sitestack.engine.task_glue import emit_data, options_task, playbook_path, run_task
from sitestack.model.options import RunOptions


def _build(c: Context, o: Any, recipe: str) -> None:
    """build-recipe and build-mpi4py: one recipe-install step of ``recipe`` on the site's hosts."""
    from sitestack.engine import partial_run

    run_task(c, o, f"build-recipe {recipe}", lambda options, report: partial_run.build_recipe(
        recipe, site=o.site, playbook=playbook_path(o.playbook), version=o.version, options=options, reporter=report),
             lock_wait=flags.BUILD_LOCK_WAIT, rebuild=(recipe,) if o.rebuild_it else ())


@options_task(*flags.BUILD, (flags.Build, "recipe"))
def build_recipe(c: Context, o: Any) -> None:
    """Build a recipe from its source against a site's toolchain; install it atomically (stamped, cached)."""
    _build(c, o, o.recipe)


@options_task(*flags.BUILD)
def build_mpi4py(c: Context, o: Any) -> None:
    """Build mpi4py from its sdist against the site's MPI (a cached wheel); install it into <prefix>/mpi4py/<version>."""
    _build(c, o, "mpi4py")


@options_task((flags.Listing, "target"), flags.Data, (flags.Task, "debug"))
def checksum(c: Context, o: Any) -> None:
    """Print the sha256 of a source tarball (URL or file), as a recipe's versions entry wants it."""
    from sitestack.engine import listings

    emit_data(o, "checksum", lambda: listings.checksum(o.target))


@options_task((RunOptions, "sources_dir"), flags.Data, (flags.Task, "debug"))
def recipes(c: Context, o: Any) -> None:
    """List the recipes in sources/ with their build system and known versions."""
    from sitestack.engine import listings

    emit_data(o, "recipes", lambda: listings.recipes(Path(o.sources_dir) if o.sources_dir else None))


# -- Horovod and the RCCL/NCCL network plugin: their own options are their steps' package: arguments ---------------

def _package(o: Any, args: Any) -> dict[str, Any]:
    """The ``package:`` arguments of the step a build task makes: those of ``args`` the task was given."""
    return {f.name: getattr(o, f.name) for f in fields(args) if getattr(o, f.name, None) not in (None, False)}


@options_task(*flags.BUILD, (flags.Build, "python"), flags.HOROVOD_ARGS)
def build_horovod(c: Context, o: Any) -> None:
    """Build Horovod from its sdist for a site (NCCL/RCCL/CPU from the facts); check --check-build and a 2-rank allreduce."""
    from sitestack.engine import partial_run

    run_task(c, o, "build-horovod", lambda options, report: partial_run.build_horovod(
        site=o.site, playbook=playbook_path(o.playbook), version=o.version, package=_package(o, flags.HOROVOD_ARGS[0]),
        options=options, reporter=report), lock_wait=flags.BUILD_LOCK_WAIT, rebuild=("horovod",) if o.rebuild_it else ())


def _build_plugin(c: Context, o: Any, kit: Literal["rocm", "cuda"], version: str | None) -> None:
    """build-rccl-plugin and build-nccl-plugin: one plugin step for toolkit ``kit``."""
    from sitestack.engine import partial_run

    run_task(c, o, f"build-{'rccl' if kit == 'rocm' else 'nccl'}-plugin", lambda options, report: partial_run.build_net_plugin(
        kit, site=o.site, playbook=playbook_path(o.playbook), version=version, package=_package(o, flags.PLUGIN_ARGS[kit][0]),
        options=options, reporter=report), lock_wait=flags.BUILD_LOCK_WAIT, rebuild=("aws-ofi-rccl",) if o.rebuild_it else ())


@options_task(*flags.PLUGIN, (flags.Plugin, "rccl_version"), flags.PLUGIN_ARGS["rocm"])
def build_rccl_plugin(c: Context, o: Any) -> None:
    """Build the RCCL libfabric plugin for a ROCm release (aws-ofi-rccl / aws-ofi-nccl) and its module file."""
    _build_plugin(c, o, "rocm", o.rccl_version)


@options_task(*flags.PLUGIN, (flags.Plugin, "nccl_version"), flags.PLUGIN_ARGS["cuda"])
def build_nccl_plugin(c: Context, o: Any) -> None:
    """Build the NCCL libfabric plugin for a CUDA release (aws-ofi-nccl --with-cuda) and its module file."""
    _build_plugin(c, o, "cuda", o.nccl_version)
