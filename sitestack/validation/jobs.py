"""The validation job of a site, rendered from its facts: batch scripts, check config, README.

Everything here is a pure function of the site's facts (and the install directory), so the
rendered files are golden-tested per site and re-rendering an unchanged site changes nothing. Templates
live in ``sitestack/validation/templates/`` (Jinja2, ``StrictUndefined``, no timestamps): ``job.sbatch.j2``
is the base, one child template per launcher fills its ``launch`` block, and ``README.md.j2`` is the users'
README. A re-render of unchanged inputs reads the earlier text (:func:`sitestack.core.templates.cached_text`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from sitestack.core import templates
from sitestack.core.quoting import sh, sh_default, sh_expanding
from sitestack.core.shipped import shipped
from sitestack.model import comm_libraries, comm_settings
from sitestack.model.miopen import MIOPEN_KEYS, miopen_cache
from sitestack.model.site import BusBandwidth, Facts, Validation
from sitestack.model.siteenv import LOAD_FAILED, prelude
from sitestack.model.slurmtime import slurm_seconds
from sitestack.onsite.launchers import LAUNCHERS
from sitestack.validation import masks as masks_mod
from sitestack.validation import runtime_checks
from sitestack.validation.container_forms import script_container
from sitestack.validation.results_dir import OUT_REFUSED, RESULT_SPACE_MIB, RESULTS_CHECK

if TYPE_CHECKING:
    import jinja2

TEMPLATES = Path(__file__).resolve().parent / "templates"
#: The programs of the job directory: the check program and its package, its report, the NCCL log
#: reader, the site's history, the start-up probe, the host-list parser, the binder of torchrun's ranks and
#: the host's fingerprint (:mod:`sitestack.onsite`, shipped whole by :func:`sitestack.core.shipped.shipped`).
PROGRAMS = ("ddp_check.py", "ddp_report.py", "nccl_log.py", "history.py", "import_probe.py", "hostlist.py",
            "bind_rank.py", "fingerprint.py")

#: MASTER_PORT = PORT_BASE + job id % PORT_SPAN: below Linux's ephemeral range (32768-60999), so
#: an outgoing connection never holds it; two jobs collide only when their ids differ by a
#: multiple of PORT_SPAN, and then the process-group check names the taken port.
PORT_BASE = 20000
PORT_SPAN = 10000

#: Intel's Level Zero device hierarchy (FLAT: each stack of a card is a root device; COMPOSITE: each
#: card), which decides a Dawn node's ranks and cores per rank
#: (setup_mpi.sh of https://github.com/kh296/dawn-containers).
HIERARCHY = "ZE_FLAT_DEVICE_HIERARCHY"


#: The built packages the check program imports when the stack includes them (their import names).
IMPORTED = ("mpi4py",)

#: Seconds the guard around the launcher waits after the ranks' deadline (ddpcheck.guard.GUARD_GRACE).
GUARD_GRACE = 20


def time_limit(job_seconds: int) -> int:
    """The checks' time limit inside a job of ``job_seconds``: the job's time less a margin (a tenth,
    at least a minute) and the guard's grace, so the result is written before the scheduler kills
    the job; never below a minute."""
    return max(60, job_seconds - max(60, job_seconds // 10) - GUARD_GRACE)


def master_port(job_id: int) -> int:
    """The job's MASTER_PORT, as the batch script computes it."""
    return PORT_BASE + job_id % PORT_SPAN


def nccl_expectation(facts: Facts) -> dict[str, str | None] | None:
    """What the site's NCCL/RCCL logs must show between nodes (``nccl_log.Expectation``'s fields),
    or None where the site's collectives are not NCCL/RCCL (oneCCL, Gloo print no NCCL logs).

    The network plugin (aws-ofi-rccl, aws-ofi-nccl) means OFI with the site's libfabric provider;
    without one, an InfiniBand fabric means NCCL's IB transport (or the IBext plugin), Slingshot
    means OFI all the same (NCCL has no native transport for it), and any other fabric (ethernet,
    loopback) leaves NCCL's TCP sockets as the expected transport.
    """
    if facts.collectives not in ("nccl", "rccl"):
        return None
    net = facts.network
    if net.net_plugin:
        return {"transport": "ofi", "provider": net.libfabric_provider, "plugin": net.net_plugin}
    fabric = net.fabric.lower()
    if fabric.startswith("infiniband"):
        return {"transport": "ib", "provider": None, "plugin": None}
    if fabric.startswith("slingshot"):
        return {"transport": "ofi", "provider": net.libfabric_provider, "plugin": None}
    return {"transport": "socket", "provider": None, "plugin": None}


