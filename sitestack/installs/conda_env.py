"""Conda environment files (``env.yml``) for packed environments: LUMI's container wrapper
(Tykky) builds from one with ``conda-containerize new --prefix DIR env.yml``
(https://docs.lumi-supercomputer.eu/software/installing/container-wrapper/).

The file is read and checked when the playbook or the task is loaded (:func:`load_env_file`):
``name``, ``channels`` and ``dependencies`` only; each dependency a conda match spec (``name``,
``name=1.2``, ``name==1.2``, ``name=1.2=build``, ``name>=1,<2``, ``channel::name``) or the one
``pip:`` list (requirement lines and the index options of a requirements.txt). An error names
``file:line``. Who installs the conda dependencies is decided on the host: the site's conda or
micromamba when it has one (:func:`conda_create_argv`); else each one is taken from the package
index under the same name and version (:func:`pypi_requirement`), and one that is a known
non-Python package (:data:`NON_PYTHON`) or is not on the index is refused by name.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from sitestack.core.errors import InputError
from sitestack.core.quoting import control_problem
from sitestack.core.yamlfile import MarkedDict, MarkedList, display_path, load_yaml
from sitestack.installs.squashfs_env import check_requirement_line, parse_requirements

#: Conda packages that are libraries or tools, not Python distributions: a PyPI project of the same
#: name is something else (or nothing), so without conda they are refused by name.
NON_PYTHON = frozenset({
    "cudatoolkit", "cuda-toolkit", "cuda-nvcc", "cuda-runtime", "cudnn", "nccl", "magma", "libgcc", "libgcc-ng",
    "libstdcxx-ng", "libgomp", "_libgcc_mutex", "_openmp_mutex", "ld_impl_linux-64", "gcc", "gxx", "gfortran",
    "gcc_linux-64", "gxx_linux-64", "binutils", "make", "openssl", "ca-certificates", "zlib", "libzlib", "xz",
    "bzip2", "libffi", "ncurses", "readline", "sqlite", "tk", "libuuid", "blas", "libblas", "libcblas", "liblapack",
    "openblas", "hdf5", "openmpi", "r-base", "rocm", "hip"})
#: Provided by every environment sitestack makes (the venv's own pip): not installed again.
PROVIDED = frozenset({"pip"})
#: A conda match spec sitestack understands: [channel::]name[ ]version-part.
SPEC = re.compile(r"(?:(?P<channel>[A-Za-z0-9][A-Za-z0-9_.-]*)::)?(?P<name>[A-Za-z0-9_][A-Za-z0-9_.-]*)"
                  r"\s*(?P<rest>.*)")
FUZZY = re.compile(r"=(?P<version>[A-Za-z0-9_.+!]+?)\.?\*?(?:=(?P<build>[A-Za-z0-9_.*+]+))?")
EXACT = re.compile(r"==(?P<version>[A-Za-z0-9_.+!]+)")
CHANNEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*|https?://[^\s,]+|file:///[^\s,]+")
KEYS = ("name", "channels", "dependencies", "prefix", "variables")


@dataclass(frozen=True)
class CondaDep:
    """One conda dependency: as written, where, and as a PEP 440 specifier (``""``: any version)."""

    spec: str
    name: str
    specifier: str
    build: str | None
    line: int


@dataclass(frozen=True)
class EnvFile:
    """A checked ``env.yml``."""

    path: str                     # as shown in messages
    name: str | None
    channels: tuple[str, ...]
    python: CondaDep | None       # the python=X.Y.Z dependency, when given
    conda: tuple[CondaDep, ...]   # the other conda dependencies (pip excluded: the venv has it)
    pip: tuple[str, ...]          # checked lines of the pip: list

    def at(self, dep: CondaDep) -> str:
        return f"{self.path}:{dep.line}"


def is_env_file(path: str, text: str) -> bool:
    """Whether ``path`` is a conda environment file: by extension, else by a top-level
    ``dependencies:`` or ``channels:`` key (a requirements.txt has neither)."""
    return path.endswith((".yml", ".yaml")) or bool(re.search(r"(?m)^(dependencies|channels)\s*:", text))


def read_env_input(path: str, where: str) -> EnvFile:
    """The environment file at ``path`` (on the controller), checked: a conda environment file
    (:func:`load_env_file`) or a requirements.txt (its lines as the ``pip`` of an :class:`EnvFile`
    with no conda part). ``where`` names what gave the path, for a missing file."""
    if not os.path.isfile(path):
        raise InputError(where, f"requirements: {path}: no such file")
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    if is_env_file(path, text):
        return load_env_file(Path(path))
    return EnvFile(path=path, name=None, channels=(), python=None, conda=(), pip=tuple(parse_requirements(text, path)))


def parse_spec(spec: str, where: str) -> CondaDep:
    """A conda match spec as a :class:`CondaDep` (``where``: ``file:line`` for errors)."""
    line = int(where.rsplit(":", 1)[1]) if where.rsplit(":", 1)[-1].isdigit() else 0
    m = SPEC.fullmatch(spec.strip())
    if m is None:
        raise InputError(where, f"not a conda package spec: {spec!r} (name, name=1.2, name==1.2, name>=1,<2)")
    name, rest = m["name"], m["rest"].strip()
    build = None
    if not rest:
        specifier = ""
    elif (exact := EXACT.fullmatch(rest)) is not None:
        specifier = f"=={exact['version']}"
    elif (fuzzy := FUZZY.fullmatch(rest)) is not None:
        # conda's name=1.2 is "1.2 or 1.2.x" (https://docs.conda.io/projects/conda/en/latest/user-guide/concepts/pkg-specs.html)
        specifier, build = f"=={fuzzy['version']}.*", fuzzy["build"]
    else:
        specifier = rest.replace(" ", "")
    if specifier:
        try:
            SpecifierSet(specifier)
        except InvalidSpecifier:
            raise InputError(where, f"{spec!r}: version {rest!r} is not one sitestack can read "
                             "(=1.2, ==1.2, >=1,<2)") from None
    return CondaDep(spec=spec.strip(), name=name, specifier=specifier, build=build, line=line)


def load_env_file(path: Path) -> EnvFile:
    """``path`` read and checked (an :class:`InputError` naming ``file:line`` when it is not usable)."""
    data = load_yaml(path)
    shown = display_path(path)
    for key in data:
        if key not in KEYS:
            raise InputError(f"{shown}:{data.lines[key]}", f"unknown key {key!r} (a conda environment file has "
                             f"{', '.join(KEYS[:3])})")
    for key in ("prefix", "variables"):
        if key in data:
            raise InputError(f"{shown}:{data.lines[key]}", f"{key}: not supported (the packed environment's place is "
                             "--dest; its variables are the site's)")
    name = data.get("name")
    if name is not None and (not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]*", name)):
        raise InputError(f"{shown}:{data.lines['name']}", f"name: {name!r} must be letters, digits, . _ + -")
    channels = _channels(data, shown)
    deps = data.get("dependencies")
    if not isinstance(deps, MarkedList) or not deps:
        line = data.lines.get("dependencies", 1)
        raise InputError(f"{shown}:{line}", "dependencies: a list of packages is required")
    python, conda, pip = None, [], []
    for item, line in zip(deps, deps.lines):
        if isinstance(item, MarkedDict):
            pip.extend(_pip_section(item, shown, line))
            continue
        if not isinstance(item, (str, int, float)) or isinstance(item, bool):
            raise InputError(f"{shown}:{line}", f"a dependency must be a package spec or the pip: list, not {item!r}")
        text = str(item)
        _one_line(text, f"{shown}:{line}")
        dep = parse_spec(text, f"{shown}:{line}")
        if canonicalize_name(dep.name) == "python":
            python = dep
        elif canonicalize_name(dep.name) not in PROVIDED:
            conda.append(dep)
    return EnvFile(path=shown, name=name, channels=channels, python=python, conda=tuple(conda), pip=tuple(pip))


def _one_line(text: str, where: str) -> None:
    problem = control_problem(text)
    if problem:
        raise InputError(where, problem)


def _channels(data: MarkedDict, shown: str) -> tuple[str, ...]:
    raw = data.get("channels")
    if raw is None:
        return ()
    if not isinstance(raw, MarkedList):
        raise InputError(f"{shown}:{data.lines['channels']}", "channels: must be a list")
    for item, line in zip(raw, raw.lines):
        if not isinstance(item, str) or not CHANNEL.fullmatch(item):
            raise InputError(f"{shown}:{line}", f"channels: {item!r} is not a channel name or URL")
    return tuple(raw)


def _pip_section(item: MarkedDict, shown: str, line: int) -> list[str]:
    if list(item) != ["pip"] or not isinstance(item["pip"], MarkedList):
        raise InputError(f"{shown}:{line}", "the only mapping allowed in dependencies is the pip: list")
    out = []
    for entry, at in zip(item["pip"], item["pip"].lines):
        if not isinstance(entry, str):
            raise InputError(f"{shown}:{at}", f"pip: {entry!r} is not a requirement line")
        _one_line(entry, f"{shown}:{at}")
        checked = check_requirement_line(entry, f"{shown}:{at}")
        if checked:
            out.append(checked)
    return out


def python_problem(dep: CondaDep, version: str) -> str | None:
    """Why ``python=...`` does not fit the base interpreter's ``version`` (``3.12`` or ``3.11.7``), or None.

    A minor version (the site's fact) fits a spec that some patch release of it could meet:
    the exact check runs against the interpreter's full version before anything is built."""
    spec = SpecifierSet(dep.specifier)
    try:
        base = Version(version)
    except InvalidVersion:
        return f"the base interpreter's version {version!r} cannot be read"
    if len(base.release) >= 3:
        fits = spec.contains(base, prereleases=True)
    else:
        fits = any(spec.contains(Version(f"{version}.{patch}"), prereleases=True) for patch in range(0, 40))
    if fits:
        return None
    return (f"{dep.spec} does not match the base interpreter, Python {version}: a packed environment "
            "uses the site's Python (change the python= line, or use a site whose Python it is)")


def pypi_requirement(dep: CondaDep) -> str:
    """The PEP 508 requirement taking ``dep`` from the package index under the same name and version."""
    return f"{dep.name}{dep.specifier}"


#: A channel URL that carries a credential: a user and password (``https://user:pw@host/...``) or an
#: anaconda.org token (``https://conda.anaconda.org/t/<token>/channel``,
#: https://docs.anaconda.com/anacondaorg/user-guide/tasks/work-with-tokens/).
SECRET_CHANNEL = re.compile(r"[a-z]+://[^/@\s]+@|/t/[^/\s]+/")


def secret_channels(env: EnvFile) -> bool:
    """Whether a channel of ``env`` carries a credential: then none goes on conda's command line, which
    ``ps`` shows every user, but all of them, in their order, into a private ``.condarc`` (:func:`condarc`)."""
    return any(SECRET_CHANNEL.search(ch) for ch in env.channels)


def condarc(env: EnvFile) -> str:
    """A ``.condarc`` listing the file's channels in order (conda reads the one ``$CONDARC`` names too,
    https://docs.conda.io/projects/conda/en/stable/user-guide/configuration/use-condarc.html)."""
    return "channels:\n" + "".join(f"  - {json.dumps(ch)}\n" for ch in env.channels)


def conda_create_argv(exe: str, root: str, env: EnvFile, python_version: str) -> list[str]:
    """The site's conda or micromamba making the environment at ``root`` with the file's conda
    dependencies and the base interpreter's Python version (``python_version``); the channels as
    ``--channel`` options, or none where one carries a credential (:func:`secret_channels`)."""
    channels = [] if secret_channels(env) else [arg for ch in env.channels for arg in ("--channel", ch)]
    return [exe, "create", "--yes", "--prefix", root, *(["--override-channels", *channels] if channels else []),
            f"python={python_version}", *(d.spec for d in env.conda)]


#: Prints ``PATH<TAB>JSON`` for each conda-like executable on the host: the candidates' own
#: ``info --json`` tells what each is (conda: ``conda_version``; micromamba: ``micromamba version``).
CONDA_PROBE = r"""
for c in "${CONDA_EXE:-}" "${MAMBA_EXE:-}" $(command -v conda micromamba mamba 2>/dev/null); do
  [ -n "$c" ] && [ -x "$c" ] || continue
  printf '%s\t%s\n' "$c" "$("$c" info --json 2>/dev/null | tr -d '\n')"
done
exit 0
"""


def conda_of(probe_output: str) -> tuple[str, str] | None:
    """``(path, "conda" | "micromamba")`` of the first executable that says it is one, or None."""
    for line in probe_output.splitlines():
        path, _, text = line.partition("\t")
        try:
            info = json.loads(text)
        except ValueError:
            continue
        if isinstance(info, dict) and isinstance(info.get("conda_version"), str):
            return path, "conda"
        if isinstance(info, dict) and isinstance(info.get("micromamba version"), str):
            return path, "micromamba"
    return None
