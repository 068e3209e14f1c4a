"""What the site's stack environment is: its name, path, pins and base Python (:class:`Stack`),
the packages sitestack built for it (:class:`Built`), and how to run the base Python and the
environment's interpreter on the host (:class:`Base`). Pure data and argv: nothing here runs.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from sitestack.core.errors import InputError, SitestackError
from sitestack.model.container_facts import runtime_of
from sitestack.model.context import RunContext
from sitestack.model.site import Facts, Site, expand
from sitestack.model.siteenv import in_site_env
from sitestack.onsite import stack_digest

#: Recipes whose wheels the stack installs when sitestack built them for the site.
DEFAULT_RECIPES = ("mpi4py", "horovod")
#: Companion packages built per wheel variant, pinned with the variant's local label.
LABELLED = ("torch", "torchvision", "torchaudio")

#: The manifest's name inside each generation; ``<path>.manifest.json`` links to the current one's.
MANIFEST = stack_digest.MANIFEST
#: The module (and its .pth) in each generation's site-packages that keeps a process on the generation
#: it started from (:mod:`sitestack.onsite.generation_pin`).
PIN = "_sitestack_generation"

#: A stack name: a module name with at least one ``/`` (placeholders allowed before they are filled).
NAME = re.compile(r"[A-Za-z0-9{][A-Za-z0-9._+{}-]*(/[A-Za-z0-9{][A-Za-z0-9._+{}-]*)+")


def normalize(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Stack:
    """The stack environment of a site, as the facts and the step's arguments define it."""

    site: str
    name: str                       # module name, e.g. pytorch/2.3.1-gpu
    path: str                       # the stable path (a symlink to the current generation)
    source: str                     # facts.python.source
    python_version: str             # major.minor
    requirements: tuple[str, ...]   # torch and companions, pinned
    extras: tuple[str, ...]
    checks: tuple[str, ...]         # what the validation job imports besides torch (CHECK_NEEDS)
    index_url: str | None
    system_site_packages: bool
    compile: bool
    index_only: bool = False        # facts.torch.index == "only": the torch line with --index-url
    installer: str = "auto"         # facts.python.installer: auto, pip or uv (not part of the plan)

    @property
    def site_packages(self) -> str:
        return f"{self.path}/lib/python{self.python_version}/site-packages"

    @property
    def manifest(self) -> str:
        """The stable manifest path: a link to the current generation's :data:`MANIFEST`."""
        return f"{self.path}.manifest.json"

    @property
    def bin(self) -> str:
        return f"{self.path}/bin"

    @property
    def family(self) -> str:
        return self.name.split("/", 1)[0]


def generation_var(stack: Stack) -> str:
    """The environment variable in which the stack's module, once loaded, keeps the real path of the
    generation the stable link pointed at (``__SITESTACK_GENERATION_PYTORCH`` for ``pytorch/...``):
    what that shell and its jobs read stays that generation through an upgrade (docs/operating.md).
    One name for the module file and the job's record (:func:`sitestack.onsite.stack_digest.generation_var`)."""
    return stack_digest.generation_var(stack.name)


def default_name(facts: Facts) -> str:
    return f"pytorch/{facts.torch.version}-{facts.torch.variant}"


#: What the validation job's checks import besides torch, so that the stack users get is the one
#: validated: torch.distributed's all_gather_object and the checkpoint check need numpy, which the
#: torch wheels do not require. Already there in containers and conda envs: pip then changes nothing.
CHECK_NEEDS: tuple[str, ...] = ("numpy",)


def torch_requirements(facts: Facts) -> tuple[str, ...]:
    """``torch==2.3.1+cu121`` and its companions: labelled ones with the variant, others as pinned."""
    torch = facts.torch
    label = f"+{torch.variant}" if torch.variant else ""
    out = [f"torch=={torch.version}{label}"]
    for name, version in sorted(torch.packages.items()):
        out.append(f"{name}=={version}{label if name in LABELLED and '+' not in version else ''}")
    return tuple(out)


def stack_for(ctx: RunContext, name: str | None = None, *, system_site_packages: str = "auto",
              compile: bool = True) -> Stack:
    """The stack of this run's site (``name`` and options as a step's arguments give them)."""
    facts = ctx.facts
    name = name or default_name(facts)
    if not NAME.fullmatch(name) or ".." in name.split("/"):
        raise InputError(ctx.site.path, f"stack name {name!r} must look like pytorch/2.3.1-gpu "
                         "(letters, digits, . _ + -, at least one /)")
    if system_site_packages == "auto":
        ssp = facts.python.source != "system"
    else:
        ssp = system_site_packages == "true"
    container = facts.python.source == "container"
    return Stack(
        site=ctx.site.name,
        name=name,
        path=f"{ctx.values['prefix'].rstrip('/')}/{name}",
        source=facts.python.source,
        python_version=facts.python.version,
        # The container provides torch and its companions (the facts record which): not reinstalled.
        requirements=() if container else torch_requirements(facts),
        extras=tuple(facts.torch.extras),
        checks=CHECK_NEEDS,
        index_url=None if container else facts.torch.index_url,
        system_site_packages=True if container else ssp,
        compile=compile,
        index_only=facts.torch.index == "only",
        installer=facts.python.installer,
    )


