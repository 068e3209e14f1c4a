"""``invoke render``: every file a site's playbook would install, written under a local directory at
its path on the site, with an index of which step writes which file, without a host.

Each step says what it writes through :meth:`sitestack.actions.action.Action.rendered`, computed by the
functions its ``pending`` and ``apply`` use, for the site's own paths: the facts resolved for this
machine's user, ``--account`` and ``--prefix`` as a provision would take them, and each further stack's
steps (``stack:``) with that stack's facts. What only exists once built on the site (environments,
builds, images) is not rendered; the index says which steps those are.

The output directory holds the site paths below it (``OUT/lustre/orion/...``), ``index.json`` and
``INDEX.md``. It must be empty or absent unless ``force`` (a re-render over an earlier one); nothing is
written outside it: a site path that is not absolute and normalised is refused, and a symbolic link met
on the way (a directory or a file) is an error, never followed.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sitestack.actions import ACTIONS
from sitestack.core.errors import InputError, SitestackError
from sitestack.core.files import atomic_write
from sitestack.core.host import local_host
from sitestack.engine.playbook import require_account
from sitestack.model.context import RunContext, RunOptions
from sitestack.model.site import Site

INDEX_JSON = "index.json"
INDEX_MD = "INDEX.md"


@dataclass
class StepFiles:
    """One step of the playbook and what it renders: paths, or why it renders nothing."""

    name: str
    action: str
    stack: str | None
    files: dict[str, tuple[str, int]] = field(default_factory=dict)
    error: str | None = None


@dataclass
class Rendering:
    """What :func:`render_site` rendered: the site, the values it resolved, and each step's files."""

    site: str
    playbook: str
    values: dict[str, str]
    steps: list[StepFiles]

    def writers(self) -> dict[str, list[str]]:
        """path -> the steps that write it, in the playbook's order (the last one's text is installed)."""
        out: dict[str, list[str]] = {}
        for step in self.steps:
            for path in step.files:
                out.setdefault(path, []).append(step.name)
        return out

    def final(self) -> dict[str, tuple[str, int, str]]:
        """path -> (text, mode, step) as the site would hold it after the run: the last writer wins."""
        return {path: (text, mode, step.name) for step in self.steps for path, (text, mode) in step.files.items()}


def render_site(site: Site, options: RunOptions) -> Rendering:
    """Every file ``site``'s steps and handlers write, for this machine's user and ``options``' account
    and prefix, without connecting anywhere. A step that cannot be made here keeps its error."""
    require_account(site, options)
    here = local_host()
    ctx = RunContext.resolve(site, home=here.home(), user=here.user(), account=options.account,
                             prefix=options.prefix, check=True, options=options, actions=ACTIONS)
    earlier: dict[str, str] = {}
    steps = []
    for spec in (*site.steps, *site.handlers):
        step = StepFiles(spec.name, spec.action, spec.stack)
        try:
            action = ACTIONS[spec.action].from_spec(spec, ctx.for_step(spec))
            step.files = action.rendered(earlier)
        except SitestackError as exc:
            step.error = str(exc)
        earlier.update({path: text for path, (text, _mode) in step.files.items()})
        steps.append(step)
    values = {k: str(v) for k, v in ctx.values.items() if k in ("prefix", "account", "user", "home")}
    return Rendering(site.name, site.path, values, steps)


