"""Recipes: ``sources/<name>.yml``, one per upstream package built from source.

A recipe is data: what the package is, every known version with its URL and sha256, the
build system and its arguments, the environment, the patches (from ``patches/<name>/``,
restricted to versions), the version rules checked against the site's facts before anything
runs, the sanity paths and post-install checks, and module-file settings. ``load_recipe``
parses it with :func:`sitestack.core.schema.build` into the frozen dataclasses below: unknown keys,
wrong types, missing keys, unknown ``{placeholders}``, bad version ranges, missing patch files
and patch files without their header are errors naming ``file:line`` and the key.

``docs/recipes.md`` documents every key.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from sitestack.core import placeholders, schema, versions
from sitestack.core.errors import InputError, SitestackError
from sitestack.core.paths import SOURCES_DIR
from sitestack.core.quoting import SHELL_NAME
from sitestack.core.yamlfile import MarkedDict, display_path, load_yaml
from sitestack.model.patches import PATCH_HEADER_KEYS, load_patches, parse_patch_header
from sitestack.model.site import Facts

#: Placeholders a recipe string may use (``{{`` and ``}}`` write literal braces).
PLACEHOLDERS: Mapping[str, str] = {
    "name": "the recipe's name",
    "version": "the version being built",
    "prefix": "the package's install prefix (what configure --prefix and CMAKE_INSTALL_PREFIX get)",
    "site_prefix": "the stack's prefix (facts.prefix, or --prefix)",
    "install": "where the installed files are while checks run (the staged tree; for module "
               "settings: the install prefix)",
    "mpicc": "the site's MPI C compiler command (facts.mpi.cc, e.g. `cc -shared` on Cray)",
    "mpicxx": "the site's MPI C++ compiler command (facts.mpi.cxx)",
    "mpi_library_match": "text MPI_Get_library_version() must contain (facts.mpi.library_match)",
    "python": "the Python interpreter that builds and runs Python packages (facts.python.executable)",
    "python_version": "facts.python.version",
    "torch_version": "facts.torch.version",
    "rocm_home": "facts.rocm.home (sites with ROCm)",
    "rocm_version": "facts.rocm.version (sites with ROCm)",
    "cuda_home": "facts.cuda.home (sites with CUDA)",
    "cuda_version": "facts.cuda.version (sites with CUDA)",
}

#: Keys whose text is prose, not checked for placeholders.
_PROSE = {"description", "homepage", "license", "why", "whatis", "notes"}

def _doc(text: str, **extra: Any) -> dict[str, Any]:
    return {"doc": text, **extra}


@dataclass(frozen=True)
class Requires:
    """Site facts a version needs. Ranges use the syntax of :mod:`sitestack.core.versions` (PEP 440)."""

    python: str | None = field(default=None, metadata=_doc("range of facts.python.version, e.g. '>=3.8'"))
    torch: str | None = field(default=None, metadata=_doc("range of facts.torch.version"))
    rocm: str | None = field(default=None, metadata=_doc("range of facts.rocm.version (the site must have ROCm)"))
    cuda: str | None = field(default=None, metadata=_doc("range of facts.cuda.version (the site must have CUDA)"))
    mpi: tuple[str, ...] = field(default=(), metadata=_doc("allowed facts.mpi.flavour values"))
    gpu: tuple[str, ...] = field(default=(), metadata=_doc("allowed facts.gpu.vendor values"))
    collectives: tuple[str, ...] = field(default=(), metadata=_doc("allowed facts.collectives values"))

    def check(self) -> str | None:
        for key in ("python", "torch", "rocm", "cuda"):
            spec = getattr(self, key)
            if spec is not None and (problem := versions.check_spec(spec)):
                return f"{key}: {problem}"
        return None

    def unmet(self, facts: Facts) -> list[str]:
        """What of this the site's facts do not satisfy, one phrase each."""
        problems = []
        ranged = {
            "python": (facts.python.version, "facts.python.version"),
            "torch": (facts.torch.version, "facts.torch.version"),
            "rocm": (facts.rocm.version if facts.rocm else None, "facts.rocm.version"),
            "cuda": (facts.cuda.version if facts.cuda else None, "facts.cuda.version"),
        }
        for key, (have, where) in ranged.items():
            spec = getattr(self, key)
            if spec is None:
                continue
            if have is None:
                problems.append(f"needs {key} {spec}, the site has no {key}")
            elif not versions.matches(spec, have):
                problems.append(f"needs {key} {spec}, the site has {have} ({where})")
        listed = {"mpi": (facts.mpi.flavour, "facts.mpi.flavour"), "gpu": (facts.gpu.vendor, "facts.gpu.vendor"),
                  "collectives": (facts.collectives, "facts.collectives")}
        for key, (have, where) in listed.items():
            allowed = getattr(self, key)
            if allowed and have not in allowed:
                problems.append(f"needs {key} one of {', '.join(allowed)}, the site has {have} ({where})")
        return problems


