"""The tasks that run part of a site's playbook: one build step, or the steps of some actions.

``invoke build-recipe``, ``build-mpi4py``, ``build-horovod``, ``build-rccl-plugin`` and ``build-nccl-plugin`` make
one step (an action and its arguments), put it in the site's playbook in place of the
playbook's own steps, and provision; ``install-venv`` and ``install-modulefiles`` run only
the playbook's steps of their actions. The site's hosts, modules, check mode, locks and recap
all work as for ``invoke provision``. Version rules are checked before anything connects.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sitestack.actions import ACTIONS
from sitestack.core.errors import InputError
from sitestack.core.report import HostRun, Reporter
from sitestack.engine import playbook as pb
from sitestack.engine.source_options import checked_sources
from sitestack.installs.conda_env import read_env_input
from sitestack.installs.venv_stack import require_module_system
from sitestack.model.context import RunOptions
from sitestack.model.recipe import load_recipe
from sitestack.model.site import Site, StepSpec
from sitestack.packages.aws_ofi_rccl import RECIPE_NAME
from sitestack.packages.aws_ofi_rccl_rules import (
    KIT_NAMES,
    Kit,
    choose_version,
    known_rocm,
    known_version,
    plugin_data,
    with_toolkit,
)


def run_step(loaded: Site, spec: StepSpec, options: RunOptions, reporter: Reporter) -> list[HostRun]:
    """Provision ``loaded`` with ``spec`` as its only step (refused first where it contradicts the
    site's facts, as a playbook's own step is when the playbook is loaded)."""
    action = ACTIONS[spec.action]
    problem = action.site_problem(action.check_args(spec.args, loaded.path, spec.line, "args"), loaded.facts, options)
    if problem:
        raise InputError(f"--site {loaded.name}", f"{spec.name}: {problem}")
    single = dataclasses.replace(loaded, steps=(spec,), handlers=(), playbook_steps=loaded.steps)
    return pb.provision(single, checked_sources(single, options, spec.name), reporter)


def _sources_dir(options: RunOptions) -> Path | None:
    return Path(options.sources_dir) if options.sources_dir else None


def build_recipe(recipe: str, *, site: str | None, playbook: Path | None, version: str | None,
                 options: RunOptions, reporter: Reporter) -> list[HostRun]:
    """Build and install one recipe version on a site's hosts (one ``recipe-install`` step)."""
    loaded = pb.load(site, playbook)
    found = load_recipe(recipe, _sources_dir(options))
    shown_version = found.select_version(version, loaded.facts, f"site {loaded.name}")
    args: dict[str, Any] = {"recipe": recipe}
    if version:
        args["version"] = version
    spec = StepSpec(name=f"{recipe}@{shown_version}", action="recipe-install", args=args, tags=("build", recipe))
    return run_step(loaded, spec, options, reporter)


def build_horovod(*, site: str | None, playbook: Path | None, version: str | None, package: Mapping[str, Any],
                  options: RunOptions, reporter: Reporter) -> list[HostRun]:
    """``invoke build-horovod``: one recipe-install step of the horovod recipe (its hooks do the rest);
    ``package``: the step's ``package:`` arguments (HorovodArgs, e.g. gpu_operations)."""
    loaded = pb.load(site, playbook)
    recipe = load_recipe("horovod", _sources_dir(options))
    chosen = recipe.select_version(version, loaded.facts, f"site {loaded.name}")
    from sitestack.packages.horovod import plan_for as horovod_plan  # provision imports this module: keep it light

    horovod_plan(recipe, loaded.facts, package.get("gpu_operations"), loaded.name)
    args: dict[str, Any] = {"recipe": "horovod", **({"version": version} if version else {}), "package": dict(package)}
    spec = StepSpec(name=f"horovod@{chosen}", action="recipe-install", args=args, tags=("build", "horovod"))
    return run_step(loaded, spec, options, reporter)


