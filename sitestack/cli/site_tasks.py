"""Tasks about sites and playbooks: sites, show-site, provision, actions, job-template, benchmark."""

from __future__ import annotations

import dataclasses
import json as jsonlib
import subprocess
import sys

from invoke.context import Context
from invoke.exceptions import Exit
from invoke.tasks import task

from sitestack.cli.common import (
    ACCOUNT_HELP,
    DATA_JSON_HELP,
    DEBUG_HELP,
    JSON_HELP,
    NO_CACHE_HELP,
    PLAYBOOK_HELP,
    PREFIX_HELP,
    SITE_HELP,
    VERBOSE_HELP,
)
from sitestack.core.paths import REPO
from sitestack.engine.task_glue import (
    SitestackTask,
    account_option,
    errors_to_exit,
    finish,
    playbook_path,
    recipe_source,
    reporter,
    run_options,
    setting,
    split_list,
)


@task(klass=SitestackTask, auto_shortflags=False, help={"json": DATA_JSON_HELP, "debug": DEBUG_HELP})
def sites(c: Context, json: str | None = None, debug: bool = False) -> None:
    """List the sites that have a playbook."""
    from sitestack.engine import playbook as pb
    from sitestack.engine import results
    from sitestack.model.site import list_sites

    with errors_to_exit(debug):
        results.check_target(json)
        found = [(name, pb.load(name).facts.description) for name in list_sites()]
        results.emit(json, "sites", {"sites": [{"name": n, "description": d} for n, d in found]},
                     (f"{n:<10} {d}" for n, d in found))


@task(klass=SitestackTask, auto_shortflags=False, help={"site": SITE_HELP, "playbook": PLAYBOOK_HELP, "prefix": PREFIX_HELP, "account": ACCOUNT_HELP,
            "format": "yaml (default) or json (the facts alone; --json gives the document docs/cli.md describes)",
            "json": DATA_JSON_HELP, "debug": DEBUG_HELP})
def show_site(c: Context, site: str | None = None, playbook: str | None = None, prefix: str | None = None,
              account: str | None = None, format: str = 'yaml', json: str | None = None, debug: bool = False) -> None:
    """Print a site's facts with placeholders resolved for this machine's user."""
    import json as json_mod

    import yaml

    from sitestack.core.host import local_host
    from sitestack.engine import playbook as pb
    from sitestack.engine import results
    from sitestack.model.context import check_prefix

    with errors_to_exit(debug):
        if format not in ("yaml", "json"):
            raise Exit("error: --format: must be yaml or json", code=1)
        check_prefix("--prefix", prefix)   # as every task that installs takes it: absolute, no '..', no system directory
        results.check_target(json)
        loaded = pb.load(site, playbook_path(playbook))
        here = local_host()
        values = loaded.placeholder_values(home=here.home(), user=here.user(),
                                           account=account_option(setting(c, "account", account)),
                                           prefix=setting(c, "prefix", prefix))
        data = {"site": loaded.name, "playbook": loaded.path,
                "hosts": [h.name for h in loaded.hosts], "facts": loaded.resolved_facts(values)}
        if format == "json":
            text = json_mod.dumps(data, indent=2, default=str)
        else:
            text = yaml.safe_dump(data, sort_keys=False, default_flow_style=False).rstrip("\n")
        results.emit(json, "show-site", data, [text])


#: The options of ``invoke provision``, as ``--help`` shows them.
PROVISION_HELP = {
    "site": SITE_HELP,
    "check": "change nothing; report what would change",
    "diff": "show a diff of the files that change (or would change)",
    "tags": "run only steps with one of these tags (comma-separated; step names work too)",
    "skip-tags": "skip steps with one of these tags (comma-separated)",
    "fail-on-change": "with --check: exit 2 when anything would change",
    "host": "run on this host (repeatable; an ssh-config alias or host name); default: the playbook's hosts",
    "limit": "only the playbook's hosts matching these names or patterns (comma-separated, e.g. 'login*')",
    "forks": "run at most N hosts at once (default: sitestack.forks, else 16)",
    "parallel-steps": ("run at most N independent steps (e.g. source builds) at once on a host, applying "
                       "(default: sitestack.parallel_steps, else the host's usable cores; 1: one after the other)"),
    "start-at": "skip the steps before this one (a step name, as the step listing shows it)",
    "step": "ask before each step: (N)o/(y)es/(c)ontinue (answers from the terminal, or y/n/c lines on stdin, "
            "at most 64 KiB; another answer is refused)",
    "list-steps": "list the steps (name, action, tags, whether this run would run them) and exit",
    "list-tags": "list the tags and the steps that carry them, and exit",
    "rebuild": "build these recipes again from source though installed (comma-separated recipe names)",
    "source": ("NAME=PATH: the source tarball (or directory) of recipe NAME for its steps, instead of downloading "
               "(repeatable; the sha256 must match the recipe, where it has one)"),
    "mirror": "a directory of source tarballs to use before downloading (air-gapped sites)",
    "no-cache": NO_CACHE_HELP,
    "prefix": PREFIX_HELP,
    "account": ACCOUNT_HELP,
    "accept-new-host-keys": "accept SSH host keys not yet in known_hosts (default: refuse)",
    "playbook": PLAYBOOK_HELP,
    "json": JSON_HELP,
    "verbose": VERBOSE_HELP,
    "debug": DEBUG_HELP,
}


