"""The site's stack environment: a venv (or conda env) with torch, the site's extras and the
packages sitestack built for the site, plus a manifest of exactly what is in it.

``stack-venv`` (``invoke install-venv``) makes ``<prefix>/<name>`` (default name
``pytorch/<torch version>-<variant>``, e.g. ``pytorch/2.3.1-gpu`` on Cirrus) on top of the
site's base Python:

- ``python.source: system`` or ``module``: ``python -m venv`` from that interpreter (the
  module loaded first); ``conda``: ``conda create --prefix`` with the site's conda module
  loaded; ``container``: ``python -m venv --system-site-packages`` run inside the image, so
  the container's torch is used and the venv adds the rest.
- it installs ``torch==V+variant`` (and torchvision/torchaudio with the same label, other
  companions as pinned) from the site's wheel index, the extras, and the wheel of every
  recipe sitestack built for the site (``recipe-install``: mpi4py, Horovod, ...), taken from
  that install, never recompiled. A recipe that is not built is left out (said in the
  step's message).
- ``<prefix>/<name>.manifest.json`` lists every distribution in the environment (name,
  version, dist-info, sha256 of its RECORD) and where it came from (index URL and wheel
  sha256, the sitestack build, or the environment's creation), with the plan it realises.

The path is a symlink to a hidden generation directory beside it. A new environment is built
in a fresh generation and switched to with one rename, so nothing half-built is ever visible
at the path; a failure removes the generation. A change of pins, extras or built wheels is
applied in place, to only what changed (pip installs the changed requirements, uninstalls
removed extras); a change of base Python, or content that no longer matches the manifest,
builds a new generation. A re-run with nothing changed reads the manifest and lists the
dist-info directories: no pip, no index.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sitestack.actions.base import Action, unified_diff
from sitestack.core.errors import InputError, SitestackError
from sitestack.core.host import Completed, Host
from sitestack.model.context import RunContext
from sitestack.model.site import Facts, Site, StepSpec, expand
from sitestack.model.siteenv import in_site_env
from sitestack.programs import activate_hook

MANIFEST_FORMAT = 1
#: Recipes whose wheels the stack installs when sitestack built them for the site.
DEFAULT_RECIPES = ("mpi4py", "horovod")
#: Companion packages built per wheel variant, pinned with the variant's local label.
LABELLED = ("torch", "torchvision", "torchaudio")
#: pip >= 22.3 can install into another interpreter's environment (``--python``).
PIP_PYTHON_OPTION = (22, 3)

_NAME = re.compile(r"[A-Za-z0-9{][A-Za-z0-9._+{}-]*(/[A-Za-z0-9{][A-Za-z0-9._+{}-]*)+")


def normalize(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


# -- what the stack is ------------------------------------------------------------------------
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
    index_url: str | None
    system_site_packages: bool
    compile: bool

    @property
    def site_packages(self) -> str:
        return f"{self.path}/lib/python{self.python_version}/site-packages"

    @property
    def manifest(self) -> str:
        return f"{self.path}.manifest.json"

    @property
    def bin(self) -> str:
        return f"{self.path}/bin"

    @property
    def family(self) -> str:
        return self.name.split("/", 1)[0]


def default_name(facts: Facts) -> str:
    return f"pytorch/{facts.torch.version}-{facts.torch.variant}"


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
    if not _NAME.fullmatch(name) or ".." in name.split("/"):
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
        index_url=None if container else facts.torch.index_url,
        system_site_packages=True if container else ssp,
        compile=compile,
    )


def module_root(ctx: RunContext) -> str:
    """Where sitestack installs module files on this host (facts.modules.install_root, filled in)."""
    return expand(ctx.facts.modules.install_root, ctx.values).rstrip("/")


def require_module_system(site: Site | None = None, facts: Facts | None = None) -> None:
    """A stack is delivered as a module: refuse a site without a module system."""
    facts = facts or site.facts  # type: ignore[union-attr]
    if facts.modules.system == "none":
        where = site.path if site else "facts.modules.system"
        name = site.name if site else "this site"
        raise InputError(where, f"site {name} has no module system (facts.modules.system: none): the stack, its "
                         "module files and the extend-venv-activate hook need Lmod or Environment Modules",
                         key="facts.modules.system")


# -- what sitestack built for the site ---------------------------------------------------------
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


def recipe_targets(ctx: RunContext, recipes: Sequence[str]) -> tuple[list[Built], list[str]]:
    """The installs of ``recipes`` this site's playbook makes (its ``recipe-install`` steps, else each
    recipe's default version at ``{prefix}/<recipe>/<version>``), without looking at a host.

    Returns (packages, notes): a recipe without ``sources/<name>.yml``, or one the site's facts
    rule out, is a note, not an error.
    """
    from sitestack.actions.recipe_install import RecipeInstall

    # The playbook's install steps (recipe-install and the actions built on it) say where each goes.
    targets: dict[str, Any] = {}
    for spec in ctx.site.steps:
        cls = ctx.actions.get(spec.action)
        if cls is None or not issubclass(cls, RecipeInstall):
            continue
        try:
            target = cls.from_spec(spec, ctx).target
        except SitestackError:
            continue
        if target.recipe.name in recipes:
            targets.setdefault(target.recipe.name, target)
    out: list[Built] = []
    notes: list[str] = []
    for recipe in recipes:
        target = targets.get(recipe)
        if target is None:
            spec = StepSpec(name=f"{recipe} (default install)", action="recipe-install", args={"recipe": recipe})
            try:
                target = RecipeInstall.from_spec(spec, ctx).target
            except SitestackError as exc:
                notes.append(f"{recipe} (not for this site: {getattr(exc, 'detail', exc)})")
                continue
        out.append(Built(recipe=recipe, version=target.version, dest=target.dest,
                         description=target.recipe.description, homepage=target.recipe.homepage,
                         settings=target.recipe.module, values=target.values(install=target.dest)))
    return out, notes


def find_built(host: Host, ctx: RunContext, recipes: Sequence[str]) -> tuple[list[Built], list[str]]:
    """The packages of :func:`recipe_targets` that are installed on ``host``, with their wheels."""
    from sitestack.actions.recipe_install import installed_wheel, read_stamp

    candidates, notes = recipe_targets(ctx, recipes)
    found = []
    for b in candidates:
        stamp = read_stamp(host, b.dest)
        if not stamp:
            notes.append(f"{b.recipe} {b.version} (not built yet)")
            continue
        artefact = stamp.get("artefact") or {}
        wheel = installed_wheel(host, b.dest)
        found.append(dataclasses.replace(b, installed=True, wheel=wheel, wheel_sha256=artefact.get("sha256")))
    return found, notes


# -- running things in the base environment -----------------------------------------------------
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
        binds = list(dict.fromkeys([self.prefix, *c.bind]))
        return in_site_env(self.facts, [c.runtime, "exec", "--bind", ",".join(binds), c.image, *argv])

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


#: Run by the environment's interpreter: every distribution in its own site-packages, as JSON.
SCAN = r"""
import hashlib, json, os, sys
try:
    from importlib import metadata