@dataclass(frozen=True)
class Rule:
    """A version rule: versions in ``versions`` need ``requires``; ``why`` says where that comes from."""

    versions: str = field(metadata=_doc("range of the recipe's versions the rule applies to ('*' for all)"))
    requires: Requires = field(metadata=_doc("site facts those versions need"))
    why: str = field(metadata=_doc("the reason, with its source (release notes, issue, build experiment)"))

    def check(self) -> str | None:
        return versions.check_spec(self.versions) and f"versions: {versions.check_spec(self.versions)}"


#: Environment variable names, checked at the recipe's file and line (they reach shell and module lines).
_ENV_KEYS: dict[str, str] = {"key_pattern": SHELL_NAME.pattern, "key_doc": "an environment variable name (letters, digits, _)"}
#: A file name in caches, mirrors and patches/<recipe>/: never a path.
FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")
#: A version key of a recipe: it becomes a directory name (<prefix>/<recipe>/<version>).
VERSION_KEY = r"[A-Za-z0-9][A-Za-z0-9._+-]*"


@dataclass(frozen=True)
class Source:
    """One known version: where its source tarball is and its sha256."""

    url: str = field(metadata=_doc("download URL of the source tarball (https, http or file); may use {name}, {version}"))
    sha256: str | None = field(metadata=_doc(
        "sha256 of the tarball (`invoke checksum URL` prints it); null where it is not known yet: "
        "downloads are then refused until a site fills it in"))
    filename: str | None = field(default=None, metadata=_doc("file name in caches and mirrors (default: the URL's last part)"))
    archives: tuple[str, ...] = field(default=(), metadata=_doc(
        "sha256 sums of other tarballs of the same source tree that were checked (e.g. a `git archive` of the tag), "
        "where the URL's own sum is not known: such a tarball under the version's file name is accepted from "
        "--mirror (and named as known from --source); nothing is downloaded on their strength"))
    requires: Requires = field(default_factory=Requires, metadata=_doc("site facts this version needs"))
    args: tuple[str, ...] = field(default=(), metadata=_doc("build arguments added for this version only"))
    env: Mapping[str, str] = field(default_factory=dict, metadata=_doc(
        "build environment added for this version only", **_ENV_KEYS))

    def check(self) -> str | None:
        if self.filename is not None and not (FILE_NAME.fullmatch(self.filename) and ".." not in self.filename):
            return f"filename: {self.filename!r} must be a plain file name (letters, digits, . _ + -; no /, no ..)"
        for sha in (self.sha256, *self.archives):
            if sha is not None and not re.fullmatch(r"[0-9a-f]{64}", sha):
                return f"sha256: must be 64 lower-case hex digits, not {sha!r}"
        if not re.match(r"^(https?|file)://", self.url):
            return f"url: must start with https://, http:// or file://, not {self.url!r}"
        return None


