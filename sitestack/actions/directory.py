"""The ``directory`` action: directories exist with the given mode."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from sitestack.actions.action import Action
from sitestack.core.errors import SitestackError
from sitestack.core.host import Host
from sitestack.core.quoting import in_prefix_problem


def parse_mode(text: str, where: str) -> int:
    try:
        value = int(text, 8)
    except ValueError:
        raise SitestackError(f"{where}: mode must be octal like '0755', not {text!r}") from None
    if not 0 <= value <= 0o7777:
        raise SitestackError(f"{where}: mode {text!r} out of range")
    return value


class Directory(Action):
    """Directories exist with the given mode."""

    action = "directory"

    @dataclass(frozen=True)
    class Args:
        paths: tuple[str, ...] = field(metadata={"doc": "directories to create (parents too)"})
        mode: str = field(default="0755", metadata={"doc": "octal permission bits"})

        def check(self) -> str | None:
            if not self.paths:
                return "paths: at least one directory"
            for path in self.paths:
                problem = in_prefix_problem(path, "paths")
                if problem:
                    return problem
            try:
                parse_mode(self.mode, "mode")
            except SitestackError as exc:
                return str(exc)
            if not re.fullmatch(r"0?[0-7]{3}", self.mode):
                return f"mode: {self.mode!r} must be permission bits like '0755' (no setuid, setgid or sticky)"
            return None

    def describe(self) -> str:
        return f"create {', '.join(self.args.paths)}"

    def wanted_mode(self) -> int:
        """The mode asked for; group-writable on a site that shares its installs with a group
        (facts.install.mode: group-write)."""
        want = parse_mode(self.args.mode, self.name)
        if self.ctx.facts.install.mode == "group-write" and want & 0o040:
            want |= 0o020
        return want

    def pending(self, host: Host) -> str | None:
        want = self.wanted_mode()
        # -L: a symlink to a directory is that directory (sites often reach a prefix on a parallel
        # file system through one, /appl/x -> /pfs/...), as Ansible's file module with follow=yes
        out = host.probe(["stat", "-L", "-c", "%F|%a|%n", "--", *self.args.paths])
        found = {}
        for line in out.stdout.splitlines():
            kind, mode, name = line.split("|", 2)
            found[name] = (kind, int(mode, 8))
        problems = []
        for path in self.args.paths:
            if path not in found:
                if host.probe(["test", "-L", path]).ok:
                    raise SitestackError(f"{path} is a symbolic link to nothing (its target is missing)")
                problems.append(f"{path} missing")
            elif found[path][0] != "directory":
                raise SitestackError(f"{path} exists and is a {found[path][0]}, not a directory")
            elif found[path][1] & 0o777 != want:
                # only permission bits are compared (args.mode has no others): the setgid bit a
                # group-shared install adds (facts.install.group) is kept, not fought
                problems.append(f"{path} mode {found[path][1]:04o}, want {want:04o}")
        return "; ".join(problems) or None

    def apply(self, host: Host) -> None:
        host.run(["mkdir", "-p", "--", *self.args.paths], sudo=self.become)
        host.run(["chmod", f"{self.wanted_mode():04o}", "--", *self.args.paths], sudo=self.become)
