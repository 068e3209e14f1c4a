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

from sitestack.builders import HostTools
from sitestack.core.cores import CORES_SH
from sitestack.core.errors import SitestackError
from sitestack.core.host import Completed, Host
from sitestack.core.probecache import path_dirs
from sitestack.installs.target import Target
from sitestack.model.site import Facts
from sitestack.model.siteenv import probe_in_site_env


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
printf 'PATH\t%s\n' "$PATH"
printf 'LMFILES\t%s\n' "${_LMFILES_:-}"
""".replace("%CORES%", CORES_SH)


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
                            vouchers=vouchers)
    if out.rc != 0:
        raise SitestackError(f"cannot probe the toolchain on {host.name}: {(out.stderr or out.stdout).strip()}")
    return read_probe(out)


#: Run by the build interpreter: what it is, whatever name found it (a shim, a symlink, a venv's link):
#: the real file, its full version and its ABI (the tag of its bytecode and of its extension modules).
INTERPRETER_PROBE = ("import json, os, sys, sysconfig; print(json.dumps({"
                     "'realpath': os.path.realpath(sys.executable), 'version': ' '.join(sys.version.split()), "
                     "'abi': ' '.join(filter(None, [sys.implementation.cache_tag, "
                     "sysconfig.get_config_var('SOABI')]))}))")


def probe_interpreter(host: Host, facts: Facts, python: str, label: str) -> dict[str, str]:
    """The build interpreter ``python`` run with the site's modules loaded: the real path of its
    ``sys.executable``, its full version and ABI. These, not the name that found it, are its identity:
    a pyenv shim (a script that execs the version's binary,
    https://github.com/pyenv/pyenv#understanding-shims), a symlink or a wrapper script before the same
    interpreter give the same; an interpreter of another minor version, or another build of the same,
    behind the same name gives others, so the package is built again. Not cached: a shim may pick
    another interpreter without any file on its path changing."""
    out = probe_in_site_env(host, facts, [python, "-c", INTERPRETER_PROBE])
    try:
        found = json.loads(out.stdout.strip().splitlines()[-1]) if out.rc == 0 else None
    except (ValueError, IndexError):
        found = None
    if not isinstance(found, dict):
        raise SitestackError(f"{label}: cannot run its build interpreter {python} on {host.name}: "
                             f"{(out.stderr or out.stdout).strip()[-300:]}")
    return {k: str(found.get(k, "")) for k in ("realpath", "version", "abi")}


def identities(found: Mapping[str, Found], python: str, interpreter: Mapping[str, str]) -> dict[str, str]:
    """Each tool's identity (:attr:`Found.identity`); the interpreter ``python``'s is its own real
    path (``readlink -f`` of a shim script is the script)."""
    out = {name: f.identity for name, f in found.items()}
    if python in found and interpreter:
        out[python] = f"{interpreter['realpath']} | {found[python].version}"
    return out


def vouchers(out: Completed) -> list[str]:
    """What the toolchain answer depends on: each tool found (as spelled and as resolved), the ``$PATH``
    directories it was looked up in (a new tool in one changes its mtime) and the module files loaded
    (:mod:`sitestack.core.probecache`). A tool that runs another (``mpicc --version`` runs the compiler)
    is covered when both come from packages (the package database is a voucher) or from ``$PATH``
    directories."""
    files: list[str] = []
    for line in out.stdout.splitlines():
        parts = line.split("\t")
        if parts[0] == "TOOL" and len(parts) == 5:
            files += dict.fromkeys(parts[2:4])
        elif parts[0] == "PATH" and len(parts) == 2:
            files += path_dirs(parts[1])
        elif parts[0] == "LMFILES" and len(parts) == 2:
            # each loaded module file, and its directory: another version beside it may become the default
            loaded = path_dirs(parts[1])
            files += loaded + [os.path.dirname(f) for f in loaded]
    return files


def probe_toolchain(host: Host, target: Target, extra: Sequence[str] = ()) -> Toolchain:
    """Find the target's tools (and ``extra`` ones) with the site's modules loaded."""
    builder = target.builder
    answer = probe_tools(host, target.facts, [*target.tools(), *extra, *builder.optional_tools])
    interpreter = (probe_interpreter(host, target.facts, target.python, target.label)
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