def validation_of(facts: Facts) -> Validation:
    """The site's validation facts with defaults filled in."""
    given = facts.validation or Validation()
    launchers = given.launchers or (facts.mpi.launcher if facts.mpi.launcher != "mpirun" else "mpiexec",)
    ranks = given.ranks_per_node or (facts.gpu.per_node if facts.gpu.vendor != "none" and facts.gpu.per_node else 2)
    return dataclasses.replace(given, launchers=tuple(launchers), ranks_per_node=ranks,
                               bind=given.bind or default_bind(facts))


def default_bind(facts: Facts) -> Literal["mask", "launcher"]:
    """Pin each rank with CPU masks where the site states its GPU-to-core map, else leave it to the launcher."""
    return "mask" if facts.gpu.cpu_bind is not None else "launcher"


def environment() -> jinja2.Environment:
    """The job's templates (``validation/templates/``), strict; ``|q`` quotes a value for the shell."""
    return templates.environment([TEMPLATES], {"q": lambda v: sh(str(v))})


@dataclass(frozen=True)
class JobInputs:
    """What a site's job depends on besides the facts."""

    site: str
    facts: Facts
    dir: str  # where the job is installed, e.g. {prefix}/validation
    env: Mapping[str, str]  # facts.env with {user}/{home} left to the job ($USER, $HOME)
    python: str | None = None  # the Python that runs the checks (default facts.python.executable)
    description: str = ""
    stage_env: str | None = None  # sitestack-stage-env, where the site stages its env on node-local storage
    stack_includes: tuple[str, ...] = ()  # the built packages (recipes) the site's stack includes: mpi4py, horovod
    stack_module: str | None = None  # the stack's module (pytorch/2.3.1-gpu), loaded by the job as users load it
    module_root: str | None = None  # where that module file is (facts.modules.install_root)
    manifest: str | None = None  # the stack's manifest, which `invoke validate` checks the job's imports against
    checks_need: tuple[str, ...] = ()  # what the checks import besides torch (venv_stack.CHECK_NEEDS)
    prefix: str | None = None  # the site's install prefix (default: the parent of dir), bound into a container
    launch_env: str | None = None  # sitestack-launch-env, sourced for the geometry, port, hosts, MIOpen and facts.env


def script_name(launcher: str) -> str:
    return f"validate-{launcher}.sbatch"


def job_context(inputs: JobInputs, launcher: str) -> dict[str, Any]:
    """The template variables of one batch script (``launcher`` one of
    :data:`~sitestack.onsite.launchers.LAUNCHERS`; ValueError
    for another, or for ``validation.bind: mask`` on a site without ``gpu.cpu_bind``)."""
    facts = inputs.facts
    v = validation_of(facts)
    if launcher not in LAUNCHERS:
        raise ValueError(f"unknown launcher {launcher!r}")
    stacks = 2 if facts.gpu.unit == "stack" else 0
    env_items, miopen = _job_env(inputs, stacks)
    geometry = _geometry_context(inputs, v, stacks)
    container, exec_prefix = _container_context(inputs)
    job_seconds = slurm_seconds(facts.scheduler.time)
    return {
        "site": inputs.site,
        "launcher": launcher,
        "script": script_name(launcher),
        "local": LAUNCHERS[launcher].local,  # the script also runs on a node without a scheduler
        "tune": False,  # the tuning sweep's script (tune_jobs) renders the same templates
        "dir": inputs.dir,
        # with the stack's module loaded, its Python is the first on PATH, as for its users
        "python": "python" if inputs.stack_module else (inputs.python or facts.python.executable),
        "prelude": prelude(facts).rstrip("\n") + "\n" if prelude(facts) else "",
        "stack_module": inputs.stack_module,
        "load_failed": LOAD_FAILED,
        "out_refused": OUT_REFUSED,
        "result_space_mib": RESULT_SPACE_MIB,
        "results_check": RESULTS_CHECK,
        "module_root": inputs.module_root,
        "sbatch": _sbatch_options(facts, v) + (container["sbatch"] if container else []),
        "env": env_items,
        "miopen": miopen,
        "container": container,
        "exec_prefix": exec_prefix,
        "stage_env": inputs.stage_env or "",
        "launch_env": inputs.launch_env or "",
        "job_seconds": job_seconds,
        "time_limit": time_limit(job_seconds),
        "guard_grace": GUARD_GRACE,
        # the guard runs on the node, outside the container: the host's python3 there
        "guard_python": "python3" if container else '"$PYTHON" python3',
        **geometry,
        **_launch_context(facts, launcher),
        **runtime_checks.job_context(),  # what the script reads when it runs, checked first
    }


