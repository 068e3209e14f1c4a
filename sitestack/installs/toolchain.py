"""The site toolchain on a host: the target's tools found with the site's modules loaded, their
identities (the executable each really is and its ``--version`` line, which go into the install's
digest: :attr:`Found.identity`), the CPU count and Slurm allocation, and which of the builder's
optional tools (cmake, ninja) the host serves or PyPI must.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sitestack.builders import HostTools
from sitestack.core.cores import CORES_SH
from sitestack.core.errors import SitestackError
from sitestack.core.host import Completed, Host, LocalHost
from sitestack.installs.target import Target
from sitestack.model.site import Facts
from sitestack.model.siteenv import ENV_REPORT, env_vouchers, probe_in_site_env


@dataclass(frozen=True)
class Toolchain:
    """What the site environment on the host provides."""

    tools: Mapping[str, str]          # command -> its identity: "real path | first line of --version"
    missing: tuple[str, ...]
    nproc: int = 1
    slurm_job: str = ""
    host_tools: HostTools = field(default_factory=HostTools)  # the builder's optional tools: host or PyPI
    #: the build interpreter as it reports itself (:func:`probe_interpreter`), where the build uses one
    interpreter: Mapping[str, str] = field(default_factory=dict)


#: Each tool as ``PATH`` spells it (what commands run: a snap's ``/snap/bin/cmake`` only works by that
#: name), the executable it really is (``readlink -f``) and the first line of its ``--version``.
PROBE_SCRIPT = r"""
for t in "$@"; do
  p=$(command -v -- "$t" 2>/dev/null) || { printf 'MISSING\t%s\n' "$t"; continue; }
  r=$(readlink -f -- "$p" 2>/dev/null) || r=$p
  v=$("$p" --version </dev/null 2>&1 | head -n 1)
  printf 'TOOL\t%s\t%s\t%s\t%s\n' "$t" "$p" "${r:-$p}" "$v"
