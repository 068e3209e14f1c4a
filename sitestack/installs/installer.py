"""One install of a recipe target, under its lock: the artefact from the build cache or built, installed
into a hidden tree beside ``dest``, checked, switched into place with one rename, stamped last.

A kill at any moment leaves ``dest`` as it was (the old install, or nothing) or the new complete
tree without its stamp, which the next run finishes from the cache. Leftovers of a killed run
(hidden trees, build dirs) are removed by the next install under the lock.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sitestack.builders import Command, Layout
from sitestack.builders.builder import venv_commands
from sitestack.core.errors import CommandFailed, SitestackError
from sitestack.core.host import Completed, Host, LocalHost
from sitestack.installs import checkcache, generations, rerun, wheel_cache
from sitestack.installs import sources as sources_mod
from sitestack.installs.inputs import digest
from sitestack.installs.progress import Progress
from sitestack.installs.stamp import STAMP, STAMP_FORMAT, sanity_missing
from sitestack.installs.target import Target, build_plan, check_commands, env_argv, host_argv, install_commands
from sitestack.installs.toolchain import Toolchain
from sitestack.model.context import RunOptions

#: The file that marks a directory as a build cache of sitestack's: ``gc`` trims no other (a cache made
#: before the marker existed gets it from the next build that uses it).
CACHE_MARKER = ".sitestack-cache"

#: Removes what killed builds left besides dest's siblings (:func:`sitestack.installs.generations.clean_stale`):
#: their build dirs, cache entries half-stored more than an hour ago; marks the cache as sitestack's.
CLEAN_SCRIPT = r"""
build_root=$1 work_glob=$2 cache_root=$3 marker=$4
for d in "$build_root"/$work_glob; do [ -e "$d" ] && rm -rf -- "$d" 2>/dev/null; done
find "$cache_root" -mindepth 2 -maxdepth 2 -name '.*.tmp-*' -mmin +60 -exec rm -rf -- {} + 2>/dev/null
[ -d "$cache_root" ] && [ ! -L "$cache_root/$marker" ] && [ ! -e "$cache_root/$marker" ] && : > "$cache_root/$marker"
exit 0
"""

#: Moves the single top directory of an unpacked tarball (or the whole unpack dir) to the source dir.
UNPACK_SCRIPT = ('w=$1 dst=$2; set -- "$w"/unpack/*; if [ $# -eq 1 ] && [ -d "$1" ] && [ ! -L "$1" ]; then mv -T "$1" "$dst"; '
                 'else mv -T "$w/unpack" "$dst"; fi')


def build_cache(host: Host, options: RunOptions) -> str:
    """The build cache on ``host``: $SITESTACK_BUILD_CACHE, else ~/.cache/sitestack/builds there."""
    return options.build_cache or f"{host.home()}/.cache/sitestack/builds"


class Installer:
    """One apply of a recipe install on ``host``, under its lock (the caller holds it).

    ``inputs`` are the install's inputs (:mod:`sitestack.installs.inputs`) as the caller computed
    them with ``toolchain``; ``mirror`` is the step's mirror directory, ``report`` where progress
    lines go, ``log_dir`` where the build log is written.
    """

    def __init__(self, host: Host, target: Target, *, inputs: Mapping[str, Any], toolchain: Toolchain,
                 options: RunOptions, log_dir: Path | None, report: Callable[[str], None] | None,
                 mirror: str | None = None) -> None:
        self.host = host
        self.target = t = target
        self.options = options
        self.toolchain = toolchain
        self.mirror = mirror
        self.token = secrets.token_hex(4)
        self.inputs = inputs
        self.digest = digest(inputs)
        self.build_digest = digest(inputs["build"])
        self.parent, self.base = os.path.split(t.dest)
        self.tree = f"{self.parent}/.{self.base}.tree-{self.token}"
        self.dest_key = hashlib.sha256(t.dest.encode()).hexdigest()[:8]
        self.build_root = f"{t.site_prefix}/.sitestack/build"
        self.work = f"{self.build_root}/{t.recipe.name}-{t.version}-{self.dest_key}-{self.token}"
        self.cache_root = build_cache(host, options)
        self.cache_entry = f"{self.cache_root}/{t.recipe.name}/{self.build_digest}"
        logs = log_dir or Path.home() / ".cache" / "sitestack" / "logs" / "recipe"
        self.log = Path(logs) / f"{t.recipe.name}-{t.version}.log"
        self.progress = Progress(self.log, t.label, report, options.progress_interval,
                                 shown=f"[{host.name}] {t.label}")
        self.from_cache = False
        # --no-cache (Spack's --fresh) and --rebuild NAME build from source; the new artefact
        # replaces the cache entry (store), so a later run reuses it.
        self.fresh = options.no_cache or t.recipe.name in options.rebuild
        self.checks: list[dict[str, Any]] = []

    # -- running commands --------------------------------------------------------------------
    def sh(self, argv: Sequence[str], *, cwd: str | None = None, env: Mapping[str, str] | None = None,
           site: bool = False, timeout: float | None = None, shown: Sequence[str] | None = None) -> Completed:
        """Run one command on the host, output to the build log; a failure names the phase and log."""
        full = host_argv(self.target.facts, argv, env) if site else env_argv(argv, env)
        try:
            return self.host.run(full, cwd=cwd, log=self.log, timeout=timeout)
        except CommandFailed as exc:
            tail = "\n".join(exc.output.rstrip().splitlines()[-25:])
            kit = rerun.write_kit(self.host, self.work, self.target.facts, argv, cwd=cwd, env=env, site=site,
                                  label=self.target.label)
            again = f"\nre-run kit: {kit}/cmd.sh (its environment: . {kit}/env.sh)" if kit else ""
            raise SitestackError(
                f"{self.target.label}: phase {self.progress.current} failed (exit {exc.rc}): "
                f"{shlex.join(list(shown or argv))}\n"
                f"log: {self.log}\nbuild dir: {self.work}{again}\n{tail}".rstrip()) from None

    def run_command(self, command: Command, jobs: str | None = None) -> None:
        """Run one of the build's commands; with ``jobs``, the usual parallel-build variables say it
        too (make, CMake, and PyTorch-style extension builds read them), unless the recipe sets
        them. Not part of the build digest: how many jobs build it does not change what is built."""
        env = {**parallel_env(jobs), **command.env} if jobs else command.env
        self.sh(command.argv, cwd=command.cwd, env=env, site=True)

    # -- the whole install -----------------------------------------------------------------------
    def run(self) -> None:
        t = self.target
        with self.progress:
            self.progress.phase("start", f"digest {self.digest[:12]}, build digest {self.build_digest[:12]}, "
                                         f"log {self.log}")
            self.clean_stale()
            try:
                artefact = None if self.fresh else self.cached_artefact()
                if artefact is None:
                    artefact = self.build()
                else:
                    self.from_cache = True
                    self.progress.phase("cache", f"using {artefact} (no build needed)")
                self.install(artefact)
            except BaseException:
                self.host.probe(["rm", "-rf", "--", self.tree])
                raise
            self.progress.phase("stamp")
            self.write_stamp(artefact)  # into the new tree: nothing is written into a published one
            self.commit()
            self.progress.phase("done", f"{t.dest} ({'from the build cache' if self.from_cache else 'built'})")
            self.host.probe(["rm", "-rf", "--", self.work])

    def clean_stale(self) -> None:
        """Remove what killed runs left: hidden trees/links beside dest, their build dirs."""
        self.progress.phase("clean")
        # The user's caches on the host are theirs alone (build logs, tarballs, wheels); a
        # $SITESTACK_BUILD_CACHE this run makes is 0700 too (one that exists keeps its mode).
        home_cache = f"{self.host.home()}/.cache/sitestack"
        self.host.run(["sh", "-c", 'mkdir -p -- "$1" && chmod 700 -- "$1" && '
                       '{ [ -d "$2" ] || { mkdir -p -- "$2" && chmod 700 -- "$2"; }; }', "sh", home_cache, self.cache_root])
        t = self.target
        glob = f"{t.recipe.name}-{t.version}-{self.dest_key}-*"
        generations.clean_stale(self.host, generations.read_history(self.host, t.dest))
        self.host.run(["bash", "-c", CLEAN_SCRIPT, "sitestack", self.build_root, glob, self.cache_root, CACHE_MARKER])

    def cached_artefact(self) -> str | None:
        """The cache entry's artefact when its sha256 is the manifest's; a damaged entry is removed."""
        if not self.host.exists(f"{self.cache_entry}/artefact.json"):
            return None
        path = wheel_cache.cached_file(self.host, self.cache_entry)
        if path is None:
            self.progress.note(f"cache entry {self.cache_entry} is damaged; rebuilding")
        return path

    def build(self) -> str:
        t = self.target
        layout = Layout(src=f"{self.work}/src", build=f"{self.work}/build", stage=f"{self.work}/stage", prefix=t.dest,
                        jobs=str(self.options.jobs or t.facts.build_jobs or self.toolchain.nproc))
        self.progress.phase("fetch")
        tarball = self.fetch()
        self.progress.phase("extract", os.path.basename(tarball))
        self.sh(["mkdir", "-p", f"{self.work}/unpack", layout.build, layout.stage])
        self.sh(["tar", "--no-same-owner", "-xf", tarball, "-C", f"{self.work}/unpack"])
        self.sh(["bash", "-c", UNPACK_SCRIPT, "sitestack", self.work, layout.src],
                shown=["move the unpacked tree to", layout.src])
        self.apply_patches(layout.src)
        program, make_program = self.build_tools()
        has_configure = self.host.exists(f"{layout.src}/configure")
        for command in build_plan(t, layout, has_configure=has_configure, program=program, make_program=make_program):
            if command.phase != self.progress.current:
                self.progress.phase(command.phase, shlex.join(command.argv)[:200])
            self.run_command(command, layout.jobs)
        return self.store(layout)

    def fetch(self) -> str:
        """The verified tarball on the host."""
        t = self.target
        mirrors = [Path(m) for m in (self.options.mirror, self.mirror) if m] + sources_mod.env_mirrors()
        source = self.options.source
        local = sources_mod.fetch(t.recipe, t.version, source=Path(source) if source else None, mirrors=mirrors)
        sources_mod.check_tarball(local, t.label)
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

    def build_tools(self) -> tuple[str | None, str | None]:
        """The build tool to run and the one it drives, where a tool venv (from PyPI) provides them.

        (None, None): the builder's defaults from the site environment. The venv is shared by every
        install on this host, made once under its own lock, and marked complete last.
        """
        tools = self.toolchain.host_tools
        if not tools.venv_packages:
            return tools.program, None
        venv = f"{self.cache_root}/tools/{tools.venv_name}"
        done = f"{venv}/.complete"  # written last: a venv without it is a killed run's, made again
        if not self.host.exists(done):
            with self.host.lock(f"{venv}.lock", wait=1800):
                if not self.host.exists(done):
                    self.progress.phase("tools", f"{' '.join(tools.venv_packages)} from PyPI into {venv}")
                    self.sh(["rm", "-rf", "--", venv])
                    for command in venv_commands(self.target.python, venv, tools.venv_packages):
                        self.run_command(command)
                    self.host.write_text(done, "ok\n")
        program = tools.program or (f"{venv}/bin/{tools.venv_program}" if tools.venv_program else None)
        make_program = f"{venv}/bin/{tools.venv_make_program}" if tools.venv_make_program else None
        return program, make_program

    def store(self, layout: Layout) -> str:
        """Put the build's artefact into the cache (atomically); return its path there."""
        t = self.target
        kind = t.builder.artefact
        self.progress.phase("cache", self.cache_entry)
        tmp = f"{self.cache_root}/{t.recipe.name}/.{self.build_digest}.tmp-{self.token}"
        self.sh(["mkdir", "-p", tmp])
        self.host.probe(["sh", "-c", '[ -e "$1" ] || [ -L "$1" ] || : > "$1"', "sh", f"{self.cache_root}/{CACHE_MARKER}"])
        if kind == "wheel":
            out = self.host.probe(["bash", "-c", 'ls -1 "$1"/*.whl', "sitestack", layout.stage])
            wheels = out.stdout.split() if out.ok else []
            if len(wheels) != 1:
                raise SitestackError(f"{t.label}: the build made {len(wheels)} wheels in {layout.stage}, expected one "
                                     f"(log: {self.log})")
            name = os.path.basename(wheels[0])
            self.sh(["cp", wheels[0], f"{tmp}/{name}"])
        else:
            tree = t.builder.staged_tree(layout)
            if not self.host.exists(tree):
                raise SitestackError(f"{t.label}: nothing was installed under {tree} (log: {self.log})")
            name = "tree.tar"
            self.sh(["tar", "-cf", f"{tmp}/{name}", "-C", tree, "."])
        sha = self.host.probe(["sha256sum", "--", f"{tmp}/{name}"]).stdout.split()[0]
        manifest = {"recipe": t.recipe.name, "version": t.version, "build_digest": self.build_digest,
                    "kind": kind, "file": name, "sha256": sha, "inputs": self.inputs["build"]}
        self.host.write_text(f"{tmp}/artefact.json", json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        # mv -T fails when another run stored the same digest first: then keep theirs. A fresh build
        # replaces the entry (a reader that finds none meanwhile builds, it never reads half an entry).
        if self.fresh:
            self.host.probe(["rm", "-rf", "--", self.cache_entry])
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
        self.checks = self.checks_for(artefact)

    def checks_for(self, artefact: str) -> list[dict[str, Any]]:
        """The checks' results: kept with the cache entry for identical inputs (:mod:`sitestack.installs.
        checkcache`; never under --rebuild/--no-cache), else run now and kept for the next prefix."""
        entry = os.path.dirname(artefact)
        manifest = self.host.read_json(f"{entry}/artefact.json") or {}
        key = checkcache.check_key(self.host, self.target, self.inputs, str(manifest.get("sha256")))
        kept = None if self.fresh else checkcache.vouched(self.host, entry, key)
        if kept is not None:
            self.progress.phase("check", f"vouched for by {checkcache.check_file(entry, key)} (same artefact, "
                                         "toolchain, interpreter, launcher and architecture)")
            return kept
        results = self.run_checks()
        checkcache.keep(self.host, entry, key, results, {"host": self.host.name, "tree": self.tree,
                                                          "at": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
        return results

    def run_checks(self) -> list[dict[str, Any]]:
        t = self.target
        results: list[dict[str, Any]] = []
        for name, argv, env, expect, ranks in check_commands(t, self.tree):
            self.progress.phase("check", name)
            if ranks > 1 and t.facts.mpi.launcher == "srun" and not self.toolchain.slurm_job:
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
        """Point ``dest`` at the new tree with one rename, retiring the tree it pointed at, and remove the
        retired trees nothing can use any more (:mod:`sitestack.installs.generations`)."""
        t = self.target
        self.progress.phase("commit", f"{t.dest} -> {os.path.basename(self.tree)}")
        history = generations.read_history(self.host, t.dest)
        entry = generations.Generation(os.path.basename(self.tree), time.time(), self.digest[:16],
                                       f"{t.recipe.name}@{t.version} from {'the build cache' if self.from_cache else 'a build'}")
        after = generations.switch(self.host, history, entry)
        generations.collect_retired(self.host, after, t.facts, note=self.progress.note)

    def write_stamp(self, artefact: str) -> None:
        t = self.target
        manifest = self.host.read_json(f"{os.path.dirname(artefact)}/artefact.json") or {}
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
                          "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                          "seconds": round(time.monotonic() - self.progress.start, 1), "log": str(self.log)},
            "inputs": self.inputs,
        }
        self.host.write_text(f"{self.tree}/{STAMP}", json.dumps(stamp, indent=2, sort_keys=True) + "\n")


def parallel_env(jobs: str) -> dict[str, str]:
    """The environment that gives a build ``jobs`` parallel jobs whatever drives it: ``MAKEFLAGS``
    (make, also under pip or CMake's Makefiles), ``CMAKE_BUILD_PARALLEL_LEVEL`` (``cmake --build``,
    https://cmake.org/cmake/help/latest/envvar/CMAKE_BUILD_PARALLEL_LEVEL.html) and ``MAX_JOBS``
    (``torch.utils.cpp_extension`` builds)."""
    return {"MAKEFLAGS": f"-j{jobs}", "CMAKE_BUILD_PARALLEL_LEVEL": jobs, "MAX_JOBS": jobs}
