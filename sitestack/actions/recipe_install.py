"""Recipe installs: a recipe version built from source and installed atomically, stamped, locked.

The ``recipe-install`` action (and ``invoke build-recipe`` / ``invoke build-mpi4py``) makes
``<dest>`` (default ``<site prefix>/<recipe>/<version>``) hold the package built from its
recipe in ``sources/``:

- **done** when ``<dest>/.sitestack/install.json`` holds the digest of every input (source
  sha256, each patch's sha256, builder and its options, the resolved commands and
  environment, the site toolchain, the install location, sanity paths and checks) and the
  recipe's sanity paths exist. An unchanged install is ``ok`` after a few probes.
- otherwise, under a per-install lock (re-checked once taken): the artefact (a wheel, or a
  tarball of the staged prefix) is taken from the build cache by its build digest, or built:
  fresh build dir, source fetched on the controller (sha256 verified), patches applied
  (already-applied ones detected), the builder's commands run with the site's modules
  loaded, the result stored in the cache. The artefact is installed into a hidden tree beside
  ``<dest>``, sanity paths and checks run on it, then ``<dest>`` (a symlink) is switched to
  it with one rename, and the stamp is written last.

A kill at any moment leaves ``<dest>`` as it was (the old install, or nothing) or the new
complete tree without its stamp, which the next run finishes from the cache. Leftovers of a
killed run (hidden trees, build dirs) are removed by the next install under the lock.

Build logs are files (one per install, controller side); phases are written there as
``==> sitestack: ... phase NAME (+ELAPSED)`` lines and reported while the build runs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import secrets
import shlex
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sitestack.actions.base import Action
from sitestack.builders import Command, Layout, autotools, cmake, pip, symbolic
from sitestack.core import versions
from sitestack.core.errors import CommandFailed, InputError, LockHeld, SitestackError
from sitestack.core.host import Host, LocalHost
from sitestack.installs import sources as sources_mod
from sitestack.model.context import RunContext
from sitestack.model.recipe import Recipe, expand, load_recipe
from sitestack.model.site import Facts, plain_data
from sitestack.model.siteenv import in_site_env, probe_in_site_env

STAMP = ".sitestack/install.json"
STAMP_FORMAT = 1
#: Kept in the install: the wheel it was installed from (a venv can install the same one).
WHEEL_DIR = ".sitestack/wheels"


# -- the target and its inputs ------------------------------------------------------------
@dataclass(frozen=True)
class Target:
    """What is installed where: a recipe version for a site, at ``dest``."""

    recipe: Recipe
    version: str
    facts: Facts
    dest: str
    site_prefix: str
    python: str

    @property
    def label(self) -> str:
        return f"{self.recipe.name} {self.version}"

    def values(self, install: str | None = None) -> dict[str, str]:
        """Placeholder values for the recipe's strings."""
        f = self.facts
        return {
            "name": self.recipe.name,
            "version": self.version,
            "prefix": self.dest,
            "site_prefix": self.site_prefix,
            "install": install or self.dest,
            "mpicc": f.mpi.cc,
            "mpicxx": f.mpi.cxx,
            "mpi_library_match": f.mpi.library_match,
            "python": self.python,
            "python_version": f.python.version,
            "torch_version": f.torch.version,
            **({"rocm_home": f.rocm.home, "rocm_version": f.rocm.version} if f.rocm else {}),
            **({"cuda_home": f.cuda.home, "cuda_version": f.cuda.version} if f.cuda else {}),
        }

    def args(self) -> list[str]:
        values = self.values()
        return [expand(a, values) for a in (*self.recipe.args, *self.recipe.versions[self.version].args)]

    def env(self) -> dict[str, str]:
        values = self.values()
        merged = {**self.recipe.env, **self.recipe.versions[self.version].env}
        return {k: expand(v, values) for k, v in merged.items()}

    def tools(self) -> list[str]:
        """Commands that must exist (first word of each), the builder's own included."""
        values = self.values()
        names = [shlex.split(expand(t, values))[0] for t in self.recipe.tools if expand(t, values).strip()]
        builder = {"autotools": ["make"], "pip": [self.python], "cmake": []}[self.recipe.build]
        out: list[str] = []
        for name in (*names, *builder):
            if name not in out:
                out.append(name)
        return out


@dataclass(frozen=True)
class Toolchain:
    """What the site environment on the host provides."""

    tools: Mapping[str, str]          # command -> "path | first line of --version"
    missing: tuple[str, ...]
    nproc: int = 1
    slurm_job: str = ""
    cmake: str | None = None          # the cmake to use (None: from PyPI into a tool venv)
    ninja: bool = True


