"""Run a site playbook on its hosts: connect, resolve facts per host, converge, recap.

``provision(site, options, reporter)`` runs every selected host in a thread pool; one host
failing (or failing to connect) does not stop the others. Applying takes a lock per install
prefix on each host, so two runs against one prefix never interleave. Check mode uses a
read-only Host: probes run for real, mutations are refused.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sitestack.actions import ACTIONS
from sitestack.core.cores import local_cores
from sitestack.core.errors import InputError, SitestackError
from sitestack.core.host import Host, LocalHost, local_host, ssh_host
from sitestack.core.hostbase import GROUP_UMASK
from sitestack.core.paths import PLAYBOOK_DIR
from sitestack.core.private import private_dir
from sitestack.core.report import HostRun, Reporter
from sitestack.core.ssh import check_ssh_config
from sitestack.core.step import Result, Step, converge, selected
from sitestack.engine import select
from sitestack.model.context import RunContext, RunOptions
from sitestack.model.site import HostSpec, Site, StepSpec, load_site

#: The run options (one typed object from the CLI down to every step).
Options = RunOptions



def load(site_name: str | None = None, path: Path | None = None) -> Site:
    """Load a site playbook, checking its steps against the registered actions."""
    if not site_name and path is None:
        raise InputError("--site", "missing: name a site (see `invoke sites`) or give --playbook FILE")
    return load_site(site_name, path=path, actions=ACTIONS)


def select_hosts(site: Site, names: Sequence[str]) -> list[HostSpec]:
    """The playbook's hosts, or the named ones (a name not in the playbook is an SSH host)."""
    return select.select_hosts(site, RunOptions(hosts=tuple(names)))


def check_tags(site: Site, options: Options) -> None:
    known = {t for s in (*site.steps, *site.handlers) for t in s.tags} | {s.name for s in site.steps} | {"always"}
    for option, values in (("--tags", options.tags), ("--skip-tags", options.skip_tags)):
        for tag in values:
            if tag not in known:
                tags = ", ".join(sorted(known - {s.name for s in site.steps}))
                raise InputError(option, f"no step of {site.path} has tag {tag!r} (tags: {tags}; step names work too)")


def log_root(options: Options, site: Site) -> Path:
    """This run's log directory, made private whatever the umask (every directory it makes is 0700:
    :mod:`sitestack.core.private`), before anything runs: an unusable one is one message."""
    cache = Path.home() / ".cache" / "sitestack"
    root = options.log_root or cache / "logs"
    path = root / site.name / time.strftime("%Y%m%d-%H%M%S")
    try:
        if not options.log_root:
            private_dir(cache)   # sitestack's own: 0700 even where an older run left it wider
        private_dir(path)
    except OSError as exc:
        raise InputError("SITESTACK_LOG_DIR" if options.log_root else str(root),
                         f"cannot make the log directory {path}: {exc.strerror}") from None
    return path


def connect(spec: HostSpec, options: Options) -> Host:
    if spec.connection == "local":
        return local_host(spec.name, read_only=options.check)
    return ssh_host(spec.name, spec.address, user=spec.user, port=spec.port, read_only=options.check,
                    accept_unknown_hosts=options.accept_new_host_keys)


def context_for(site: Site, host: Host, options: Options, logs: Path | None) -> RunContext:
    """Resolve the site's placeholders for ``host`` and build the steps' context."""
    return RunContext.resolve(site, home=host.home(), user=host.user(), account=options.account,
                              prefix=options.prefix, check=options.check, log_dir=logs, options=options,
                              actions=ACTIONS)


