"""The site toolchain on a host: the target's tools found with the site's modules loaded, their
``--version`` lines (which go into the install's digest), the CPU count and Slurm allocation, and
which of the builder's optional tools (cmake, ninja) the host serves or PyPI must.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from sitestack.builders import HostTools
from sitestack.core.errors import SitestackError
from sitestack.core.host import Completed, Host
from sitestack.core.probecache import path_dirs
from sitestack.installs.target import Target
from sitestack.model.siteenv import probe_in_site_env


@dataclass(frozen=True)
class Toolchain:
    """What the site environment on the host provides."""

    tools: Mapping[str, str]          # command -> "path | first line of --version"
    missing: tuple[str, ...]
    nproc: int = 1
    slurm_job: str = ""
    host_tools: HostTools = field(default_factory=HostTools)  # the builder's optional tools: host or PyPI
    #: the build interpreter as it reports itself (:func:`probe_interpreter`), where the build uses one
    interpreter: Mapping[str, str] = field(default_factory=dict)


PROBE_SCRIPT = r"""
for t in "$@"; do
  p=$(command -v -- "$t" 2>/dev/null) || { printf 'MISSING\t%s\n' "$t"; continue; }
  v=$("$p" --version </dev/null 2>&1 | head -n 1)
  printf 'TOOL\t%s\t%s\t%s\n' "$t" "$p" "$v"
done
printf 'NPROC\t%s\n' "$(nproc 2>/dev/null || echo 1)"
printf 'SLURM\t%s\n' "${SLURM_JOB_ID:-}"
printf 'PATH\t%s\n' "$PATH"
printf 'LMFILES\t%s\n' "${_LMFILES_:-}"
"""


#: Run by the build interpreter: what it is, whatever name found it (a shim, a symlink, a venv's link).
INTERPRETER_PROBE = ("import json, os, sys; print(json.dumps({'executable': sys.executable, "
                     "'realpath': os.path.realpath(sys.executable), 'version': ' '.join(sys.version.split())}))")


def probe_interpreter(host: Host, target: Target) -> dict[str, str]:
    """The target's build interpreter run with the site's modules loaded: its ``sys.executable``, that
    file's real path and its full version (an interpreter of another minor version, or another build of
    the same, behind the same name gives other inputs, so the package is built again). Not cached:
    a shim (pyenv) may pick another interpreter without any file on its path changing."""
    out = probe_in_site_env(host, target.facts, [target.python, "-c", INTERPRETER_PROBE])
    try:
        found = json.loads(out.stdout.strip().splitlines()[-1]) if out.rc == 0 else None
    except (ValueError, IndexError):
        found = None
    if not isinstance(found, dict):
        raise SitestackError(f"{target.label}: cannot run its build interpreter {target.python} on {host.name}: "
                             f"{(out.stderr or out.stdout).strip()[-300:]}")
    return {k: str(found.get(k, "")) for k in ("executable", "realpath", "version")}


def vouchers(out: Completed) -> list[str]:
    """What the toolchain answer depends on: each tool found, the ``$PATH`` directories it was looked up
    in (a new tool in one changes its mtime) and the module files loaded (:mod:`sitestack.core.probecache`).
    A tool that runs another (``mpicc --version`` runs the compiler) is covered when both come from
    packages (the package database is a voucher) or from ``$PATH`` directories."""
    files: list[str] = []
    for line in out.stdout.splitlines():
        parts = line.split("\t")
        if parts[0] == "TOOL" and len(parts) == 4:
            files.append(parts[2])
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
    tools = [*target.tools(), *extra, *builder.optional_tools]
    out = probe_in_site_env(host, target.facts, ["bash", "-c", PROBE_SCRIPT, "sitestack", *dict.fromkeys(tools)],
                            vouchers=vouchers)
    if out.rc != 0:
        raise SitestackError(f"cannot probe the toolchain on {host.name}: {(out.stderr or out.stdout).strip()}")
    found: dict[str, str] = {}
    missing: list[str] = []
    nproc, slurm = 1, ""
    for line in out.stdout.splitlines():
        parts = line.split("\t")
        if parts[0] == "TOOL" and len(parts) == 4:
            found[parts[1]] = f"{parts[2]} | {parts[3].strip()}"
        elif parts[0] == "MISSING":
            missing.append(parts[1])
        elif parts[0] == "NPROC":
            nproc = int(parts[1]) if parts[1].strip().isdigit() else 1
        elif parts[0] == "SLURM" and len(parts) > 1:
            slurm = parts[1].strip()
    # Optional tools are never "missing": the builder says whether the host's serve or PyPI's are used.
    optional = {name: found.pop(name) for name in builder.optional_tools if name in found}
    missing = [m for m in missing if m not in builder.optional_tools]
    host_tools = builder.host_tools(target.recipe.builder_options(), optional)
    found.update(host_tools.shown)
    interpreter = probe_interpreter(host, target) if target.python in found else {}
    return Toolchain(found, tuple(missing), nproc, slurm, host_tools, interpreter)


def require_tools(toolchain: Toolchain, target: Target, host: Host) -> None:
    """Refuse the install when a required tool is missing, naming it, the modules loaded and the recipe."""
    if toolchain.missing:
        loaded = ", ".join(target.facts.modules.load) or "no site modules"
        raise SitestackError(f"{target.label}: missing on {host.name} (with {loaded} loaded): "
                             f"{', '.join(toolchain.missing)} (needed by {target.recipe.path}; the MPI wrapper is "
                             f"facts.mpi.cc = {target.facts.mpi.cc!r})")