def shared_with_group(facts: Facts) -> bool:
    """The site gives its installs to a group (facts.install: mode group-write, or a group): the
    stack's files get their own modes and group, so they are never links to a cache's files."""
    return facts.install.mode == "group-write" or bool(facts.install.group)


def module_root(ctx: RunContext) -> str:
    """Where sitestack installs module files on this host (facts.modules.install_root, filled in)."""
    return expand(ctx.facts.modules.install_root, ctx.values).rstrip("/")


def require_module_system(site: Site | None = None, facts: Facts | None = None) -> None:
    """A stack is delivered as a module: refuse a site without a module system (give ``site`` or ``facts``)."""
    if facts is None:
        if site is None:
            raise TypeError("require_module_system needs a site or its facts")
        facts = site.facts
    if facts.modules.system == "none":
        where = site.path if site else "facts.modules.system"
        name = site.name if site else "this site"
        raise InputError(where, f"site {name} has no module system (facts.modules.system: none): the stack, its "
                         "module files and the extend-venv-activate hook need Lmod or Environment Modules",
                         key="facts.modules.system")


@dataclass(frozen=True)
class Built:
    """A package sitestack builds for the site (a ``recipe-install``), and whether it is installed."""

    recipe: str
    version: str
    dest: str
    description: str
    homepage: str
    settings: Any                    # recipe.ModuleSettings or None
    values: Mapping[str, str]        # the recipe's placeholder values, {install} = dest
    installed: bool = False
    wheel: str | None = None         # the wheel the install came from (pip builds)
    wheel_sha256: str | None = None

    @property
    def module_version(self) -> str:
        return os.path.basename(self.dest)

    @property
    def module_name(self) -> str:
        name = getattr(self.settings, "name", None) or self.recipe
        return f"{name}/{self.module_version}"


def built_for_other_python(wheel: str, version: str) -> str | None:
    """The Python a built wheel is for where that is not ``version`` (major.minor), else None: a build
    made for another interpreter is rebuilt by its step before the stack installs it again."""
    try:
        tags = parse_wheel_filename(os.path.basename(wheel))[3]
    except InvalidWheelFilename:
        return None
    want = "cp" + version.replace(".", "")
    interpreters = {t.interpreter for t in tags if t.interpreter.startswith("cp") and t.abi != "abi3"}
    if not interpreters or len(interpreters) != len(tags) or want in interpreters:
        return None
    return ", ".join(sorted(f"{i[2]}.{i[3:]}" for i in interpreters))


class Base:
    """How to run the base Python and the stack's interpreter on the host, for one site."""

    def __init__(self, facts: Facts, stack: Stack, prefix: str) -> None:
        self.facts = facts
        self.stack = stack
        self.prefix = prefix.rstrip("/")

    def _container(self, argv: Sequence[str]) -> list[str]:
        c = self.facts.container
        if c is None or not c.image:
            raise SitestackError("python.source is container, but facts.container.image is not set")
        # the stack prefix (the environment, the built packages' wheels) and the site's binds
        return in_site_env(self.facts, runtime_of(c).exec_argv(c.image, argv, [self.prefix, *c.bind]))

    def image(self) -> str | None:
        """The container image the environment runs in, or None."""
        c = self.facts.container
        return c.image if self.stack.source == "container" and c is not None and c.image else None

    def base(self, argv: Sequence[str]) -> list[str]:
        """``argv`` with the base Python (``python`` is replaced by the site's interpreter)."""
        python = self.facts.python.executable
        argv = [python if a == "python" else a for a in argv]
        if self.stack.source == "container":
            return self._container(argv)
        if self.stack.source == "system":
            return list(argv)
        return in_site_env(self.facts, argv)

    def env_python(self, root: str, argv: Sequence[str]) -> list[str]:
        """``argv`` run by the interpreter of the environment at ``root``."""
        full = [f"{root}/bin/python", *argv]
        if self.stack.source == "container":
            return self._container(full)
        if self.stack.source == "system":
            return full
        return in_site_env(self.facts, full)

    def create(self, root: str) -> list[list[str]]:
        """Commands that make an empty environment at ``root`` (which does not exist yet)."""
        if self.stack.source == "conda":
            return [in_site_env(self.facts, ["conda", "create", "--yes", "--quiet", "--prefix", root,
                                             f"python={self.stack.python_version}", "pip"])]
        argv = ["python", "-m", "venv", "--without-pip"]
        if self.stack.system_site_packages:
            argv.append("--system-site-packages")
        return [self.base([*argv, root])]