def run_host(site: Site, spec: HostSpec, options: Options, reporter: Reporter, logs: Path | None,
             confirm: select.Confirm | None = None) -> HostRun:
    """Run the playbook on one host; never raises for an expected failure."""
    run = HostRun(spec.name)
    start = time.perf_counter()
    if logs is not None:
        reporter.log_host_to(spec.name, logs / spec.name / "provision.log")
    host = None
    if options.progress is None:  # progress lines go to the console and this host's provision.log
        options = dataclasses.replace(options, progress=lambda text: reporter.note(text, spec.name))
    try:
        host = connect(spec, options)
        if options.verbose:
            host.echo = lambda line: reporter.output(spec.name, line)
        ctx = context_for(site, host, options, logs / spec.name if logs else None)
        if ctx.facts.install.mode == "group-write":
            host.umask = GROUP_UMASK
            if isinstance(host, LocalHost):
                os.umask(int(GROUP_UMASK, 8))
        prefix = ctx.values["prefix"]
        not_probed = not_the_site(site, ctx, host, options, reporter)
        if ctx.facts.install.group and not not_probed:
            check_group(host, ctx.facts.install.group)  # before anything is built, not at the end
        # A step --tags/--skip-tags leave out is only reported skipped: it is not built for the host
        # (a recipe install loads and checks its recipe and plans its build: most of a no-op's CPU
        # per host when only the core steps run).
        unbuilt = [_Unbuilt(s) for s in site.steps]
        steps = [ACTIONS[s.action].from_spec(s, ctx.for_step(s)) if selected(u, options.tags, options.skip_tags)
                 else u for s, u in zip(site.steps, unbuilt, strict=True)]
        handlers = [ACTIONS[s.action].from_spec(s, ctx.for_step(s)) for s in site.handlers]

        def go() -> list[Result]:
            return converge(steps, host, check=options.check, want_diff=options.diff, tags=options.tags,
                            skip_tags=options.skip_tags, handlers=handlers, not_probed=not_probed,
                            on_result=lambda r: reporter.result(spec.name, r),
                            gate=select.gate_for(site, options, spec.name, confirm),
                            concurrency=step_concurrency(host, options, confirm))

        if options.check or not_probed:
            run.results = go()
        else:
            if "{account}" in prefix:
                raise InputError("--account", f"site {site.name} installs under {prefix}: give --account (or set SITESTACK_ACCOUNT)")
            with host.lock(f"{prefix}/.sitestack/provision.lock", wait=options.lock_wait,
                           report=lambda text: reporter.note(text, spec.name)):
                run.results = go()
                if ctx.facts.install.group and any(r.status == "changed" for r in run.results):
                    share_with_group(host, prefix, ctx.facts.install.group)
    except SitestackError as exc:
        run.error = str(exc)
        reporter.host_error(spec.name, run.error)
    finally:
        if host is not None:
            host.close()
    run.elapsed = time.perf_counter() - start
    return run


def not_the_site(site: Site, ctx: RunContext, host: Host, options: Options, reporter: Reporter) -> str | None:
    """Why ``host`` cannot be probed as the site's (its ``facts.marker`` is missing), or None. In check
    mode the steps then plan unprobed; the note says once where the files they would write can be read."""
    if not ctx.facts.marker or host.exists(ctx.facts.marker):
        return None
    reason = f"{host.name} is not a {site.name} host ({ctx.facts.marker} missing)"
    if options.check:
        reporter.note(f"{reason}: to read the files this playbook would install, run "
                      f"`invoke render {render_args(site)} --out DIR`", host.name)
    return reason


def render_args(site: Site) -> str:
    """How ``invoke render`` names ``site``: ``--site NAME`` for a playbook of playbooks/, else ``--playbook FILE``."""
    shipped = Path(site.path).resolve() == (PLAYBOOK_DIR / f"{site.name}.yml").resolve()
    return f"--site {site.name}" if shipped else f"--playbook {site.path}"


def step_concurrency(host: Host, options: Options, confirm: select.Confirm | None = None) -> int:
    """How many independent steps run at once on ``host``: ``--parallel-steps`` (or the setting), else
    one per usable core (:mod:`sitestack.core.cores`: the affinity mask, capped by a Slurm job's). One
    where the host's commands cannot run from several threads (SSH: one shell), with ``--step`` (one
    question at a time) and in check mode (:func:`converge` plans in order)."""
    if options.check or confirm is not None or not host.concurrent_steps:
        return 1
    return options.parallel_steps or local_cores()


class _Unbuilt(Step):
    """A step of the playbook as :func:`converge` sees one it does not run: its name, tags and notify."""

    def __init__(self, spec: StepSpec) -> None:
        self.name, self.tags, self.notify = spec.name, frozenset(spec.tags), spec.notify