def probe_toolchain(host: Host, target: Target, extra: Sequence[str] = ()) -> Toolchain:
    """Find the target's tools (and ``extra`` ones) with the site's modules loaded."""
    tools = [*target.tools(), *extra]
    if target.recipe.build == "cmake":
        tools += ["cmake", "ninja"]
    script = r"""
for t in "$@"; do
  p=$(command -v -- "$t" 2>/dev/null) || { printf 'MISSING\t%s\n' "$t"; continue; }
  v=$("$p" --version </dev/null 2>&1 | head -n 1)
  printf 'TOOL\t%s\t%s\t%s\n' "$t" "$p" "$v"
done
printf 'NPROC\t%s\n' "$(nproc 2>/dev/null || echo 1)"
printf 'SLURM\t%s\n' "${SLURM_JOB_ID:-}"
"""
    out = probe_in_site_env(host, target.facts, ["bash", "-c", script, "sitestack", *dict.fromkeys(tools)])
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
    cmake_cmd, ninja = None, True
    if target.recipe.build == "cmake":
        opts = target.recipe.builder_options()
        have = found.pop("cmake", None)
        ninja_found = found.pop("ninja", None)
        missing = [m for m in missing if m not in ("cmake", "ninja")]
        if have:
            version = have.split("|", 1)[1].strip().rsplit(" ", 1)[-1]
            try:
                if versions.matches(f">={opts.minimum}", version):
                    cmake_cmd = have.split(" | ")[0]
                    found["cmake"] = have
            except ValueError:
                pass
        ninja = bool(ninja_found) or opts.generator != "Ninja"
        if ninja_found and opts.generator == "Ninja":
            found["ninja"] = ninja_found
        if cmake_cmd is None or not ninja:
            found["cmake"] = f"PyPI cmake>={opts.minimum}" + (" + ninja" if not ninja else "")
    return Toolchain(found, tuple(missing), nproc, slurm, cmake_cmd, ninja)


def require_tools(toolchain: Toolchain, target: Target, host: Host) -> None:
    needed = [t for t in toolchain.missing]
    if needed:
        loaded = ", ".join(target.facts.modules.load) or "no site modules"
        raise SitestackError(f"{target.label}: missing on {host.name} (with {loaded} loaded): {', '.join(needed)} "
                             f"(needed by {target.recipe.path}; the MPI wrapper is facts.mpi.cc = {target.facts.mpi.cc!r})")


def cmake_venv(cache_root: str, minimum: str) -> str:
    return f"{cache_root}/tools/cmake-{minimum}"


def build_plan(target: Target, layout: Layout, *, has_configure: bool = True, cmake_cmd: str = "cmake",
               make_program: str | None = None) -> list[Command]:
    """The builder's commands for ``target`` in ``layout`` (pure)."""
    recipe = target.recipe
    opts = recipe.builder_options()
    args, env = target.args(), target.env()
    if recipe.build == "autotools":
        return autotools.plan(layout=layout, args=args, env=env, bootstrap=opts.bootstrap,
                              bootstrap_command=opts.bootstrap_command, has_configure=has_configure,
                              out_of_tree=opts.out_of_tree, make_args=opts.make_args)
    if recipe.build == "cmake":
        return cmake.plan(layout=layout, args=args, env=env, cmake=cmake_cmd, generator=opts.generator,
                          build_type=opts.build_type, source_subdir=opts.source_subdir, make_program=make_program)
    return pip.plan(layout=layout, python=target.python, args=args, env=env, build_isolation=opts.build_isolation)


def staged_tree(target: Target, layout: Layout) -> str:
    """Where a prefix build's files are after its plan ran."""
    return autotools.staged_tree(layout) if target.recipe.build == "autotools" else cmake.staged_tree(layout)


def artefact_kind(target: Target) -> str:
    return "wheel" if target.recipe.build == "pip" else "tree"


def install_commands(target: Target, artefact: str, tree: str) -> list[Command]:
    """Install the artefact file into ``tree`` (a directory that does not exist yet)."""
    if artefact_kind(target) == "wheel":
        wheel_dir = f"{tree}/{WHEEL_DIR}"
        return [pip.install(python=target.python, wheel=artefact, target=tree),
                Command("install", ("mkdir", "-p", wheel_dir), "/"),
                Command("install", ("cp", artefact, wheel_dir + "/"), "/")]
    return [Command("install", ("mkdir", "-p", tree), "/"),
            Command("install", ("tar", "-xf", artefact, "-C", tree), "/")]


def launcher_argv(facts: Facts, ranks: int) -> list[str]:
    launcher = facts.mpi.launcher
    return {"srun": ["srun", "-n", str(ranks)], "mpirun": ["mpirun", "-np", str(ranks)]}.get(
        launcher, ["mpiexec", "-n", str(ranks)])


