"""The ``require-tools`` action: commands exist on the host once the site's modules are loaded (an assertion)."""

from __future__ import annotations

from dataclasses import dataclass, field

from sitestack.actions.action import Action
from sitestack.core.errors import SitestackError
from sitestack.core.host import Host
from sitestack.model.siteenv import ENV_REPORT, env_vouchers, probe_in_site_env


class RequireTools(Action):
    """Commands exist on the host once the site's modules are loaded (an assertion)."""

    action = "require-tools"

    asserts = True

    @dataclass(frozen=True)
    class Args:
        tools: tuple[str, ...] = field(metadata={"doc": "commands that must be on PATH"})

    def describe(self) -> str:
        return f"check that {', '.join(self.args.tools)} exist"

    def pending(self, host: Host) -> str | None:
        # Kept in the probe cache while the PATH directories and module files stay the same: a tool
        # removed or added changes its directory's mtime (sitestack.model.siteenv.env_vouchers).
        script = 'for t in "$@"; do command -v "$t" >/dev/null 2>&1 || printf \'MISSING\\t%s\\n\' "$t"; done\n' + ENV_REPORT
        facts = self.ctx.facts
        out = probe_in_site_env(host, facts, ["bash", "-c", script, "sitestack", *self.args.tools],
                                vouchers=lambda done: env_vouchers(facts, done))
        if out.rc != 0:
            raise SitestackError(f"cannot check tools: {out.stderr.strip()}")
        missing = [line.split("\t", 1)[1] for line in out.stdout.splitlines() if line.startswith("MISSING\t")]
        if missing:
            loaded = ", ".join(self.ctx.facts.modules.load) or "no site modules"
            raise SitestackError(f"missing on {host.name} (with {loaded} loaded): {', '.join(missing)}")
        return None
