"""The generations of a site's stacks: list them (``invoke generations``), switch back
(``invoke rollback``) and collect the retired ones (``invoke gc``).

A stack is found by its manifest link ``<prefix>/<family>/<version>.manifest.json`` (as ``invoke
installed`` finds it); its generations, the record and the rules for keeping a retired one are
:mod:`sitestack.installs.generations`'. The host is the site's first (or ``--host``). A rollback
or a collection holds the prefix's provision lock, so it never runs beside a provision.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from sitestack.core.errors import InputError, SitestackError
from sitestack.core.host import Host
from sitestack.engine.inventory import prefix_glob
from sitestack.engine.playbook import connect, context_for
from sitestack.engine.select import select_hosts
from sitestack.installs import generations as gens
from sitestack.installs.site_stack import site_stack
from sitestack.installs.stamp import STAMP
from sitestack.installs.venv_stack import MANIFEST
from sitestack.model.context import RunContext, RunOptions
from sitestack.model.facts import Facts
from sitestack.model.site import Site


@contextlib.contextmanager
def opened(site: Site, options: RunOptions, *, read_only: bool) -> Iterator[tuple[Host, RunContext]]:
    """The site's first selected host and its run context (facts, prefix), closed after."""
    spec = select_hosts(site, options)[0]
    host = connect(spec, RunOptions(check=read_only, accept_new_host_keys=options.accept_new_host_keys))
    try:
        yield host, context_for(site, host, options, None)
    finally:
        host.close()


def stack_paths(host: Host, prefix: str) -> dict[str, str]:
    """module name (``pytorch/2.13.0-cpu``) -> stable path, of every stack under ``prefix``."""
    suffix = ".manifest.json"
    return {path[len(prefix) + 1:-len(suffix)]: path[:-len(suffix)] for path in prefix_glob(host, prefix, suffix)}


def install_paths(host: Host, prefix: str) -> dict[str, str]:
    """``recipe@version`` -> path, of every recipe install under ``prefix`` (their trees are generations too)."""
    suffix = f"/{STAMP}"
    out = {}
    for path in prefix_glob(host, prefix, suffix):
        dest = path[:-len(suffix)]
        recipe, version = dest[len(prefix) + 1:].split("/", 1)
        out[f"{recipe}@{version}"] = dest
    return out


def chosen(found: dict[str, str], stack: str | None, prefix: str) -> dict[str, str]:
    """The stacks ``--stack`` names (all when None); a name that is not there is an input error."""
    if stack is None:
        return found
    if stack not in found:
        raise InputError("--stack", f"no stack {stack!r} under {prefix} (stacks: {', '.join(sorted(found)) or 'none'})")
    return {stack: found[stack]}


Grace = tuple[int | None, str]


def graces(host: Host, ctx: RunContext) -> Callable[[str], Grace]:
    """stable path -> how long its retired generations are kept (:func:`sitestack.installs.generations.grace_seconds`),
    each stack by its own facts (a ``stacks:`` overlay's ``scheduler.max_job_time``, not the playbook's).
    A path no stack of the playbook makes (a recipe install, a stack since renamed) gets the longest of
    them: a generation is never removed sooner than any stack's jobs may run."""
    by_time: dict[str | None, Grace] = {}

    def grace_of(facts: Facts) -> Grace:
        key = facts.scheduler.max_job_time
        if key not in by_time:
            by_time[key] = gens.grace_seconds(host, facts)
        return by_time[key]

    own = ctx.site.own or ctx.site
    named: dict[str, Grace] = {}
    for key in (None, *own.stacks):
        stack_ctx = ctx.for_stack(key)
        stack = site_stack(stack_ctx)
        if stack is not None:
            named[stack.path] = grace_of(stack_ctx.facts)
    known = [*named.values(), grace_of(ctx.facts)]
    longest = next((g for g in known if g[0] is None), max(known, key=lambda g: g[0] or 0))
    return lambda path: named.get(path, longest)


