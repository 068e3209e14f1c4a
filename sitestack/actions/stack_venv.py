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
- pip installs them, or uv where the host has it (facts.python.installer;
  :mod:`sitestack.installs.venv_uv`), with the same indexes and the same resolution.
- ``<prefix>/<name>.manifest.json`` lists every distribution in the environment (name,
  version, dist-info, sha256 of its RECORD) and where it came from (index URL and wheel
  sha256, the sitestack build, or the environment's creation), with the plan it realises: from
  the installed metadata (direct_url.json, INSTALLER), with pip's report adding the
  index URL and the wheel's sha256 where pip installed.

The path is a symlink to a hidden generation directory beside it, and nothing is ever installed
into a generation once it is switched in (:mod:`sitestack.installs.generations`). A change of pins,
extras or built wheels makes the next generation from a copy of the current one (files
hard-linked) and installs only what changed into the copy; a change of base Python, or content
that no longer matches the manifest, builds one from nothing. Either is switched in with one
rename, so nothing half-built is ever visible at the path; a failure removes it. The generation
switched out is retired, and removed by a later run once nothing can use it. Each generation
holds its manifest; ``<name>.manifest.json`` links to the current one's. A re-run with nothing
changed reads the manifest and lists the dist-info directories: no pip, no index.

A new generation of a stack that claims its module directory's default, where the playbook
validates that stack (:func:`waits_for_validation`), is not switched in by this step: it is
recorded *pending* beside the current one, and ``invoke provision`` runs the validation job on it
and switches it in on PASS (:mod:`sitestack.engine.generation_promotion`). The first generation
switches in at once: there is nothing to protect.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from sitestack.actions.action import Action, unified_diff
from sitestack.core.errors import CommandFailed, SitestackError
from sitestack.core.host import Host
from sitestack.core.swap import relink_argv
from sitestack.installs import generations
from sitestack.installs.site_stack import find_built, stack_libraries
from sitestack.installs.venv_env import EnvTools, check_index, list_dists, program
from sitestack.installs.venv_manifest import (
    dump,
    explain,
    manifest_for,
    needs_new_generation,
    origins_from_report,
    plan_digest,
    plan_for,
    read_manifest,
    requirement_name,
)
from sitestack.installs.venv_stack import (
    DEFAULT_RECIPES,
    MANIFEST,
    NAME,
    PIN,
    Base,
    Built,
    built_for_other_python,
    normalize,
    require_module_system,
    shared_with_group,
    stack_for,
)
from sitestack.installs.venv_template import VenvTemplates, template_mode
from sitestack.model.context import RunContext
from sitestack.model.site import Site, StepSpec


def waits_for_validation(site: Site, key: str | None) -> bool:
    """Whether a new generation of playbook stack ``key`` waits for its validation before it is switched
    in: its modulefiles step claims the directory's default (``default: true``) and the playbook has an
    install-validation-job step for it (the test of sitestack.engine.stack_validation.has_job, which an
    action cannot import). Otherwise nothing would validate it, and it switches in at once."""
    claims = any(s.action == "modulefiles" and s.stack == key and s.args.get("default") is True for s in site.steps)
    return claims and any(s.action == "install-validation-job" and s.stack == key for s in site.steps)


# -- the step ---------------------------------------------------------------------------------------
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
            if self.name is not None and not NAME.fullmatch(self.name):
                return f"name: {self.name!r} must look like pytorch/2.3.1-gpu"
            return None

    def __init__(self, spec: StepSpec, args: Any, ctx: RunContext) -> None:
        super().__init__(spec, args, ctx)
        self.stack = stack_for(ctx, args.name, system_site_packages=args.system_site_packages, compile=args.compile)
        self.base = Base(ctx.facts, self.stack, ctx.values["prefix"])
        self.notes: list[str] = []
        self.waits = waits_for_validation(ctx.site, spec.stack)

    def describe(self) -> str:
        return f"install the stack environment {self.stack.path}"

    def desired(self, host: Host) -> tuple[dict[str, Any], list[Built]]:
        built, self.notes = find_built(host, self.ctx, self.args.recipes)
        # A stack made before its packages' builds (they are built with its interpreter) leaves out a wheel
        # built for another Python: its step rebuilds it with this stack's interpreter, then a later
        # stack-venv step installs it.
        other = {b.recipe: built_for_other_python(b.wheel, self.stack.python_version) for b in built if b.wheel}
        self.notes += [f"{b.recipe} {b.version} (built for Python {other[b.recipe]})" for b in built if other.get(b.recipe)]
        built = [b for b in built if not other.get(b.recipe)]
        return plan_for(self.stack, self.ctx.facts, built, stack_libraries(self.ctx)), built

    def pending(self, host: Host) -> str | None:
        require_module_system(facts=self.ctx.facts)
        reason = self._reason(host)
        if reason is not None:
            check_index(host, self.stack.index_url)
            if self.stack.installer == "uv":   # without uv (or beside the base's packages) the run would fail: so does the plan
                EnvTools(host, self.stack, self.base, None).uv()
            if self.notes:
                reason += f" (left out: {'; '.join(self.notes)})"
            return reason
        due = [v for v in self._retired(host) if v.removed]
        if due:
            return f"remove {len(due)} retired generation(s): {'; '.join(v.path for v in due)}"
        return None

    def _retired(self, host: Host) -> list[generations.Verdict]:
        """What may become of each retired generation of the stack (:mod:`sitestack.installs.generations`)."""
        history = generations.read_history(host, self.stack.path)
        if not history.retired():
            return []
        return generations.verdicts(host, history, generations.grace_seconds(host, self.ctx.facts))

    def _reason(self, host: Host) -> str | None:
        image = self.base.image()
        if image and not host.exists(image):  # it runs in the image: no image, no working stack
            return f"the image it runs in, {image}, is missing"
        plan, _ = self.desired(host)
        manifest = read_manifest(host, self.stack)
        if manifest is None:
            return f"{self.stack.manifest} missing"
        if manifest.get("plan") != plan:
            return None if self.pending_for(host, plan) else explain(manifest.get("plan", {}), plan)
        if "base_packages" not in manifest:   # written before the manifest listed the base's packages
            return f"{self.stack.manifest} does not list the packages of the base Python"
        has_python, dists = list_dists(host, self.stack)
        if not has_python:
            return f"{self.stack.path}/bin/python missing"
        recorded = {p["dist_info"] for p in manifest.get("packages", [])}
        if dists != recorded:
            added, gone = sorted(dists - recorded), sorted(recorded - dists)
            return ("content differs from the manifest: " +
                    ", ".join([f"+{d}" for d in added] + [f"-{d}" for d in gone]))
        return None

    def pending_for(self, host: Host, plan: dict[str, Any] | None = None) -> generations.Generation | None:
        """The pending generation (built, awaiting its validation) that realises the step's plan; None where
        there is none (or the stack does not wait for validation: :func:`waits_for_validation`)."""
        if not self.waits:
            return None
        waiting = generations.read_history(host, self.stack.path).pending()
        plan = self.desired(host)[0] if plan is None else plan
        return waiting if waiting is not None and waiting.digest == plan_digest(plan) else None

    def diff(self, host: Host) -> str | None:
        plan, _ = self.desired(host)
        manifest = read_manifest(host, self.stack)
        old = dump(manifest["plan"]) if manifest else None
        return unified_diff(old, dump(plan), self.stack.manifest + " (plan)")

    def apply(self, host: Host) -> None:
        require_module_system(facts=self.ctx.facts)
        reason = self._reason(host)
        if reason is not None:
            self._new_generation(host, reason)
        generations.collect_retired(host, generations.read_history(host, self.stack.path), self.ctx.facts,
                                    note=self.ctx.note)

    def _new_generation(self, host: Host, reason: str) -> None:
        """Build the stack's next generation and switch to it: from nothing when the base changed or the
        content is not what the manifest says, else from a copy of the current one with what changed."""
        plan, built = self.desired(host)
        check_index(host, self.stack.index_url)
        manifest = read_manifest(host, self.stack)
        has_python, dists = list_dists(host, self.stack)
        fresh = (manifest is None or needs_new_generation(manifest.get("plan", {}), plan) or not has_python
                 or dists != {p["dist_info"] for p in manifest.get("packages", [])})
        builder = Builder(self, host, plan, built, manifest, reason)
        builder.uv()  # installer: uv without uv on the host is refused here, before anything is made
        if fresh or not builder.next_generation():
            builder.build_generation()


class Builder(EnvTools):
    """One apply of :class:`StackVenv`: a new generation, made from nothing or from the current one, switched to."""

    def __init__(self, step: StackVenv, host: Host, plan: dict[str, Any], built: list[Built],
                 manifest: dict[str, Any] | None, reason: str) -> None:
        super().__init__(host, step.stack, step.base, step.ctx.log_dir / "stack-venv.log" if step.ctx.log_dir else None,
                         report=step.ctx.note, interval=step.ctx.options.progress_interval)
        self.plan, self.built, self.manifest, self.reason = plan, built, manifest, reason
        self.waits, self.ctx_note = step.waits, step.ctx.note
        #: The generations of this stack switched in by this run (one per stack context, shared by the stack's
        #: steps): a later step of the same run (stack-packages after stack-venv) replaces one of them at once,
        #: as nobody validated or loaded it yet.
        self.switched_this_run: set[str] = step.ctx.__dict__.setdefault("_switched_in", set())
        self.parent, self.leaf = os.path.split(self.stack.path)
        self.options, self.facts = step.ctx.options, step.ctx.facts
        self.token = secrets.token_hex(4)
        self.gen = f"{self.parent}/.{self.leaf}.gen-{self.token}"

    def wheels(self) -> list[str]:
        return [b.wheel for b in self.built if b.wheel]

    # -- a new generation from nothing ----------------------------------------------------------
    def build_generation(self) -> None:
        """Build the whole environment in a new generation, then switch the path to it."""
        if self.host.exists(self.stack.path) and not self.host.probe(["test", "-L", self.stack.path]).ok \
                and self.manifest is None:
            raise SitestackError(f"{self.stack.path} exists and is not a stack sitestack installed (no "
                                 f"{os.path.basename(self.stack.manifest)}): move it away first")
        gen = self.gen
        with self._making(gen):
            for argv in self.base.create(gen):
                self.run(argv)
            # what the environment's creation put there (conda's python and pip): not installed by sitestack
            created = list_dists(self.host, self.stack, gen)[1]
            requirements = [*self.stack.requirements, *self.stack.extras, *self.stack.checks, *self.wheels()]
            templates = VenvTemplates(self, self.plan, self.options, {b.recipe: b.wheel for b in self.built if b.wheel},
                                      shared=shared_with_group(self.facts))
            text = templates.clone(gen) if requirements else None
            if text is None and requirements:
                text = self.pip_install(gen, requirements, f"{gen}/.sitestack-pip-report.json")
                templates.store(gen, text)
            scan = self.scan(gen)
            origins = origins_from_report(text, self.built)
            # the scan saw gen's paths; the manifest describes the stable path
            self._publish(gen, manifest_for(self.stack, self.plan, scan, origins, None, os.path.basename(gen),
                                            self.built, created=created))

    # -- the next generation: the current one copied, then changed --------------------------------
    def next_generation(self) -> bool:
        """Make the next generation from the current one (its files hard-linked, as a template's are:
        :mod:`sitestack.installs.venv_template`) and install only what changed into the copy; False when
        the current one cannot be copied that way (a conda or container environment, templates off,
        another base interpreter), and nothing was made."""
        mode = template_mode()
        current = self.host.probe(["readlink", "-e", "--", self.stack.path]).stdout.strip()
        if self.stack.source not in ("system", "module") or mode == "off" or not current or self.manifest is None:
            return False
        gen = self.gen
        with self._making(gen):
            for argv in self.base.create(gen):
                self.run(argv)
            try:
                self.run(self.base.env_python(gen, ["-c", program("venv_clone"), current, gen, current, mode]))
            except CommandFailed as exc:
                if exc.rc != 3:  # 3: made for another base interpreter
                    raise
                self.host.run(["rm", "-rf", "--", gen])
                return False
            self._publish(gen, self.update(gen))
        return True

    @contextlib.contextmanager
    def _making(self, gen: str) -> Iterator[None]:
        """Around making ``gen``: leftovers of killed runs removed first; ``gen`` removed on any failure."""
        self.run(["mkdir", "-p", self.parent])
        generations.clean_stale(self.host, generations.read_history(self.host, self.stack.path))
        try:
            yield
        except BaseException:
            self.host.probe(["rm", "-rf", "--", gen])
            self.host.probe(["rmdir", "-p", "--ignore-fail-on-non-empty", "--", self.parent])
            raise

    def _publish(self, gen: str, manifest: dict[str, Any]) -> None:
        """Finish ``gen`` (its manifest and the start-up pin inside it), then switch the stable path to it,
        retiring the current generation; the stable manifest path links into the current generation."""
        site_packages = f"{gen}/lib/python{self.stack.python_version}/site-packages"
        self.host.write_text(f"{site_packages}/{PIN}.py", program("generation_pin"), 0o644)
        self.host.write_text(f"{site_packages}/{PIN}.pth", f"import {PIN}\n", 0o644)
        self.host.write_text(f"{gen}/{MANIFEST}", dump(manifest), 0o644)
        history = generations.read_history(self.host, self.stack.path)
        entry = generations.Generation(os.path.basename(gen), time.time(), plan_digest(self.plan), self.reason)
        if self.waits and history.current is not None and history.current not in self.switched_this_run:
            generations.park(self.host, history, entry)
            self.ctx_note(f"generation {entry.name} of {self.stack.name} built beside {history.current}: it is switched "
                      "in once its validation job passes (docs/operating.md)")
            return
        generations.switch(self.host, history, entry)
        self.switched_this_run.add(entry.name)
        link = f"{self.leaf}/{MANIFEST}"
        if self.host.probe(["readlink", "--", self.stack.manifest]).stdout.strip() != link:
            self.run(relink_argv(self.stack.manifest, link, self.token))

    # -- what changed, installed into the copy ----------------------------------------------------
    def update(self, root: str) -> dict[str, Any]:
        """Install what changed into the environment at ``root`` (a copy of the current generation) and
        uninstall extras that were removed; the manifest of the result."""
        assert self.manifest is not None
        old = self.manifest.get("plan", {})
        keys = ("requirements", "extras", "checks")
        new_reqs = [r for key in keys for r in self.plan.get(key, [])]
        old_reqs = [r for key in keys for r in old.get(key, [])]
        changed = [r for r in new_reqs if r not in old_reqs]
        if any(self.plan.get(k) != old.get(k) for k in ("index_url", "index_credentials")):
            changed = list(new_reqs)
        wanted = {requirement_name(r) for r in new_reqs}
        removed = sorted({requirement_name(r) for r in old_reqs} - wanted)
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
            self.uninstall(root, removed)
        origins = {**origins_from_report(text_a, self.built), **origins_from_report(text_b, self.built)}
        touched = {requirement_name(r) for r in changed if not r.endswith(".whl")} | set(removed)
        touched |= {normalize(b.recipe) for b in self.built}
        copied = {normalize(p["name"]) for p in self.manifest.get("packages", [])} - touched
        return manifest_for(self.stack, self.plan, self.scan(root), origins, self.manifest, os.path.basename(root),
                            self.built, copied=copied)


__all__ = ["StackVenv"]