def facts_using(node: Any, placeholder: str, key: str = "") -> list[str]:
    """The dotted keys of the raw facts whose strings use ``{placeholder}``."""
    if isinstance(node, dict):
        return [k for name, value in node.items() for k in facts_using(value, placeholder, f"{key}.{name}" if key else str(name))]
    if isinstance(node, list):
        return [k for i, value in enumerate(node) for k in facts_using(value, placeholder, f"{key}[{i}]")]
    return [key] if isinstance(node, str) and "{" + placeholder + "}" in node else []


#: Exit 3: no such group; 4: the user may not give files to it (not root, not a member).
_GROUP_CHECK = ('getent group "$1" >/dev/null || exit 3; [ "$(id -u)" = 0 ] && exit 0; '
                'for g in $(id -Gn); do [ "$g" = "$1" ] && exit 0; done; exit 4')


def check_group(host: Host, group: str) -> None:
    """Refuse a run whose ``facts.install.group`` the host lacks or the user cannot give files to
    (``chgrp`` needs membership unless root), before any step runs."""
    rc = host.probe(["sh", "-c", _GROUP_CHECK, "sh", group]).rc
    if rc == 3:
        raise SitestackError(f"facts.install.group: there is no group {group!r} on {host.name} (getent group)")
    if rc == 4:
        raise SitestackError(f"facts.install.group: {host.user()} is not a member of group {group!r} on {host.name}, "
                             "so cannot give it the installed files (id -Gn)")


def share_with_group(host: Host, prefix: str, group: str) -> None:
    """Give ``group`` what was installed under ``prefix``; directories setgid so later files keep it.
    A prefix that is a symlink is followed (the trailing slash names the directory behind it);
    symlinks below it are not: their targets stay as they are (``--no-dereference`` changes the
    link itself, and find does not descend them)."""
    tree = prefix.rstrip("/") + "/"
    host.run(["chgrp", "-R", "--no-dereference", "--", group, tree])
    host.run(["find", tree, "-type", "d", "!", "-perm", "-2000", "-exec", "chmod", "g+s", "--", "{}", "+"])


def require_account(site: Site, options: Options) -> None:
    """A site whose facts use ``{account}`` needs --account, in check mode too: a plan or a job
    script with a literal ``{account}`` in it would be wrong."""
    if options.account is not None:
        return
    jobs = any(s.action == "install-validation-job" for s in site.steps)  # the scheduler facts go into its job scripts
    keys = [k for k in facts_using(site.raw_facts or {}, "account")
            if not (k == "prefix" and options.prefix) and (jobs or not k.startswith("scheduler."))]
    if keys:
        raise InputError("--account", f"site {site.name} needs an account: facts {', '.join(keys)} use {{account}} "
                         "(give --account, or set SITESTACK_ACCOUNT)")


def provision(site: Site, options: Options, reporter: Reporter) -> list[HostRun]:
    """Run ``site``'s playbook on the selected hosts in parallel; return each host's outcome."""
    check_tags(site, options)
    select.check_start_at(site, options)
    select.check_rebuild(site, options)
    require_account(site, options)
    specs = select.select_hosts(site, options)
    for spec in specs:
        if spec.connection == "ssh":
            check_ssh_config(spec.address or spec.name)
    confirm = select.Confirm() if options.confirm_steps else None
    logs = None if options.check else log_root(options, site)
    reporter.start(site.name, [s.name for s in specs], options.check, logs)
    # --step asks one question at a time, so its hosts run one after another (ansible's linear --step)
    forks = 1 if confirm is not None else min(options.forks, len(specs))
    if forks <= 1:
        runs = [run_host(site, spec, options, reporter, logs, confirm) for spec in specs]
    else:
        with concurrent.futures.ThreadPoolExecutor(max_workers=forks) as pool:
            runs = list(pool.map(lambda s: run_host(site, s, options, reporter, logs), specs))
    reporter.recap(runs)
    return runs


def exit_code(runs: Sequence[HostRun], *, check: bool, fail_on_change: bool) -> int:
    """0 ok/changed, 1 any failure, 2 with --check --fail-on-change when anything would change."""
    if any(r.failed for r in runs):
        return 1
    if check and fail_on_change and any(r.changed for r in runs):
        return 2
    return 0