except ImportError:  # Python < 3.8
    metadata = None
sp = sys.argv[1]
out = []
names = sorted(n for n in os.listdir(sp) if n.endswith(".dist-info") or n.endswith(".egg-info"))
for n in names:
    d = os.path.join(sp, n)
    meta = os.path.join(d, "METADATA") if n.endswith(".dist-info") else os.path.join(d, "PKG-INFO")
    name = version = None
    try:
        with open(meta, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("Name:") and name is None:
                    name = line.split(":", 1)[1].strip()
                elif line.startswith("Version:") and version is None:
                    version = line.split(":", 1)[1].strip()
                elif not line.strip():
                    break
    except OSError:
        pass
    record = os.path.join(d, "RECORD")
    digest = None
    if os.path.isfile(record):
        with open(record, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
    out.append({"name": name or n.split("-")[0], "version": version, "dist_info": n, "record_sha256": digest})
print(json.dumps({"python": "%d.%d.%d" % sys.version_info[:3], "packages": out}))
"""

#: Run by a python3 on the host: can the index be reached? (stdlib only; any Python 3)
INDEX_PROBE = r"""
import os, sys, urllib.request, urllib.error
url = sys.argv[1]
try:
    if url.startswith("file://"):
        path = urllib.request.url2pathname(url[7:])
        if not os.path.isdir(path):
            raise OSError("no directory %s" % path)
    else:
        req = urllib.request.Request(url.rstrip("/") + "/torch/", headers={"User-Agent": "sitestack"})
        urllib.request.urlopen(req, timeout=float(sys.argv[2])).close()
except urllib.error.HTTPError as exc:
    if exc.code >= 500:
        print("HTTP %d %s" % (exc.code, exc.reason)); sys.exit(3)
except Exception as exc:
    print(getattr(exc, "reason", None) or exc); sys.exit(3)
"""


def check_index(host: Host, url: str | None, timeout: float = 15) -> None:
    """Raise a clear error when the wheel index cannot be reached from ``host``."""
    if not url:
        return
    out = host.probe(["python3", "-c", INDEX_PROBE, url, str(timeout)], timeout=timeout + 15)
    if out.rc == 127 and "not found" in (out.stderr + out.stdout):
        return  # no python3 to ask with: pip will say it
    if out.rc != 0:
        reason = (out.stdout.strip() or out.stderr.strip().splitlines()[-1:] or ["no answer"])
        reason = reason if isinstance(reason, str) else reason[0]
        raise SitestackError(f"wheel index {url} cannot be reached from {host.name}: {reason} "
                             "(facts.torch.index_url; nothing was installed)")


# -- the plan and the manifest --------------------------------------------------------------------------
def plan_for(stack: Stack, facts: Facts, built: Sequence[Built]) -> dict[str, Any]:
    """Everything the environment's content depends on (what the manifest records as its plan)."""
    base: dict[str, Any] = {"source": stack.source, "python": stack.python_version,
                            "executable": facts.python.executable,
                            "system_site_packages": stack.system_site_packages}
    if stack.source in ("module", "conda"):
        base["module"] = facts.python.module
        base["modules"] = list(facts.modules.load)
    if stack.source == "container" and facts.container:
        base["image"] = facts.container.image
    return {
        "base": base,
        "compile": stack.compile,
        "index_url": stack.index_url,
        "requirements": list(stack.requirements),
        "extras": list(stack.extras),
        "built": {b.recipe: {"version": b.version, "wheel": os.path.basename(b.wheel or ""),
                             "sha256": b.wheel_sha256, "install": b.dest}
                  for b in built if b.wheel},
    }


def requirement_name(req: str) -> str:
    return normalize(re.split(r"[\s<>=!~;\[@(]", req.strip(), maxsplit=1)[0])


def explain(old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    """What differs between two plans, in words."""
    parts = []
    if old.get("base") != new.get("base"):
        parts.append("base Python changed")
    if old.get("compile") != new.get("compile"):
        parts.append("bytecode compilation changed")
    if old.get("index_url") != new.get("index_url"):
        parts.append(f"index {old.get('index_url')} -> {new.get('index_url')}")
    for key in ("requirements", "extras"):
        added = [r for r in new.get(key, []) if r not in old.get(key, [])]
        gone = [r for r in old.get(key, []) if r not in new.get(key, [])]
        if added or gone:
            parts.append(f"{key}: " + ", ".join([f"+{r}" for r in added] + [f"-{r}" for r in gone]))
    ob, nb = old.get("built", {}), new.get("built", {})
    for recipe in sorted(set(ob) | set(nb)):
        if recipe not in ob:
            parts.append(f"+{recipe} {nb[recipe]['version']} (built)")
        elif recipe not in nb:
            parts.append(f"-{recipe} (no longer built)")
        elif ob[recipe] != nb[recipe]:
            parts.append(f"{recipe} {ob[recipe]['version']} -> {nb[recipe]['version']} (rebuilt)")
    return "; ".join(parts) or "plan changed"


def needs_new_generation(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    return old.get("base") != new.get("base") or old.get("compile") != new.get("compile")


def read_manifest(host: Host, stack: Stack) -> dict[str, Any] | None:
    text = host.read_text(stack.manifest)
    if text is None:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    return data if isinstance(data, dict) and data.get("format") == MANIFEST_FORMAT else None


def origins_from_report(text: str | None, built: Sequence[Built]) -> dict[str, dict[str, Any]]:
    """name -> where pip took it from, from a ``pip install --report`` file."""
    out: dict[str, dict[str, Any]] = {}
    if not text:
        return out
    try:
        report = json.loads(text)
    except ValueError:
        return out
    wheels = {os.path.basename(b.wheel): b for b in built if b.wheel}
    for item in report.get("install", []):
        meta = item.get("metadata", {})
        info = item.get("download_info", {})
        url = info.get("url", "")
        sha = (info.get("archive_info", {}).get("hashes") or {}).get("sha256") or \
            (info.get("archive_info", {}).get("hash", "").partition("=")[2] or None)
        origin: dict[str, Any] = {"kind": "index", "url": url, "sha256": sha, "requested": bool(item.get("requested"))}
        b = wheels.get(os.path.basename(url.split("#", 1)[0]).replace("%2B", "+"))
        if b is not None:
            origin = {"kind": "built", "recipe": b.recipe, "install": b.dest, "wheel": b.wheel, "sha256": b.wheel_sha256,
                      "requested": True}
        out[normalize(meta.get("name", ""))] = origin
    return out


def manifest_for(stack: Stack, plan: Mapping[str, Any], scan: Mapping[str, Any], origins: Mapping[str, Any],
                 previous: Mapping[str, Any] | None, generation: str) -> dict[str, Any]:
    """The manifest: the plan, and every distribution in the environment with its origin."""
    before = {normalize(p["name"]): p.get("source") for p in (previous or {}).get("packages", [])}
    packages = []
    for p in scan["packages"]:
        key = normalize(p["name"])
        source = origins.get(key) or before.get(key) or {"kind": "environment",
                                                          "detail": "created with the environment"}
        packages.append({**p, "source": source})
    return {
        "format": MANIFEST_FORMAT,
        "site": stack.site,
        "name": stack.name,
        "path": stack.path,
        "generation": generation,
        "python": scan["python"],
        "site_packages": stack.site_packages,
        "plan": dict(plan),
        "packages": sorted(packages, key=lambda p: normalize(p["name"])),
    }


def dump(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


# -- the steps ---------------------------------------------------------------------------------------
def _list_dists(host: Host, stack: Stack) -> tuple[bool, set[str]]:
    """(interpreter present, dist-info names) of the environment at the stable path."""
    script = ('[ -x "$1/bin/python" ] || echo NOPYTHON; cd "$2" 2>/dev/null || exit 0; '
              'for d in *.dist-info *.egg-info; do [ -e "$d" ] && echo "$d"; done; exit 0')
    out = host.probe(["sh", "-c", script, "sh", stack.path, stack.site_packages])
    lines = out.stdout.split()
    return "NOPYTHON" not in lines, {n for n in lines if n != "NOPYTHON"}


class StackVenv(Action):
    """The site's stack environment (venv or conda env) with torch, extras and the wheels sitestack
    built, and its manifest beside it."""

    action = "stack-venv"

    @dataclass(frozen=True)
    class Args:
        name: str | None = field(default=None, metadata={"doc": "module name of the stack, also its path under "
                                                                "{prefix} (default pytorch/<torch.version>-<torch.variant>)"})
        recipes: tuple[str, ...] = field(default=DEFAULT_RECIPES, metadata={
            "doc": "recipes whose wheels the stack installs when sitestack built them for the site"})
        system_site_packages: str = field(default="auto", metadata={
            "doc": "see the base Python's packages: true, false, or auto (false for python.source system)"})
        compile: bool = field(default=True, metadata={"doc": "compile bytecode at install (a shared stack "
                                                             "users cannot write to needs it)"})

        def check(self) -> str | None:
            if self.system_site_packages not in ("auto", "true", "false"):
                return f"system_site_packages: must be auto, true or false, not {self.system_site_packages!r}"
            if self.name is not None and not _NAME.fullmatch(self.name):
                return f"name: {self.name!r} must look like pytorch/2.3.1-gpu"
            return None

    def __init__(self, spec: StepSpec, args: Any, ctx: RunContext) -> None:
        super().__init__(spec, args, ctx)
        self.stack = stack_for(ctx, args.name, system_site_packages=args.system_site_packages, compile=args.compile)
        self.base = Base(ctx.facts, self.stack, ctx.values["prefix"])
        self.notes: list[str] = []

    def describe(self) -> str:
        return f"install the stack environment {self.stack.path}"

    def desired(self, host: Host) -> tuple[dict[str, Any], list[Built]]:
        built, self.notes = find_built(host, self.ctx, self.args.recipes)
        return plan_for(self.stack, self.ctx.facts, built), built

    def pending(self, host: Host) -> str | None:
        require_module_system(facts=self.ctx.facts)
        reason = self._reason(host)
        if reason is not None:
            check_index(host, self.stack.index_url)
            if self.notes:
                reason += f" (left out: {'; '.join(self.notes)})"
        return reason

    def _reason(self, host: Host) -> str | None:
        plan, _ = self.desired(host)
        manifest = read_manifest(host, self.stack)
        if manifest is None:
            return f"{self.stack.manifest} missing"
        if manifest.get("plan") != plan:
            return explain(manifest.get("plan", {}), plan)
        has_python, dists = _list_dists(host, self.stack)
        if not has_python:
            return f"{self.stack.path}/bin/python missing"
        recorded = {p["dist_info"] for p in manifest.get("packages", [])}
        if dists != recorded:
            added, gone = sorted(dists - recorded), sorted(recorded - dists)
            return ("content differs from the manifest: " +
                    ", ".join([f"+{d}" for d in added] + [f"-{d}" for d in gone]))
        return None

    def diff(self, host: Host) -> str | None:
        plan, _ = self.desired(host)
        manifest = read_manifest(host, self.stack)
        old = dump(manifest["plan"]) if manifest else None
        return unified_diff(old, dump(plan), self.stack.manifest + " (plan)")

    def apply(self, host: Host) -> None:
        require_module_system(facts=self.ctx.facts)
        plan, built = self.desired(host)
        check_index(host, self.stack.index_url)
        manifest = read_manifest(host, self.stack)
        has_python, dists = _list_dists(host, self.stack)
        fresh = (manifest is None or needs_new_generation(manifest.get("plan", {}), plan) or not has_python
                 or dists != {p["dist_info"] for p in manifest.get("packages", [])})
        if fresh:
            Builder(self, host, plan, built, manifest).build_generation()
        else:
            Builder(self, host, plan, built, manifest).update()


class Builder:
    """One apply of :class:`StackVenv`."""

    def __init__(self, step: StackVenv, host: Host, plan: dict[str, Any], built: list[Built],
                 manifest: dict[str, Any] | None) -> None:
        self.step, self.host, self.plan, self.built, self.manifest = step, host, plan, built, manifest
        self.stack = step.stack
        self.base = step.base
        self.log = step.ctx.log_dir / "stack-venv.log" if step.ctx.log_dir else None
        self.parent, self.leaf = os.path.split(self.stack.path)
        self.token = secrets.token_hex(4)

    def run(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> Completed:
        return self.host.run(argv, env=env, log=self.log)

    # -- pip --------------------------------------------------------------------------------------
    def pip(self, root: str) -> list[str]:
        """How to run pip for the environment at ``root``."""
        if self.stack.source == "conda":
            return self.base.env_python(root, ["-m", "pip"])
        out = self.host.probe(self.base.base(["python", "-m", "pip", "--version"]))
        match = re.search(r"pip (\d+)\.(\d+)", out.stdout) if out.ok else None
        if match and (int(match[1]), int(match[2])) >= PIP_PYTHON_OPTION:
            return self.base.base(["python", "-m", "pip", "--python", f"{root}/bin/python"])
        # An old or absent pip in the base: give the environment its own (ensurepip, from the stdlib).
        if not self.host.exists(f"{root}/bin/pip"):
            self.run(self.base.env_python(root, ["-m", "ensurepip", "--default-pip"]))
        return self.base.env_python(root, ["-m", "pip"])

    def pip_install(self, root: str, requirements: Sequence[str], report: str, *extra: str) -> str | None:
        argv = [*self.pip(root), "install", "--no-input", "--disable-pip-version-check", "--progress-bar", "off",
                "--retries", "2", "--timeout", "60", "--report", report, *extra]
        if not self.stack.compile:
            argv.append("--no-compile")
        if self.stack.index_url:
            argv += ["--extra-index-url", self.stack.index_url]
        self.run([*argv, *requirements])
        text = self.host.read_text(report)
        self.host.probe(["rm", "-f", "--", report])
        return text

    def scan(self, root: str) -> dict[str, Any]:
        sp = f"{root}/lib/python{self.stack.python_version}/site-packages"
        out = self.host.probe(self.base.env_python(root, ["-c", SCAN, sp]), timeout=300)
        try:
            data = json.loads(out.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise SitestackError(f"cannot list the packages of {root}: {(out.stderr or out.stdout).strip()[-500:]}") from None
        major_minor = ".".join(data["python"].split(".")[:2])
        if major_minor != self.stack.python_version:
            raise SitestackError(f"the base Python is {data['python']}, the site says python.version "
                                 f"{self.stack.python_version} (facts.python)")
        return data

    def wheels(self) -> list[str]:
        return [b.wheel for b in self.built if b.wheel]

    # -- a new generation ---------------------------------------------------------------------
    def build_generation(self) -> None:
        """Build the whole environment in a hidden directory, then switch the path to it."""
        if self.host.exists(self.stack.path) and not self.host.probe(["test", "-L", self.stack.path]).ok \
                and self.manifest is None:
            raise SitestackError(f"{self.stack.path} exists and is not a stack sitestack installed (no "
                                 f"{os.path.basename(self.stack.manifest)}): move it away first")
        gen = f"{self.parent}/.{self.leaf}.gen-{self.token}"
        self.run(["mkdir", "-p", self.parent])
        self._clean_stale()
        try:
            for argv in self.base.create(gen):
                self.run(argv)
            report = f"{gen}/.sitestack-pip-report.json"
            requirements = [*self.stack.requirements, *self.stack.extras, *self.wheels()]
            text = self.pip_install(gen, requirements, report) if requirements else None
            scan = self.scan(gen)
            origins = origins_from_report(text, self.built)
            manifest = manifest_for(self.stack, self.plan, scan, origins, None, os.path.basename(gen))
            # the scan saw gen's paths; the manifest describes the stable path
            self._switch(gen)
        except BaseException:
            self.host.probe(["rm", "-rf", "--", gen])
            self.host.probe(["rmdir", "-p", "--ignore-fail-on-non-empty", "--", self.parent])
            raise
        self.host.write_text(self.stack.manifest, dump(manifest), 0o644)

    def _switch(self, gen: str) -> None:
        """Point the stack's path at ``gen`` with one rename (:mod:`sitestack.core.swap`)."""
        # imported here: this step is the only user, and the module's import block is not ours to reorder
        from sitestack.core.swap import swap_argv

        self.run(swap_argv(self.parent, self.leaf, os.path.basename(gen), self.token))

    def _clean_stale(self) -> None:
        """Remove generations a killed run left (not the current one)."""
        script = r"""
parent=$1 leaf=$2
cur=""; [ -L "$parent/$leaf" ] && cur=$(readlink "$parent/$leaf")
for d in "$parent"/."$leaf".gen-* "$parent"/."$leaf".link-* "$parent"/."$leaf".old-*; do
  [ -e "$d" ] || [ -L "$d" ] || continue
  [ "$(basename "$d")" = "$cur" ] && continue
  rm -rf -- "$d"
done
exit 0
"""
        self.run(["bash", "-c", script, "sitestack", self.parent, self.leaf])

    # -- in place ------------------------------------------------------------------------------
    def update(self) -> None:
        """Install what changed in the current generation; uninstall extras that were removed."""
        assert self.manifest is not None
        old = self.manifest.get("plan", {})
        root = self.stack.path
        changed = [r for r in (*self.plan["requirements"], *self.plan["extras"])
                   if r not in (*old.get("requirements", []), *old.get("extras", []))]
        if self.plan.get("index_url") != old.get("index_url"):
            changed = [*self.plan["requirements"], *self.plan["extras"]]
        wanted = {requirement_name(r) for r in (*self.plan["requirements"], *self.plan["extras"])}
        removed = sorted({requirement_name(r) for r in (*old.get("requirements", []), *old.get("extras", []))} - wanted)
        old_built, new_built = old.get("built", {}), self.plan.get("built", {})
        # A newly built package comes with its dependencies; a rebuilt one keeps them.
        changed += [b.wheel for b in self.built if b.wheel and b.recipe not in old_built]
        rebuilt = [b.wheel for b in self.built
                   if b.wheel and b.recipe in old_built and old_built[b.recipe] != new_built.get(b.recipe)]
        removed += sorted(normalize(r) for r in old_built if r not in new_built)
        report = f"{self.parent}/.{self.leaf}.pip-report-{self.token}.json"
        text_a = self.pip_install(root, changed, report) if changed else None
        # A rebuilt wheel keeps its version: pip must be told to replace it (and nothing else).
        text_b = self.pip_install(root, rebuilt, report, "--force-reinstall", "--no-deps") if rebuilt else None
        if removed:
            self.run([*self.pip(root), "uninstall", "--yes", *removed])
        origins = {**origins_from_report(text_a, self.built), **origins_from_report(text_b, self.built)}
        scan = self.scan(root)
        manifest = manifest_for(self.stack, self.plan, scan, origins, self.manifest,
                                self.manifest.get("generation", ""))
        self.host.write_text(self.stack.manifest, dump(manifest), 0o644)


# -- the extend-venv-activate command in the stack's bin/ ---------------------------------------------------
def hook_config(ctx: RunContext, stack: Stack) -> dict[str, Any]:
    """What the installed extend-venv-activate needs to know about the stack and the site."""
    from sitestack.model.siteenv import INIT_CANDIDATES

    mods = ctx.facts.modules
    bash_inits = [mods.init] if mods.init else list(INIT_CANDIDATES)
    inits: dict[str, list[str]] = {"bash": [], "zsh": [], "fish": [], "csh": []}
    for path in bash_inits:
        head, tail = os.path.split(path)
        if tail == "bash":
            for shell in inits:
                inits[shell].append(f"{head}/{shell}")
        else:  # e.g. /etc/profile.d/modules.sh: sh syntax
            inits["bash"].append(path)
            inits["zsh"].append(path)
    roots = [*mods.use, module_root(ctx)]
    return {
        "site": ctx.site.name,
        "module": stack.name,
        "module_roots": list(dict.fromkeys(roots)),
        "init": inits,
        "python_version": stack.python_version,
        "stack": stack.path,
    }


class VenvHook(Action):
    """The extend-venv-activate command in the stack's bin/: extends a user's venv so that activating it
    loads the stack's module and deactivating restores the environment."""

    action = "venv-hook"

    @dataclass(frozen=True)
    class Args:
        name: str | None = field(default=None, metadata={"doc": "the stack's name, as the stack-venv step has it"})

    def __init__(self, spec: StepSpec, args: Any, ctx: RunContext) -> None:
        super().__init__(spec, args, ctx)
        self.stack = stack_for(ctx, args.name)
        self.path = f"{self.stack.bin}/{activate_hook.COMMAND}"

    def describe(self) -> str:
        return f"install {self.path}"

    def render(self) -> str:
        return activate_hook.render_command(hook_config(self.ctx, self.stack))

    def pending(self, host: Host) -> str | None:
        require_module_system(facts=self.ctx.facts)
        current = host.read_text(self.path)
        if current is None:
            return f"{self.path} missing"
        if current != self.render():
            return f"{self.path} differs"
        out = host.probe(["stat", "-c", "%a", "--", self.path])
        if out.ok and out.stdout.strip() != "755":
            return f"{self.path} mode {out.stdout.strip()}, want 755"
        return None

    def diff(self, host: Host) -> str | None:
        return unified_diff(host.read_text(self.path), self.render(), self.path)

    def apply(self, host: Host) -> None:
        if not host.exists(f"{self.stack.bin}/python"):
            raise SitestackError(f"the stack environment {self.stack.path} is not installed (run the stack-venv "
                                 f"step first: invoke install-venv --site {self.ctx.site.name})")
        host.write_text(self.path, self.render(), 0o755)


__all__ = ["Stack", "Built", "StackVenv", "VenvHook", "stack_for", "find_built", "recipe_targets", "plan_for",
           "module_root"]
