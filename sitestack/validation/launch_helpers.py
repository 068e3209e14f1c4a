"""The users' launch helpers of a site, rendered from its facts, and its job-script template.

Installed by the ``install-launch-env`` step into ``{prefix}/bin`` (docs/launch.md):

- ``sitestack-launch-env``: POSIX sh, sourced in a batch script or a task. It exports what the
  sites' procedures compute by hand (Dawn's ``setup_mpi.sh``, https://github.com/kh296/dawn-containers;
  LUMI's ``get-master`` and masks, https://lumi-supercomputer.github.io/LUMI-EasyBuild-docs/p/PyTorch/;
  OLCF's MASTER_ADDR and MIOpen cache, https://docs.olcf.ornl.gov/software/python/pytorch_frontier.html):
  NODELIST, NNODES, TASKS_PER_NODE, CPUS_PER_TASK, WORLD_SIZE, MASTER_ADDR, a job-unique
  MASTER_PORT (:func:`sitestack.validation.jobs.master_port`), RANK/LOCAL_RANK inside a task, the
  CPU masks, the MIOpen cache per job (:mod:`sitestack.model.miopen`), facts.env (where the job's
  environment has no value or an empty one), and the user's choice (facts.env_defaults) passed into the
  site's container (``APPTAINERENV_NAME``, which wins over the image's ``%environment``).
- ``sitestack-launch CMD...``: runs CMD with it sourced, once per task under srun or mpiexec.
- ``sitestack-bind-rank [--cpu-masks M | --cores-per-rank N] -- CMD...``: a rank started by torchrun pins
  itself to the CPUs srun would give its LOCAL_RANK, then runs CMD (``sitestack/onsite/bind_rank.py``).
- ``sitestack-hostlist``: the one Slurm host-list parser (``sitestack/onsite/hostlist.py``), which
  the helper runs with ``python3`` where ``scontrol show hostnames`` is not available (containers).
- ``sitestack-stage-env`` (sites with ``node.stage_env``): the pack of the stack whose module is loaded
  broadcast with sbcast to node-local storage, unpacked, fixed up, checked and put first on PATH.

:func:`render_job_template` is what ``invoke job-template`` prints: a job that loads the stack
module the way users do and sources the helper. Every value from the facts reaches the text through
:mod:`sitestack.core.quoting` (``|q`` and :func:`~sitestack.core.quoting.sh_expanding`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sitestack.core import templates
from sitestack.core.quoting import SHELL_NAME, sh_default, sh_expanding
from sitestack.core.shipped import single_file
from sitestack.model.container_facts import passed_in
from sitestack.model.miopen import MIOPEN_KEYS, miopen_cache
from sitestack.model.site import Facts
from sitestack.model.siteenv import prelude
from sitestack.onsite.launchers import LAUNCHERS, TEMPLATE_LAUNCHERS
from sitestack.onsite.venv_unpack import CONDA_UNPACK
from sitestack.onsite.venv_unpack import PROGRAM as UNPACK_PROGRAM
from sitestack.validation import jobs, runtime_checks
from sitestack.validation import masks as masks_mod
from sitestack.validation.container_forms import script_container

HELPER = "sitestack-launch-env"
LAUNCH = "sitestack-launch"
STAGE = "sitestack-stage-env"
HOSTLIST = "sitestack-hostlist"
BIND_RANK = "sitestack-bind-rank"


@dataclass(frozen=True)
class StackPack:
    """A stack of the site as ``sitestack-stage-env`` knows it: the module users load, and the pack a
    ``stage-archive`` step makes of its env (None: no step packs it, and staging it is refused)."""

    module: str                         # e.g. pytorch/2.10.0-rocm7.1
    pack: str | None = None             # {prefix}/packs/pytorch-2.10.0-rocm7.1.tar.gz
    #: where each generation's pack lies: a job stages the pack of the generation its module loaded
    generations: str | None = None
    #: the variable in which the stack's module keeps the generation it loaded (docs/operating.md)
    generation_var: str = ""
    own: bool = False                   # the playbook's own stack: staged where no stack module is loaded


@dataclass(frozen=True)
class LaunchInputs:
    """What a site's helpers depend on besides the facts."""

    site: str
    facts: Facts
    bin: str  # where the helpers are installed, e.g. {prefix}/bin
    env: Mapping[str, str]  # facts.env with {user}/{home} as ${USER}/${HOME}
    scratch: str | None = None  # node.local_scratch with {user}/{home} as ${USER}/${HOME}
    #: every stack of the playbook (its own first), with its pack where one is made (sites that stage)
    packs: tuple[StackPack, ...] = ()
    stack_module: str = ""  # e.g. pytorch/2.13.0-cpu
    module_root: str = ""  # where the stack's module files are

    @property
    def stage(self) -> bool:
        return bool(self.facts.node.stage_env and any(p.pack for p in self.packs) and self.scratch)


