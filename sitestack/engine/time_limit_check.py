"""Before ``invoke validate`` submits the job: the checks' time limit against how long a healthy run
of this stack took on this site (its history, :mod:`sitestack.onsite.ddpcheck.time_budget`). A limit
shorter than a healthy run is refused, one shorter than its margin is warned of; the job is told the
healthy duration so a run that reaches the limit is named "time limit too short", not a hang."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, MutableMapping
from typing import Any

from sitestack.core import envvars
from sitestack.core.errors import SitestackError
from sitestack.core.report import Reporter
from sitestack.model.site import Facts
from sitestack.model.slurmtime import slurm_seconds
from sitestack.onsite.ddpcheck.time_budget import FLOOR, HEALTHY_VAR, MARGIN, healthy_seconds, too_short
from sitestack.validation.jobs import time_limit


def job_time_limit(facts: Facts, environ: Mapping[str, str]) -> tuple[float | None, str]:
    """(the checks' limit the job will use, where it comes from): $SITESTACK_TIME_LIMIT of the
    submitting environment (the batch script takes it first), else the one the job derives from the
    site's ``scheduler.time``. None for a value that is not a number (the job refuses it by name)."""
    given = envvars.get("SITESTACK_TIME_LIMIT", environ)   # a value out of range: one message naming it
    if given is not None:
        return float(given), "SITESTACK_TIME_LIMIT"
    return float(time_limit(slurm_seconds(facts.scheduler.time))), f"scheduler.time {facts.scheduler.time}"


def check_time_limit(records: list[dict[str, Any]], facts: Facts, env: MutableMapping[str, str],
                     reporter: Reporter, environ: Mapping[str, str] | None = None) -> None:
    """Refuse a limit below the healthy duration of ``records`` (the site's history), warn below its
    margin or, with no healthy run on record, below the job's own floor; put the healthy duration in
    the job's ``env``."""
    limit, source = job_time_limit(facts, os.environ if environ is None else environ)
    healthy = healthy_seconds(records)
    if healthy is not None:
        env[HEALTHY_VAR] = f"{healthy:g}"
    if limit is None:
        return
    short = too_short(limit, healthy)
    cannot = too_short(limit, healthy, margin=1)
    if cannot and healthy is not None:
        raise SitestackError(f"{cannot} ({source}): the run could not finish; give it at least "
                             f"{math.ceil(healthy * MARGIN)}s (SITESTACK_TIME_LIMIT, or the site's scheduler.time)")
    if short:
        reporter.note(f"warning: {short} ({source}): runs vary, and a loaded node takes longer")
    elif healthy is None and limit < FLOOR:
        reporter.note(f"warning: a time limit of {limit:.0f}s ({source}) is below the {FLOOR}s the job gives itself "
                      "at least, and the site's history has no passed run to compare it with: a run that needs longer "
                      "ends at the limit")