def _sbatch_options(facts: Facts, v: Validation) -> list[str]:
    """The job's ``#SBATCH`` options: tasks per node where the site asks for them, the scheduler's
    partition, account and gres where set, its time, then the scheduler's own options."""
    sched = facts.scheduler
    sbatch = []
    if v.sbatch_tasks:
        sbatch.append(f"--ntasks-per-node={v.ranks_per_node}")
    for key, value in (("partition", sched.partition), ("account", sched.account), ("gres", sched.gres)):
        if value:
            sbatch.append(f"--{key}={value}")
    sbatch.append(f"--time={sched.time}")
    sbatch.extend(sched.options)
    return sbatch


def _job_env(inputs: JobInputs, stacks: int) -> tuple[list[tuple[str, str]], list[str]]:
    """The variables the job itself exports (name, shell-quoted value), and the MIOpen cache variables
    whose directories it makes on every node."""
    env_items = []
    # With the users' launch helper, facts.env and the MIOpen cache (model/miopen.py: per job) are its; the
    # job only makes that cache on every node and removes it at the end. Without it (--python, no
    # install-launch-env step) the job's own, from the same rule.
    for key, value in ({} if inputs.launch_env else inputs.env).items():
        if (stacks and key == HIERARCHY) or key in MIOPEN_KEYS:
            continue  # HIERARCHY: the default of the geometry below, which a hierarchy chosen at submission overrides
        # a value the job was submitted with (not empty) is kept, as the module and the launch helper keep it
        env_items.append((key, sh_default(key, value)))
    cache = miopen_cache(inputs.facts, user="${USER}")
    if cache is None:
        return env_items, []
    if not inputs.launch_env:
        env_items += [(key, sh_expanding(cache)) for key in MIOPEN_KEYS]
    return env_items, list(MIOPEN_KEYS)


def _container_context(inputs: JobInputs) -> tuple[dict[str, Any] | None, str]:
    """The site's container for the templates (validation/container_forms.py: the runtime row's forms)
    and the prefix that runs a command in it; ``(None, "")`` for a site without a container."""
    facts = inputs.facts
    if not facts.container:
        return None, ""
    container = script_container(
        facts.container, gpus=facts.gpu.vendor != "none",
        # the prefix holds the stack's Python (PYTHON) and everything it installed
        binds=(*facts.container.bind, inputs.prefix or str(Path(inputs.dir).parent), "$VALIDATION_DIR", "$OUT"),
        # the user's choices (facts.env_defaults) into the image; with the launch helper, the helper's
        pass_names=[] if inputs.launch_env else list(facts.env_defaults))
    return container, container["exec_prefix"]