def _context(inputs: LaunchInputs) -> dict[str, Any]:
    facts = inputs.facts
    v = jobs.validation_of(facts)
    binding = masks_mod.Binding.from_facts(facts)
    stacks = 2 if facts.gpu.unit == "stack" else 0
    # facts.env: the job's own value where it has one (not empty), else the site's
    env = [(k, sh_default(k, value)) for k, value in inputs.env.items() if k not in MIOPEN_KEYS]
    cache = miopen_cache(facts, user="${_sitestack_user}")  # USER (else id -un), checked when the helper runs
    miopen = sh_expanding(cache) if cache else ""
    # the run-time checks the helper embeds (sitestack/validation/runtime_checks.py)
    checks = ("number", "word", "private_dir") if miopen else ("number",)
    return {
        "site": inputs.site,
        "description": facts.description,
        "path": f"{inputs.bin}/{HELPER}",
        "launch": f"{inputs.bin}/{LAUNCH}",
        "launch_name": LAUNCH,
        "hostlist": f"{inputs.bin}/{HOSTLIST}",
        "port_base": jobs.PORT_BASE,
        "port_span": jobs.PORT_SPAN,
        "env": env,
        # the users' choices at submission (facts.env_defaults), which the job template names
        "defaults": [(k, v) for k, v in env if k in facts.env_defaults],
        "pass_in": passed_in(facts.container, [k for k, _ in env if k in facts.env_defaults]),
        "stacks": stacks,
        "cards": (facts.gpu.per_node // stacks) if stacks else 0,
        "node_cores": facts.node.cores,
        "ranks_per_node": v.ranks_per_node,
        "cores_per_rank": facts.gpu.cores_per_gpu or 0,
        "unit": facts.gpu.unit if facts.gpu.vendor != "none" else "rank",
        "masks": ",".join(masks_mod.rank_masks(binding)) if binding else "",
        "miopen": miopen,
        "checks": runtime_checks.functions(*checks),
        "check_names": checks,
        "max_id": runtime_checks.MAX_ID,
        "max_count": runtime_checks.MAX_COUNT,
    }


def _render(name: str, inputs: LaunchInputs) -> str:
    """Template ``name`` with the inputs' context, or its text from an earlier run with the same
    context (:func:`sitestack.core.templates.cached_text`: a no-op run then imports no Jinja2)."""
    context = _context(inputs)
    return templates.cached_text([jobs.TEMPLATES], repr((name, sorted(context.items()))),
                                 lambda: jobs.environment().get_template(name).render(**context))


def render_helper(inputs: LaunchInputs) -> str:
    """``sitestack-launch-env``."""
    return _render("launch-env.sh.j2", inputs)


def render_launch(inputs: LaunchInputs) -> str:
    """``sitestack-launch``."""
    return _render("launch.sh.j2", inputs)


def checked_name(name: str) -> str:
    """``name``, a shell variable name (the stage script reads it unquoted, as ``${NAME:-}``); anything
    else is refused, never rendered."""
    if name and not SHELL_NAME.fullmatch(name):
        raise ValueError(f"{name!r} is not a shell variable name")
    return name


def render_stage(inputs: LaunchInputs) -> str:
    """``sitestack-stage-env`` (only where the site stages its env)."""
    if not inputs.stage or inputs.scratch is None:
        raise ValueError("the site does not stage its env (facts.node.stage_env) or has no pack")
    own = next((p for p in inputs.packs if p.own and p.pack), None)
    # The script follows what the unpacked copy holds, not the facts: the pack's kind is decided when
    # it is made, from what the env is (sitestack.installs.staging.env_kind), after this is rendered.
    return jobs.environment().get_template("stage-env.sh.j2").render(
        site=inputs.site, path=f"{inputs.bin}/{STAGE}", packs=inputs.packs, own=own,
        packed=", ".join(p.module for p in inputs.packs if p.pack), scratch=sh_expanding(inputs.scratch),
        scratch_text=inputs.scratch, conda_unpack=CONDA_UNPACK, venv_unpack=UNPACK_PROGRAM,
        generation_vars=sorted({checked_name(p.generation_var) for p in inputs.packs if p.generation_var}),
        checks=runtime_checks.functions("number", "word"), check_names=("number", "word"),
        max_id=runtime_checks.MAX_ID, max_count=runtime_checks.MAX_COUNT,
        # run by one task per node: the scratch directory (private under any umask where it is made
        # here), then the job's copy in it, private (runtime_checks.PRIVATE_DIR); removal of the copy
        private_script=runtime_checks.script(("private_dir",), '(umask 077 && mkdir -p -- "$1") 2>/dev/null',
                                             '_sitestack_private_dir sitestack-stage-env "$2"'),
        remove_script=runtime_checks.script(("remove_own",), '_sitestack_remove_own "$1"'),
        user_in_scratch="${USER}" in inputs.scratch)


def helper_files(inputs: LaunchInputs) -> dict[str, tuple[str, int]]:
    """Every file of the install-launch-env step: name in ``bin`` -> (content, mode)."""
    files = {HELPER: (render_helper(inputs), 0o644), LAUNCH: (render_launch(inputs), 0o755),
             HOSTLIST: (single_file("hostlist"), 0o755), BIND_RANK: (single_file("bind_rank"), 0o755)}
    if inputs.stage:
        files[STAGE] = (render_stage(inputs), 0o644)
    return files


def template_launcher(facts: Facts) -> str:
    """srun, or mpiexec where the site's jobs start with it (Dawn: Intel MPI's Hydra)."""
    first = jobs.validation_of(facts).launchers[0]
    if first in LAUNCHERS and LAUNCHERS[first].mpi:
        return first
    # else the site's MPI launch command (facts mpi.launcher: srun, mpiexec or mpirun)
    return "srun" if facts.mpi.launcher == "srun" else "mpiexec"


def _bind_args(bind: str | None, ctx: dict[str, Any]) -> str:
    """What ``sitestack-bind-rank`` is given under torchrun, as srun binds a task: the helper's CPU_MASKS, or
    the cores of a rank; "" for an equal share of the agent's CPUs."""
    if bind == "mask" and ctx["masks"]:
        return ' --cpu-masks "$CPU_MASKS"'
    return f" --cores-per-rank {ctx['cores_per_rank']}" if ctx["cores_per_rank"] else ""


def render_job_template(inputs: LaunchInputs, launcher: str | None = None) -> str:
    """The job script ``invoke job-template`` prints: modules, the stack module, the helper, one launch with
    ``launcher`` (one of :data:`~sitestack.onsite.launchers.TEMPLATE_LAUNCHERS`; None: :func:`template_launcher`;
    ValueError for another)."""
    facts = inputs.facts
    launcher = launcher or template_launcher(facts)
    if launcher not in TEMPLATE_LAUNCHERS:
        raise ValueError(f"job-template launcher {launcher!r} is not one of {', '.join(TEMPLATE_LAUNCHERS)}")
    v = jobs.validation_of(facts)
    ctx = _context(inputs)
    job = jobs.job_context(jobs.JobInputs(site=inputs.site, facts=facts, dir="", env={}), v.launchers[0]
                           if v.launchers[0] in LAUNCHERS else "srun")
    sbatch = [line for line in job["sbatch"] if not line.startswith(("--ntasks-per-node=", "--time="))]
    sbatch.append(f"--time={facts.scheduler.time}")
    if v.bind == "mask" and ctx["masks"]:
        bind = ' --cpu-bind=mask_cpu:"$CPU_MASKS"'
    elif v.bind == "gpu-closest":
        bind = ' --cpus-per-task="$CPUS_PER_TASK" --gpus-per-task=1 --gpu-bind=closest'
    else:
        bind = ' --cpus-per-task="$CPUS_PER_TASK"'
    container = None
    exec_prefix = ""
    if facts.container:
        # the row's forms (validation/container_forms.py); the launch helper's pass_in covers a runtime
        # that passes values by variable, the options the users' choices for one that takes them on its
        # command line
        container = script_container(facts.container, gpus=facts.gpu.vendor != "none",
                                     binds=(*facts.container.bind, inputs.bin.rsplit("/", 1)[0]),
                                     pass_names=list(facts.env_defaults) if not ctx["pass_in"] else [],
                                     append_binds=True)
        exec_prefix = container["exec_prefix"]   # (the image's sbatch option came with the job's)
    text = prelude(facts)
    return jobs.environment().get_template("job-template.sbatch.j2").render(
        **ctx, sbatch=sbatch, sbatch_tasks=v.sbatch_tasks, launcher=launcher,
        launcher_options=jobs.launcher_options(facts, launcher), bind_rank=f"{inputs.bin}/{BIND_RANK}",
        bind_args=_bind_args(v.bind, ctx),
        prelude=text, module_root=inputs.module_root, stack_module=inputs.stack_module,
        launch_env=f"{inputs.bin}/{HELPER}", stage=inputs.stage, stage_env=f"{inputs.bin}/{STAGE}",
        scratch_text=inputs.scratch or "", container=container, exec_prefix=exec_prefix,
        srun_mpi=job["srun_mpi"], bind=bind, mpi_flavour=facts.mpi.flavour, miopen_remove=job["miopen_remove"])