def describe(host: Host, name: str, path: str, grace: Grace) -> dict[str, Any]:
    """One stack's generations, newest first, each with what a collection would do with it."""
    history = gens.read_history(host, path)
    # one look at the processes for every generation on disk, the verdicts' included
    users = gens.in_use(host, [f"{history.parent}/{name}" for name in sorted(history.on_disk)])
    fate = {v.path.rsplit("/", 1)[1]: v for v in gens.verdicts(host, history, grace, users=users)}
    rows = []
    for g in sorted(history.generations, key=lambda g: g.created, reverse=True):
        on_disk = g.name in history.on_disk
        current = g.name == history.current
        verdict = fate.get(g.name)
        state = "current" if current else ("pending" if g.pending and on_disk else "retired" if on_disk else "removed")
        rows.append({"generation": g.name, "state": state, "created": g.when(g.created),
                     "retired": g.when(g.retired) if not current else None, "digest": g.digest, "change": g.change,
                     "promoted": g.promoted or None,
                     "in_use": bool(users.get(f"{history.parent}/{g.name}")),
                     "manifest": f"{history.parent}/{g.name}/{MANIFEST}" if on_disk else None,
                     "fate": None if current or verdict is None else verdict.why})
    return {"stack": name, "path": path, "current": history.current, "grace": grace[1], "generations": rows}


def lines(found: list[dict[str, Any]]) -> list[str]:
    out: list[str] = []
    for stack in found:
        out.append(f"{stack['stack']}  ({stack['path']})")
        for g in stack["generations"]:
            mark = "*" if g["state"] == "current" else " "
            use = "  in use" if g["in_use"] else ""
            out.append(f" {mark} {g['generation']}  {g['state']:<8} made {g['created']}  {g['digest'] or '-'}{use}")
            if g["change"]:
                out.append(f"      {g['change']}")
            if g["promoted"]:
                out.append(f"      {g['promoted']}")
            if g["fate"]:
                out.append(f"      {g['fate']}")
    return out or ["no stacks"]


def list_generations(site: Site, options: RunOptions, stack: str | None) -> list[dict[str, Any]]:
    """``invoke generations``: each stack's generations (read-only)."""
    with opened(site, options, read_only=True) as (host, ctx):
        prefix = ctx.values["prefix"].rstrip("/")
        grace = graces(host, ctx)
        return [describe(host, name, path, grace(path)) for name, path in sorted(chosen(stack_paths(host, prefix), stack,
                                                                                        prefix).items())]


def locked(host: Host, prefix: str, options: RunOptions, report: Callable[[str], None]) -> Any:
    """The prefix's provision lock: a rollback, a collection or a promotion never runs beside a provision."""
    return host.lock(f"{prefix}/.sitestack/provision.lock", wait=options.lock_wait, report=report)


def rollback(site: Site, options: RunOptions, stack: str | None, report: Callable[[str], None]) -> list[str]:
    """``invoke rollback``: point each chosen stack back at its newest retired generation."""
    done = []
    with opened(site, options, read_only=False) as (host, ctx):
        prefix = ctx.values["prefix"].rstrip("/")
        found = stack_paths(host, prefix)
        if not found:
            raise SitestackError(f"no stack environment under {prefix} on {host.name} (see `invoke installed`)")
        if stack is None and len(found) > 1:
            raise InputError("--stack", f"the site has {len(found)} stacks: name one ({', '.join(sorted(found))})")
        with locked(host, prefix, options, report):
            for name, path in chosen(found, stack, prefix).items():
                left, now = gens.rollback(host, path)
                done.append(f"{name}: {left.name} -> {now.name} (made {now.when(now.created)}; "
                            f"`invoke rollback` again returns to {left.name})")
    return done


def collect(site: Site, options: RunOptions, *, dry_run: bool, report: Callable[[str], None]) -> list[gens.Verdict]:
    """The retired generations of every stack and recipe install: removed where :func:`sitestack.installs.generations.verdicts`
    allows (``dry_run``: only said), each with why it went or stays."""
    out: list[gens.Verdict] = []
    with opened(site, options, read_only=dry_run) as (host, ctx):
        prefix = ctx.values["prefix"].rstrip("/")
        grace = graces(host, ctx)
        held = contextlib.nullcontext() if dry_run else locked(host, prefix, options, report)
        with held:
            found = {**stack_paths(host, prefix), **install_paths(host, prefix)}
            for _name, path in sorted(found.items()):
                out += gens.collect(host, gens.read_history(host, path), grace(path), dry_run=dry_run)
    return out


__all__ = ["collect", "list_generations", "lines", "rollback"]