def build_net_plugin(toolkit: Kit, *, site: str | None, playbook: Path | None, version: str | None,
                     package: Mapping[str, Any], options: RunOptions, reporter: Reporter) -> list[HostRun]:
    """``invoke build-rccl-plugin`` (``toolkit`` rocm) and ``build-nccl-plugin`` (cuda): the toolkit release
    and plugin ``version`` checked, then one recipe-install step of the plugin recipe; ``package``: its
    ``package:`` arguments (PluginArgs: the release, homes, tests), the release the one checked here.

    Without --site (or --playbook) the site is ``local``, this machine: said on the first line, and
    refused when this machine's site has no such toolkit (facts.rocm, facts.cuda) and no --rocm-home or
    --cuda-home says where one is, so that ``--rocm 5.7.1`` alone never builds for a site nobody chose."""
    task = {"rocm": "build-rccl-plugin", "cuda": "build-nccl-plugin"}[toolkit]
    kit, _ = KIT_NAMES[toolkit]
    home = package.get(f"{toolkit}_home")
    loaded = pb.load(site or ("local" if playbook is None else None), playbook)
    have = loaded.facts.rocm if toolkit == "rocm" else loaded.facts.cuda
    if site is None and playbook is None:
        if have is None and not home:
            raise InputError("--site", f"not given, and the local site (this machine, {loaded.path}) has no {kit} "
                             f"(facts.{toolkit}): name the site to build for (e.g. --site frontier, --site lumi), or "
                             f"give --site local with --{toolkit}-home")
        reporter.note(f"{task}: site local (this machine, {loaded.path}); --site names another")
    recipe = load_recipe(RECIPE_NAME, _sources_dir(options))
    data = plugin_data(recipe)
    release = package.get(toolkit) or (have.version if have else None)
    if not release:
        example = "5.7.1" if toolkit == "rocm" else "13.0"
        raise InputError(loaded.path, f"site {loaded.name} has no facts.{toolkit}: add `{toolkit}: {{version: ..., "
                         f"home: ...}}` under facts:, or give --{toolkit} (e.g. --{toolkit} {example})")
    release = known_rocm(data, release, recipe.path) if toolkit == "rocm" else known_version(release, "--cuda", "13.0")
    facts = with_toolkit(loaded.facts, toolkit, release, home or "/opt/toolkit")   # the home is not looked at here
    chosen = choose_version(recipe, data, facts, version, loaded.name, toolkit=toolkit, nccl=package.get("nccl"))
    args: dict[str, Any] = {"recipe": RECIPE_NAME, **({"version": version} if version else {}),
                            "package": {**package, toolkit: release}}
    spec = StepSpec(name=f"{data.install_name}@{chosen}-{toolkit}-{release}", action="recipe-install", args=args,
                    tags=("build", "netplugin"))
    return run_step(loaded, spec, options, reporter)


def steps_of(site: Site, actions: Sequence[str]) -> tuple[StepSpec, ...]:
    """The site's steps with these actions, in playbook order; a default step for each action it lacks."""
    chosen = [s for s in site.steps if s.action in actions]
    have = {s.action for s in chosen}
    for action in actions:
        if action not in have:
            chosen.append(StepSpec(name=action, action=action, args={}, tags=(action,)))
    order = {a: i for i, a in enumerate(actions)}
    return tuple(sorted(chosen, key=lambda s: order[s.action]))


def run_steps(actions: Sequence[str], *, site: str | None, playbook: Path | None, options: RunOptions,
              reporter: Reporter) -> list[HostRun]:
    """Run only the steps with these actions of a site's playbook (a default step where it has none)."""
    loaded = pb.load(site, playbook)
    require_module_system(loaded)
    subset = dataclasses.replace(loaded, steps=steps_of(loaded, actions), handlers=())
    return pb.provision(subset, options, reporter)


def install_venv(*, site: str | None, playbook: Path | None, options: RunOptions, reporter: Reporter) -> list[HostRun]:
    """``invoke install-venv``: the stack environment and its extend-venv-activate command."""
    return run_steps(("stack-venv", "venv-hook"), site=site, playbook=playbook, options=options, reporter=reporter)


def install_modulefiles(*, site: str | None, playbook: Path | None, options: RunOptions,
                        reporter: Reporter) -> list[HostRun]:
    """``invoke install-modulefiles``: the module files of the site's stack and built packages."""
    return run_steps(("modulefiles",), site=site, playbook=playbook, options=options, reporter=reporter)


def pack_env(*, site: str | None, playbook: Path | None, name: str | None, requirements: str | None,
             dest: str | None, options: RunOptions, reporter: Reporter) -> list[HostRun]:
    """``invoke pack-env``: the playbook's ``pack-env`` steps (``name``: only that one), or one step
    made from ``requirements`` (and ``name``, ``dest``) on top of the playbook's step of that name, else
    of its one pack-env step (the site's settings of a pack, e.g. ``channels_without_conda``, hold for a
    user's env.yml too)."""
    loaded = pb.load(site, playbook)
    steps = [s for s in loaded.steps if s.action == "pack-env" and (name is None or s.args.get("name") == name)]
    if requirements is None and dest is None:
        if not steps:
            raise InputError(loaded.path if name is None else "--name",
                             "the playbook has no pack-env step" + (f" named {name!r}" if name else "") +
                             ": give --requirements FILE and --name NAME")
        return pb.provision(dataclasses.replace(loaded, steps=tuple(steps), handlers=()), options, reporter)
    every = [s for s in loaded.steps if s.action == "pack-env"]
    base = steps or (every if len(every) == 1 else [])
    args: dict[str, Any] = dict(base[0].args) if base else {}
    if name is not None:
        args["name"] = name
    if requirements is not None:
        if not Path(requirements).is_file():
            raise InputError("--requirements", f"{requirements}: no such file")
        args["requirements"] = str(Path(requirements).resolve())
        # bad input is refused before anything runs; an env.yml's name: names the environment
        env = read_env_input(args["requirements"], "--requirements")
        args["name"] = args.get("name") or env.name
    if not args.get("requirements"):
        raise InputError("--requirements", "give the requirements file (requirements.txt or a conda env.yml)")
    if not args.get("name"):
        raise InputError("--name", "give the environment's name (the playbook has no pack-env step to take it from)")
    if dest is not None:
        args["dest"] = dest
    spec = StepSpec(name=f"pack-env {args['name']}", action="pack-env", args=args, tags=("pack-env",))
    return run_step(loaded, spec, options, reporter)
