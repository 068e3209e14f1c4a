"""What a step knows about its run: the site, its facts for one host, and the run's options.

:class:`RunOptions` (sitestack/model/options.py) is the one options object of a run: the CLI
builds it, the engine passes it down unchanged, and every step reads its typed fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sitestack.model.options import RunOptions as RunOptions
from sitestack.model.options import check_host_option as check_host_option
from sitestack.model.options import check_path_option as check_path_option
from sitestack.model.options import check_prefix as check_prefix
from sitestack.model.site import Facts, Site


@dataclass(frozen=True)
class RunContext:
    """What a step knows about the run: the site, its facts resolved for this host, options."""

    site: Site
    facts: Facts
    resolved: Mapping[str, Any]  # the facts as plain data, placeholders filled
    values: Mapping[str, str]  # placeholder values for this host
    check: bool = False
    log_dir: Path | None = None
    options: RunOptions = field(default_factory=RunOptions)
    actions: Mapping[str, Any] = field(default_factory=dict)  # the action table (sitestack.actions.ACTIONS)

    @classmethod
    def resolve(cls, site: Site, *, home: str, user: str, account: str | None, prefix: str | None,
                **fields: Any) -> RunContext:
        """The context of ``site`` on a host with this ``home`` and ``user`` (facts resolved by
        :meth:`Site.resolve`); ``fields`` are the other fields (check, log_dir, options, actions)."""
        resolved = site.resolve(home=home, user=user, account=account, prefix=prefix)
        return cls(site=site, facts=resolved.facts, resolved=resolved.data, values=resolved.values, **fields)

    def for_stack(self, key: str | None) -> RunContext:
        """The context of a step of the playbook's stack ``key`` (a step's ``stack:``): that stack's facts
        resolved for the same host, prefix and options; this one for the playbook's own (None)."""
        if key == self.site.stack:
            return self
        memo: dict[str | None, RunContext] = self.__dict__.setdefault("_stacks", {})
        if key not in memo:
            account = self.values.get("account")
            memo[key] = RunContext.resolve(self.site.for_stack(key), home=self.values["home"], user=self.values["user"],
                                           account=None if account in (None, "{account}") else account,
                                           prefix=self.values["prefix"], check=self.check, log_dir=self.log_dir,
                                           options=self.options, actions=self.actions)
        return memo[key]

    def for_step(self, spec: Any) -> RunContext:
        """The context a playbook step runs with (its ``stack:``, else the playbook's facts)."""
        return self.for_stack(getattr(spec, "stack", None))

    def note(self, text: str) -> None:
        """A progress line: to the run's reporter (and its log), else stdout."""
        if self.options.progress is not None:
            self.options.progress(text)
        else:
            print(text, flush=True)
