"""The module files of a site, as :class:`ModuleSpec` data: the stack's module and one per
package sitestack built for the site (the network plugin's included), from the facts, the
stack and each recipe's ``module`` settings. Rendering is :mod:`sitestack.installs.modulefile_render`'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sitestack.core.errors import SitestackError
from sitestack.core.redact import redact
from sitestack.installs.modulefile_render import ModuleSpec, PathOp, family_name
from sitestack.installs.modulefile_text import Text, in_generation, literal, text_of
from sitestack.installs.venv_stack import Built, Stack, generation_var
from sitestack.model.container_facts import runtime_of
from sitestack.model.container_runtimes import which_can
from sitestack.model.context import RunContext
from sitestack.model.miopen import MIOPEN_KEYS, miopen_cache
from sitestack.model.recipe import expand
from sitestack.model.site import Container, Facts, Site

#: Where a container site's run scripts ($RUNSCRIPTS) are bound inside the container (LUMI's module).
RUNSCRIPTS_MOUNT = "/runscripts"


def default_requires(facts: Facts) -> tuple[str, ...]:
    """The site modules the stack's module needs by default: the base Python's module."""
    if facts.python.source in ("module", "conda") and facts.python.module:
        return (facts.python.module,)
    return ()


def site_env(site: Site, values: Mapping[str, str]) -> list[tuple[str, Text]]:
    return [(name, text_of(value, values)) for name, value in sorted(site.late_env(values).items())]


def split_defaults(facts: Facts, env: Sequence[tuple[str, Text]]) -> tuple[list[tuple[str, Text]], list[tuple[str, Text]]]:
    """``env`` as (settings the module sets, whatever the environment holds: its own variables, such as
    the MIOpen cache per job; the site's settings, facts.env, which it sets only where the environment
    has no value or an empty one, so a value the user chose wins, as in the launch helper and the job)."""
    return ([(k, v) for k, v in env if k not in facts.env],
            [(k, v) for k, v in env if k in facts.env])


def is_plugin(b: Built, facts: Facts) -> bool:
    return b.recipe == facts.network.net_plugin or b.recipe.startswith(("aws-ofi-", "rccl-net", "nccl-net"))


def stack_module(ctx: RunContext, stack: Stack, built: Sequence[Built], *, requires: Sequence[str] | None = None,
                 autoload: bool = True) -> ModuleSpec:
    facts = ctx.facts
    name, version = stack.name.rsplit("/", 1)
    container = facts.container if stack.source == "container" else None
    # The container's own network plugin needs no host module (and so none of the site modules the
    # host-built plugin's module loads): a fact chooses (facts.container.net_plugin).
    plugins = [b.module_name for b in built if is_plugin(b, facts)
               and (container is None or container.net_plugin == "host")]
    needs = tuple(dict.fromkeys([*(default_requires(facts) if requires is None else requires), *plugins]))
    paths: list[PathOp] = []
    env: list[tuple[str, Text]] = []
    if container is not None:
        paths, env = container_settings(ctx, stack, container)
    else:
        # PATH only: the stack's own interpreter finds its site-packages (a venv's pyvenv.cfg, a conda prefix).
        # A PYTHONPATH entry would win over a copy staged on node-local storage (sitestack-stage-env, OLCF's
        # https://docs.olcf.ornl.gov/software/python/sbcast_conda.html) and import the shared prefix's packages;
        # users' own venvs get the stack's packages from their activation (extend-venv-activate).
        paths.append(PathOp("prepend", "PATH", in_generation(stack.path, "/bin")))
    settings = [(k, v) for k, v in site_env(ctx.site, ctx.values) if k not in MIOPEN_KEYS]
    # MIOpen's cache: the job's own directory, from SLURM_JOB_ID when the module is loaded (model/miopen.py)
    cache = miopen_cache(facts)
    if cache is not None:
        settings += [(key, text_of(cache, ctx.values)) for key in MIOPEN_KEYS]
    settings, defaults = split_defaults(facts, sorted(settings, key=lambda kv: kv[0]))
    env += settings
    torch = facts.torch
    summary = f"PyTorch {torch.version} ({torch.variant}) stack for {ctx.site.name}"
    built_lines = [f"{b.recipe} {b.version} ({b.dest})" for b in built if not is_plugin(b, facts)]
    built_lines += [f"{b.recipe} {b.version} (module {b.module_name})" for b in built if is_plugin(b, facts)]
    own = [b.recipe for b in built if not is_plugin(b, facts)]
    provides = (("torch", torch.version), *sorted(torch.packages.items()),
                *((b.recipe, b.version) for b in built if not is_plugin(b, facts)))
    description = f"{summary}: {', '.join(['torch', *sorted(torch.packages)])}" + (
        f"; built for the site: {', '.join(own)}" if own else "")
    data = {
        "site_description": facts.description,
        "path": stack.path,
        "python": stack.python_version,
        "torch_version": torch.version,
        "variant": torch.variant,
        "index_url": redact(stack.index_url) if stack.index_url else None,  # modulefiles are world-readable
        "requirements": list(stack.requirements),
        "extras": list(stack.extras),
        "built": built_lines,
        "manifest": stack.manifest,
        "container": ({"runtime": container.runtime, "image": container.image} if container else None),
    }
    return ModuleSpec(
        name=name, version=version, template="stack", site=ctx.site.name, summary=summary,
        whatis=(("Name", name), ("Version", version), ("Category", "machine learning"),
                ("Description", description), ("URL", "https://pytorch.org")),
        requires=needs, autoload=autoload, family=family_name(stack.family), paths=tuple(paths), env=tuple(env),
        # site modules only `module use` finds (LUMI AI Factory's bindings module, https://github.com/
        # Lumi-supercomputer/LUMI-AI-Guide 02-setting-up-environment): the site's module directories first
        modulepath=tuple(facts.modules.use) if needs else (),
        defaults=tuple(defaults), data=data, extensions=provides,
        # the job keeps the generation it loaded (docs/operating.md)
        generation=(generation_var(stack), stack.path))


def container_settings(ctx: RunContext, stack: Stack, container: Container) -> tuple[list[PathOp], list[tuple[str, Text]]]:
    """What the stack's module sets for a container site, as LUMI's PyTorch container module does
    (https://lumi-supercomputer.github.io/LUMI-EasyBuild-docs/p/PyTorch/): SIF and SIF<NAME>, the bind path (the prefix and
    the site's binds), RUNSCRIPTS, RUNSCRIPTS<NAME>, CONTAINERROOT and EBROOT<NAME> where the playbook installs
    the run scripts (container-image, which are also bound at /runscripts) and the image has the conda
    activation they run (facts.container.with_conda), WITH_CONDA,
    and the container's PATH (/runscripts, then the stack's venv) and PYTHONPATH."""
    runtime = runtime_of(container)
    if runtime.bind_var is None or runtime.env_prefix is None:
        # the module can only set what the runtime reads from variables; a runtime that takes binds and
        # PATH as options gets them from the job (validation/container_forms.py) instead
        raise SitestackError(f"facts.container.runtime: {runtime.name} reads no bind or environment variables, "
                             "so the stack's module cannot set its binds and PATH inside: leave the module out "
                             "(the validation job's and job template's lines run the image), or use "
                             f"{which_can(lambda r: r.env_prefix is not None)}")
    prefix = ctx.values["prefix"].rstrip("/")
    # LUMI's create_container_vars: SIF .. NAME:upper() with '-' as 'MIN' (SIFPYTORCH)
    suffix = stack.family.upper().replace("-", "MIN")
    paths: list[PathOp] = []
    env: list[tuple[str, Text]] = []
    if container.image:
        env += [("SIF", text_of(container.image, ctx.values)), (f"SIF{suffix}", text_of(container.image, ctx.values))]
    # The run scripts are those of LUMI's EasyBuild container modules: they run the image's conda activation
    # ($WITH_CONDA) before Python, and the page sends users to $EBROOTPYTORCH/runscripts. An image without
    # conda (LUMI AI Factory's, Python on the image's PATH: https://github.com/lumi-ai-factory/laifs-container-recipes
    # containerfiles/torch/Venv_Torch) has neither in its guide, so its stack's module sets neither.
    runscripts = bool(container.with_conda) and any(
        s.action == "container-image" and (s.args or {}).get("runscripts", True) for s in ctx.site.steps)
    binds = [text_of(bind, ctx.values) for bind in dict.fromkeys([prefix, *container.bind])]
    if runscripts:
        # $RUNSCRIPTS appears at /runscripts inside the container, as with LUMI's module: the page's
        # `singularity exec $SIF /runscripts/conda-python-simple ...` names that path.
        binds.append(literal(f"{prefix}/runscripts:{RUNSCRIPTS_MOUNT}"))
    paths += [PathOp("append", runtime.bind_var, bind, ",") for bind in binds]
    paths.append(PathOp("prepend", runtime.prepend_path_var, in_generation(stack.path, "/bin")))
    if runscripts:
        # EBROOT<NAME>: EasyBuild's install root, where LUMI's PyTorch page sends users for the scripts
        # ("the scripts in $EBROOTPYTORCH/runscripts", its distributed-learning section)
        env += [("RUNSCRIPTS", literal(f"{prefix}/runscripts")), (f"RUNSCRIPTS{suffix}", literal(f"{prefix}/runscripts")),
                ("CONTAINERROOT", literal(prefix)), (f"EBROOT{suffix}", literal(prefix))]
        # and on the container's PATH: the page's job runs `singularity exec $SIFPYTORCH conda-python-distributed`
        paths.append(PathOp("prepend", runtime.prepend_path_var, literal(RUNSCRIPTS_MOUNT)))
    if container.with_conda:
        env.append(("WITH_CONDA", text_of(container.with_conda, ctx.values)))
    paths.append(PathOp("prepend", runtime.env_var("PYTHONPATH"),
                        in_generation(stack.path, stack.site_packages[len(stack.path):])))
    return paths, env


def package_module(ctx: RunContext, b: Built, *, autoload: bool = True) -> ModuleSpec:
    """The module of a package sitestack built (from its recipe's module settings)."""
    facts = ctx.facts
    settings = b.settings
    name, version = b.module_name.rsplit("/", 1)
    summary = (getattr(settings, "whatis", None) or b.description).strip().rstrip(".")
    values = dict(b.values)
    paths = []
    for var, dirs in sorted((getattr(settings, "prepend", None) or {}).items()):
        for d in dirs:
            paths.append(PathOp("prepend", var, text_of(expand(d, values).replace("{", "{{").replace("}", "}}"),
                                                        ctx.values)))
    env: dict[str, Text] = {}
    plugin = is_plugin(b, facts)
    if plugin:  # the site's network settings go with the plugin
        for var, value in site_env(ctx.site, ctx.values):
            if var.startswith(("NCCL_", "FI_")):
                env[var] = value
    for var, value in sorted((getattr(settings, "set", None) or {}).items()):
        env[var] = text_of(expand(value, values).replace("{", "{{").replace("}", "}}"), ctx.values)
    requires = tuple(facts.modules.load) if getattr(settings, "site_modules", True) else ()
    template = "net-plugin" if plugin else b.recipe
    settings_env, defaults = split_defaults(facts, sorted(env.items()))
    launcher = {"srun": "srun -n 2", "mpirun": "mpirun -np 2"}.get(facts.mpi.launcher, "mpiexec -n 2")
    data = {"version": b.version, "dest": b.dest, "recipe": b.recipe, "mpi": facts.mpi.flavour,
            "launcher": launcher, "collectives": facts.collectives}
    return ModuleSpec(
        name=name, version=version, template=template, site=ctx.site.name, summary=summary,
        whatis=(("Name", name), ("Version", version), ("Description", summary), ("URL", b.homepage)),
        requires=requires, autoload=autoload, family=family_name(name), paths=tuple(paths), env=tuple(settings_env),
        defaults=tuple(defaults), help=summary, data=data)


def site_modules(ctx: RunContext, stack: Stack, built: Sequence[Built], *, requires: Sequence[str] | None = None,
                 autoload: bool = True, plugins: bool = True) -> list[ModuleSpec]:
    """The stack's module and one per built package (``plugins=False``: not the network plugin's,
    which the plugin's build step writes itself; the stack's module still loads it)."""
    return [stack_module(ctx, stack, built, requires=requires, autoload=autoload),
            *(package_module(ctx, b, autoload=autoload) for b in built if plugins or not is_plugin(b, ctx.facts))]