def _geometry_context(inputs: JobInputs, v: Validation, stacks: int) -> dict[str, Any]:
    """The template variables of the node's geometry: ranks, cards and stacks, cores, the rank masks
    and the port range (ValueError for ``bind: mask`` without ``gpu.cpu_bind``)."""
    facts = inputs.facts
    binding = masks_mod.Binding.from_facts(facts)
    if v.bind == "mask" and not binding:
        raise ValueError("validation.bind is mask, but the site has no gpu.cpu_bind to derive masks from")
    return {
        "ranks_per_node": v.ranks_per_node,
        "stacks": stacks,
        "cards": (facts.gpu.per_node // stacks) if stacks else 0,
        "hierarchy": inputs.env.get(HIERARCHY) or "FLAT",
        "node_cores": facts.node.cores or 1,
        "cores_per_rank": facts.gpu.cores_per_gpu or 0,
        "port_base": PORT_BASE,
        "port_span": PORT_SPAN,
        "bind": v.bind,
        "masks": ",".join(masks_mod.rank_masks(binding)) if binding else "",
        "per_node": facts.gpu.per_node or v.ranks_per_node,
        "unit": facts.gpu.unit if facts.gpu.vendor != "none" else "rank",
    }


def _launch_context(facts: Facts, launcher: str) -> dict[str, Any]:
    """The template variables of the launchers: the one-process-per-node command, the two-rank MPI
    probe's command (srun, Open MPI's or MPICH's mpiexec), srun's PMI flag, and NCCL's network."""
    srun_mpi = " --mpi=pmi2" if facts.mpi.flavour in ("mpich", "intel-mpi") else ""
    mpi_launcher = facts.mpi.launcher
    if mpi_launcher == "srun":
        per_node = 'srun --nodes="$NNODES" --ntasks="$NNODES" --ntasks-per-node=1'
        probe = f'srun --nodes=$(( NNODES > 1 ? 2 : 1 )) --ntasks=2 --ntasks-per-node="$PROBE_PER_NODE"{srun_mpi}'
    elif facts.mpi.flavour == "openmpi":
        per_node = 'mpiexec -n "$NNODES" -N 1 --host "$NODELIST"'
        probe = 'mpiexec -n 2 -N "$PROBE_PER_NODE" --host "$(echo "$NODELIST" | sed "s/\\([^,]*\\)/\\1:2/g")"'
    else:
        per_node = 'mpiexec -n "$NNODES" -ppn 1 -hosts "$NODELIST"'
        probe = 'mpiexec -n 2 -ppn "$PROBE_PER_NODE" -hosts "$NODELIST"'
    return {
        "per_node_command": per_node,
        "probe_command": probe,
        "srun_mpi": srun_mpi,
        "launcher_options": launcher_options(facts, launcher),
        "srun_used": launcher == "srun" or mpi_launcher == "srun",
        "mpi_flavour": facts.mpi.flavour,
        "nccl": facts.collectives in ("nccl", "rccl"),
    }


def launcher_options(facts: Facts, launcher: str) -> str:
    """``facts.scheduler.launcher_options`` of ``launcher`` as they follow its command: each a space and one
    shell word (the one place these facts reach a script), or "" where the site gives none."""
    return "".join(" " + sh(option) for option in facts.scheduler.launcher_options.get(launcher, ()))


def render_job(inputs: JobInputs, launcher: str) -> str:
    """One batch script."""
    ctx = job_context(inputs, launcher)
    name = LAUNCHERS[launcher].template
    return templates.cached_text([TEMPLATES], repr((name, sorted(ctx.items()))),
                                 lambda: environment().get_template(name).render(**ctx))


def check_config(inputs: JobInputs) -> dict[str, Any]:
    """What ``ddp_check.py`` expects on this site (``check-config.json``)."""
    facts = inputs.facts
    v = validation_of(facts)
    binding = masks_mod.Binding.from_facts(facts)
    cpu_bind = None
    if binding:
        cpu_bind = {"gpu_cpus": [masks_mod.cpus_for_gpu(binding, g) for g in range(len(binding.gpu_to_numa))],
                    "masks": masks_mod.rank_masks(binding), "node_cores": binding.node_cores}

    def ref(r: BusBandwidth | None) -> dict[str, Any] | None:
        return None if r is None else {"busbw_gbs": r.busbw_gbs, "lower": r.lower, "message_bytes": r.message_bytes,
                                       "source": r.source}

    return {
        "site": inputs.site,
        "gpu_vendor": facts.gpu.vendor,
        "gpu_unit": facts.gpu.unit,
        "collectives": facts.collectives,
        "ranks_per_node": v.ranks_per_node,
        "torch_version": facts.torch.version,
        "cpu_bind": cpu_bind,
        "mpi": {"flavour": facts.mpi.flavour, "library_match": facts.mpi.library_match},
        "network": {"fabric": facts.network.fabric, "net_plugin": facts.network.net_plugin,
                    "libfabric_provider": facts.network.libfabric_provider,
                    "nccl_net": comm_libraries.net_names(facts.network.net_plugin) if facts.network.net_plugin else [],
                    "nccl_expect": nccl_expectation(facts)},
        "bandwidth": {"single_node": ref(v.single_node), "multi_node": ref(v.multi_node)},
        "compute": None if v.compute is None else {"gflops": v.compute.gflops, "lower": v.compute.lower,
                                                   "source": v.compute.source},
        "stack": {"includes": sorted(inputs.stack_includes), "module": inputs.stack_module,
                  "manifest": inputs.manifest, "launch_env": inputs.launch_env, "needs": ["torch", *inputs.checks_need, *sorted(
                      r for r in inputs.stack_includes if r in IMPORTED)]},
        "history_dir": f"{(inputs.prefix or str(Path(inputs.dir).parent)).rstrip('/')}/history",
        "settings": comm_settings.job_settings(facts),
    }


def render_readme(inputs: JobInputs) -> str:
    facts = inputs.facts
    v = validation_of(facts)
    ctx = job_context(inputs, v.launchers[0])
    library = {"nccl": "NCCL", "rccl": "RCCL", "oneccl": "oneCCL", "gloo": "Gloo"}[facts.collectives]
    backend = {"nccl": "nccl", "rccl": "nccl (RCCL)", "oneccl": "xccl or ccl (oneCCL)", "gloo": "gloo"}[facts.collectives]
    if v.bind == "mask":
        affinity = "each rank runs on the usable cores of the CCD/NUMA domain closest to its GPU (`mask_cpu` masks derived from `gpu.cpu_bind`)"
    elif v.bind == "gpu-closest" and facts.gpu.cpu_bind:
        affinity = "each rank's cores lie in the NUMA domain of the GPU Slurm gave it (`--gpu-bind=closest`, checked against `gpu.cpu_bind`)"
    else:
        affinity = "ranks are not all pinned to one core (the site states no GPU-to-core map)"
    refs = []
    for label, r in (("one node", v.single_node), ("two or more nodes", v.multi_node)):
        if r and r.busbw_gbs is not None:
            refs.append(f"{r.busbw_gbs * (1 + r.lower):.4g} GB/s on {label} (reference {r.busbw_gbs:g} GB/s)")
        elif r:
            refs.append(f"{1 + r.lower:.0%} of the busbw calibrated on this site on {label}")
    bandwidth = "; ".join(refs) if refs else "a value reported, not judged (no reference in the site facts)"
    compute = (f" and reaches {v.compute.gflops * (1 + v.compute.lower):.4g} GFLOPS (reference {v.compute.gflops:g} GFLOPS)"
               if v.compute and v.compute.gflops is not None else
               f" and reaches {1 + v.compute.lower:.0%} of the rate calibrated on this site" if v.compute
               else " (the rate is reported, not judged against a reference: none in the site facts)")
    expect = nccl_expectation(facts)
    names = {"ofi": "OFI", "ib": "InfiniBand (NCCL's IB transport or the IBext plugin)", "socket": "TCP sockets"}
    if expect is None:
        plugin_text, nccl_log_args = f"skipped: {library} uses no NCCL network plugin", ""
    else:
        through = "".join(f" {word} {expect[key]}" for key, word in (("plugin", "through"), ("provider", "with provider"))
                          if expect[key])
        plugin_text = (f"on two or more nodes the NCCL_DEBUG=INFO log shows every host using {names[str(expect['transport'])]}"
                       f"{through}; otherwise the cause (plugin not found or failed, wrong provider or plugin, socket fallback)")
        nccl_log_args = "".join(f" --expect-{key} {sh(str(value))}" for key, value in expect.items() if value)
    variables = dict(
        site=inputs.site, description=inputs.description or facts.description, dir=inputs.dir,
        jobs=[{"launcher": name, "script": script_name(name)} for name in v.launchers],
        python=ctx["python"], container=ctx["container"], ranks_per_node_text=(
            "GPUs per node from the allocation and ZE_FLAT_DEVICE_HIERARCHY" if ctx["stacks"] else str(v.ranks_per_node)),
        library=library, backend=backend, affinity_text=affinity, bandwidth_text=bandwidth, compute_text=compute, plugin_text=plugin_text,
        nccl_log_args=nccl_log_args,
        mpi_flavour=facts.mpi.flavour, library_match=facts.mpi.library_match, time_limit=ctx["time_limit"],
        guard_grace=GUARD_GRACE, out_refused=OUT_REFUSED, result_space_mib=RESULT_SPACE_MIB)
    return templates.cached_text([TEMPLATES], repr(("README.md.j2", sorted(variables.items()))),
                                 lambda: environment().get_template("README.md.j2").render(**variables))


def job_files(inputs: JobInputs) -> dict[str, tuple[str, int]]:
    """Every text file of the installed job: relative path -> (content, mode)."""
    v = validation_of(inputs.facts)
    files: dict[str, tuple[str, int]] = {}
    files.update(shipped(PROGRAMS))
    files["check-config.json"] = (json.dumps(check_config(inputs), indent=2, sort_keys=True) + "\n", 0o644)
    for launcher in v.launchers:
        files[f"jobs/{script_name(launcher)}"] = (render_job(inputs, launcher), 0o755)
    files["README.md"] = (render_readme(inputs), 0o644)
    return files
