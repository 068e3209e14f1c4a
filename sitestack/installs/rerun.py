"""The re-run kit a failed build command leaves in its build directory, as EasyBuild 5 does for a
failed shell command (its ``env.sh`` and ``cmd.sh``, https://docs.easybuild.io/easybuild-v5/run_shell_cmd/):
``rerun/env.sh`` sets up the command's environment when sourced (the site's module system and modules,
then the command's own variables), ``rerun/cmd.sh`` runs the command again in its directory with that
environment. The build directory stays until the next build of the same recipe there.

env.sh never exits (it is sourced into the admin's shell): a module that does not load says so on
stderr. Every value is one shell word (:func:`sitestack.core.quoting.sh`); a value holding a credential
is left out, with a line saying so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sitestack.core.host import Host
from sitestack.core.quoting import sh
from sitestack.core.redact import has_secret
from sitestack.model.site import Facts
from sitestack.model.siteenv import module_init_lines

DIR = "rerun"


def env_script(facts: Facts, env: Mapping[str, str], site: bool, label: str) -> str:
    """The text of env.sh: with ``site``, the module system set up and the site's modules loaded (as
    :func:`sitestack.model.siteenv.prelude` does for the command, without its exits), then ``env``."""
    lines = [f"# sitestack: the environment of {label}'s failed build command; source it: . ./env.sh"]
    mods = facts.modules
    if site and mods.system != "none":
        lines += module_init_lines(facts)
        lines += [f"module use {sh(path)}" for path in mods.use]
        lines += [f"module load {sh(name)} || echo {sh('cannot load module ' + name)} >&2" for name in mods.load]
    for name, value in sorted(env.items()):
        # a credential is never written to disk: the line says to set it (core/redact.py decides)
        lines.append(f"# export {name}=... (holds a credential: set it yourself)" if has_secret(f"{name}={value}")
                     else f"export {name}={sh(value)}")
    return "\n".join(lines) + "\n"


def cmd_script(argv: Sequence[str], cwd: str | None, label: str) -> str:
    """The text of cmd.sh: env.sh sourced from beside it, then ``argv`` run in ``cwd``."""
    return "\n".join([
        "#!/bin/bash",
        f"# sitestack: runs {label}'s failed build command again, in its directory and environment: bash cmd.sh",
        '. "$(dirname -- "$0")/env.sh"',
        *([f"cd -- {sh(cwd)} || exit 1"] if cwd else []),
        f"exec {' '.join(sh(word) for word in argv)}",
    ]) + "\n"


def write_kit(host: Host, work: str, facts: Facts, argv: Sequence[str], *, cwd: str | None,
              env: Mapping[str, str] | None, site: bool, label: str) -> str | None:
    """Write ``<work>/rerun/{env.sh,cmd.sh}`` on ``host`` (private: the environment may hold the
    site's settings); the kit's directory, or None where it could not be written (the failure is
    still reported, without a kit)."""
    kit = f"{work}/{DIR}"
    try:
        host.run(["mkdir", "-p", "-m", "0700", "--", kit])
        host.write_text(f"{kit}/env.sh", env_script(facts, env or {}, site, label), 0o600)
        host.write_text(f"{kit}/cmd.sh", cmd_script(argv, cwd, label), 0o700)
    except Exception:  # noqa: BLE001 - a kit that cannot be written must not hide the build's failure
        return None
    return kit
