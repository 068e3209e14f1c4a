"""What a site's playbook makes, as other steps need to know it: the stack environment, the packages
built for it, and the inputs of the validation job and the users' launch helpers.

Each is read from the playbook's steps through the run's action table (``ctx.actions``), never by
importing an action module, so actions share these helpers without importing one another.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from sitestack.core.errors import SitestackError
from sitestack.core.host import Host
from sitestack.installs.stamp import installed_wheel, read_stamp
from sitestack.installs.venv_stack import Built, Stack, module_root, stack_for
from sitestack.model.context import RunContext
from sitestack.model.site import StepSpec, expand
from sitestack.validation import launch_helpers
from sitestack.validation.jobs import JobInputs

#: The action that builds a recipe; an action class with ``installs_recipe = True`` builds one too.
RECIPE_INSTALL = "recipe-install"


def steps_of(ctx: RunContext) -> list[StepSpec]:
    """The playbook's steps of the stack ``ctx`` is for (a step's ``stack:``; the playbook's own facts'
    steps where it is for none): a stack's packages, environment and module are its own steps'."""
    return [s for s in ctx.site.steps if s.stack == ctx.site.stack]


def site_stack(ctx: RunContext) -> Stack | None:
    """The site's stack environment, where the playbook makes one (a stack-venv step)."""
    spec = next((s for s in steps_of(ctx) if s.action == "stack-venv"), None)
    if spec is None:
        return None
    args = ctx.actions[spec.action].from_spec(spec, ctx).args  # placeholders filled
    return stack_for(ctx, getattr(args, "name", None))


def stack_python(ctx: RunContext) -> str | None:
    """The Python of the site's stack environment, where the playbook makes one (a stack-venv step)."""
    stack = site_stack(ctx)
    return f"{stack.bin}/python" if stack else None


def stack_interpreter(ctx: RunContext, recipe: str) -> str | None:
    """The interpreter that builds ``recipe`` for the site's stack, where that is not the base Python:
    the stack environment's own ``bin/python`` where the playbook makes a conda env (facts.python.source
    conda) whose stack-venv step installs the recipe's wheel. A conda env has its own interpreter, of the
    version ``conda create python=X.Y`` chose, which the base ``python3`` on PATH (the conda module's)
    matches only by chance (OLCF's PyTorch guide builds mpi4py with pip inside the activated env:
    https://docs.olcf.ornl.gov/software/python/pytorch_frontier.html). None elsewhere: a venv stack
    (system, module) is facts.python.executable's own interpreter made in the same site environment
    (and has no pip of its own), a container's runs only inside its image. ``invoke build-mpi4py`` and the
    other build tasks build for the stack of the site's playbook too (``Site.playbook_steps``)."""
    if ctx.facts.python.source != "conda":
        return None
    for spec in ctx.site.playbook_steps or ctx.site.steps:   # a build task's one step: the playbook's
        if spec.action == "stack-venv" and spec.stack == ctx.site.stack:
            args = ctx.actions[spec.action].from_spec(spec, ctx).args
            if recipe in args.recipes:
                return f"{stack_for(ctx, args.name).bin}/python"
    return None


def stack_includes(ctx: RunContext) -> tuple[str, ...]:
    """The built packages the site's stack includes (the recipes of its recipe-install steps, where a
    stack-venv step makes the stack): the job fails when one of them is missing or broken."""
    if not any(s.action == "stack-venv" for s in steps_of(ctx)):
        return ()
    return tuple(sorted({str(s.args["recipe"]) for s in steps_of(ctx)
                         if s.action == RECIPE_INSTALL and s.args.get("recipe")}))


def launch_dir(ctx: RunContext) -> str | None:
    """Where the playbook's install-launch-env step installs the users' launch helpers, if it has one."""
    spec = next((s for s in ctx.site.steps if s.action == "install-launch-env"), None)
    return None if spec is None else str(ctx.actions[spec.action].from_spec(spec, ctx.for_step(spec)).args.dir).rstrip("/")


def launch_helper(ctx: RunContext) -> str | None:
    """``sitestack-launch-env`` as the install-launch-env step installs it: the job sources it for its
    geometry, host list, master address and port and MIOpen cache, as users do."""
    directory = launch_dir(ctx)
    return None if directory is None else f"{directory}/{launch_helpers.HELPER}"


def stage_script(ctx: RunContext) -> str | None:
    """``sitestack-stage-env`` as the install-launch-env step installs it, where the site stages the env of
    ``ctx``'s stack (a stage-archive step of that stack packs it)."""
    directory = launch_dir(ctx)
    if directory is None or not ctx.facts.node.stage_env or site_stack(ctx) is None:
        return None
    if not any(s.action == "stage-archive" for s in steps_of(ctx)):
        return None
    return f"{directory}/{launch_helpers.STAGE}"