@dataclass(frozen=True)
class Patch:
    """A patch from ``patches/<recipe>/``, applied with ``patch -p1`` in the listed order."""

    file: str = field(metadata=_doc("file name in patches/<recipe>/"))
    versions: str | None = field(default=None, metadata=_doc(
        "range of versions it applies to (default: the patch header's Applies-to)"))
    # Filled by the loader from the file:
    sha256: str = field(default="", init=False, compare=False)
    header: Mapping[str, str] = field(default_factory=dict, init=False, compare=False)
    path: str = field(default="", init=False, compare=False)

    @property
    def applies_to(self) -> str:
        return self.versions if self.versions is not None else self.header.get("Applies-to", "*")


@dataclass(frozen=True)
class Autotools:
    """Options of the autotools builder."""

    bootstrap: Literal["auto", "always", "never"] = field(default="auto", metadata=_doc(
        "run the bootstrap command first: auto (only when there is no configure script), always, never"))
    bootstrap_command: tuple[str, ...] = field(default=("autoreconf", "-fi"), metadata=_doc(
        "how to make configure, e.g. [./autogen.sh]"))
    out_of_tree: bool = field(default=False, metadata=_doc("configure in a separate build directory (VPATH build)"))
    make_args: tuple[str, ...] = field(default=(), metadata=_doc("extra arguments to make and make install"))


@dataclass(frozen=True)
class CMake:
    """Options of the CMake builder."""

    generator: Literal["Ninja", "Unix Makefiles"] = field(default="Ninja", metadata=_doc("CMake generator"))
    build_type: str = field(default="Release", metadata=_doc("CMAKE_BUILD_TYPE"))
    minimum: str = field(default="3.18", metadata=_doc(
        "oldest usable cmake; with an older or no cmake on the host, cmake (and ninja) come from PyPI"))
    source_subdir: str | None = field(default=None, metadata=_doc("directory of the top CMakeLists.txt inside the source"))

    def check(self) -> str | None:
        try:
            versions.parse(self.minimum)
        except ValueError as exc:
            return f"minimum: {exc}"
        return None


@dataclass(frozen=True)
class Pip:
    """Options of the pip (sdist -> wheel) builder."""

    build_isolation: bool = field(default=True, metadata=_doc(
        "false where the build must see packages of the build interpreter (torch); true fetches "
        "the build requirements into an isolated environment"))


@dataclass(frozen=True)
class Check:
    """A command run against the staged install before it is put in place; its result goes in the stamp."""

    name: str = field(metadata=_doc("what it checks, shown in messages and the stamp"))
    run: tuple[str, ...] = field(metadata=_doc("argv, run with the site's modules loaded", multiline=True))
    expect: str | None = field(default=None, metadata=_doc("text the output must contain"))
    ranks: int = field(default=1, metadata=_doc("MPI ranks: more than 1 starts it with the site's launcher"))
    env: Mapping[str, str] = field(default_factory=dict, metadata=_doc("environment for the command", **_ENV_KEYS))

    def check(self) -> str | None:
        if not self.run:
            return "run: at least the command"
        if self.ranks < 1:
            return "ranks: at least 1"
        return None


@dataclass(frozen=True)
class ModuleSettings:
    """What the package's module file sets (rendered by the module-file templates)."""

    name: str | None = field(default=None, metadata=_doc("module name (default: the recipe name); version = the recipe version"))
    whatis: str | None = field(default=None, metadata=_doc("one-line whatis text (default: description)"))
    prepend: Mapping[str, tuple[str, ...]] = field(default_factory=dict, metadata=_doc(
        "path-like variables and the directories prepended, e.g. PYTHONPATH: ['{install}']", **_ENV_KEYS))
    set: Mapping[str, str] = field(default_factory=dict, metadata=_doc("variables set", **_ENV_KEYS))

    def check(self) -> str | None:
        if self.name is not None and (not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]*(/[A-Za-z0-9][A-Za-z0-9._+-]*)*",
                                                       self.name) or ".." in self.name.split("/")):
            return f"name: {self.name!r} is not a module name (like pkg or pkg/sub; no '..')"
        return None
    site_modules: bool = field(default=True, metadata=_doc("the module loads the site modules it was built with"))