def check_out(given: str | None, *, force: bool) -> Path:
    """The output directory ``--out`` names; refused where missing, a link or not a directory, or holding
    anything unless ``force``."""
    if not given:
        raise InputError("--out", "missing: name a directory to write the files under (e.g. --out site-files)")
    out = Path(given)
    if out.is_symlink():
        raise InputError("--out", f"{out} is a symbolic link: give the directory itself")
    if out.exists() and not out.is_dir():
        raise InputError("--out", f"{out} is not a directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise InputError("--out", f"{out} is not empty: give an empty or new directory, or --force to write over it")
    return out


def local_path(out: Path, site_path: str) -> Path:
    """Where ``site_path`` goes under ``out``; an error for a path that is not absolute and normalised
    (``..``, ``.``, empty parts), which could leave ``out``, or one that would be the index."""
    parts = site_path.split("/")[1:]
    if not site_path.startswith("/") or not parts or any(p in ("", ".", "..") for p in parts):
        raise SitestackError(f"cannot render {site_path!r}: not an absolute, normalised path on the site")
    if parts in ([INDEX_JSON], [INDEX_MD]):
        raise SitestackError(f"cannot render {site_path!r}: the index has that name")
    return out.joinpath(*parts)


def _make_dirs(out: Path, target: Path) -> None:
    """The directories from ``out`` down to ``target``'s parent, each a real directory (a link is an error)."""
    here = out
    for part in target.relative_to(out).parts[:-1]:
        here = here / part
        try:
            os.mkdir(here, 0o755)
        except FileExistsError:
            if not stat.S_ISDIR(os.lstat(here).st_mode):
                raise SitestackError(f"{here} is not a directory (a link or a file): not writing through it") from None


def write_rendering(rendering: Rendering, out: Path) -> dict[str, Any]:
    """Write the files and the index under ``out`` (made if missing); return the index document."""
    out.mkdir(parents=True, exist_ok=True)
    final = rendering.final()
    for site_path, (text, mode, _step) in sorted(final.items()):
        target = local_path(out, site_path)
        _make_dirs(out, target)
        if os.path.lexists(target) and not stat.S_ISREG(os.lstat(target).st_mode):
            raise SitestackError(f"{target} is not a regular file (a link?): not writing through it")
        atomic_write(target, text.encode(), mode)
    document = index_document(rendering)
    atomic_write(out / INDEX_JSON, (json.dumps(document, indent=2) + "\n").encode())
    atomic_write(out / INDEX_MD, index_markdown(document).encode())
    return document


def index_document(rendering: Rendering) -> dict[str, Any]:
    """The index: each file once (its site path, mode, the step whose text it holds, earlier writers),
    and each step with its file count or why it rendered nothing."""
    writers = rendering.writers()
    files = [{"path": path, "mode": f"{mode:04o}", "step": step, "bytes": len(text.encode()),
              "also_written_by": writers[path][:-1]}
             for path, (text, mode, step) in sorted(rendering.final().items())]
    steps = [{"step": s.name, "action": s.action, "stack": s.stack, "files": len(s.files),
              **({"error": s.error} if s.error else {})} for s in rendering.steps]
    return {"site": rendering.site, "playbook": rendering.playbook, "values": rendering.values,
            "files": files, "steps": steps}


def index_markdown(document: Mapping[str, Any]) -> str:
    """The index as a readable page: the steps in order, each with the files it writes."""
    lines = [f"# Files the {document['site']} playbook installs", "",
             f"Rendered from {document['playbook']} for " + ", ".join(f"{k} {v}" for k, v in document["values"].items())
             + ". Each file is below this directory at its path on the site.", ""]
    by_step: dict[str, list[Mapping[str, Any]]] = {}
    for entry in document["files"]:
        by_step.setdefault(entry["step"], []).append(entry)
    for step in document["steps"]:
        stack = f", stack {step['stack']}" if step["stack"] else ""
        lines.append(f"## {step['step']} ({step['action']}{stack})")
        lines.append("")
        if step.get("error"):
            lines.append(f"Not rendered: {step['error']}")
        elif not step["files"]:
            lines.append("Writes no file known before it runs on the site (it checks, builds or copies there).")
        for entry in by_step.get(step["step"], []):
            also = f" (also written by {', '.join(entry['also_written_by'])})" if entry["also_written_by"] else ""
            lines.append(f"- `{entry['path']}` {entry['mode']}{also}")
        lines.append("")
    return "\n".join(lines)


def summary(document: Mapping[str, Any], out: Path) -> list[str]:
    """The lines ``invoke render`` prints: where the files went, how many, and each step that failed."""
    lines = [f"{len(document['files'])} files of {document['site']} rendered under {out} "
             f"(index: {out / INDEX_MD}, {out / INDEX_JSON})"]
    lines += [f"  {s['step']}: not rendered: {s['error']}" for s in document["steps"] if s.get("error")]
    return lines
