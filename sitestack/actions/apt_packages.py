"""The ``apt-packages`` action: debian packages are installed (apt-get; sudo where the step says become)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from sitestack.actions.action import Action, log_name
from sitestack.core.errors import CannotProbe
from sitestack.core.host import Host
from sitestack.core.probecache import cached_probe

#: A Debian package name (policy 5.6.1), with an optional :architecture.
DEBIAN_PACKAGE = re.compile(r"[a-z0-9][a-z0-9+.-]+(:[a-z0-9-]+)?")


class AptPackages(Action):
    """Debian packages are installed (apt-get; sudo where the step says become)."""

    action = "apt-packages"

    @dataclass(frozen=True)
    class Args:
        packages: tuple[str, ...] = field(metadata={"doc": "Debian package names"})

        def check(self) -> str | None:
            for name in self.packages:
                # Debian policy 5.6.1 (an optional :arch): a name starting with '-' would be an apt option.
                if not DEBIAN_PACKAGE.fullmatch(name):
                    return f"packages: {name!r} is not a Debian package name"
            return None if self.packages else "packages: at least one package"

    def describe(self) -> str:
        return f"install {', '.join(self.args.packages)}"

    def pending(self, host: Host) -> str | None:
        # The answer is dpkg's status database, which the probe cache vouches for anyway (an install or
        # removal rewrites it): kept there, a no-op starts no dpkg-query.
        out = cached_probe(host, ["dpkg-query", "-W", "-f=${Package} ${Status}\\n", "--", *self.args.packages],
                           lambda done: [])
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
        host.run(["apt-get", "install", "-y", "--no-install-recommends", "--", *names], env=env, sudo=self.become, log=log)
