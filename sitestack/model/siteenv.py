"""Commands run inside the site's environment: module system initialised, site modules loaded.

Remote shells are non-login, so ``module`` is not defined there: :func:`in_site_env` wraps an
argv so that bash sources the module system's init script first (the one the site names, else
the usual Lmod and Environment Modules locations), runs ``module use`` / ``module load`` for
the site's modules, then ``exec``\\s the command. The argv travels as positional parameters,
never pasted into the script.

Exit codes of the wrapper itself: :data:`NO_MODULE_SYSTEM` when no ``module`` command can be
set up, :data:`LOAD_FAILED` when a site module does not load.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from sitestack.core.errors import CannotProbe, SitestackError
from sitestack.core.host import Completed, Host
from sitestack.core.probecache import cached_probe, path_dirs
from sitestack.core.quoting import sh
from sitestack.model.site import Facts

NO_MODULE_SYSTEM = 97
LOAD_FAILED = 98

#: Where module systems keep their bash init scripts (Lmod from source and Debian's lmod,
#: Cray's Lmod, Environment Modules 4/5).
INIT_CANDIDATES = (
    "/usr/share/lmod/lmod/init/bash",
    "/opt/cray/pe/lmod/lmod/init/bash",
    "/usr/share/modules/init/bash",
    "/etc/profile.d/modules.sh",
)


def init_candidates(facts: Facts) -> list[str]:
    """The init scripts that may define ``module``, in the order tried: the site's own or :data:`INIT_CANDIDATES`."""
    return [facts.modules.init] if facts.modules.init else list(INIT_CANDIDATES)


def module_init_lines(facts: Facts) -> list[str]:
    """The bash lines that define ``module`` where it is not defined yet: the first readable init script
    of the site's (``modules.init``) or of :data:`INIT_CANDIDATES` is sourced. They never exit, so they
    may be sourced into a user's shell too (:mod:`sitestack.installs.rerun`)."""
    return ["if ! type module >/dev/null 2>&1; then",
            f"  for f in {' '.join(sh(c) for c in init_candidates(facts))}; do",
            '    if [ -r "$f" ]; then . "$f"; break; fi',
            "  done",
            "fi"]


def prelude(facts: Facts, *, load: bool = True) -> str:
    """The bash lines that set up ``module`` and load the site modules (empty without modules)."""
    mods = facts.modules
    if mods.system == "none":
        return ""
    looked = " ".join(init_candidates(facts))
    lines = [
        *module_init_lines(facts),
        f"type module >/dev/null 2>&1 || {{ echo {sh('no module command (looked for ' + looked + ')')} >&2; "
        f"exit {NO_MODULE_SYSTEM}; }}",
    ]
    if load:
        for path in mods.use:
            lines.append(f"module use {sh(path)} || exit {LOAD_FAILED}")
        for name in mods.load:
            # Lmod and Environment Modules >= 4 both return non-zero when a load fails.
            lines.append(f"module load {sh(name)} || {{ echo {sh('cannot load module ' + name)} >&2; exit {LOAD_FAILED}; }}")
    return "\n".join(lines) + "\n"


def in_site_env(facts: Facts, argv: Sequence[str], *, load: bool = True) -> list[str]:
    """``argv`` wrapped to run after the site's module system and modules are set up."""
    script = prelude(facts, load=load)
    if not script:
        return list(argv)
    return ["bash", "-c", script + 'exec "$@"', "sitestack", *argv]


def probe_in_site_env(host: Host, facts: Facts, argv: Sequence[str], *, load: bool = True,
                      vouchers: Callable[[Completed], Sequence[str] | None] | None = None) -> Completed:
    """Probe ``argv`` in the site environment; CannotProbe when there is no module system,
    SitestackError when a site module does not load. With ``vouchers``, a successful answer is kept
    while the files it names stay the same (:func:`sitestack.core.probecache.cached_probe`)."""
    wrapped = in_site_env(facts, argv, load=load)
    out = host.probe(wrapped) if vouchers is None else cached_probe(host, wrapped, vouchers)
    if out.rc == NO_MODULE_SYSTEM and facts.modules.system != "none":
        raise CannotProbe(f"{facts.modules.system} not found on {host.name}: {out.stderr.strip()}")
    if out.rc == LOAD_FAILED and facts.modules.system != "none":
        raise SitestackError(out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "a site module did not load")
    return out


#: Printed at the end of a probe's script run in the site environment: what :func:`env_vouchers` reads.
ENV_REPORT = """printf 'PATH\\t%s\\n' "$PATH"
printf 'LMFILES\\t%s\\n' "${_LMFILES_:-}"
"""


def env_vouchers(facts: Facts, out: Completed) -> list[str]:
    """What an answer given in the site environment depends on, from its :data:`ENV_REPORT` lines: the
    ``$PATH`` directories (a tool added or removed changes one's mtime), each module file loaded and its
    directory (another version beside it may become the default), and the module system's init script
    (:mod:`sitestack.core.probecache` adds the package databases)."""
    files = [facts.modules.init] if facts.modules.init else list(INIT_CANDIDATES)
    for line in out.stdout.splitlines():
        name, _, value = line.partition("\t")
        if name == "PATH":
            files += path_dirs(value)
        elif name == "LMFILES":
            loaded = path_dirs(value)
            files += loaded + [os.path.dirname(f) for f in loaded]
    return files
