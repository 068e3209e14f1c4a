"""The tuning sweep of a site, rendered from its facts: the plan (``tune-plan.json``) and one batch
script per launcher (``jobs/tune-<launcher>.sbatch``), installed beside the validation job.

The plan is the one-factor-at-a-time grid of ``facts.tuning`` (:meth:`sitestack.model.facts.Tuning.points`):
point ``p00`` with every tuning variable unset, then one point per (variable, candidate), then the default
again (it brackets the sweep, so a drift shows in the default's own samples). The batch
script is the validation job's (:mod:`sitestack.validation.jobs`: modules, launch helper, geometry, checks
of run-time values, MASTER_ADDR, time limit) with the guard replaced by the sweep driver
(``ddp_check.py --sweep``, :mod:`sitestack.onsite.ddpcheck.sweep`), which runs the same launcher line
once per point. Pure functions of the facts, like the validation job's files; nothing at all for a
site without ``facts.tuning``.
"""

from __future__ import annotations

import json
from typing import Any

from sitestack.core import templates
from sitestack.model.container_facts import runtime_of
from sitestack.model.site import Facts
from sitestack.model.slurmtime import slurm_seconds, slurm_time
from sitestack.onsite.launchers import LAUNCHERS, tune_launchers
from sitestack.validation.jobs import TEMPLATES, JobInputs, environment, job_context, time_limit, validation_of

PLAN = "tune-plan.json"
PLAN_SCHEMA = "sitestack-tune-plan/1"
#: Sizes measured on a CPU-only site when the facts name none: 64 KiB, 1 MiB, 4 MiB (gloo on a CPU
#: reaches its plateau by 4 MiB; docs/validation.md).
CPU_SIZES = (65536, 1048576, 4194304)
#: The validation job's reference size where the site states none (validation_facts.BusBandwidth).
REFERENCE_BYTES = 134217728


def tune_sizes(facts: Facts) -> tuple[int, ...]:
    """The message sizes of the sweep: ``facts.tuning.sizes``, else 64 KiB, 1 MiB and 4 MiB on a CPU
    site, 1 MiB, 16 MiB and the validation reference size on a GPU site."""
    if facts.tuning and facts.tuning.sizes:
        return facts.tuning.sizes
    if facts.gpu.vendor == "none":
        return CPU_SIZES
    v = validation_of(facts)
    reference = next((r.message_bytes for r in (v.single_node, v.multi_node) if r), REFERENCE_BYTES)
    return tuple(sorted({1 << 20, 16 << 20, reference}))


def tune_plan(site: str, facts: Facts) -> dict[str, Any] | None:
    """The plan the sweep job runs (``tune-plan.json``), or None for a site with nothing to tune."""
    tuning = facts.tuning
    if tuning is None:
        return None
    return {
        "schema": PLAN_SCHEMA,
        "site": site,
        "sizes": list(tune_sizes(facts)),
        "repeats": tuning.repeats,
        "point_seconds": tuning.point_seconds,
        "min_gain": tuning.min_gain,
        "notes": {name: v.note for name, v in tuning.variables.items()},
        "variables": list(tuning.variables),
        "points": [{"id": f"p{i:02d}", "label": label, "settings": settings}
                   for i, (label, settings) in enumerate(tuning.points())],
    }


def tune_script_name(launcher: str) -> str:
    """The sweep script of ``launcher`` in the job's ``jobs/`` directory."""
    return f"tune-{launcher}.sbatch"


def tune_job_seconds(facts: Facts) -> int:
    """The sweep job's wall time: what every point needs to run to its time limit
    (:meth:`sitestack.model.facts.Tuning.sweep_seconds`), at least the validation job's time, at most
    ``facts.scheduler.max_job_time`` where set (loading the playbook refuses a plan that cannot fit)."""
    seconds = slurm_seconds(facts.scheduler.time)
    if facts.tuning:
        seconds = max(seconds, facts.tuning.sweep_seconds())
    if facts.scheduler.max_job_time:
        seconds = min(seconds, slurm_seconds(facts.scheduler.max_job_time))
    return seconds


def render_tune_job(inputs: JobInputs, launcher: str) -> str:
    """One sweep batch script: the launcher's validation template with the sweep driver around it, its
    ``--time`` the plan's (:func:`tune_job_seconds`), its driver told the container runtime's prefix for
    variables inside the image where the site has one."""
    facts = inputs.facts
    ctx = {**job_context(inputs, launcher), "tune": True, "script": tune_script_name(launcher)}
    seconds = tune_job_seconds(facts)
    ctx.update(sbatch=[f"--time={slurm_time(seconds)}" if line.startswith("--time=") else line for line in ctx["sbatch"]],
               job_seconds=seconds, time_limit=time_limit(seconds),
               container_env=(runtime_of(facts.container).env_prefix or "") if facts.container else "")
    name = LAUNCHERS[launcher].template
    return templates.cached_text([TEMPLATES], repr((name, sorted(ctx.items()))),
                                 lambda: environment().get_template(name).render(**ctx))


def tune_files(inputs: JobInputs) -> dict[str, tuple[str, int]]:
    """The sweep's files (relative path -> (content, mode)): the plan and a script per launcher of the
    validation job that has one; none without ``facts.tuning``."""
    plan = tune_plan(inputs.site, inputs.facts)
    if plan is None:
        return {}
    files = {PLAN: (json.dumps(plan, indent=2) + "\n", 0o644)}
    for launcher in validation_of(inputs.facts).launchers:
        if launcher in tune_launchers():
            files[f"jobs/{tune_script_name(launcher)}"] = (render_tune_job(inputs, launcher), 0o755)
    return files