def job_inputs(ctx: RunContext, directory: str, python: str | None) -> JobInputs:
    """The job's inputs for a run context: facts.env keeps ``{user}``/``{home}`` for the job's user;
    the checks run with ``python``, else the stack's Python, else facts.python.executable. The stack's
    digest is not among them: the job reads it from the stack's manifest when it runs
    (``ddpcheck/provenance.py``), so the job's files do not depend on whether the stack was made first."""
    runtime = {"user": "${USER}", "home": "${HOME}"}
    env = {k: expand(v, runtime) for k, v in ctx.site.late_env(ctx.values).items()}
    stack = site_stack(ctx)
    # The job validates what users get: the stack's module, loaded as they load it, where the playbook
    # installs module files for it, unless another Python was asked for (--python: validate that one).
    uses_module = stack is not None and python is None and any(s.action == "modulefiles" for s in steps_of(ctx))
    return JobInputs(site=ctx.site.name, facts=ctx.facts, dir=directory, env=env, python=python or stack_python(ctx),
                     prefix=ctx.values["prefix"], stage_env=stage_script(ctx),
                     launch_env=launch_helper(ctx) if python is None else None,
                     stack_includes=stack_includes(ctx),
                     stack_module=stack.name if stack is not None and uses_module else None,
                     module_root=module_root(ctx) if uses_module else None,
                     manifest=stack.manifest if stack is not None and python is None else None,
                     checks_need=stack.checks if stack is not None else ())


def _install_targets(ctx: RunContext, recipes: Sequence[str]) -> dict[str, Any]:
    """recipe -> the install target of the playbook's first step that builds it."""
    targets: dict[str, Any] = {}
    for spec in steps_of(ctx):
        cls = ctx.actions.get(spec.action)
        if cls is None or not (spec.action == RECIPE_INSTALL or getattr(cls, "installs_recipe", False)):
            continue
        try:
            step = cls.from_spec(spec, ctx)
        except SitestackError:
            continue
        target = getattr(step, "target", None)
        if target is not None and target.recipe.name in recipes:
            targets.setdefault(target.recipe.name, target)
    return targets


def recipe_targets(ctx: RunContext, recipes: Sequence[str]) -> tuple[list[Built], list[str]]:
    """The installs of ``recipes`` this site's playbook makes (its ``recipe-install`` steps, else each
    recipe's default version at ``{prefix}/<recipe>/<version>``), without looking at a host.

    Returns (packages, notes): a recipe without ``sources/<name>.yml``, or one the site's facts
    rule out, is a note, not an error. A stack of the playbook's ``stacks:`` has only the installs of
    its own steps (another stack's are built for another interpreter and toolchain).
    """
    targets = _install_targets(ctx, recipes)
    out: list[Built] = []
    notes: list[str] = []
    for recipe in recipes:
        target = targets.get(recipe)
        if target is None and ctx.site.stack is not None:
            notes.append(f"{recipe} (no recipe-install step of stack {ctx.site.stack})")
            continue
        if target is None:
            spec = StepSpec(name=f"{recipe} (default install)", action=RECIPE_INSTALL, args={"recipe": recipe})
            try:
                target = ctx.actions[RECIPE_INSTALL].from_spec(spec, ctx).target
            except SitestackError as exc:
                notes.append(f"{recipe} (not for this site: {getattr(exc, 'detail', exc)})")
                continue
        out.append(Built(recipe=recipe, version=target.version, dest=target.dest,
                         description=target.recipe.description, homepage=target.recipe.homepage,
                         settings=target.recipe.module, values=target.values(install=target.dest)))
    return out, notes


def stack_libraries(ctx: RunContext) -> dict[str, list[str]]:
    """Kind -> directories of the libraries the site's stack builds itself, which the validation job
    expects each rank to map from there (the stack manifest's ``libraries``, beside what the scan of the
    environment finds: :func:`sitestack.installs.venv_manifest.expected_libraries`): the network plugin
    (``facts.network.net_plugin``, the recipe that builds it) where a recipe-install step of the stack
    builds it, in its install's ``lib``, autotools' default libdir, where the recipe's sanity path and its
    module's ``LD_LIBRARY_PATH`` have it. A plugin the site's container or module provides is not named."""
    plugin = ctx.facts.network.net_plugin
    if not plugin or plugin not in stack_includes(ctx):
        return {}
    built, _notes = recipe_targets(ctx, [plugin])
    return {"net-plugin": [f"{b.dest}/lib" for b in built]} if built else {}


def find_built(host: Host, ctx: RunContext, recipes: Sequence[str]) -> tuple[list[Built], list[str]]:
    """The packages of :func:`recipe_targets` that are installed on ``host``, with their wheels."""
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


__all__ = ["RECIPE_INSTALL", "find_built", "job_inputs", "launch_dir", "launch_helper", "recipe_targets",
           "site_stack", "stack_includes", "stack_libraries", "stack_interpreter", "stack_python", "stage_script"]