@task(klass=SitestackTask, auto_shortflags=False, iterable=["host", "source"], help=PROVISION_HELP)
def provision(c: Context, site: str | None = None, check: bool = False, diff: bool = False, tags: str | None = None,
              skip_tags: str | None = None, fail_on_change: bool = False, host: list[str] | None = None,
              limit: str | None = None, forks: str | None = None, parallel_steps: str | None = None,
              start_at: str | None = None, step: bool = False,
              list_steps: bool = False, list_tags: bool = False, rebuild: str | None = None, no_cache: bool = False,
              source: list[str] | None = None, mirror: str | None = None, prefix: str | None = None,
              account: str | None = None, accept_new_host_keys: bool = False, playbook: str | None = None,
              json: str | None = None, verbose: bool = False, debug: bool = False) -> None:
    """Run a site's playbook: every step, idempotently, on each host; print a recap."""
    from sitestack.engine import playbook as pb
    from sitestack.engine import select
    from sitestack.engine.source_options import checked_sources

    with errors_to_exit(debug):
        loaded = pb.load(site, playbook_path(playbook))
        options = run_options(c, check=check, diff=diff, fail_on_change=fail_on_change, tags=split_list(tags, "--tags"),
                              skip_tags=split_list(skip_tags, "--skip-tags"), hosts=tuple(host or ()),
                              limit=split_list(limit, "--limit"), forks=forks, parallel_steps=parallel_steps,
                              start_at=start_at, confirm_steps=step, verbose=verbose, rebuild=split_list(rebuild, "--rebuild"),
                              no_cache=no_cache, prefix=prefix, account=account,
                              accept_new_host_keys=accept_new_host_keys, mirror=mirror,
                              recipe_sources=tuple(recipe_source(s) for s in source or ()))
        options = checked_sources(loaded, options, "--source")
        if list_steps or list_tags:
            pb.check_tags(loaded, options)
            select.check_start_at(loaded, options)
            print("\n".join(select.list_steps(loaded, options) if list_steps else select.list_tags(loaded)))
            return
        report = reporter(diff, debug, json)
        runs = pb.provision(loaded, options, report)
        finish("provision", runs, report, check=check, fail_on_change=fail_on_change, json_target=json)


@task(klass=SitestackTask, auto_shortflags=False, help={"json": DATA_JSON_HELP, "debug": DEBUG_HELP})
def actions(c: Context, json: str | None = None, debug: bool = False) -> None:
    """List the actions a playbook step can name, with their arguments."""
    from sitestack.actions import ACTIONS
    from sitestack.engine import results

    with errors_to_exit(debug):
        results.check_target(json)
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
        results.emit(json, "actions", {"actions": listed}, lines)


@task(klass=SitestackTask, auto_shortflags=False, help={
    "site": SITE_HELP, "playbook": PLAYBOOK_HELP, "prefix": PREFIX_HELP, "account": ACCOUNT_HELP,
    "output": "write the script to FILE, a regular file ('-' or default: print it); docs/cli.md", "debug": DEBUG_HELP})
def job_template(c: Context, site: str | None = None, playbook: str | None = None, prefix: str | None = None,
                 account: str | None = None, output: str | None = None, debug: bool = False) -> None:
    """Print a job script for the site that users can copy: stack module, launch helper, one srun/mpiexec."""
    from sitestack.engine import jobtemplate
    from sitestack.engine import playbook as pb

    with errors_to_exit(debug):
        jobtemplate.check_output(output)
        loaded = pb.load(site, playbook_path(playbook))
        options = run_options(c, prefix=prefix, account=account)
        text = jobtemplate.job_template(loaded, options)
        jobtemplate.write_template(text, output if output is not None else "-")


@task(klass=SitestackTask, auto_shortflags=False,
      help={"name": "run only these benchmarks/NAME.py (comma-separated; default: all)", "json": DATA_JSON_HELP})
def benchmark(c: Context, name: str | None = None, json: str | None = None) -> None:
    """Run the benchmarks in benchmarks/ (timings and targets; results in benchmarks/results/), then
    print every target they report, with the machine's load."""
    from sitestack.core.files import signature
    from sitestack.engine import results

    here = REPO / "benchmarks"
    if not here.is_dir():
        raise Exit(f"error: benchmark: no {here}: the benchmarks run from a checkout of sitestack", code=1)
    scripts = sorted(p for p in here.glob("*.py") if not p.name.startswith("_"))
    if name:
        wanted = split_list(name, "--name")
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
