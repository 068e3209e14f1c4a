"""The ``pack-env`` action (``invoke pack-env``): an environment from a requirements.txt or a
conda environment file (env.yml), packed into one squashfs image with wrappers in ``<dest>/bin`` (LUMI's container wrapper "Tykky",
https://docs.lumi-supercomputer.eu/software/installing/container-wrapper/; layout and wrappers: :mod:`sitestack.installs.squashfs_env`).

- The venv is made with the site's Python: inside the site's container when the site runs its
  stack in one (``python.source: container``; the container's packages are seen through
  ``--system-site-packages``, like the stack venv), else on the host.
- Idempotent by a digest of the inputs (requirements, interpreter, runtime, image, format): a
  re-run with the same inputs only reads the stamp; a changed requirement re-packs.
- Atomic: a new generation is built in a hidden sibling of ``<dest>`` and switched to with one
  rename. Until then the old image and wrappers stay in use; a failing package install removes
  the new generation and says so, and nothing half-packed is ever visible at ``<dest>``.
- A conda environment file (``env.yml``, as Tykky's ``conda-containerize new --prefix DIR env.yml``
  takes) is checked at load (:mod:`sitestack.installs.conda_env`); its ``python=`` must be the base
  interpreter's version; its conda dependencies are installed by the site's conda or micromamba, or
  else from the package index under the same name and version, decided before anything is built
  (:mod:`sitestack.installs.env_sources`); its ``pip:`` list is installed with pip.
- No environment file (``requirements`` left empty, as lumi.yml's ``packed-env`` step is): the
  step has nothing to pack and costs nothing; ``invoke pack-env --requirements FILE`` gives one.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from sitestack.actions.action import Action, log_name
from sitestack.core.errors import CommandFailed, InputError, SitestackError
from sitestack.core.host import Host
from sitestack.core.pip_auth import Configured, configured_for, pip_auth
from sitestack.core.redact import redact
from sitestack.installs import generations
from sitestack.installs.conda_env import EnvFile, condarc, python_problem, read_env_input, secret_channels
from sitestack.installs.env_sources import Sources, plan_sources
from sitestack.installs.squashfs_env import (
    BASE_SCRIPTS,
    MOUNTERS,
    PackedEnv,
    commands_of,
    requirement_names,
    split_options,
    wrapper,
)
from sitestack.model.container_facts import runtime_of
from sitestack.model.container_runtimes import which_can
from sitestack.model.context import RunContext
from sitestack.model.site import StepSpec, expand

NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._+-]*"
CHOICES = ("auto", "true", "false")


class PackEnv(Action):
    """An environment from a requirements.txt or an env.yml, packed into one squashfs image, with
    wrapper commands (Tykky's layout)."""

    action = "pack-env"

    @dataclass(frozen=True)
    class Args:
        name: str | None = field(default=None, metadata={
            "doc": "the environment's name (letters, digits, . _ + -; default: the env.yml's name:)"})
        requirements: str | None = field(default=None, metadata={
            "doc": "requirements.txt or conda env.yml on the controller (relative: to the playbook's directory); "
                   "none: the step has nothing to pack (invoke pack-env --requirements FILE gives one)"})
        dest: str | None = field(default=None, metadata={"doc": "where it goes (default {prefix}/envs/<name>); "
                                                                "users put <dest>/bin on PATH"})
        container: str = field(default="auto", metadata={"doc": "build and run in the site's container: true, "
                                                                "false, or auto (where python.source is container)"})
        system_site_packages: str = field(default="auto", metadata={
            "doc": "see the base Python's packages: true, false, or auto (true in a container)"})
        channels_without_conda: str = field(default="refuse", metadata={
            "doc": "where the env.yml names channels: but the host has no conda or micromamba: refuse, or index "
                   "(take each conda dependency from the package index under the same name and version)"})

        def check(self) -> str | None:
            import re

            if self.name is not None and not re.fullmatch(NAME_PATTERN, self.name):
                return f"name: {self.name!r} must be letters, digits, . _ + - (no /)"
            for key in ("container", "system_site_packages"):
                if getattr(self, key) not in CHOICES:
                    return f"{key}: must be auto, true or false, not {getattr(self, key)!r}"
            if self.channels_without_conda not in ("refuse", "index"):
                return f"channels_without_conda: must be refuse or index, not {self.channels_without_conda!r}"
            if self.dest is not None and not self.dest.startswith(("/", "{")):
                return f"dest: {self.dest!r} must be an absolute path"
            return None

    def __init__(self, spec: StepSpec, args: Any, ctx: RunContext) -> None:
        super().__init__(spec, args, ctx)
        self._sources: dict[str, Sources] = {}
        self.env: EnvFile | None = None
        self.packed: PackedEnv | None = None
        self.requirements_file = ""
        if args.requirements is None:
            return
        where = f"{ctx.site.path}:{spec.line}" if spec.line else ctx.site.path
        path = args.requirements
        if not os.path.isabs(path):
            path = os.path.join(os.path.dirname(os.path.abspath(ctx.site.path)), path)
        self.requirements_file = path
        self.env = env = read_env_input(path, where)
        name = args.name or env.name
        if name is None:
            raise InputError(where, f"pack-env: {path} names no environment: give the step a name", key="args.name")
        if env.python is not None and (problem := python_problem(env.python, ctx.facts.python.version)):
            raise InputError(env.at(env.python), problem)
        self.packed = self._packed(name, args, where)

    def _packed(self, name: str, args: Any, where: str) -> PackedEnv:
        facts, ctx, env = self.ctx.facts, self.ctx, self.env
        assert env is not None
        use_container = (args.container == "true" or
                         (args.container == "auto" and facts.python.source == "container"))
        runtime = image = None
        binds: tuple[str, ...] = ()
        prefix = ctx.values["prefix"].rstrip("/")
        if use_container:
            if facts.container is None or not facts.container.image:
                raise InputError(where, f"pack-env {name}: container is {args.container}, but the site has no "
                                 "facts.container.image", key="args.container")
            runtime = runtime_of(facts.container)
            if not runtime.mounts_images:
                raise InputError(where, f"pack-env {name}: the packed environment is mounted into the container as an "
                                 f"image, which {runtime.name} cannot do (runtimes that can: {which_can(lambda r: r.mounts_images)}); "
                                 "set container: false", key="args.container")
            image = expand(facts.container.image, ctx.values)
            binds = tuple(dict.fromkeys([prefix, *(expand(b, ctx.values) for b in facts.container.bind)]))
        ssp = args.system_site_packages == "true" or (args.system_site_packages == "auto" and use_container)
        dest = (args.dest or f"{prefix}/envs/{name}").rstrip("/")
        return PackedEnv(name=name, dest=dest, requirements=env.pip, python=facts.python.executable,
                         system_site_packages=ssp, runtime=runtime, image=image, binds=binds,
                         conda=tuple(d.spec for d in env.conda), channels=env.channels)

    def describe(self) -> str:
        if self.packed is None:
            return "pack nothing: no environment file given (invoke pack-env --requirements FILE gives one)"
        return f"pack the environment {self.packed.name} into {self.packed.dest}"

    def sources(self, host: Host) -> Sources:
        """Who installs what on ``host`` (decided once per host, before anything is built)."""
        assert self.packed is not None and self.env is not None
        if host.name not in self._sources:
            self._sources[host.name] = plan_sources(host, self.packed, self.env,
                                                    channels_to_index=self.args.channels_without_conda == "index")
        return self._sources[host.name]

    def pending(self, host: Host) -> str | None:
        p = self.packed
        if p is None:
            return None
        stamp = host.read_json(f"{p.dest}/packed.json")
        if stamp is None:
            summary = self.sources(host).summary
            return f"{p.dest} not packed yet" + (f"; {redact(summary)}" if summary else "")
        if stamp.get("digest") != p.digest():
            old, new = stamp.get("inputs", {}), p.inputs()
            changed = sorted(k for k in new if old.get(k) != new[k])
            self.sources(host)
            return f"inputs changed ({', '.join(changed) or 'format'}): re-pack"
        missing = [f for f in ("env.sqfs", "bin/python") if not host.exists(f"{p.dest}/{f}")]
        if missing:
            return f"{', '.join(missing)} missing in {p.dest}"
        return None

    def _tools(self, host: Host) -> None:
        assert self.packed is not None
        p = self.packed
        tools = {"mksquashfs": "squashfs-tools"}
        tools.update({p.runtime.command: "the site's container runtime"} if p.runtime else
                     {"mountpoint": "util-linux", "flock": "util-linux"})
        script = 'for t in "$@"; do command -v "$t" >/dev/null 2>&1 || echo "$t"; done'
        mounters = [] if p.runtime else [m[0] for m in MOUNTERS]
        out = host.probe(["bash", "-c", script, "sitestack", *tools, *mounters])
        missing = [t for t in out.stdout.split() if t in tools]
        if mounters and set(mounters) <= set(out.stdout.split()):
            # the wrappers mount with the first found (squashfs_env.MOUNTERS); either will do
            tools[" or ".join(mounters)] = "squashfuse"
            missing.append(" or ".join(mounters))
        if missing:
            raise SitestackError(f"packing needs {', '.join(f'{t} ({tools[t]})' for t in missing)} "
                                 f"on {host.name}")

    def apply(self, host: Host) -> None:
        p = self.packed
        if p is None:
            return
        sources = self.sources(host)
        self._tools(host)
        if host.exists(p.dest) and not host.probe(["test", "-L", p.dest]).ok and \
                not host.probe(["bash", "-c", '[ -d "$1" ] && [ -z "$(ls -A -- "$1")" ]', "sitestack", p.dest]).ok:
            raise SitestackError(f"{p.dest} exists and is not a packed environment sitestack made nor an empty "
                                 "directory: move it away first")
        log = self.ctx.log_dir / log_name(self.name) if self.ctx.log_dir else None
        gen = f".{p.leaf}.gen-{secrets.token_hex(4)}"
        gdir = f"{p.parent}/{gen}"
        history = generations.read_history(host, p.dest)
        host.run(["mkdir", "-p", "--", p.parent])
        generations.clean_stale(host, history)
        host.run(["mkdir", "-p", "--", f"{gdir}/root", f"{gdir}/bin"])
        try:
            commands = self._build(host, gdir, sources, log)
            stamp = {"digest": p.digest(), "inputs": p.inputs(), "generation": gen, "commands": commands,
                     "requirements_file": self.requirements_file, "sources": redact(sources.summary)}
            host.write_text(f"{gdir}/packed.json", json.dumps(stamp, indent=2, sort_keys=True) + "\n")
            # the image a running wrapper mounted stays until nothing uses it (docs/operating.md); an
            # empty directory at dest (Tykky's users make it first) is moved aside by the switch
            entry = generations.Generation(gen, time.time(), p.digest()[:16], f"packed from {self.requirements_file}")
            after = generations.switch(host, history, entry)
        except BaseException:
            host.probe(["rm", "-rf", "--", gdir])
            raise
        host.run(["find", p.parent, "-maxdepth", "1", "-name", f".{p.leaf}.old-*", "-type", "d", "-empty", "-delete"])
        generations.collect_retired(host, after, self.ctx.facts, note=self.ctx.note)

    def _build(self, host: Host, gdir: str, sources: Sources, log: Any) -> list[str]:
        """Fill ``gdir``: the environment at root (conda, or a venv), its pip packages, the image,
        the wrappers; the commands wrapped."""
        assert self.packed is not None
        p, root = self.packed, f"{gdir}/root"
        if sources.conda is not None:
            self.ctx.note(redact(f"{p.name}: {sources.summary}"))
            assert self.env is not None
            with private_condarc(host, self.env) as env:
                host.run(p.in_env(sources.conda_argv(root)), env=env, log=log)
        else:
            if sources.summary:
                self.ctx.note(redact(f"{p.name}: {sources.summary}"))
            self.ctx.note(f"{p.name}: creating the venv{' in the container' if p.runtime else ''}")
            host.run(p.in_env([p.python, "-m", "venv", *(["--system-site-packages"] if p.system_site_packages else []),
                               root]), log=log)
        self._fill(host, root, gdir, sources, log)
        listing = host.run(["find", f"{root}/bin", "-maxdepth", "1", "(", "(", "-type", "f", "-perm", "-u+x", ")",
                            "-o", "-type", "l", ")", "-printf", "%f\n"]).stdout
        commands = commands_of(listing)
        self.ctx.note(f"{p.name}: mksquashfs ({len(commands)} commands)")
        jobs = self.ctx.options.jobs or self.ctx.facts.build_jobs
        host.run(["mksquashfs", root, f"{gdir}/env.sqfs", *p.mksquashfs_options(),
                  *(["-processors", str(jobs)] if jobs else [])], log=log)
        # the image holds the environment now; root stays as the (empty) mount point
        host.run(["bash", "-c", 'rm -rf -- "$1" && mkdir -- "$1"', "sitestack", root])
        for command in commands:
            host.write_text(f"{gdir}/bin/{command}", wrapper(p, gdir, command), 0o755)
        return commands

    def _fill(self, host: Host, root: str, gdir: str, sources: Sources, log: Any) -> None:
        """pip's part, in conda's order: the conda dependencies taken from the package index
        (``sources.first``, conda-requirements.txt) are installed first, then the ``pip:`` lines
        (requirements.txt) by a second pip run, which may upgrade what the first installed, as pip
        does after ``conda env create`` (e.g. an env.yml's ``sympy=1.13.1`` under a torch that needs
        a newer one). Then the base's console scripts of the requested distributions."""
        assert self.packed is not None
        options, requirements = split_options(sources.pip)
        # an index's credentials go to pip by environment; the files keep ${VAR} in their place (pip_auth)
        auth = pip_auth(options, requirements, lambda: self._configured(host, root))
        first = pip_auth([], sources.first)
        secrets = {**auth.env, **first.env}
        host.write_text(f"{gdir}/requirements.txt", "".join(f"{line}\n" for line in auth.lines))
        if sources.first:
            host.write_text(f"{gdir}/conda-requirements.txt", "".join(f"{line}\n" for line in first.lines))
            self._pip_install(host, root, auth.options, f"{gdir}/conda-requirements.txt", log, secrets,
                              shown=f"(the conda dependencies of {self.requirements_file})", given=options)
        if requirements:
            self._pip_install(host, root, auth.options, f"{gdir}/requirements.txt", log, secrets,
                              shown=self.requirements_file, given=options)
        names = requirement_names([*sources.first, *requirements])
        if names and self.packed.system_site_packages:
            host.run(self.packed.in_env([f"{root}/bin/python", "-c", BASE_SCRIPTS, root, *names]), log=log)

    def _configured(self, host: Host, root: str) -> Configured:
        """pip's configured extra indexes and find-links, as the env's pip reads them on ``host``."""
        assert self.packed is not None
        return configured_for(host, self.packed.in_env([f"{root}/bin/python"]))

    def _pip_install(self, host: Host, root: str, options: list[str], file: str, log: Any,
                     secrets: dict[str, str], *, shown: str, given: list[str]) -> None:
        """``pip install OPTIONS -r file`` with the env's pip (``shown``: what the note names; ``given``:
        the options as written, shown redacted), ``secrets`` in its environment; a failure says what
        stays in use."""
        assert self.packed is not None
        p = self.packed
        self.ctx.note(redact(" ".join([f"{p.name}: pip install", *given, "-r", shown])))
        try:
            host.run(p.in_env([f"{root}/bin/python", "-m", "pip", "install", "--no-input", "--disable-pip-version-check",
                               *options, "-r", file]), log=log, secrets=secrets)
        except CommandFailed as exc:
            tail = "\n".join(exc.output.rstrip().splitlines()[-8:])
            where = f" (full log: {exc.log})" if exc.log else ""
            raise SitestackError(redact(f"pip could not install the requirements of "
                                        f"{self.requirements_file}; nothing was changed, the previous environment "
                                        f"stays in use{where}\n{tail}")) from None


@contextlib.contextmanager
def private_condarc(host: Host, env: EnvFile) -> Iterator[dict[str, str]]:
    """The environment conda runs with: ``$CONDARC`` naming a ``.condarc`` of the file's channels, 0600 in
    a private directory (mktemp -d: 0700) removed afterwards, where a channel carries a credential
    (:func:`~sitestack.installs.conda_env.secret_channels`: never on the command line, which ``ps`` shows);
    nothing otherwise."""
    if not secret_channels(env):
        yield {}
        return
    out = host.probe(["mktemp", "-d"])
    tmp = out.stdout.strip()
    if not out.ok or not tmp.startswith("/"):
        raise SitestackError(f"[{host.name}] cannot make a private temporary directory: {out.stderr.strip()}")
    try:
        host.write_text(f"{tmp}/condarc", condarc(env), 0o600)
        yield {"CONDARC": f"{tmp}/condarc"}
    finally:
        host.probe(["rm", "-rf", "--", tmp])
