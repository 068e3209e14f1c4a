"""The ``command`` action: run a command once: the step is done when the path in `creates` exists."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sitestack.actions.action import Action, log_name
from sitestack.core.host import Host
from sitestack.core.quoting import SHELL_NAME
from sitestack.model.siteenv import in_site_env


class Command(Action):
    """Run a command once: the step is done when the path in `creates` exists.

    The escape hatch for what no other action covers (Ansible's ``command`` with
    ``creates``). The command should create that path last, when it succeeded.
    """

    action = "command"

    @dataclass(frozen=True)
    class Args:
        argv: tuple[str, ...] = field(metadata={"doc": "the command and its arguments (no shell)"})
        creates: str = field(metadata={"doc": "absolute path that exists once the command has run"})
        env: Mapping[str, str] = field(default_factory=dict, metadata={
            "doc": "extra environment variables", "key_pattern": SHELL_NAME.pattern,
            "key_doc": "an environment variable name (letters, digits, _)"})
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