@dataclass(frozen=True)
class Recipe:
    """A loaded ``sources/<name>.yml``."""

    name: str = field(metadata=_doc("the package name (the file's name)"))
    description: str = field(metadata=_doc("one line: what it is and why the stack needs it"))
    homepage: str = field(metadata=_doc("project home page"))
    build: Literal["autotools", "cmake", "pip"] = field(metadata=_doc("build system"))
    default_version: str = field(metadata=_doc("version built when none is asked for"))
    versions: Mapping[str, Source] = field(metadata=_doc(
        "every known version: url, sha256, and what it needs", key_pattern=VERSION_KEY,
        key_doc="a version (letters, digits, . _ + -: it names the install directory)"))
    license: str | None = field(default=None, metadata=_doc("SPDX licence"))
    tools: tuple[str, ...] = field(default=(), metadata=_doc(
        "commands that must exist with the site's modules loaded; their --version goes into the digest"))
    rules: tuple[Rule, ...] = field(default=(), metadata=_doc("version rules checked before anything runs"))
    args: tuple[str, ...] = field(default=(), metadata=_doc(
        "build arguments, one per item (configure options, -D cache entries, pip wheel options)"))
    env: Mapping[str, str] = field(default_factory=dict, metadata=_doc("build environment", **_ENV_KEYS))
    patches: tuple[Patch, ...] = field(default=(), metadata=_doc("patches, applied in this order"))
    autotools: Autotools | None = field(default=None, metadata=_doc("autotools builder options"))
    cmake: CMake | None = field(default=None, metadata=_doc("CMake builder options"))
    pip: Pip | None = field(default=None, metadata=_doc("pip builder options"))
    sanity: tuple[str, ...] = field(default=(), metadata=_doc(
        "paths (globs allowed) relative to the install prefix that must exist after install"))
    checks: tuple[Check, ...] = field(default=(), metadata=_doc("commands that must succeed on the staged install"))
    module: ModuleSettings | None = field(default=None, metadata=_doc("module-file settings"))
    data: Mapping[str, Any] = field(default_factory=dict, metadata=_doc(
        "package-specific tables for version rules that `rules` cannot express (e.g. which GPU "
        "architectures each CUDA release targets); read and validated by the package's own module"))
    path: str = field(default="", init=False, compare=False)
    patch_dir: str = field(default="", init=False, compare=False)

    def check(self) -> str | None:
        if not self.versions:
            return "versions: at least one version"
        if self.default_version not in self.versions:
            return f"default_version: {self.default_version!r} is not in versions ({', '.join(self.known_versions())})"
        for key in ("autotools", "cmake", "pip"):
            if getattr(self, key) is not None and key != self.build:
                return f"{key}: options for the {key} builder, but build is {self.build}"
        if not self.sanity:
            return "sanity: at least one path that must exist after install"
        for path in self.sanity:
            if path.startswith("/") or ".." in Path(path).parts:
                return f"sanity: {path!r} must be relative to the install prefix"
        return None

    # -- queries -------------------------------------------------------------------------
    def known_versions(self) -> list[str]:
        return sorted(self.versions, key=versions.sort_key)

    def builder_options(self) -> Autotools | CMake | Pip:
        opts: Autotools | CMake | Pip | None = getattr(self, self.build)
        return opts if opts is not None else {"autotools": Autotools, "cmake": CMake, "pip": Pip}[self.build]()

    def patches_for(self, version: str) -> list[Patch]:
        return [p for p in self.patches if versions.matches(p.applies_to, version)]

    def unmet(self, version: str, facts: Facts) -> list[str]:
        """Why ``version`` cannot be built on a site with ``facts`` (empty: it can)."""
        problems = list(self.versions[version].requires.unmet(facts))
        for rule in self.rules:
            if versions.matches(rule.versions, version):
                problems += [f"{p} ({rule.why})" for p in rule.requires.unmet(facts)]
        return problems

    def select_version(self, version: str | None, facts: Facts, site: str = "the site") -> str:
        """The version to build: ``version`` or the default, checked against the version rules.

        An unknown version or one the site's facts do not allow is an error that says what is
        supported.
        """
        wanted = version or self.default_version
        if wanted not in self.versions:
            raise InputError("--version" if version else self.path,
                             f"unknown version {wanted!r} of {self.name} (known versions in {self.path}: "
                             f"{', '.join(self.known_versions())})")
        problems = self.unmet(wanted, facts)
        if problems:
            fits = [v for v in self.known_versions() if not self.unmet(v, facts)]
            hint = (f"versions of {self.name} that fit {site}: {', '.join(fits)}" if fits
                    else f"no known version of {self.name} fits {site}")
            raise SitestackError(f"{self.name} {wanted} is not supported on {site}: {'; '.join(problems)}. {hint}")
        return wanted


