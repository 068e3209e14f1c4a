"""Tasks about the stack and what is installed: install-venv, install-modulefiles,
install-validation-job, validate, installed, uninstall, gc, generations, rollback, promote.

The engine is imported inside each task: a task's start pays only for what that task runs.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from invoke.context import Context

from sitestack.cli.flags import INSTALLED, RUN, VALIDATE, Listing, Task
from sitestack.core.errors import InputError
from sitestack.engine.task_glue import emit_data, job_task, options_of, options_task, playbook_path, run_task
from sitestack.model.options import RunOptions, ValidateOptions, int_option, size_option

# -- the validation job ----------------------------------------------------------------------------


@options_task(Task, (RunOptions, "check diff hosts prefix account accept_new_host_keys verbose python"))
def install_validation_job(c: Context, o: Any) -> None:
    """Install the validation DDP job (check program, batch scripts, README, MPI probe) into the site prefix."""
    from sitestack.engine import playbook as pb

    def run(options: RunOptions, report: Any) -> Any:
        loaded = pb.load(o.site, playbook_path(o.playbook))
        # the playbook's own stack's job; a further stack's is its step's name: provision --tags NAME
        step = next((s for s in loaded.steps if s.action == "install-validation-job" and s.stack is None), None)
        if step is None:
            raise InputError(loaded.path, "the playbook has no install-validation-job step for its own stack")
        return pb.provision(loaded, dataclasses.replace(options, tags=(step.name,)), report)

    run_task(c, o, "install-validation-job", run)


@options_task(*VALIDATE, (ValidateOptions, "nodes ranks_per_node launcher scheduler wait collect results python timeout "
                                           "calibrate if_changed stack all_stacks"))
def validate(c: Context, o: Any) -> None:
    """Run the site's validation job (sbatch, or torchrun/mpiexec; here or on --host), print the verdict and where the report is.

    ``--stack NAME`` runs that stack's job, ``--all-stacks`` every stack's in turn (engine/stack_validation.py)."""
    from sitestack.engine import results
    from sitestack.engine import validate as validation_mod

    job_task(c, o, validation_mod.validate, results.validate_document)


# -- the stack: venv, extend-venv-activate hook, module files ------------------------------------------

@options_task(*RUN)
def install_venv(c: Context, o: Any) -> None:
    """Install the site's stack environment (torch, extras, the wheels sitestack built) and extend-venv-activate."""
    from sitestack.engine import partial_run

    run_task(c, o, "install-venv", lambda options, report: partial_run.install_venv(
        site=o.site, playbook=playbook_path(o.playbook), options=options, reporter=report))


@options_task(*RUN)
def install_modulefiles(c: Context, o: Any) -> None:
    """Install the module files (Lua or Tcl, as the site uses) of the stack and the packages sitestack built."""
    from sitestack.engine import partial_run

    run_task(c, o, "install-modulefiles", lambda options, report: partial_run.install_modulefiles(
        site=o.site, playbook=playbook_path(o.playbook), options=options, reporter=report))


# -- what is installed (like spack find / spack uninstall / spack gc) --------------------------------

@options_task(*INSTALLED)
def installed(c: Context, o: Any) -> None:
    """List what is installed in a site's prefix: recipe installs (from their stamps), stack environments, module files."""
    from sitestack.engine import inventory
    from sitestack.engine import playbook as pb

    def listing() -> tuple[dict[str, Any], list[str]]:
        loaded = pb.load(o.site, playbook_path(o.playbook))
        found = inventory.installed(loaded, options_of(RunOptions, c, o))
        return {"site": loaded.name, **dataclasses.asdict(found)}, list(inventory.inventory_lines(found))
    emit_data(o, "installed", listing)


@options_task(*INSTALLED[2:], (Task, "site playbook debug"), (Listing, "spec"))
def uninstall(c: Context, o: Any) -> None:
    """Remove one recipe install from a site's prefix, under its lock (module files: run install-modulefiles after)."""
    from sitestack.engine import inventory
    from sitestack.engine import playbook as pb

    emit_data(o, "uninstall", lambda: ({}, ["removed " + inventory.remove(
        pb.load(o.site, playbook_path(o.playbook)), options_of(RunOptions, c, o), o.spec, print)]))


@options_task(*INSTALLED, (Listing, "max_size max_age dry_run gc_site"))
def gc(c: Context, o: Any) -> None:
    """Remove the site's retired stack generations nothing can use any more; with --max-size/--max-age, trim
    the build cache too (built artefacts; source tarballs are kept)."""
    from sitestack.engine import inventory, lifecycle, listings
    from sitestack.engine import playbook as pb

    def listing() -> tuple[dict[str, Any], list[str]]:
        limit = size_option("--max-size", o.max_size) if o.max_size is not None else None
        days = float(int_option("--max-age", o.max_age, low=0, high=100000)) if o.max_age is not None else None
        loaded = pb.load(o.gc_site or "local", playbook_path(o.playbook))
        options = options_of(RunOptions, c, o)
        gone: list[tuple[str, int]] = []
        if limit is not None or days is not None:   # first: a cache that is not sitestack's stops gc before any removal
            gone = inventory.gc(loaded, options, max_age_days=days, max_bytes=limit, dry_run=o.dry_run)
        return listings.gc_report(lifecycle.collect(loaded, options, dry_run=o.dry_run, report=print), gone, o.dry_run)
    emit_data(o, "gc", listing)


# -- generations of the stacks: list, roll back --------------------------------------------------------

@options_task(*INSTALLED, (Listing, "stack"))
def generations(c: Context, o: Any) -> None:
    """List each stack's generations: when made, digest, what changed, current or retired, in use, and what gc would do."""
    from sitestack.engine import lifecycle as gens
    from sitestack.engine import playbook as pb

    def listing() -> tuple[dict[str, Any], list[str]]:
        loaded = pb.load(o.site, playbook_path(o.playbook))
        found = gens.list_generations(loaded, options_of(RunOptions, c, o), o.stack)
        return {"site": loaded.name, "stacks": found}, list(gens.lines(found))
    emit_data(o, "generations", listing)


@options_task(*INSTALLED[2:], (Task, "site playbook debug"), (Listing, "stack"))
def rollback(c: Context, o: Any) -> None:
    """Switch a stack back to its previous generation (one rename; run it again to undo)."""
    from sitestack.engine import lifecycle as gens
    from sitestack.engine import playbook as pb

    emit_data(o, "rollback", lambda: ({}, [f"rolled back {line}" for line in gens.rollback(
        pb.load(o.site, playbook_path(o.playbook)), options_of(RunOptions, c, o), o.stack, print)]))


@options_task(*INSTALLED[2:], (Task, "site playbook debug"), (Listing, "stack"), (RunOptions, "check force_promote"))
def promote(c: Context, o: Any) -> None:
    """Make a stack its module directory's default (`module load pytorch` loads it), or switch in its generation
    pending validation, refused without a passing validation run of that generation unless --force (recorded)."""
    from sitestack.engine import generation_promotion
    from sitestack.engine import playbook as pb

    def listing() -> tuple[dict[str, Any], list[str]]:
        options = options_of(RunOptions, c, o)
        line = generation_promotion.promote(pb.load(o.site, playbook_path(o.playbook)), options, o.stack,
                                 force=options.force_promote)
        return {"promoted": line}, [line]
    emit_data(o, "promote", listing)
