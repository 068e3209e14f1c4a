"""The ``modules-available`` action: every site module in facts."""

from __future__ import annotations

from dataclasses import dataclass

from sitestack.actions.action import Action
from sitestack.core.errors import SitestackError
from sitestack.core.host import Host
from sitestack.model.siteenv import ENV_REPORT, env_vouchers, probe_in_site_env


class ModulesAvailable(Action):
    """Every site module in facts.modules.load loads, in order (an assertion)."""

    action = "modules-available"

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
        # Kept in the probe cache while the module system's init script and the module files it loaded
        # stay the same (sitestack.model.siteenv.env_vouchers); a failed load is never kept.
        facts = self.ctx.facts
        out = probe_in_site_env(host, facts, ["bash", "-c", ENV_REPORT],
                                vouchers=lambda done: env_vouchers(facts, done))
        if out.rc != 0:
            raise SitestackError(f"site modules do not load: {out.stderr.strip()}")
        return None