def recipe_path(name: str, sources_dir: Path | None = None) -> Path:
    directory = Path(sources_dir) if sources_dir else SOURCES_DIR
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name or ""):
        raise InputError("--recipe", f"{name!r} is not a recipe name (letters, digits, '.', '-', '_')")
    path = directory / f"{name}.yml"
    if not path.is_file():
        raise InputError("--recipe", f"unknown recipe {name!r} (known recipes in {display_path(directory)}: "
                                     f"{', '.join(list_recipes(directory)) or 'none'})")
    return path


def list_recipes(sources_dir: Path | None = None) -> list[str]:
    directory = Path(sources_dir) if sources_dir else SOURCES_DIR
    return sorted(p.stem for p in directory.glob("*.yml"))


def patch_dir_for(sources_dir: Path | None, name: str) -> Path:
    """``patches/<name>/`` beside the sources directory."""
    directory = Path(sources_dir) if sources_dir else SOURCES_DIR
    return directory.resolve().parent / "patches" / name


def load_recipe(name: str, sources_dir: Path | None = None, *, path: Path | None = None) -> Recipe:
    """Load and validate ``<sources_dir>/<name>.yml`` (and its patches)."""
    if path is None:
        path = recipe_path(name, sources_dir)
        sources_dir = path.parent
    shown = display_path(path)
    data = load_yaml(path)
    _check_placeholders(data, shown)
    recipe = schema.build(Recipe, data, shown)
    if recipe.name != path.stem:
        raise InputError(f"{shown}:{data.lines.get('name', 1)}", f"must be {path.stem!r} (the file name), not {recipe.name!r}", key="name")
    object.__setattr__(recipe, "path", shown)
    pdir = patch_dir_for(path.parent, recipe.name)
    object.__setattr__(recipe, "patch_dir", str(pdir))
    load_patches(recipe.patches, data, shown, pdir)
    return recipe


def _check_placeholders(node: Any, shown: str) -> None:
    """Every ``{name}`` in a recipe's strings (prose keys aside) must be a known placeholder."""
    placeholders.check(node, PLACEHOLDERS, shown, skip=_PROSE)


def expand(text: str, values: Mapping[str, str]) -> str:
    """Fill a recipe string's placeholders (checked at load time); one without a value on this
    site is a SitestackError: a build argument must be complete."""
    return placeholders.expand(text, values, missing="raise")


def expand_all(node: Any, values: Mapping[str, str]) -> Any:
    """Fill placeholders in every string of a plain data tree; as :func:`expand` for missing values."""
    return placeholders.expand_all(node, values, missing="raise")


__all__ = ["PATCH_HEADER_KEYS", "PLACEHOLDERS", "MarkedDict", "Recipe", "expand", "expand_all", "list_recipes",
           "load_recipe", "parse_patch_header"]
