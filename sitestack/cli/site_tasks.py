"""Tasks about sites and playbooks: sites, show-site, provision, actions, job-template, benchmark."""

from __future__ import annotations

import sys
from typing import Any

from invoke.context import Context
from invoke.exceptions import Exit

from sitestack.cli.flags import FACTS, RUN, Data, Jobs, Listing, Render, Task
from sitestack.core.paths import REPO
from sitestack.engine.task_glue import emit_data, errors_to_exit, options_of, options_task, playbook_path, run_task
from sitestack.model.options import RunOptions, split_list


@options_task(Data, (Task, "debug"))
def sites(c: Context, o: Any) -> None:
    """List the sites that have a playbook."""
    from sitestack.engine import listings

    emit_data(o, "sites", listings.sites)


@options_task(*FACTS, Data, (Listing, "format"))
def show_site(c: Context, o: Any) -> None:
    """Print a site's facts with placeholders resolved for this machine's user."""
    from sitestack.engine import listings
    from sitestack.engine import playbook as pb

    def listing() -> tuple[dict[str, Any], list[str]]:
        options = options_of(RunOptions, c, o)   # as every task that installs takes them: --prefix, --account
        loaded = pb.load(o.site, playbook_path(o.playbook))
        return listings.show_site(loaded, options.account, options.prefix, o.format)
    emit_data(o, "show-site", listing)


@options_task(*RUN, (RunOptions, "tags skip_tags limit forks parallel_steps start_at confirm_steps rebuild no_cache "
                     "recipe_sources mirror promote"), (Jobs, "list_steps list_tags"))
def provision(c: Context, o: Any) -> None:
    """Run a site's playbook: every step, idempotently, on each host; print a recap."""
    from sitestack.engine import playbook as pb
    from sitestack.engine import select
    from sitestack.engine.source_options import checked_sources

    def checked(options: RunOptions) -> tuple[Any, RunOptions]:
        loaded = pb.load(o.site, playbook_path(o.playbook))
        return loaded, checked_sources(loaded, options, "--source")

    def run(options: RunOptions, report: Any) -> Any:
        from sitestack.engine import generation_promotion, promotion

        loaded, options = checked(options)
        runs = promotion.after_provision(loaded, options, pb.provision(loaded, options, report), report)
        return generation_promotion.after_provision(loaded, options, runs, report)

    if not (o.list_steps or o.list_tags):
        return run_task(c, o, "provision", run)
    with errors_to_exit(o.debug):
        loaded, options = checked(options_of(RunOptions, c, o))
        pb.check_tags(loaded, options)
        select.check_start_at(loaded, options)
        print("\n".join(select.list_steps(loaded, options) if o.list_steps else select.list_tags(loaded)))


@options_task(*FACTS, Data, Render)
def render(c: Context, o: Any) -> None:
    """Write every file the site's playbook would install (module files, rc files, venv hooks, launch
    helpers, job scripts, run scripts, image definitions), at its site path under --out, with an index of
    which step writes which; nothing connects to the site."""
    from sitestack.engine import playbook as pb
    from sitestack.engine import render as rendering

    failed = False

    def listing() -> tuple[dict[str, Any], list[str]]:
        nonlocal failed
        out = rendering.check_out(o.out, force=o.force)
        loaded = pb.load(o.site, playbook_path(o.playbook))
        document = rendering.write_rendering(rendering.render_site(loaded, options_of(RunOptions, c, o)), out)
        failed = any(step.get("error") for step in document["steps"])
        return document, rendering.summary(document, out)
    emit_data(o, "render", listing)
    if failed:
        raise Exit(code=1)


@options_task(Data, (Task, "debug"))
def actions(c: Context, o: Any) -> None:
    """List the actions a playbook step can name, with their arguments."""
    from sitestack.engine import listings

    emit_data(o, "actions", listings.actions)


@options_task(*FACTS, (Listing, "output template_launcher"))
def job_template(c: Context, o: Any) -> None:
    """Print a job script for the site that users can copy: stack module, launch helper, one srun, mpiexec or
    torchrun launch."""
    from sitestack.engine import jobtemplate
    from sitestack.engine import playbook as pb

    with errors_to_exit(o.debug):
        jobtemplate.check_output(o.output)
        jobtemplate.check_launcher(o.template_launcher)
        loaded = pb.load(o.site, playbook_path(o.playbook))
        text = jobtemplate.job_template(loaded, options_of(RunOptions, c, o), o.template_launcher)
        jobtemplate.write_template(text, o.output if o.output is not None else "-")


@options_task(Data, (Jobs, "benchmarks"))
def benchmark(c: Context, o: Any) -> None:
    """Run the benchmarks in benchmarks/ (timings and targets; results in benchmarks/results/), then
    print every target they report, with the machine's load."""
    from sitestack.engine import listings

    failed = False
    with errors_to_exit():
        scripts = listings.benchmark_scripts(REPO / "benchmarks", split_list("--name", o.benchmarks) if o.benchmarks else ())

    def listing() -> tuple[dict[str, Any], list[str]]:
        nonlocal failed
        document, lines = listings.run_benchmarks(scripts, sys.stderr if o.json == "-" else sys.stdout)  # --json -:
        failed = document["failed"]   # stdout holds only the document
        return document, lines
    emit_data(o, "benchmark", listing)
    if failed:
        raise Exit(code=1)
