"""Generic idempotent actions a playbook step can name, and the registry of all actions.

An action is a :class:`~sitestack.step.Step` class with an ``Args`` dataclass (checked
against the playbook when it is loaded, so a bad argument is an error naming file, line and
key before anything runs) and a constructor taking the step's spec, its arguments and the
:class:`RunContext` of the host it runs on. ``@register("name")`` adds it to :data:`ACTIONS`.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from . import schema
from .errors import CannotProbe, InputError, SitestackError
from .host import Host
from .site import Facts, Site, StepSpec, expand_all, plain_data as _plain
from .siteenv import in_site_env, probe_in_site_env
from .step import Step

ACTIONS: dict[str, type[Action]] = {}


@dataclass(frozen=True)
class RunContext:
    """What a step knows about the run: the site, its facts resolved for this host, options."""

    site: Site
    facts: Facts
    resolved: Mapping[str, Any]  # the facts as plain data, placeholders filled
    values: Mapping[str, str]  # placeholder values for this host
    check: bool = False
    log_dir: Path | None = None
    options: Mapping[str, Any] = field(default_factory=dict)  # task options (e.g. --source)


class Action(Step):
    """A Step built from a playbook step."""

    action: ClassVar[str] = ""

    @dataclass(frozen=True)
    class Args:
        pass

    def __init__(self, spec: StepSpec, args: Any, ctx: RunContext) -> None:
        self.name = spec.name
        self.tags = frozenset(spec.tags)
        self.notify = spec.notify
        self.become = spec.become
        self.args = args
        self.ctx = ctx

    @classmethod
    def check_args(cls, raw: Any, file: str, line: int, key: str) -> Any:
        """Validate the raw YAML arguments; raise InputError naming file, line and key."""
        return schema.build(cls.Args, raw if raw is not None else {}, file, line=line, key=key)

    @classmethod
    def from_spec(cls, spec: StepSpec, ctx: RunContext) -> Action:
        """The step for one host: arguments checked, placeholders (defaults' too) filled."""
        args = cls.check_args(_plain(spec.args), ctx.site.path, spec.line, "args")
        filled = {f.name: expand_all(_plain(getattr(args, f.name)), ctx.values) for f in dataclasses.fields(args)}
        filled = {k: tuple(v) if isinstance(getattr(args, k), tuple) else v for k, v in filled.items()}
        return cls(spec, dataclasses.replace(args, **filled), ctx)


def register(name: str) -> Callable[[type[Action]], type[Action]]:
    def wrap(cls: type[Action]) -> type[Action]:
        if name in ACTIONS:
            raise RuntimeError(f"action {name!r} registered twice")
        cls.action = name
        ACTIONS[name] = cls
        return cls
    return wrap


def _mode(text: str, where: str) -> int:
    try:
        value = int(text, 8)
    except ValueError:
        raise SitestackError(f"{where}: mode must be octal like '0755', not {text!r}") from None
    if not 0 <= value <= 0o7777:
        raise SitestackError(f"{where}: mode {text!r} out of range")
    return value


def unified_diff(old: str | None, new: str, path: str) -> str:
    """A unified diff from ``old`` (None: no file) to ``new``."""
    return "".join(difflib.unified_diff(
        (old or "").splitlines(keepends=True), new.splitlines(keepends=True),
        fromfile="/dev/null" if old is None else f"{path} (on host)", tofile=f"{path} (new)"))


@register("directory")
class Directory(Action):
    """Directories exist with the given mode."""

    @dataclass(frozen=True)
    class Args:
        paths: tuple[str, ...] = field(metadata={"doc": "directories to create (parents too)"})
        mode: str = field(default="0755", metadata={"doc": "octal permission bits"})

        def check(self) -> str | None:
            if not self.paths:
                return "paths: at least one directory"
            for path in self.paths:
                if not path.startswith("/") and not path.startswith("{"):
                    return f"paths: {path!r} must be absolute"
            try:
                _mode(self.mode, "mode")
            except SitestackError as exc:
                return str(exc)
            return None

    def describe(self) -> str:
        return f"create {', '.join(self.args.paths)}"

    def pending(self, host: Host) -> str | None:
        want = _mode(self.args.mode, self.name)
        out = host.probe(["stat", "-c", "%F|%a|%n", "--", *self.args.paths])
        found = {}
        for line in out.stdout.splitlines():
            kind, mode, name = line.split("|", 2)
            found[name] = (kind, int(mode, 8))
        problems = []
        for path in self.args.paths:
            if path not in found:
                problems.append(f"{path} missing")
            elif found[path][0] != "directory":
                raise SitestackError(f"{path} exists and is a {found[path][0]}, not a directory")
            elif found[path][1] != want:
                problems.append(f"{path} mode {found[path][1]:04o}, want {want:04o}")
        return "; ".join(problems) or None

    def apply(self, host: Host) -> None:
        host.run(["mkdir", "-p", "--", *self.args.paths], sudo=self.become)
        host.run(["chmod", self.args.mode, "--", *self.args.paths], sudo=self.become)


@register("require-tools")
class RequireTools(Action):
    """Commands exist on the host once the site's modules are loaded (an assertion)."""

    asserts = True

    @dataclass(frozen=True)
    class Args:
        tools: tuple[str, ...] = field(metadata={"doc": "commands that must be on PATH"})

    def describe(self) -> str:
        return f"check that {', '.join(self.args.tools)} exist"

    def pending(self, host: Host) -> str | None:
        script = 'for t in "$@"; do command -v "$t" >/dev/null 2>&1 || echo "$t"; done'
        out = probe_in_site_env(host, self.ctx.facts, ["bash", "-c", script, "sitestack", *self.args.tools])
        if out.rc != 0:
            raise SitestackError(f"cannot check tools: {out.stderr.strip()}")
        missing = out.stdout.split()
        if missing:
            loaded = ", ".join(self.ctx.facts.modules.load) or "no site modules"
            raise SitestackError(f"missing on {host.name} (with {loaded} loaded): {', '.join(missing)}")
        return None


@register("modules-available")
class ModulesAvailable(Action):
    """Every site module in facts.modules.load loads, in order (an assertion)."""

    asserts = True

    @dataclass(frozen=True)
    class Args:
        pass

    def describe(self) -> str:
        mods = self.ctx.facts.modules.load
        return f"check that {', '.join(mods)} load" if mods else "check that the module system works"

    def pending(self, host: Host) -> str | None:
        if self.ctx.facts.modules.system == "none":
            return None
        out = probe_in_site_env(host, self.ctx.facts, ["true"])
        if out.rc != 0:
            raise SitestackError(f"site modules do not load: {out.stderr.strip()}")
        return None


@register("site-facts")
class SiteFacts(Action):
    """The resolved site facts are recorded as JSON in the prefix (what later steps and users read)."""

    @dataclass(frozen=True)
    class Args:
        path: str = field(default="{prefix}/share/sitestack/site.json", metadata={"doc": "where to write them"})

    def describe(self) -> str:
        return f"write {self.args.path}"

    def render(self) -> str:
        record = {"site": self.ctx.site.name, "facts": self.ctx.resolved}
        return json.dumps(record, indent=2, sort_keys=True) + "\n"

    def pending(self, host: Host) -> str | None:
        current = host.read_text(self.args.path)
        if current is None:
            return f"{self.args.path} missing"
        return None if current == self.render() else f"{self.args.path} differs"

    def diff(self, host: Host) -> str | None:
        return unified_diff(host.read_text(self.args.path), self.render(), self.args.path)

    def apply(self, host: Host) -> None:
        host.write_text(self.args.path, self.render(), 0o644)


@register("apt-packages")
class AptPackages(Action):
    """Debian packages are installed (apt-get; sudo where the step says become)."""

    @dataclass(frozen=True)
    class Args:
        packages: tuple[str, ...] = field(metadata={"doc": "Debian package names"})

    def describe(self) -> str:
        return f"install {', '.join(self.args.packages)}"

    def pending(self, host: Host) -> str | None:
        out = host.probe(["dpkg-query", "-W", "-f=${Package} ${Status}\\n", *self.args.packages])
        if out.rc == 127 and "not found" in out.stderr:
            raise CannotProbe("dpkg-query not found: not a Debian host")
        installed = {line.split()[0] for line in out.stdout.splitlines() if line.endswith(" installed")}
        missing = [p for p in self.args.packages if p not in installed]
        return f"not installed: {', '.join(missing)}" if missing else None

    def apply(self, host: Host) -> None:
        env = {"DEBIAN_FRONTEND": "noninteractive"}
        log = self.ctx.log_dir / log_name(self.name) if self.ctx.log_dir else None
        missing = self.pending(host) or ""
        # apt-get update only when the package lists are missing (fresh containers have none).
        if not host.probe(["sh", "-c", "ls /var/lib/apt/lists/*_Packages >/dev/null 2>&1"]).ok:
            host.run(["apt-get", "update"], env=env, sudo=self.become, log=log)
        names = missing.removeprefix("not installed: ").split(", ")
        host.run(["apt-get", "install", "-y", "--no-install-recommends", *names], env=env, sudo=self.become, log=log)


@register("command")
class Command(Action):
    """Run a command once: the step is done when the path in `creates` exists.

    The escape hatch for what no other action covers (Ansible's ``command`` with
    ``creates``). The command should create that path last, when it succeeded.
    """

    @dataclass(frozen=True)
    class Args:
        argv: tuple[str, ...] = field(metadata={"doc": "the command and its arguments (no shell)"})
        creates: str = field(metadata={"doc": "absolute path that exists once the command has run"})
        env: Mapping[str, str] = field(default_factory=dict, metadata={"doc": "extra environment variables"})
        site_env: bool = field(default=False, metadata={"doc": "run with the site's modules loaded"})

        def check(self) -> str | None:
            if not self.argv:
                return "argv: the command is empty"
            if not (self.creates.startswith("/") or self.creates.startswith("{")):
                return f"creates: {self.creates!r} must be absolute"
            return None

    def describe(self) -> str:
        return f"run {' '.join(self.args.argv)}"

    def pending(self, host: Host) -> str | None:
        return None if host.exists(self.args.creates) else f"{self.args.creates} missing"

    def apply(self, host: Host) -> None:
        argv = in_site_env(self.ctx.facts, self.args.argv) if self.args.site_env else list(self.args.argv)
        log = self.ctx.log_dir / log_name(self.name) if self.ctx.log_dir else None
        host.run(argv, env=dict(self.args.env), log=log, sudo=self.become)


def log_name(step_name: str) -> str:
    """A log file name for a step: its name with anything but letters, digits, . and - as _."""
    import re
    return re.sub(r"[^A-Za-z0-9.-]+", "_", step_name).strip("_") + ".log"
