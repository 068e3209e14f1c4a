"""The ``site-facts`` action: the resolved site facts are recorded as JSON in the prefix (what later steps and users read)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from sitestack.actions.action import Action, unified_diff
from sitestack.core.host import Host
from sitestack.core.quoting import in_prefix_problem


class SiteFacts(Action):
    """The resolved site facts are recorded as JSON in the prefix (what later steps and users read)."""

    action = "site-facts"

    @dataclass(frozen=True)
    class Args:
        path: str = field(default="{prefix}/share/sitestack/site.json", metadata={"doc": "where to write them"})

        def check(self) -> str | None:
            return in_prefix_problem(self.path, "path")

    def describe(self) -> str:
        return f"write {self.args.path}"

    def render(self) -> str:
        record = {"site": self.ctx.site.name, "facts": self.ctx.resolved}
        return json.dumps(record, indent=2, sort_keys=True) + "\n"

    def rendered(self, earlier: Mapping[str, str]) -> dict[str, tuple[str, int]]:
        return {self.args.path: (self.render(), 0o644)}

    def pending(self, host: Host) -> str | None:
        current = host.read_text(self.args.path)
        if current is None:
            return f"{self.args.path} missing"
        return None if current == self.render() else f"{self.args.path} differs"

    def diff(self, host: Host) -> str | None:
        return unified_diff(host.read_text(self.args.path), self.render(), self.args.path)

    def apply(self, host: Host) -> None:
        host.write_text(self.args.path, self.render(), 0o644)
