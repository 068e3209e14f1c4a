"""The tuning plan (``tune-plan.json``, schema ``sitestack-tune-plan/1``) as the sweep driver and the
ranks read it at run time: every value checked for its form before use, a bad one refused with one
:class:`PlanError` naming the file and the key (the program prints it as one line, no traceback).

The install-validation-job step writes the plan from ``facts.tuning``; ``$SITESTACK_TUNE_PLAN`` may name
another (a confirmation run), so the file is read like any input of the job.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from typing import Any

from ..fileio import ReadError, read_json

SCHEMA = "sitestack-tune-plan/1"
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
POINT_ID = re.compile(r"p[0-9]{2,3}")
#: A plan variable's name: none the job itself needs or sets (the same rule as the playbook's,
#: ``sitestack.model.tuning_facts.TUNING_NAME``, which the tests hold equal; this program imports nothing of sitestack).
TUNING_NAME = re.compile(
    r"(?=SITESTACK_CHECK_FAULT$|(?!(?:PATH|LD_LIBRARY_PATH|LD_PRELOAD|PYTHONPATH|PYTHONHOME|HOME|USER|TMPDIR|MASTER_ADDR"
    r"|MASTER_PORT|RANK|WORLD_SIZE|LOCAL_RANK|LOCAL_WORLD_SIZE|GROUP_RANK|ROLE_RANK|NODELIST|NNODES|TASKS_PER_NODE"
    r"|CPUS_PER_TASK|CPU_MASKS|MODULEPATH|LOADEDMODULES|NCCL_DEBUG|NCCL_DEBUG_SUBSYS|NCCL_DEBUG_FILE|NCCL_NET"
    r"|MIOPEN_USER_DB_PATH|MIOPEN_CUSTOM_CACHE_DIR|ZE_FLAT_DEVICE_HIERARCHY|ZE_AFFINITY_MASK|SINGULARITY_BINDPATH"
    r"|APPTAINER_BINDPATH|MPI_LOCALRANKID)$|SLURM_|PMI_|OMPI_|LMOD_|TORCHELASTIC_|SINGULARITYENV_|APPTAINERENV_"
    r"|SITESTACK_))[A-Za-z_][A-Za-z0-9_]*")
#: Bounds on what a plan may ask for: a job step per point, each with its own port of the sweep's range
#: (:mod:`.pointenv`).
MAX_POINTS, MAX_SIZES, MAX_SIZE, MAX_VALUE = 200, 32, 1 << 33, 4096
#: The largest plan file read (a plan of MAX_POINTS points is a few tens of KiB).
MAX_PLAN_BYTES = 1 << 20


class PlanError(ValueError):
    """A plan that cannot be run as written (the message names the file and the key)."""


def load_plan(path: str) -> dict[str, Any]:
    """The plan at ``path``, checked (:func:`check_plan`)."""
    try:
        data = read_json(path, MAX_PLAN_BYTES)
    except ReadError as exc:
        raise PlanError(f"the tuning plan {exc}") from None
    return check_plan(data, path)


def check_plan(data: Any, where: str) -> dict[str, Any]:
    """``data`` when it is a plan of this schema with every value of its form; else a PlanError."""
    def bad(key: str, problem: str) -> PlanError:
        return PlanError(f"{where}: {key}: {problem}")

    if not isinstance(data, dict):
        raise PlanError(f"{where}: not a tuning plan (a JSON object is expected)")
    if data.get("schema") != SCHEMA:
        raise bad("schema", f"expected {SCHEMA!r}, not {_shown(data.get('schema'))}")
    sizes = data.get("sizes")
    if not isinstance(sizes, list) or not 1 <= len(sizes) <= MAX_SIZES or not all(
            _whole(s) and 0 < s <= MAX_SIZE and s % 4 == 0 for s in sizes) or len(set(sizes)) != len(sizes):
        raise bad("sizes", f"1 to {MAX_SIZES} different byte sizes, positive multiples of 4 up to {MAX_SIZE}")
    if not _whole(data.get("repeats")) or not 5 <= data["repeats"] <= 100:
        raise bad("repeats", f"a whole number from 5 to 100, not {_shown(data.get('repeats'))}")
    seconds = data.get("point_seconds")
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not math.isfinite(seconds) \
            or not 10 <= seconds <= 86400:
        raise bad("point_seconds", f"a number of seconds from 10 to 86400, not {_shown(seconds)}")
    names = data.get("variables")
    if not isinstance(names, list) or not all(isinstance(n, str) and NAME.fullmatch(n) for n in names):
        raise bad("variables", "a list of environment variable names (letters, digits, _)")
    reserved = next((n for n in names if not TUNING_NAME.fullmatch(n)), None)
    if reserved is not None:
        raise bad("variables", f"{reserved}: the job itself needs or sets it, and the sweep unsets every plan "
                               "variable at each point (docs/tuning.md)")
    points = data.get("points")
    if not isinstance(points, list) or not 1 <= len(points) <= MAX_POINTS:
        raise bad("points", f"a list of 1 to {MAX_POINTS} points")
    seen: set[str] = set()
    for i, point in enumerate(points):
        _check_point(point, f"points[{i}]", set(names), seen, bad)
    return data


def _check_point(point: Any, key: str, names: set[str], seen: set[str], bad: Any) -> None:
    if not isinstance(point, dict):
        raise bad(key, "a point is a JSON object (id, label, settings)")
    ident, label, settings = point.get("id"), point.get("label"), point.get("settings")
    if not isinstance(ident, str) or not POINT_ID.fullmatch(ident) or ident in seen:
        raise bad(f"{key}.id", f"a point id p00..p999, each once, not {_shown(ident)}")
    seen.add(ident)
    if not isinstance(label, str) or not label.isprintable() or len(label) > MAX_VALUE:
        raise bad(f"{key}.label", "one printable line")
    if not isinstance(settings, dict):
        raise bad(f"{key}.settings", "a JSON object of variable names and values")
    for name, value in settings.items():
        if name not in names:
            raise bad(f"{key}.settings.{_shown(name)}", "not one of the plan's variables (each is unset at every point)")
        if not isinstance(value, str) or not value or not value.isprintable() or len(value) > MAX_VALUE:
            raise bad(f"{key}.settings.{name}", f"a value of one printable line, not {_shown(value)}")


def point_of(plan: Mapping[str, Any], env: Mapping[str, str], where: str) -> dict[str, Any]:
    """The point ``$SITESTACK_TUNE_POINT`` names (the sweep driver sets it for each point's ranks)."""
    ident = env.get("SITESTACK_TUNE_POINT") or ""
    point = next((p for p in plan["points"] if p["id"] == ident), None)
    if point is None:
        raise PlanError(f"SITESTACK_TUNE_POINT must name a point of {where}, not {_shown(ident)}")
    return dict(point)


def point_dir(out: str, ident: str) -> str:
    """Where a point's ranks and guard write: ``OUT/points/<id>``."""
    return os.path.join(out, "points", ident)


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "..."
