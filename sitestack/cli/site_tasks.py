"""Tasks about sites and playbooks: sites, show-site, provision, actions, job-template, benchmark."""

from __future__ import annotations

import dataclasses
import json as jsonlib
import subprocess
import sys
from typing import Any

from invoke.context import Context
from invoke.exceptions import Exit

from sitestack.cli.options import FACTS, RUN, Data, Jobs, Listing, Task
from sitestack.core.paths import REPO
from sitestack.engine.task_glue import errors_to_exit, finish, options_of, options_task, playbook_path, reporter
from sitestack.model.options import RunOptions, split_list


@options_task(Data, (Task, "debug"))
def sites(c: Context, o: Any) -> None:
    """List the sites that have a playbook."""
    from sitestack.engine import playbook as pb
    from sitestack.engine import results
    from sitestack.model.site import list_sites

    with errors_to_exit(o.debug):
        results.check_target(o.json)
        found = [(name, pb.load(name).facts.description) for name in list_sites()]
        results.emit(o.json, "sites", {"sites": [{"name": n, "description": d} for n, d in found]},
                     (f"{n:<10} {d}" for n, d in found))


@options_task(*FACTS, Data, (Listing, "format"))
def show_site(c: Context, o: Any) -> None:
    """Print a site's facts with placeholders resolved for this machine's user."""
    import json as json_mod

    import yaml

    from sitestack.core.host import local_host
    from sitestack.engine import playbook as pb
    from sitestack.engine import results

    with errors_to_exit(o.debug):
        if o.format not in ("yaml", "json"):
            raise Exit("error: --format: must be yaml or json", code=1)
        options = options_of(RunOptions, c, o)   # as every task that installs takes them: --prefix, --account
        results.check_target(o.json)
        loaded = pb.load(o.site, playbook_path(o.playbook))
        here = local_host()
        values = loaded.placeholder_values(home=here.home(), user=here.user(), account=options.account,
                                           prefix=options.prefix)
        data = {"site": loaded.name, "playbook": loaded.path,
                "hosts": [h.name for h in loaded.hosts], "facts": loaded.resolved_facts(values)}
        if o.format == "json":
            text = json_mod.dumps(data, indent=2, default=str)
        else:
            text = yaml.safe_dump(data, sort_keys=False, default_flow_style=False).rstrip("\n")
        results.emit(o.json, "show-site", data, [text])


@options_task(*RUN, (RunOptions, "tags skip_tags limit forks parallel_steps start_at confirm_steps rebuild no_cache "
                     "recipe_sources mirror"), (Jobs, "list_steps list_tags"))
def provision(c: Context, o: Any) -> None:
    """Run a site's playbook: every step, idempotently, on each host; print a recap."""
    from sitestack.engine import playbook as pb
    from sitestack.engine import select
    from sitestack.engine.source_options import checked_sources

    with errors_to_exit(o.debug):
        loaded = pb.load(o.site, playbook_path(o.playbook))
        options = checked_sources(loaded, options_of(RunOptions, c, o), "--source")
        if o.list_steps or o.list_tags:
            pb.check_tags(loaded, options)
            select.check_start_at(loaded, options)
            print("\n".join(select.list_steps(loaded, options) if o.list_steps else select.list_tags(loaded)))
            return
        report = reporter(options.diff, o.debug, o.json)
        finish("provision", pb.provision(loaded, options, report), report, options, o.json)


@options_task(Data, (Task, "debug"))
def actions(c: Context, o: Any) -> None:
    """List the actions a playbook step can name, with their arguments."""
    from sitestack.actions import ACTIONS
    from sitestack.engine import results

    with errors_to_exit(o.debug):
        results.check_target(o.json)
        listed, lines = [], []
        for name, cls in sorted(ACTIONS.items()):
            summary = " ".join((cls.__doc__ or "").strip().split("\n\n")[0].split())  # the whole first paragraph
            lines.append(f"{name}: {summary}")
            args = []
            for f in dataclasses.fields(cls.Args):
                doc = f.metadata.get("doc", "")
                default = None if f.default is dataclasses.MISSING else f.default
                shown = default is not None and "(default" not in doc
                lines.append(f"    {f.name}: {doc}" + (f" (default {default!r})" if shown else ""))
                args.append({"name": f.name, "doc": doc, "default": default})
            listed.append({"name": name, "summary": summary, "args": args})
        results.emit(o.json, "actions", {"actions": listed}, lines)


@options_task(*FACTS, (Listing, "output"))
def job_template(c: Context, o: Any) -> None:
    """Print a job script for the site that users can copy: stack module, launch helper, one srun/mpiexec."""
    from sitestack.engine import jobtemplate
    from sitestack.engine import playbook as pb

    with errors_to_exit(o.debug):
        jobtemplate.check_output(o.output)
        loaded = pb.load(o.site, playbook_path(o.playbook))
        text = jobtemplate.job_template(loaded, options_of(RunOptions, c, o))
        jobtemplate.write_template(text, o.output if o.output is not None else "-")


@options_task(Data, (Jobs, "benchmarks"))
def benchmark(c: Context, o: Any) -> None:
    """Run the benchmarks in benchmarks/ (timings and targets; results in benchmarks/results/), then
    print every target they report, with the machine's load."""
    from sitestack.core.files import signature
    from sitestack.engine import results

    here = REPO / "benchmarks"
    if not here.is_dir():
        raise Exit(f"error: benchmark: no {here}: the benchmarks run from a checkout of sitestack", code=1)
    scripts = sorted(p for p in here.glob("*.py") if not p.name.startswith("_"))
    json = o.json
    if o.benchmarks:
        wanted = split_list("--name", o.benchmarks)
        known = ", ".join(p.stem for p in scripts)
        for missing in sorted(set(wanted) - {p.stem for p in scripts}):
            raise Exit(f"error: --name: no benchmark {missing!r} (benchmarks: {known})", code=1)
        scripts = [p for p in scripts if p.stem in wanted]
    with errors_to_exit(False):
        results.check_target(json)
    failed, reported = 0, []
    console = sys.stderr if json == "-" else sys.stdout   # with --json -, stdout holds only the document
    for script in scripts:
        print(f"== {script.stem}", file=console, flush=True)
        written = here / "results" / f"{script.stem}.json"
        before = signature(written)
        failed |= subprocess.run([sys.executable, str(script)], cwd=here, stdout=console).returncode
        if written.exists() and signature(written) != before:  # written by this run
            reported.append(jsonlib.loads(written.read_text()))
    lines = ["== targets"]
    for doc in reported:
        load = doc.get("load") or {}
        lines.append(f"{doc.get('benchmark')} (load average before {load.get('before', '?')}, after {load.get('after', '?')})")
        lines += [f"  {t['name']:<48} {t['value']:10.3f} {t['unit']:<2} (target {'>=' if t.get('at_least') else '<='} "
                  f"{t['limit']:g}: {'met' if t['met'] else 'MISSED'})" for t in doc.get("targets", [])]
    with errors_to_exit(False):
        results.emit(json, "benchmark", {"benchmarks": reported, "failed": bool(failed)}, lines)
    if failed:
        raise Exit(code=1)