def check_commands(target: Target, tree: str) -> list[tuple[str, list[str], dict[str, str], str | None, int]]:
    """(name, argv, env, expected text, ranks) for each of the recipe's checks on ``tree``."""
    values = target.values(install=tree)
    out = []
    for check in target.recipe.checks:
        argv = [expand(a, values) for a in check.run]
        if check.ranks > 1:
            argv = launcher_argv(target.facts, check.ranks) + argv
        env = {k: expand(v, values) for k, v in check.env.items()}
        expect = expand(check.expect, values) if check.expect is not None else None
        out.append((check.name, argv, env, expect, check.ranks))
    return out


def host_argv(facts: Facts, command: Command | Sequence[str], env: Mapping[str, str] | None = None) -> list[str]:
    """The argv run on the host: the site's modules loaded, then ``env`` set, then the command."""
    if isinstance(command, Command):
        argv, env = list(command.argv), dict(command.env)
    else:
        argv, env = list(command), dict(env or {})
    if env:
        argv = ["env", *(f"{k}={v}" for k, v in sorted(env.items())), *argv]
    return in_site_env(facts, argv)


def build_inputs(target: Target, toolchain: Toolchain) -> dict[str, Any]:
    """Everything the artefact depends on (its digest is the build cache key)."""
    recipe = target.recipe
    plan = build_plan(target, symbolic(target.dest))
    return {
        "recipe": recipe.name,
        "version": target.version,
        "source": {"sha256": recipe.versions[target.version].sha256},
        "patches": [{"file": p.file, "sha256": p.sha256} for p in recipe.patches_for(target.version)],
        "builder": recipe.build,
        "options": plain_data(dataclasses.asdict(recipe.builder_options())),
        "plan": [c.as_dict() for c in plan],
        "toolchain": {
            "modules": list(target.facts.modules.load),
            "module_use": list(target.facts.modules.use),
            # the recipe's tools and the builder's (not helpers like tar and patch)
            "tools": {k: v for k, v in sorted(toolchain.tools.items()) if k in target.tools() or k in ("cmake", "ninja")},
        },
    }


def install_inputs(target: Target) -> dict[str, Any]:
    checks = check_commands(target, "$INSTALL")
    return {
        "dest": target.dest,
        "artefact": artefact_kind(target),
        "install": [c.as_dict() for c in install_commands(target, "$ARTEFACT", "$INSTALL")],
        "sanity": list(target.recipe.sanity),
        "checks": [{"name": n, "argv": a, "env": e, "expect": x} for n, a, e, x, _ in checks],
    }


