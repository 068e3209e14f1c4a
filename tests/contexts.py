"""Run contexts for a site without a host, as the tests' golden files and unit checks need them."""

from __future__ import annotations

from sitestack.actions import ACTIONS
from sitestack.model.context import RunContext
from sitestack.model.site import Site


def offline_context(site: Site, *, home: str = "/home/user", user: str = "user", account: str | None = "project",
                    prefix: str | None = None) -> RunContext:
    """A run context for ``site`` resolved as for a user ``user`` with home ``home``, without a host."""
    return RunContext.resolve(site, home=home, user=user, account=account, prefix=prefix, actions=ACTIONS)
