"""Where a packed environment's packages come from, decided on the host before anything is built.

An env.yml's ``python=`` must fit the base interpreter's full version (probed). Its conda
dependencies are installed by the site's conda or micromamba where the host has one (found by
what the executable says it is: :data:`~sitestack.installs.conda_env.CONDA_PROBE`); where it
has none, each one is taken from the package index under the same name and version, which pip's
resolver confirms without installing anything (``pip install --dry-run --no-deps
--ignore-installed``, with the file's index options and the site's pip configuration). A known
non-Python package (:data:`~sitestack.installs.conda_env.NON_PYTHON`), a conda build string, or
a package the index does not have is refused by name, with its line.
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.utils import canonicalize_name

from sitestack.core.errors import InputError, SitestackError
from sitestack.core.hostbase import Host
from sitestack.core.pip_auth import configured_for, pip_auth
from sitestack.core.redact import redact
from sitestack.installs.conda_env import (
    CONDA_PROBE,
    NON_PYTHON,
    CondaDep,
    EnvFile,
    conda_create_argv,
    conda_of,
    pypi_requirement,
    python_problem,
)
from sitestack.installs.squashfs_env import PackedEnv, split_options

#: pip's resolver may fetch metadata over the network: give it time.
DRY_RUN_TIMEOUT = 900


@dataclass(frozen=True)
class Sources:
    """What installs the environment: ``conda`` (argv with ``{root}`` for the env's path; None:
    a venv of the base interpreter), ``first``: the conda dependencies as requirements on the package
    index, installed by pip before the rest, and the pip lines (options and requirements) after it."""

    conda: tuple[str, ...] | None
    pip: tuple[str, ...]
    summary: str            # one line for the output: who installs what
    first: tuple[str, ...] = ()

    def conda_argv(self, root: str) -> list[str]:
        return [root if word == "{root}" else word for word in self.conda or ()]


def base_version(host: Host, packed: PackedEnv) -> str:
    """The base interpreter's full version (``3.11.7``), probed where the environment is built."""
    out = host.probe(packed.in_env([packed.python, "-c", "import platform; print(platform.python_version())"]))
    if not out.ok or not out.stdout.strip():
        raise SitestackError(f"{packed.python} does not run on {host.name}: {out.stderr.strip()[-300:]}")
    return out.stdout.strip().splitlines()[-1]


def plan_sources(host: Host, packed: PackedEnv, env: EnvFile, *, channels_to_index: bool = False) -> Sources:
    """The :class:`Sources` of ``env`` on ``host``; an :class:`InputError` naming the file and line
    of a dependency that cannot be installed here. Where the host has no conda, a file that names
    ``channels:`` is refused unless ``channels_to_index`` (the step's ``channels_without_conda: index``):
    the index's package of a name may be another's than the channel's. Read-only: runs in check mode too."""
    if env.python is None and not env.conda:
        return Sources(conda=None, pip=env.pip, summary="")
    version = base_version(host, packed)
    if env.python is not None and (problem := python_problem(env.python, version)):
        raise InputError(env.at(env.python), problem)
    if not env.conda:
        return Sources(conda=None, pip=env.pip, summary="")
    found = conda_of(host.probe(packed.in_env(["bash", "-c", CONDA_PROBE])).stdout)
    if found is not None:
        argv = conda_create_argv(found[0], "{root}", env, version)
        return Sources(conda=tuple(argv), pip=env.pip,
                       summary=f"conda dependencies by {found[1]} {found[0]}: {' '.join(argv)}")
    where = f"{host.name} has no conda or micromamba"
    if env.channels and not channels_to_index:
        raise InputError(env.path, f"channels: {', '.join(redact(c) for c in env.channels)}, and {where}: its "
                         "conda dependencies would come from the package index, whose package of a name may be "
                         "another's than the channel's (load the site's conda, or set the pack-env step's "
                         "channels_without_conda: index)")
    for dep in env.conda:
        if canonicalize_name(dep.name) in NON_PYTHON:
            raise InputError(env.at(dep), f"{dep.spec}: a conda package that is not a Python distribution, and {where} "
                             "to install it (load the site's conda, or leave it out)")
        if dep.build:
            raise InputError(env.at(dep), f"{dep.spec}: a conda build string ({dep.build}), and {where}")
    wanted = [pypi_requirement(dep) for dep in env.conda]
    missing = _not_on_index(host, packed, env, wanted)
    if missing:
        names = "; ".join(f"{env.at(dep)}: {dep.spec} (pip: {why})" for dep, why in missing)
        raise InputError(env.path, f"not on the package index under the same name and version, and {where}: "
                         f"{names} (move them to the pip: list with a version the index has, or use conda)")
    shown = ", ".join(f"{dep.spec} as {pypi_requirement(dep)}" for dep in env.conda)
    return Sources(conda=None, first=tuple(wanted), pip=env.pip,
                   summary=f"conda dependencies from the package index with pip ({where}): {shown}")


def _dry_run(host: Host, packed: PackedEnv, options: list[str], requirements: list[str]) -> tuple[bool, str]:
    """pip's resolver run on ``requirements``, nothing installed: (found all, pip's stderr). ``--report``
    makes it a dry run that pip does not refuse for an externally managed (PEP 668) interpreter, such as
    a Debian or Ubuntu image's system Python (pip's install command exempts ``--dry-run --report``:
    https://pip.pypa.io/en/stable/cli/pip_install/#cmdoption-report, pip >= 22.2)."""
    # an index's credentials by environment, not on the command line (pip_auth)
    auth = pip_auth(options, (), lambda: configured_for(host, packed.in_env([packed.python])))
    argv = [packed.python, "-m", "pip", "install", "--dry-run", "--report", "/dev/null", "--no-deps",
            "--ignore-installed", "--quiet",
            "--no-input", "--disable-pip-version-check", *auth.options, *requirements]
    out = host.probe(packed.in_env(argv), timeout=DRY_RUN_TIMEOUT, secrets=auth.env)
    if "No module named pip" in out.stderr:
        raise SitestackError(f"{packed.python} has no pip on {host.name}: it cannot look packages up")
    return out.ok, out.stderr


def _not_on_index(host: Host, packed: PackedEnv, env: EnvFile, wanted: list[str]) -> list[tuple[CondaDep, str]]:
    """The conda dependencies pip's resolver finds no distribution for, each with pip's last error
    line (one run; one per dependency only when that run fails, to name every missing one)."""
    options, _ = split_options(env.pip)
    ok, _ = _dry_run(host, packed, options, wanted)
    if ok:
        return []
    missing = []
    for dep, req in zip(env.conda, wanted):
        found, err = _dry_run(host, packed, options, [req])
        if not found:
            errors = [line.strip() for line in err.splitlines() if line.startswith("ERROR:")]
            missing.append((dep, redact(errors[-1][len("ERROR:"):].strip() if errors else "no distribution")[:200]))
    return missing
