"""What the tasks that list things print: each function here returns a task's ``--json`` document
(docs/cli.md) and its human lines, which the task emits (:func:`sitestack.engine.results.emit`).

A listing is library code, as every task's work is: the task parses its options, calls one
function and prints (tasks.py).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from sitestack.core.errors import InputError
from sitestack.onsite.visible import escaped as printable

#: A document and its human lines.
Listing = tuple[dict[str, Any], list[str]]


def sites() -> Listing:
    """``invoke sites``: each site with a playbook, and its description."""
    from sitestack.engine import playbook as pb
    from sitestack.model.site import list_sites

    found = [(name, pb.load(name).facts.description) for name in list_sites()]
    return {"sites": [{"name": n, "description": d} for n, d in found]}, [f"{n:<10} {d}" for n, d in found]


def show_site(loaded: Any, account: str | None, prefix: str | None, form: str) -> Listing:
    """``invoke show-site``: the site's facts resolved for this machine's user, as YAML or JSON (``form``)."""
    import yaml

    from sitestack.core.host import local_host

    if form not in ("yaml", "json"):
        raise InputError("--format", "must be yaml or json")
    here = local_host()
    values = loaded.placeholder_values(home=here.home(), user=here.user(), account=account, prefix=prefix)
    data = {"site": loaded.name, "playbook": loaded.path, "hosts": [h.name for h in loaded.hosts],
            "facts": loaded.resolved_facts(values)}
    if form == "json":
        return data, [json.dumps(data, indent=2, default=str)]
    return data, [yaml.safe_dump(data, sort_keys=False, default_flow_style=False).rstrip("\n")]


def checksum(target: str) -> Listing:
    """``invoke checksum``: the sha256 of a source tarball (URL or file), as a recipe's versions entry wants it."""
    from sitestack.installs import sources

    sha, name, size = sources.checksum(target)
    where = f"    url: {target}" if "://" in target else f"    filename: {name}"
    return ({"target": target, "filename": name, "size": size, "sha256": sha},
            [f"{sha}  {name}  ({size} bytes)", where, f"    sha256: {sha}"])


def recipes(directory: Path | None) -> Listing:
    """``invoke recipes``: each recipe of sources/ (or ``directory``), its build system and versions."""
    from sitestack.model import recipe as recipe_mod

    rows, listed = [("recipe", "build", "versions (* default)", "description")], []
    for name in recipe_mod.list_recipes(directory):
        r = recipe_mod.load_recipe(name, directory)
        shown = ", ".join(f"{v}*" if v == r.default_version else v for v in r.known_versions())
        rows.append((name, r.build, shown, r.description))
        listed.append({"name": name, "build": r.build, "versions": list(r.known_versions()),
                       "default_version": r.default_version, "description": r.description})
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    return {"recipes": listed}, ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[3] for row in rows]


def actions() -> Listing:
    """``invoke actions``: each action a step can name, its summary and its arguments."""
    from sitestack.actions import ACTIONS

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
    return {"actions": listed}, lines


def gc_report(fates: Sequence[Any], gone: Sequence[tuple[str, int]], dry_run: bool) -> Listing:
    """``invoke gc``: the retired generations' fates (engine/lifecycle.py) and the cache artefacts removed."""
    lines = [f"{printable(v.path)}: {'would be ' + v.why if dry_run and v.removed else v.why}" for v in fates]
    lines += [f"{'would remove' if dry_run else 'removed'} {printable(path)} ({size} bytes)" for path, size in gone]
    lines.append(f"{sum(v.removed for v in fates)} retired generation(s) {'to remove' if dry_run else 'removed'}, "
                 f"{sum(not v.removed for v in fates)} kept; {len(gone)} artefact(s), "
                 f"{sum(s for _, s in gone)} bytes{' (dry run)' if dry_run else ''}")
    document = {"dry_run": dry_run, "removed": [{"path": str(path), "bytes": size} for path, size in gone],
                "bytes": sum(size for _, size in gone),
                "generations": [{"path": v.path, "removed": v.removed, "why": v.why} for v in fates]}
    return document, lines


def history(loaded: Any, options: Any, count: int | None, perflog: str | None) -> Listing:
    """``invoke history``: the site's runs as its history directory on the host holds them (warnings
    about unreadable entries on stderr, so the listing and ``--json -`` stay what they say); with
    ``perflog``, also written as a ReFrame perflog (docs/history.md)."""
    from sitestack.engine import perflog as perflog_mod
    from sitestack.engine import site_history
    from sitestack.engine import validate as validation_mod

    target = validation_mod.open_host(loaded, options)
    try:
        resolved = loaded.resolve(home=target.home(), user=target.user(), account=options.account, prefix=options.prefix)
        directory, runs, warnings = site_history.list_runs(target, validation_mod.install_dir(loaded, resolved.values),
                                                           resolved.values["prefix"], count)
    finally:
        target.close()
    for warning in warnings:
        print(f"warning: {printable(warning)}", file=sys.stderr)
    if perflog is not None:
        perflog_mod.write_perflog(runs, perflog, "--perflog")
    human = [site_history.row_of(r) for r in runs] or [f"no runs in {directory} yet"]
    return ({"site": loaded.name, "history_dir": directory, "runs": runs},
            [f"history of {loaded.name}: {directory}", *human])


def benchmark_scripts(here: Path, wanted: Sequence[str]) -> list[Path]:
    """The scripts of benchmarks/ (``here``), only those named in ``wanted`` where it names some."""
    if not here.is_dir():
        raise InputError("benchmark", f"no {here}: the benchmarks run from a checkout of sitestack")
    scripts = sorted(p for p in here.glob("*.py") if not p.name.startswith("_"))
    for missing in sorted(set(wanted) - {p.stem for p in scripts}):
        raise InputError("--name", f"no benchmark {missing!r} (benchmarks: {', '.join(p.stem for p in scripts)})")
    return [p for p in scripts if p.stem in wanted or not wanted]


def run_benchmarks(scripts: Sequence[Path], console: TextIO) -> Listing:
    """``invoke benchmark``: run each script (its output to ``console``), then every target they
    reported in benchmarks/results/ this run, with the machine's load (the document's ``failed``:
    whether a script failed)."""
    from sitestack.core.files import signature
    from sitestack.onsite.fileio import ReadError, read_json

    failed, reported = 0, []
    for script in scripts:
        print(f"== {script.stem}", file=console, flush=True)
        written = script.parent / "results" / f"{script.stem}.json"
        before = signature(written)
        failed |= subprocess.run([sys.executable, str(script)], cwd=script.parent, stdout=console).returncode
        if written.exists() and signature(written) != before:  # written by this run
            try:
                reported.append(read_json(str(written), 1 << 20))  # a script's own targets: a few kB
            except ReadError as e:
                print(f"== {script.stem}: {e}", file=console, flush=True)
                failed = 1
    lines = ["== targets"]
    for doc in reported:
        load = doc.get("load") or {}
        lines.append(f"{doc.get('benchmark')} (load average before {load.get('before', '?')}, after {load.get('after', '?')})")
        lines += [f"  {t['name']:<48} {t['value']:10.3f} {t['unit']:<2} (target {'>=' if t.get('at_least') else '<='} "
                  f"{t['limit']:g}: {'met' if t['met'] else 'MISSED'})" for t in doc.get("targets", [])]
    return {"benchmarks": reported, "failed": bool(failed)}, lines