def digest(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def explain_change(old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    """What differs between two stamps' inputs, in words (the first few differences)."""
    out: list[str] = []
    ob, nb = old.get("build", {}), new.get("build", {})
    if ob.get("source") != nb.get("source"):
        out.append("source tarball changed")
    op = {p["file"]: p["sha256"] for p in ob.get("patches", [])}
    np_ = {p["file"]: p["sha256"] for p in nb.get("patches", [])}
    for name in np_:
        if name not in op:
            out.append(f"patch {name} added")
        elif op[name] != np_[name]:
            out.append(f"patch {name} changed")
    out += [f"patch {name} removed" for name in op if name not in np_]
    if [p["file"] for p in ob.get("patches", [])] != [p["file"] for p in nb.get("patches", [])] and not out:
        out.append("patch order changed")
    if ob.get("builder") != nb.get("builder") or ob.get("options") != nb.get("options"):
        out.append("builder options changed")
    oplan, nplan = ob.get("plan", []), nb.get("plan", [])
    if oplan != nplan:
        oa = [a for c in oplan for a in c.get("argv", [])]
        na = [a for c in nplan for a in c.get("argv", [])]
        added = [a for a in na if a not in oa]
        removed = [a for a in oa if a not in na]
        if added or removed:
            out.append("build arguments changed: " + " ".join([*(f"+{a}" for a in added), *(f"-{a}" for a in removed)]))
        oe = {k: v for c in oplan for k, v in c.get("env", {}).items()}
        ne = {k: v for c in nplan for k, v in c.get("env", {}).items()}
        if oe != ne:
            keys = sorted(k for k in {*oe, *ne} if oe.get(k) != ne.get(k))
            out.append("build environment changed: " + ", ".join(keys))
        if not (added or removed or oe != ne):
            out.append("build commands changed")
    if ob.get("toolchain") != nb.get("toolchain"):
        ot, nt = ob.get("toolchain", {}), nb.get("toolchain", {})
        keys = [k for k in ("modules", "module_use") if ot.get(k) != nt.get(k)]
        tools = sorted(t for t in {*ot.get("tools", {}), *nt.get("tools", {})}
                       if ot.get("tools", {}).get(t) != nt.get("tools", {}).get(t))
        out.append("site toolchain changed: " + ", ".join([*keys, *tools]))
    oi, ni = old.get("install", {}), new.get("install", {})
    for key in ("dest", "artefact", "install", "sanity", "checks"):
        if oi.get(key) != ni.get(key):
            out.append(f"install {key} changed")
    if old.get("format") != new.get("format") and not out:
        out.append("stamp format changed")
    return "; ".join(out[:6]) or "inputs changed"


# -- progress ---------------------------------------------------------------------------------
class Progress:
    """Phase lines in the build log, reported as they start; a heartbeat during long phases."""

    def __init__(self, log: Path, label: str, report: Callable[[str], None] | None, interval: float = 30.0,
                 shown: str | None = None) -> None:
        self.log = log
        self.label = label
        self.shown = shown or label
        self.report = report
        self.interval = interval
        self.start = time.monotonic()
        self.current = ""
        self._since = self.start
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        log.parent.mkdir(parents=True, exist_ok=True)

    def elapsed(self) -> str:
        return _fmt(time.monotonic() - self.start)

    def phase(self, name: str, detail: str = "") -> None:
        self.current = name
        self._since = time.monotonic()
        line = f"==> sitestack: {self.label}: phase {name} (+{self.elapsed()}){': ' + detail if detail else ''}"
        with open(self.log, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")
        if self.report:
            self.report(f"    {self.shown}: {name} (+{self.elapsed()}){': ' + detail if detail else ''}")

    def note(self, text: str) -> None:
        with open(self.log, "a", encoding="utf-8") as handle:
            handle.write(f"==> sitestack: {self.label}: {text}\n")

    def __enter__(self) -> Progress:
        if self.report and self.interval > 0:
            self._thread = threading.Thread(target=self._beat, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()

    def _beat(self) -> None:
        while not self._stop.wait(self.interval):
            if self.report and self.current:
                self.report(f"    {self.shown}: still in {self.current} ({_fmt(time.monotonic() - self._since)} in this "
                            f"phase, +{self.elapsed()} in all; log: {self.log})")


def _fmt(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


# -- the action ----------------------------------------------------------------------------------
class RecipeInstall(Action):
    """A package built from its recipe in sources/ and installed atomically (stamped, locked, cached)."""

    action = "recipe-install"

    @dataclass(frozen=True)
    class Args:
        recipe: str = field(metadata={"doc": "recipe name: sources/<recipe>.yml"})
        version: str | None = field(default=None, metadata={"doc": "version to build (default: the recipe's default_version)"})
        dest: str | None = field(default=None, metadata={"doc": "install prefix of the package (default: {prefix}/<recipe>/<version>)"})
        python: str | None = field(default=None, metadata={"doc": "interpreter that builds Python packages (default: facts.python.executable)"})
        mirror: str | None = field(default=None, metadata={"doc": "controller directory with source tarballs (air-gapped sites)"})

        def check(self) -> str | None:
            import re
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", self.recipe):
                return f"recipe: {self.recipe!r} is not a recipe name"
            if self.dest is not None and not (self.dest.startswith("/") or self.dest.startswith("{")):
                return f"dest: {self.dest!r} must be absolute"
            return None

    def __init__(self, spec: Any, args: Any, ctx: RunContext) -> None:
        super().__init__(spec, args, ctx)
        options = ctx.options
        sources_dir = options.sources_dir
        self.recipe = load_recipe(args.recipe, Path(sources_dir) if sources_dir else None)
        self.version = self.recipe.select_version(args.version, ctx.facts,
                                                  f"site {ctx.site.name}")
        site_prefix = ctx.values["prefix"]
        dest = args.dest or f"{site_prefix}/{self.recipe.name}/{self.version}"
        self.target = Target(self.recipe, self.version, ctx.facts, dest.rstrip("/"), site_prefix,
                             args.python or ctx.facts.python.executable)
        self.options = options
        self.report = ctx.note
        self._toolchain: Toolchain | None = None

    # -- Step ----------------------------------------------------------------------------------
    def describe(self) -> str:
        return f"build and install {self.target.label} into {self.target.dest}"

    def pending(self, host: Host) -> str | None:
        if host.read_only:
            return self.reason(host)
        with self._lock(host):
            return self.reason(host)

    def apply(self, host: Host) -> None:
        with self._lock(host):
            if self.reason(host) is None:  # a concurrent run installed it while we waited
                return
            Installer(self, host).run()

    # -- helpers ---------------------------------------------------------------------------------
    def lock_path(self) -> str:
        parent, base = os.path.split(self.target.dest)
        return f"{parent}/.{base}.lock"

    def _lock(self, host: Host):
        return _wait_lock(host, self.lock_path(), self.options.install_lock_wait,
                          self.report, f"[{host.name}] {self.target.label}")

    def toolchain(self, host: Host) -> Toolchain:
        if self._toolchain is None:
            extra = ["tar"] + (["patch"] if self.recipe.patches_for(self.version) else [])
            self._toolchain = probe_toolchain(host, self.target, extra)
        return self._toolchain

    def inputs(self, host: Host) -> dict[str, Any]:
        toolchain = self.toolchain(host)
        require_tools(toolchain, self.target, host)
        build = build_inputs(self.target, toolchain)
        return {"format": STAMP_FORMAT, "build": build, "install": install_inputs(self.target)}

    def reason(self, host: Host) -> str | None:
        """Why the install is needed (None: it is done). Read-only."""
        dest = self.target.dest
        inputs = self.inputs(host)
        text = host.read_text(f"{dest}/{STAMP}")
        if text is None:
            return "not installed" if not host.exists(dest) else f"no stamp in {dest} (unfinished or foreign install)"
        try:
            stamp = json.loads(text)
        except ValueError:
            return f"unreadable stamp {dest}/{STAMP}"
        if stamp.get("digest") != digest(inputs):
            return "inputs changed: " + explain_change(stamp.get("inputs", {}), inputs)
        missing = sanity_missing(host, dest, self.recipe.sanity)
        if missing:
            return f"sanity paths missing in {dest}: {', '.join(missing)}"
        return None


def _wait_lock(host: Host, path: str, wait: float, report: Callable[[str], None] | None, label: str):
    """The install's lock; says so when another run holds it and waits up to ``wait`` seconds."""
    import contextlib

    @contextlib.contextmanager
    def held():
        try:
            lock = host.lock(path, wait=0)
            lock.__enter__()
        except LockHeld as exc:
            if report:
                report(f"    {label}: waiting for the install lock ({exc})")
            lock = host.lock(path, wait=wait)
            lock.__enter__()
        try:
            yield
        finally:
            lock.__exit__(None, None, None)
    return held()


def sanity_missing(host: Host, root: str, patterns: Sequence[str]) -> list[str]:
    """The sanity patterns with no match under ``root``."""
    script = 'cd "$1" 2>/dev/null || { echo "$1"; exit 0; }; shift; for p in "$@"; do compgen -G "$p" >/dev/null || echo "$p"; done'
    out = host.probe(["bash", "-c", script, "sitestack", root, *patterns])
    if out.rc != 0:
        raise SitestackError(f"cannot check {root}: {out.stderr.strip()}")
    return out.stdout.split()


# -- installing ---------------------------------------------------------------------------------
class Installer:
    """One apply of a :class:`RecipeInstall`, under its lock."""

    def __init__(self, step: RecipeInstall, host: Host) -> None:
        self.step = step
        self.host = host
        self.target = step.target
        self.ctx = step.ctx
        self.options = step.options
        t = self.target
        self.token = secrets.token_hex(4)
        self.inputs = step.inputs(host)
        self.digest = digest(self.inputs)
        self.build_digest = digest(self.inputs["build"])
        self.parent, self.base = os.path.split(t.dest)
        self.tree = f"{self.parent}/.{self.base}.tree-{self.token}"
        self.dest_key = hashlib.sha256(t.dest.encode()).hexdigest()[:8]
        self.build_root = f"{t.site_prefix}/.sitestack/build"
        self.work = f"{self.build_root}/{t.recipe.name}-{t.version}-{self.dest_key}-{self.token}"
        self.cache_root = (self.options.build_cache or f"{host.home()}/.cache/sitestack/builds")
        self.cache_entry = f"{self.cache_root}/{t.recipe.name}/{self.build_digest}"
        log_dir = self.ctx.log_dir or Path.home() / ".cache" / "sitestack" / "logs" / "recipe"
        self.log = Path(log_dir) / f"{t.recipe.name}-{t.version}.log"
        interval = self.options.progress_interval
        self.progress = Progress(self.log, t.label, step.report, interval, shown=f"[{host.name}] {t.label}")
        self.from_cache = False

    # -- running commands --------------------------------------------------------------------
    def sh(self, argv: Sequence[str], *, cwd: str | None = None, env: Mapping[str, str] | None = None,
           site: bool = False, timeout: float | None = None, shown: Sequence[str] | None = None):
        """Run one command on the host, output to the build log; a failure names the phase and log."""
        full = host_argv(self.target.facts, argv, env) if site else (
            ["env", *(f"{k}={v}" for k, v in sorted((env or {}).items())), *argv] if env else list(argv))
        try:
            return self.host.run(full, cwd=cwd, log=self.log, timeout=timeout)
        except CommandFailed as exc:
            tail = "\n".join(exc.output.rstrip().splitlines()[-25:])
            raise SitestackError(
                f"{self.target.label}: phase {self.progress.current} failed (exit {exc.rc}): "
                f"{shlex.join(list(shown or argv))}\n"
                f"log: {self.log}\nbuild dir: {self.work}\n{tail}".rstrip()) from None

    def run_command(self, command: Command) -> None:
        self.sh(command.argv, cwd=command.cwd, env=command.env, site=True)

    # -- the whole install -----------------------------------------------------------------------
    def run(self) -> None:
        t = self.target
        with self.progress:
            self.progress.phase("start", f"digest {self.digest[:12]}, build digest {self.build_digest[:12]}, log {self.log}")
            self.clean_stale()
            try:
                artefact = self.cached_artefact()
                if artefact is None:
                    artefact = self.build()
                else:
                    self.from_cache = True
                    self.progress.phase("cache", f"using {artefact} (no build needed)")
                self.install(artefact)
            except BaseException:
                self.host.probe(["rm", "-rf", "--", self.tree])
                raise
            self.commit()
            self.progress.phase("stamp")
            self.write_stamp(artefact)
            self.progress.phase("done", f"{t.dest} ({'from the build cache' if self.from_cache else 'built'})")
            self.host.probe(["rm", "-rf", "--", self.work])

    def clean_stale(self) -> None:
        """Remove what killed runs left: hidden trees/links beside dest, their build dirs."""
        self.progress.phase("clean")
        script = r"""
parent=$1 base=$2 build_root=$3 work_glob=$4 cache_root=$5
current=""
if [ -L "$parent/$base" ]; then current=$(readlink "$parent/$base"); fi
for d in "$parent"/."$base".tree-* "$parent"/."$base".link-* "$parent"/."$base".old-*; do
  [ -e "$d" ] || [ -L "$d" ] || continue
  [ "$(basename "$d")" = "$current" ] && continue
  rm -rf -- "$d" 2>/dev/null || true
done
for d in "$build_root"/$work_glob; do [ -e "$d" ] && rm -rf -- "$d" 2>/dev/null; done
find "$cache_root" -mindepth 2 -maxdepth 2 -name '.*.tmp-*' -mmin +60 -exec rm -rf -- {} + 2>/dev/null
exit 0
"""
        t = self.target
        glob = f"{t.recipe.name}-{t.version}-{self.dest_key}-*"
        self.host.run(["bash", "-c", script, "sitestack", self.parent, self.base, self.build_root, glob, self.cache_root])

    def cached_artefact(self) -> str | None:
        text = self.host.read_text(f"{self.cache_entry}/artefact.json")
        if text is None:
            return None
        try:
            manifest = json.loads(text)
            path = f"{self.cache_entry}/{manifest['file']}"
        except (ValueError, KeyError, TypeError):
            manifest, path = {}, ""
        out = self.host.probe(["sha256sum", "--", path]) if path else None
        if out is not None and out.ok and out.stdout.split()[0] == manifest.get("sha256"):
            return path
        self.progress.note(f"cache entry {self.cache_entry} is damaged; rebuilding")
        self.host.run(["rm", "-rf", "--", self.cache_entry])
        return None

    def build(self) -> str:
        t, recipe = self.target, self.target.recipe
        toolchain = self.step.toolchain(self.host)
        layout = Layout(src=f"{self.work}/src", build=f"{self.work}/build", stage=f"{self.work}/stage", prefix=t.dest,
                        jobs=str(self.options.jobs or t.facts.build_jobs or toolchain.nproc))
        self.progress.phase("fetch")
        tarball = self.fetch()
        self.progress.phase("extract", os.path.basename(tarball))
        self.sh(["mkdir", "-p", f"{self.work}/unpack", layout.build, layout.stage])
        self.sh(["tar", "-xf", tarball, "-C", f"{self.work}/unpack"])
        self.sh(["bash", "-c", 'w=$1 dst=$2; set -- "$w"/unpack/*; if [ $# -eq 1 ] && [ -d "$1" ]; then mv -T "$1" "$dst"; '
                 'else mv -T "$w/unpack" "$dst"; fi', "sitestack", self.work, layout.src],
                shown=["move the unpacked tree to", layout.src])
        self.apply_patches(layout.src)
        cmake_cmd, make_program = "cmake", None
        if recipe.build == "cmake":
            cmake_cmd, make_program = self.cmake_tools(toolchain)
        has_configure = self.host.exists(f"{layout.src}/configure")
        for command in build_plan(t, layout, has_configure=has_configure, cmake_cmd=cmake_cmd, make_program=make_program):
            if command.phase != self.progress.current:
                self.progress.phase(command.phase, shlex.join(command.argv)[:200])
            self.run_command(command)
        return self.store(layout)

    def fetch(self) -> str:
        """The verified tarball on the host."""
        t = self.target
        mirrors = [Path(m) for m in (self.options.mirror, self.step.args.mirror) if m] + sources_mod.env_mirrors()
        source = self.options.source
        local = sources_mod.fetch(t.recipe, t.version, source=Path(source) if source else None, mirrors=mirrors)
        if isinstance(self.host, LocalHost):
            return str(local)
        sha = t.recipe.versions[t.version].sha256
        remote = f"{self.cache_root}/sources/{sha}/{local.name}"
        out = self.host.probe(["sha256sum", "--", remote])
        if not (out.ok and out.stdout.split()[0] == sha):
            self.host.put_file(local, remote)
        return remote

    def apply_patches(self, src: str) -> None:
        t = self.target
        patches = t.recipe.patches_for(t.version)
        if not patches:
            return
        self.progress.phase("patch", ", ".join(p.file for p in patches))
        for i, patch in enumerate(patches):
            remote = f"{self.work}/patches/{i:02d}-{patch.file}"
            self.host.put_file(Path(patch.path), remote)
            # --force: never guess that a patch is reversed (--batch would, and "succeed")
            reverse = self.host.probe(["patch", "-p1", "-R", "--dry-run", "--force", "-s", "-i", remote], cwd=src)
            if reverse.ok:
                self.progress.note(f"patch {patch.file}: already applied, skipped")
                continue
            forward = self.host.probe(["patch", "-p1", "--dry-run", "--batch", "--forward", "-i", remote], cwd=src)
            if not forward.ok:
                with open(self.log, "a", encoding="utf-8") as handle:
                    handle.write(forward.stdout + forward.stderr)
                detail = "\n".join((forward.stdout + forward.stderr).strip().splitlines()[-10:])
                raise SitestackError(f"{t.label}: patch {patch.file} does not apply to {t.recipe.name} {t.version} "
                                     f"({patch.path}; Applies-to: {patch.applies_to}); nothing was installed\n{detail}")
            self.sh(["patch", "-p1", "--batch", "--forward", "-i", remote], cwd=src)

    def cmake_tools(self, toolchain: Toolchain) -> tuple[str, str | None]:
        """The cmake to run, and the ninja (CMAKE_MAKE_PROGRAM) when it comes from PyPI."""
        opts = self.target.recipe.builder_options()
        if toolchain.cmake and toolchain.ninja:
            return toolchain.cmake, None
        venv = cmake_venv(self.cache_root, opts.minimum)
        done = f"{venv}/.complete"  # written last: a venv without it is a killed run's, made again
        if not self.host.exists(done):
            with self.host.lock(f"{venv}.lock", wait=1800):  # shared by every install on this host
                if not self.host.exists(done):
                    self.progress.phase("tools", f"cmake>={opts.minimum} from PyPI into {venv}")
                    self.sh(["rm", "-rf", "--", venv])
                    for command in cmake.tool_venv_commands(self.target.python, venv, opts.minimum, opts.generator):
                        self.run_command(command)
                    self.host.write_text(done, "ok\n")
        cmake_cmd = toolchain.cmake or f"{venv}/bin/cmake"
        ninja = None if toolchain.ninja else f"{venv}/bin/ninja"
        return cmake_cmd, ninja

    def store(self, layout: Layout) -> str:
        """Put the build's artefact into the cache (atomically); return its path there."""
        t = self.target
        self.progress.phase("cache", self.cache_entry)
        tmp = f"{self.cache_root}/{t.recipe.name}/.{self.build_digest}.tmp-{self.token}"
        self.sh(["mkdir", "-p", tmp])
        if artefact_kind(t) == "wheel":
            out = self.host.probe(["bash", "-c", 'ls -1 "$1"/*.whl', "sitestack", layout.stage])
            wheels = out.stdout.split() if out.ok else []
            if len(wheels) != 1:
                raise SitestackError(f"{t.label}: the build made {len(wheels)} wheels in {layout.stage}, expected one "
                                     f"(log: {self.log})")
            name = os.path.basename(wheels[0])
            self.sh(["cp", wheels[0], f"{tmp}/{name}"])
        else:
            tree = staged_tree(t, layout)
            if not self.host.exists(tree):
                raise SitestackError(f"{t.label}: nothing was installed under {tree} (log: {self.log})")
            name = "tree.tar"
            self.sh(["tar", "-cf", f"{tmp}/{name}", "-C", tree, "."])
        sha = self.host.probe(["sha256sum", "--", f"{tmp}/{name}"]).stdout.split()[0]
        manifest = {"recipe": t.recipe.name, "version": t.version, "build_digest": self.build_digest,
                    "kind": artefact_kind(t), "file": name, "sha256": sha, "inputs": self.inputs["build"]}
        self.host.write_text(f"{tmp}/artefact.json", json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        # mv -T fails when another run stored the same digest first: then keep theirs.
        self.host.probe(["mv", "-T", "--", tmp, self.cache_entry])
        self.host.probe(["rm", "-rf", "--", tmp])
        cached = self.cached_artefact()
        if cached is None:
            raise SitestackError(f"{t.label}: cannot store the artefact in {self.cache_entry}")
        return cached

    def install(self, artefact: str) -> None:
        t = self.target
        self.progress.phase("install", f"{os.path.basename(artefact)} -> {self.tree}")
        for command in install_commands(t, artefact, self.tree):
            self.sh(command.argv, env=command.env, site=command.argv[0] == t.python)
        self.progress.phase("sanity")
        missing = sanity_missing(self.host, self.tree, t.recipe.sanity)
        if missing:
            raise SitestackError(f"{t.label}: sanity paths missing after install: {', '.join(missing)} "
                                 f"(staged in {self.tree}; {t.dest} left as it was; log: {self.log})")
        self.checks = self.run_checks()

    def run_checks(self) -> list[dict[str, Any]]:
        t = self.target
        results = []
        for name, argv, env, expect, ranks in check_commands(t, self.tree):
            self.progress.phase("check", name)
            if ranks > 1 and t.facts.mpi.launcher == "srun" and not self.step.toolchain(self.host).slurm_job:
                results.append({"name": name, "ok": None, "skipped": "srun needs a Slurm allocation; run this "
                                "install inside one, or rely on the validation job"})
                self.progress.note(f"check {name}: skipped (srun outside an allocation)")
                continue
            out = self.sh(argv, env=env, site=True, timeout=600)
            if expect is not None and expect not in out.stdout:
                raise SitestackError(f"{t.label}: check {name!r} failed: the output does not contain {expect!r} "
                                     f"(nothing was changed at {t.dest}; log: {self.log})\n"
                                     + "\n".join(out.stdout.strip().splitlines()[-10:]))
            results.append({"name": name, "ok": True, "output": out.stdout.strip()[:2000]})
        return results

    def commit(self) -> None:
        """Point ``dest`` at the new tree with one rename; remove the tree it pointed at."""
        self.progress.phase("commit", f"{self.target.dest} -> {os.path.basename(self.tree)}")
        script = r"""
set -e
parent=$1 base=$2 tree=$3 token=$4
cd "$parent"
old=""
if [ -L "$base" ]; then old=$(readlink "$base");
elif [ -e "$base" ]; then mv -T -- "$base" ".$base.old-$token"; old=".$base.old-$token"; fi
ln -s -- "$tree" ".$base.link-$token"
mv -T -- ".$base.link-$token" "$base"
case "$old" in
  ""|*/*) ;;
  *) rm -rf -- "$old" ;;
esac
"""
        self.sh(["bash", "-c", script, "sitestack", self.parent, self.base, os.path.basename(self.tree), self.token],
                shown=["switch", self.target.dest, "to", self.tree])

    def write_stamp(self, artefact: str) -> None:
        t = self.target
        manifest = json.loads(self.host.read_text(f"{os.path.dirname(artefact)}/artefact.json") or "{}")
        stamp = {
            "format": STAMP_FORMAT,
            "recipe": t.recipe.name,
            "version": t.version,
            "digest": self.digest,
            "build_digest": self.build_digest,
            "artefact": {"kind": manifest.get("kind"), "file": manifest.get("file"), "sha256": manifest.get("sha256"),
                         "cache": os.path.dirname(artefact), "from_cache": self.from_cache},
            "checks": self.checks,
            "installed": {"host": self.host.name, "tree": os.path.basename(self.tree),
                          "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "seconds": round(time.monotonic() - self.progress.start, 1),
                          "log": str(self.log)},
            "inputs": self.inputs,
        }
        self.host.write_text(f"{t.dest}/{STAMP}", json.dumps(stamp, indent=2, sort_keys=True) + "\n")


# -- reading installs (for other steps: venvs, module files) ------------------------------------------
def read_stamp(host: Host, dest: str) -> dict[str, Any] | None:
    """The stamp of the install at ``dest``, or None."""
    text = host.read_text(f"{dest}/{STAMP}")
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def installed_wheel(host: Host, dest: str) -> str | None:
    """The wheel an install at ``dest`` came from (kept in the install), for installing it elsewhere."""
    stamp = read_stamp(host, dest)
    if not stamp or stamp.get("artefact", {}).get("kind") != "wheel":
        return None
    return f"{dest}/{WHEEL_DIR}/{stamp['artefact']['file']}"


__all__ = ["RecipeInstall", "Target", "build_plan", "host_argv", "build_inputs", "install_inputs", "digest",
           "explain_change", "read_stamp", "installed_wheel", "InputError"]
