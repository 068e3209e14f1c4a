"""The ``pack-env`` action (``invoke pack-env``): a venv from a requirements.txt, packed into
one squashfs image with wrappers in ``<dest>/bin`` (LUMI's container wrapper "Tykky",
https://docs.lumi-supercomputer.eu/software/installing/container-wrapper/; layout and wrappers: :mod:`sitestack.installs.squashfs_env`).

- The venv is made with the site's Python: inside the site's container when the site runs its
  stack in one (``python.source: container``; the container's packages are seen through
  ``--system-site-packages``, like the stack venv), else on the host.
- Idempotent by a digest of the inputs (requirements, interpreter, runtime, image, format): a
  re-run with the same inputs only reads the stamp; a changed requirement re-packs.
- Atomic: a new generation is built in a hidden sibling of ``<dest>`` and switched to with one
  rename. Until then the old image and wrappers stay in use; a failing package install removes
  the new generation and says so, and nothing half-packed is ever visible at ``<dest>``.
- A conda environment file (``env.yml``) is parsed (a file that does not parse is an error
  naming it) and refused: sitestack packs pip requirements only (docs/containers.md).
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sitestack.actions.action import Action, log_name
from sitestack.core.errors import CommandFailed, InputError, SitestackError
from sitestack.core.host import Host
from sitestack.installs.squashfs_env import (
    MKSQUASHFS_OPTIONS,
    PackedEnv,
    clean_argv,
    commands_of,
    parse_requirements,
    wrapper,
)
from sitestack.model.container_facts import runtime_of
from sitestack.model.context import RunContext
from sitestack.model.site import StepSpec, expand

NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._+-]*"
CHOICES = ("auto", "true", "false")


def read_requirements(path: str, where: str) -> list[str]:
    """The checked lines of the requirements file at ``path`` (on the controller)."""
    if not os.path.isfile(path):
        raise InputError(where, f"requirements: {path}: no such file")
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    if path.endswith((".yml", ".yaml")):
        try:
            yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            line = f":{mark.line + 1}" if mark is not None else ""
            raise InputError(f"{path}{line}", f"does not parse as YAML: {getattr(exc, 'problem', exc)}") from None
        raise InputError(where, f"requirements: {path} is a conda environment file; pack-env builds pip "
                         "environments from a requirements.txt (no conda here to solve it; docs/containers.md)")
    return parse_requirements(text, path)


class PackEnv(Action):
    """A venv from a requirements file, packed into one squashfs image, with wrapper commands."""

    action = "pack-env"

    @dataclass(frozen=True)
    class Args:
        name: str = field(metadata={"doc": "the environment's name (letters, digits, . _ + -)"})
        requirements: str = field(metadata={"doc": "requirements.txt on the controller (relative: to the playbook's "
                                                   "directory)"})
        dest: str | None = field(default=None, metadata={"doc": "where it goes (default {prefix}/envs/<name>); "
                                                                "users put <dest>/bin on PATH"})
        container: str = field(default="auto", metadata={"doc": "build and run in the site's container: true, "
                                                                "false, or auto (where python.source is container)"})
        system_site_packages: str = field(default="auto", metadata={
            "doc": "see the base Python's packages: true, false, or auto (true in a container)"})

        def check(self) -> str | None:
            import re

            if not re.fullmatch(NAME_PATTERN, self.name):
                return f"name: {self.name!r} must be letters, digits, . _ + - (no /)"
            for key in ("container", "system_site_packages"):
                if getattr(self, key) not in CHOICES:
                    return f"{key}: must be auto, true or false, not {getattr(self, key)!r}"
            if self.dest is not None and not self.dest.startswith(("/", "{")):
                return f"dest: {self.dest!r} must be an absolute path"
            return None

    def __init__(self, spec: StepSpec, args: Any, ctx: RunContext) -> None:
        super().__init__(spec, args, ctx)
        facts = ctx.facts
        where = f"{ctx.site.path}:{spec.line}" if spec.line else ctx.site.path
        path = args.requirements
        if not os.path.isabs(path):
            path = os.path.join(os.path.dirname(os.path.abspath(ctx.site.path)), path)
        self.requirements_file = path
        requirements = read_requirements(path, where)
        use_container = (args.container == "true" or
                         (args.container == "auto" and facts.python.source == "container"))
        runtime = image = None
        binds: tuple[str, ...] = ()
        prefix = ctx.values["prefix"].rstrip("/")
        if use_container:
            if facts.container is None or not facts.container.image:
                raise InputError(where, f"pack-env {args.name}: container is {args.container}, but the site has no "
                                 "facts.container.image", key="args.container")
            runtime = runtime_of(facts.container)
            image = expand(facts.container.image, ctx.values)
            binds = tuple(dict.fromkeys([prefix, *(expand(b, ctx.values) for b in facts.container.bind)]))
        ssp = args.system_site_packages == "true" or (args.system_site_packages == "auto" and use_container)
        dest = (args.dest or f"{prefix}/envs/{args.name}").rstrip("/")
        self.packed = PackedEnv(name=args.name, dest=dest, requirements=tuple(requirements),
                             python=facts.python.executable, system_site_packages=ssp, runtime=runtime, image=image,
                             binds=binds)

    def describe(self) -> str:
        return f"pack the environment {self.packed.name} into {self.packed.dest}"

    def _stamp(self, host: Host) -> dict[str, Any] | None:
        return host.read_json(f"{self.packed.dest}/packed.json")

    def pending(self, host: Host) -> str | None:
        p = self.packed
        stamp = self._stamp(host)
        if stamp is None:
            return f"{p.dest} not packed yet"
        if stamp.get("digest") != p.digest():
            old, new = stamp.get("inputs", {}), p.inputs()
            changed = sorted(k for k in new if old.get(k) != new[k])
            return f"inputs changed ({', '.join(changed) or 'format'}): re-pack"
        missing = [f for f in ("env.sqfs", "bin/python") if not host.exists(f"{p.dest}/{f}")]
        if missing:
            return f"{', '.join(missing)} missing in {p.dest}"
        return None

    def _tools(self, host: Host) -> None:
        p = self.packed
        tools = {"mksquashfs": "squashfs-tools"}
        tools.update({p.runtime.command: "the site's container runtime"} if p.runtime else
                     {"squashfuse": "squashfuse", "mountpoint": "util-linux", "flock": "util-linux"})
        script = 'for t in "$@"; do command -v "$t" >/dev/null 2>&1 || echo "$t"; done'
        out = host.probe(["bash", "-c", script, "sitestack", *tools])
        missing = out.stdout.split()
        if missing:
            raise SitestackError(f"packing needs {', '.join(f'{t} ({tools[t]})' for t in missing)} "
                                 f"on {host.name}")

    def apply(self, host: Host) -> None:
        p = self.packed
        self._tools(host)
        if host.exists(p.dest) and not host.probe(["test", "-L", p.dest]).ok:
            raise SitestackError(f"{p.dest} exists and is not a packed environment sitestack made: move it away first")
        log = self.ctx.log_dir / log_name(self.name) if self.ctx.log_dir else None
        gen = f".{p.leaf}.gen-{secrets.token_hex(4)}"
        gdir = f"{p.parent}/{gen}"
        root = f"{gdir}/root"
        previous = host.probe(["readlink", p.dest]).stdout.strip()
        host.run(["mkdir", "-p", "--", root, f"{gdir}/bin"])
        try:
            host.write_text(f"{gdir}/requirements.txt", "\n".join(p.requirements) + "\n")
            self.ctx.note(f"{p.name}: creating the venv{' in the container' if p.runtime else ''}")
            host.run(p.in_env([p.python, "-m", "venv", *(["--system-site-packages"] if p.system_site_packages else []),
                               root]), log=log)
            self.ctx.note(f"{p.name}: pip install -r {self.requirements_file}")
            try:
                host.run(p.in_env([f"{root}/bin/python", "-m", "pip", "install", "--no-input", "--disable-pip-version-check",
                                   "-r", f"{gdir}/requirements.txt"]), log=log)
            except CommandFailed as exc:
                tail = "\n".join(exc.output.rstrip().splitlines()[-8:])
                where = f" (full log: {exc.log})" if exc.log else ""
                raise SitestackError(f"pip could not install the requirements of "
                                     f"{self.requirements_file}; nothing was changed, the previous environment stays "
                                     f"in use{where}\n{tail}") from None
            listing = host.run(["find", f"{root}/bin", "-maxdepth", "1", "(", "(", "-type", "f", "-perm", "-u+x", ")",
                                "-o", "-type", "l", ")", "-printf", "%f\n"]).stdout
            commands = commands_of(listing)
            self.ctx.note(f"{p.name}: mksquashfs ({len(commands)} commands)")
            jobs = self.ctx.options.jobs or self.ctx.facts.build_jobs
            host.run(["mksquashfs", root, f"{gdir}/env.sqfs", *MKSQUASHFS_OPTIONS,
                      *(["-processors", str(jobs)] if jobs else [])], log=log)
            # the image holds the venv now; root stays as the (empty) mount point
            host.run(["bash", "-c", 'rm -rf -- "$1" && mkdir -- "$1"', "sitestack", root])
            for command in commands:
                host.write_text(f"{gdir}/bin/{command}", wrapper(p, gdir, command), 0o755)
            stamp = {"digest": p.digest(), "inputs": p.inputs(), "generation": gen, "commands": commands,
                     "requirements_file": self.requirements_file}
            host.write_text(f"{gdir}/packed.json", json.dumps(stamp, indent=2, sort_keys=True) + "\n")
            token = gen.rsplit("-", 1)[1]
            host.run(["bash", "-c", 'cd -- "$1" && ln -s -- "$2" ".$3.link-$4" && mv -T -- ".$3.link-$4" "$3"',
                      "sitestack", p.parent, gen, p.leaf, token])
        except BaseException:
            host.probe(["rm", "-rf", "--", gdir])
            raise
        host.run(clean_argv(p, keep=os.path.basename(previous)))