done
printf 'NPROC\t%s\n' "$(%CORES%)"
printf 'SLURM\t%s\n' "${SLURM_JOB_ID:-}"
""".replace("%CORES%", CORES_SH) + ENV_REPORT


@dataclass(frozen=True)
class Found:
    """A tool the probe found: ``path`` as ``PATH`` spells it (what is run), ``real`` the executable
    it is (symlinks resolved), ``version`` the first line of its ``--version``."""

    path: str
    real: str
    version: str

    @property
    def identity(self) -> str:
        """What the tool is, whatever names it: the digest records this, never the ``PATH`` spelling
        (a symlink farm or a module's wrapper directory first on ``PATH`` is not another tool). The
        spelling differs between two runs of the same machine: pyenv's ``exec`` puts the version's
        ``bin`` first on ``PATH`` (https://github.com/pyenv/pyenv#understanding-shims), so a run
        started from a Python (cron, CI, a wrapper script) finds the real binary where a login shell
        finds the shim."""
        return f"{self.real} | {self.version}"

    @property
    def spelled(self) -> str:
        return f"{self.path} | {self.version}"


@dataclass(frozen=True)
class ProbeAnswer:
    """What :data:`PROBE_SCRIPT` printed, read."""

    found: dict[str, Found]
    missing: list[str]
    nproc: int = 1
    slurm: str = ""


def read_probe(out: Completed) -> ProbeAnswer:
    """The tools found and missing, the CPU count and Slurm job of a :data:`PROBE_SCRIPT` answer."""
    found: dict[str, Found] = {}
    missing: list[str] = []
    nproc, slurm = 1, ""
    for line in out.stdout.splitlines():
        parts = line.split("\t")
        if parts[0] == "TOOL" and len(parts) == 5:
            found[parts[1]] = Found(parts[2], parts[3], parts[4].strip())
        elif parts[0] == "MISSING" and len(parts) == 2:
            missing.append(parts[1])
        elif parts[0] == "NPROC" and len(parts) == 2:
            nproc = int(parts[1]) if parts[1].strip().isdigit() else 1
        elif parts[0] == "SLURM" and len(parts) == 2:
            slurm = parts[1].strip()
    return ProbeAnswer(found, missing, nproc, slurm)


def probe_tools(host: Host, facts: Facts, tools: Sequence[str]) -> ProbeAnswer:
    """Find ``tools`` with the site's modules loaded (kept in the probe cache while its vouchers stay)."""
    out = probe_in_site_env(host, facts, ["bash", "-c", PROBE_SCRIPT, "sitestack", *dict.fromkeys(tools)],
                            vouchers=lambda out: vouchers(facts, out))
    if out.rc != 0:
        raise SitestackError(f"cannot probe the toolchain on {host.name}: {(out.stderr or out.stdout).strip()}")
    return read_probe(out)


#: Run by the build interpreter with ``RESOLVED CWD`` (what ``PATH`` found for its name, ``readlink -f``,
#: and the directory the probe runs in): what it is, whatever name found it (a shim, a symlink, a venv's
#: link): the real file, its full version and its ABI (the tag of its bytecode and of its extension
#: modules); and ``vouch``, the files that chose this interpreter for that name, or null where they cannot
#: be known (a wrapper script other than pyenv's: it may choose by anything).
INTERPRETER_PROBE = r"""
import json, os, sys, sysconfig
resolved, cwd = (sys.argv[1:] + ["", ""])[:2]
def script(path):
    try:
        with open(path, "rb") as handle:
            return handle.read(2) == b"#!"
    except OSError:
        return True
env = os.environ
vouch = [os.path.realpath(sys.executable), os.path.join(sys.prefix, "pyvenv.cfg"), resolved]
vouch += [d for d in env.get("PATH", "").split(os.pathsep) if d.startswith("/")]
root = env.get("PYENV_ROOT", "")
if script(resolved) and root.startswith("/") and resolved.startswith(os.path.join(root, "shims") + os.sep):
    # pyenv's choice: $PYENV_VERSION (part of the environment, which the cache's key digests), else the
    # first .python-version from the working directory up, else $PYENV_ROOT/version; its hooks may
    # change it (https://github.com/pyenv/pyenv#choosing-the-python-version).
    here = os.path.realpath(cwd or ".")
    while True:
        vouch.append(os.path.join(here, ".python-version"))
        if here == "/":
            break
        here = os.path.dirname(here)
    vouch += [os.path.join(root, "version"), os.path.join(root, "versions"), os.path.join(root, "libexec")]
    vouch += [d for d in env.get("PYENV_HOOK_PATH", "").split(os.pathsep) if d.startswith("/")]
elif script(resolved):
    vouch = None
print(json.dumps({"realpath": os.path.realpath(sys.executable), "version": " ".join(sys.version.split()),
                  "abi": " ".join(filter(None, [sys.implementation.cache_tag, sysconfig.get_config_var("SOABI")])),
                  "vouch": vouch}))
"""


def probe_interpreter(host: Host, facts: Facts, python: str, label: str, found: Found | None = None) -> dict[str, str]:
    """The build interpreter ``python`` run with the site's modules loaded: the real path of its
    ``sys.executable``, its full version and ABI. These, not the name that found it, are its identity:
    a pyenv shim (a script that execs the version's binary,
    https://github.com/pyenv/pyenv#understanding-shims), a symlink or a wrapper script before the same
    interpreter give the same; an interpreter of another minor version, or another build of the same,
    behind the same name gives others, so the package is built again.

    ``found``: what the toolchain probe found for ``python``. With it the answer is kept in the probe
    cache while the files that chose the interpreter stay the same: the binary, its venv's
    ``pyvenv.cfg``, the ``PATH`` directories, and for a pyenv shim pyenv's version files and hooks
    (the working directory is part of the cache's key: pyenv reads ``.python-version`` from there up).
    Any other wrapper script is run every time: it may choose by anything."""
    resolved = found.real if found else ""
    argv = [python, "-c", INTERPRETER_PROBE, resolved, os.getcwd() if isinstance(host, LocalHost) else ""]
    out = probe_in_site_env(host, facts, argv, vouchers=interpreter_vouchers if found else None)
    found_json = _interpreter_answer(out)
    if found_json is None:
        raise SitestackError(f"{label}: cannot run its build interpreter {python} on {host.name}: "
                             f"{(out.stderr or out.stdout).strip()[-300:]}")
    return {k: str(found_json.get(k, "")) for k in ("realpath", "version", "abi")}


def _interpreter_answer(out: Completed) -> dict[str, Any] | None:
    try:
        found = json.loads(out.stdout.strip().splitlines()[-1]) if out.rc == 0 else None
    except (ValueError, IndexError):
        found = None
    return found if isinstance(found, dict) else None


def interpreter_vouchers(out: Completed) -> list[str] | None:
    """The files :data:`INTERPRETER_PROBE` says chose the interpreter, or None (not kept)."""
    answer = _interpreter_answer(out)
    vouch = answer.get("vouch") if answer else None
    if not isinstance(vouch, list) or not all(isinstance(v, str) and v.startswith("/") for v in vouch):
        return None
    return list(dict.fromkeys(vouch))


def identities(found: Mapping[str, Found], python: str, interpreter: Mapping[str, str]) -> dict[str, str]:
    """Each tool's identity (:attr:`Found.identity`); the interpreter ``python``'s is its own real
    path (``readlink -f`` of a shim script is the script)."""
    out = {name: f.identity for name, f in found.items()}
    if python in found and interpreter:
        out[python] = f"{interpreter['realpath']} | {found[python].version}"
    return out


def vouchers(facts: Facts, out: Completed) -> list[str]:
    """What the toolchain answer depends on: each tool found (as spelled and as resolved), and the site
    environment it was found in (:func:`sitestack.model.siteenv.env_vouchers`: the ``$PATH``
    directories, the module files loaded). A tool that runs another (``mpicc --version`` runs the
    compiler) is covered when both come from packages (the package database is a voucher) or from
    ``$PATH`` directories."""
    files: list[str] = []
    for line in out.stdout.splitlines():
        parts = line.split("\t")
        if parts[0] == "TOOL" and len(parts) == 5:
            files += dict.fromkeys(parts[2:4])
    return files + env_vouchers(facts, out)


def probe_toolchain(host: Host, target: Target, extra: Sequence[str] = ()) -> Toolchain:
    """Find the target's tools (and ``extra`` ones) with the site's modules loaded."""
    builder = target.builder
    answer = probe_tools(host, target.facts, [*target.tools(), *extra, *builder.optional_tools])
    interpreter = (probe_interpreter(host, target.facts, target.python, target.label, answer.found[target.python])
                   if target.python in answer.found else {})
    found = identities(answer.found, target.python, interpreter)
    # Optional tools are never "missing": the builder says whether the host's serve or PyPI's are used.
    # It is told each as spelled (its program is run by that name); what it shows is recorded as the
    # tool's identity.
    spelled = {name: answer.found[name].spelled for name in builder.optional_tools if name in found}
    for name in spelled:
        found.pop(name)
    missing = [m for m in answer.missing if m not in builder.optional_tools]
    host_tools = builder.host_tools(target.recipe.builder_options(), spelled)
    found.update({k: answer.found[k].identity if v == spelled.get(k) else v for k, v in host_tools.shown.items()})
    return Toolchain(found, tuple(missing), answer.nproc, answer.slurm, host_tools, interpreter)


def require_tools(toolchain: Toolchain, target: Target, host: Host) -> None:
    """Refuse the install when a required tool is missing, naming it, the modules loaded and the recipe."""
    if toolchain.missing:
        loaded = ", ".join(target.facts.modules.load) or "no site modules"
        raise SitestackError(f"{target.label}: missing on {host.name} (with {loaded} loaded): "
                             f"{', '.join(toolchain.missing)} (needed by {target.recipe.path}; the MPI wrapper is "
                             f"facts.mpi.cc = {target.facts.mpi.cc!r})")
