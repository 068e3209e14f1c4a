"""The site's validation history as a ReFrame performance log (perflog), for sites that collect those.

:func:`perflog_text` writes what ReFrame 4.10's default ``filelog`` perflog handler writes for an
equivalent ReFrame test: a run-only test named ``sitestack_validation`` whose three performance
functions report the validation job's metrics. The default handler (``reframe/core/settings.py``,
``handlers_perflog``; https://reframe-hpc.readthedocs.io/en/stable/config_reference.html) has

- ``format``: ``%(check_result)s|%(check_job_completion_time)s|%(check_#ALL)s``, where ``check_#ALL``
  is every loggable attribute of the test, sorted by name, less the handler's ``ignore_keys``, joined
  by ``|``; ``check_perfvalues`` (one of them) expands to each performance variable in the test's
  order, each with ``format_perfvars``: ``value|unit|ref|lower_thres|upper_thres``;
- a header line, written when the file is new: the same fields without their ``check_`` prefix,
  ``<var>_value|<var>_unit|...`` for each performance variable (ReFrame renames a perflog whose first
  line is another header to ``<file>.h0`` and starts a new file);
- the time ``job_completion_time`` with ``datefmt`` ``%FT%T`` in the local time zone of the machine
  that writes the log, and ``job_completion_time_unix`` as a JSON number;
- other values as ReFrame's ``_xfmt`` renders them: a string as is, a list joined with ``,``, any
  other value as JSON (``null``, ``false``, ``{}``); the performance values with Python's ``str``
  (a variable without a reference: ``0|None|None``, as ReFrame writes it).

The mapping (one line per validation run, oldest first):

- ``system`` is the site's name; ``partition`` is the run's layout without its geometry,
  ``<launcher>-<backend>-<device>`` (``srun-gloo-cpu``); the geometry goes in ``num_tasks`` (the world
  size) and ``num_tasks_per_node``;
- ``environ`` is the stack's module name in ReFrame's name alphabet (``pytorch/2.13.0-cpu`` ->
  ``pytorch_2_13_0-cpu``; ``builtin``, ReFrame's default environment, without a stack); ``modules``
  is the module's own name;
- ``jobid`` the job's id, ``result`` ``pass`` for a passed run and ``fail`` otherwise, ``job_exitcode``
  the run's ``exit_code`` when the record has one, else 0 for a passed run (the job's rule) and null;
  ``job_nodelist`` the record's ``hosts`` (null without); ``job_submit_time`` its start and
  ``job_completion_time`` its ``ended`` (its start without one);
- the performance variables, in this order: ``busbw`` (GB/s, at the reference message size),
  ``compute`` (GFLOPS per rank) and ``startup`` (s). A reference comes from the record's
  ``references`` (``{"busbw_gbs": [ref, lower, upper]}``, ReFrame's tuple: thresholds as fractions,
  None for none); a metric the run did not measure is written ``None`` (the header stays the same:
  ReFrame itself would drop the column and start a new file).

Tuning runs are not exported: a sweep measures settings, not the stack as its users run it.

ReFrame does not escape its values: a ``|`` or a line break in one would split the line or the
column (``CheckFieldFormatter.formatMessage`` formats with ``%``). An export that would do that is
refused instead, naming the record.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from sitestack.core import user_file
from sitestack.core.errors import InputError
from sitestack.onsite.history import TIME_MAX

#: The test ReFrame would log as (its class name: the perflog's file name is ``<name>.log``).
CHECK_NAME = "sitestack_validation"

#: The option that names the export's file (where a refused record is reported).
OPTION = "--perflog"

#: ReFrame's separator in the default ``format`` and ``format_perfvars``.
SEPARATOR = "|"

#: ReFrame's default perflog ``datefmt`` (``%FT%T``) spelled out: Python's own strftime codes.
TIME_FORMAT = "%Y-%m-%dT%H:%M:%S"

#: The performance variables: (name in the perflog, the record's metric, unit), in the test's order.
PERF_VARIABLES = (("busbw", "busbw_gbs", "GB/s"), ("compute", "compute_gflops", "GFLOPS"), ("startup", "startup_s", "s"))

#: ``format_perfvars`` of the default handler: the parts of each performance variable, in order.
PERF_PARTS = ("value", "unit", "ref", "lower_thres", "upper_thres")

#: The loggable attributes of a ReFrame 4.10 run-only test that the default handler does not ignore,
#: sorted as ``check_#ALL`` sorts them; ``perfvalues`` is where the performance variables go.
ALL_ATTRIBUTES = (
    "descr", "env_vars", "environ", "exclusive_access", "extra_resources", "job_completion_time_unix",
    "job_exitcode", "job_nodelist", "job_submit_time", "jobid", "modules", "name", "num_cpus_per_task",
    "num_gpus_per_node", "num_tasks", "num_tasks_per_core", "num_tasks_per_node", "num_tasks_per_socket",
    "partition", "perfvalues", "short_name", "system", "unique_name", "use_multithreading",
)

#: The fields before ``check_#ALL`` in the default ``format``.
LEADING = ("result", "job_completion_time")

_NAME_CHAR = re.compile(r"[^A-Za-z0-9_-]")
_NAME_START = re.compile(r"[A-Za-z_]")
_BREAKING = re.compile(r"[|\r\n\x0b\x0c\x1c-\x1e\x85\u2028\u2029]")   # str.splitlines() splits at these too


def header() -> str:
    """The perflog's first line, as ReFrame's ``MultiFileHandler`` generates it for the test."""
    names: list[str] = list(LEADING)
    for attr in ALL_ATTRIBUTES:
        if attr == "perfvalues":
            names += [f"{var}_{part}" for var, _, _ in PERF_VARIABLES for part in PERF_PARTS]
        else:
            names.append(attr)
    return SEPARATOR.join(names)


def reframe_name(value: str | None, default: str) -> str:
    """``value`` in ReFrame's alphabet for system, partition and environment names
    (``^[a-zA-Z_][a-zA-Z0-9_-]*$``, its configuration schema): other characters become ``_``."""
    if not value:
        return default
    name = _NAME_CHAR.sub("_", value)
    return name if _NAME_START.match(name) else f"_{name}"


def perflog_text(records: Iterable[Mapping[str, Any]]) -> str:
    """The perflog (header and one line per validation record, by completion time, oldest first) of
    ``records`` (history records, ``sitestack-history/1``); tuning records are left out. A record
    whose values would break the format, or that is not a history record, is refused (InputError)."""
    rows = []
    for record in records:
        if not isinstance(record, Mapping):
            raise InputError(OPTION, f"a history record is not a JSON object: {str(record)[:60]!r}")
        if record.get("kind") != "validation":
            continue
        rows.append(_row(record))
    rows.sort(key=lambda row: row[0])
    return "".join(f"{line}\n" for line in [header(), *(line for _, line in rows)])


def write_perflog(records: Iterable[Mapping[str, Any]], path: str, option: str = OPTION) -> None:
    """Write :func:`perflog_text` of ``records`` to ``path`` (``-``: stdout) by the rule for a file the
    user names (``sitestack/core/user_file.py``: a regular file or a new one, written atomically)."""
    user_file.check(option, path)
    user_file.write(option, path, perflog_text(records))


def _row(record: Mapping[str, Any]) -> tuple[float, str]:
    """(completion time, the perflog line) of one validation record."""
    where = f"history record {_text(record.get('id'), 'id', '?')}"
    started = _time(record.get("started"), where, "started")
    if started is None:
        raise InputError(OPTION, f"{where}: started: missing (the run's start time, seconds since the epoch)")
    ended = _time(record.get("ended"), where, "ended")
    completed = started if ended is None else ended
    layout = _mapping(record.get("layout"), where, "layout")
    stack = _mapping(record.get("stack"), where, "stack")
    metrics = _mapping(record.get("metrics"), where, "metrics")
    references = _mapping(record.get("references"), where, "references")
    passed = record.get("verdict") == "passed"
    module = _text(stack.get("module"), f"{where}: stack.module")
    launcher, backend, device = (_text(layout.get(k), f"{where}: layout.{k}", "unknown") for k in ("launcher", "backend", "device"))
    world, nodes = _count(layout.get("world_size"), where, "world_size"), _count(layout.get("nodes"), where, "nodes")
    values: dict[str, Any] = {
        "result": "pass" if passed else "fail",
        "job_completion_time": datetime.fromtimestamp(completed).astimezone().strftime(TIME_FORMAT),
        "descr": "", "env_vars": {}, "exclusive_access": False, "extra_resources": {},
        "environ": reframe_name(module, "builtin"),
        "job_completion_time_unix": float(completed),
        "job_exitcode": _exit_code(record, passed, where),
        "job_nodelist": _hosts(record.get("hosts"), where),
        "job_submit_time": float(started),
        "jobid": _text(record.get("job_id"), f"{where}: job_id") or None,
        "modules": [module] if module else [],
        "name": CHECK_NAME, "short_name": CHECK_NAME, "unique_name": CHECK_NAME,
        "num_cpus_per_task": None, "num_gpus_per_node": None, "num_tasks": world,
        "num_tasks_per_core": None, "num_tasks_per_socket": None, "use_multithreading": None,
        "num_tasks_per_node": world // nodes if world and nodes and world % nodes == 0 else None,
        "partition": reframe_name(f"{launcher}-{backend}-{device}", "default"),
        "system": _text(record.get("site"), f"{where}: site", "unknown"),
    }
    fields = [_xfmt(values[name]) for name in LEADING]
    for attr in ALL_ATTRIBUTES:
        if attr == "perfvalues":
            fields += _perf_fields(metrics, references, where)
        else:
            fields.append(_xfmt(values[attr]))
    return completed, SEPARATOR.join(fields)


def _perf_fields(metrics: Mapping[str, Any], references: Mapping[str, Any], where: str) -> list[str]:
    """``value|unit|ref|lower|upper`` of each performance variable, as ReFrame's ``_format_perf``
    writes them (``%s`` of each: Python's str)."""
    fields: list[str] = []
    for _, metric, unit in PERF_VARIABLES:
        value = _number(metrics.get(metric), where, f"metrics.{metric}")
        ref, lower, upper = _reference(references.get(metric), where, metric)
        fields += [str(value), unit, str(ref), str(lower), str(upper)]
    return fields


def _reference(value: Any, where: str, metric: str) -> tuple[float, float | None, float | None]:
    """A ReFrame reference tuple (ref, lower, upper) from the record, or ReFrame's ``(0, None, None)``."""
    if value is None:
        return 0, None, None
    if not isinstance(value, list | tuple) or len(value) != 3:
        raise InputError(OPTION, f"{where}: references.{metric}: not [reference, lower, upper]: {value!r}")
    ref = _number(value[0], where, f"references.{metric}[0]")
    if ref is None:
        raise InputError(OPTION, f"{where}: references.{metric}: the reference value is missing")
    return ref, _number(value[1], where, f"references.{metric}[1]"), _number(value[2], where, f"references.{metric}[2]")


def _xfmt(value: Any) -> str:
    """ReFrame's ``_xfmt``: a string as is, a list joined by ``,`` (each element likewise), any other
    value as JSON."""
    if isinstance(value, list | tuple):
        return ",".join(_xfmt(v) for v in value)
    return value if isinstance(value, str) else json.dumps(value)


def _text(value: Any, where: str, default: str = "") -> str:
    """A string field of a record; refused when it is not a string or would break a line or column."""
    if value is None:
        return default
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        raise InputError(OPTION, f"{where}: not a string: {value!r}")
    if _BREAKING.search(value):
        raise InputError(OPTION, f"{where}: {value!r} contains '|' or a line break, which would break the "
                                    "perflog's one line per run (ReFrame does not escape them)")
    return value


def _number(value: Any, where: str, key: str) -> float | None:
    """A finite number of a record (None when absent)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InputError(OPTION, f"{where}: {key}: not a finite number: {value!r}")
    return value


def _time(value: Any, where: str, key: str) -> float | None:
    """A time of a record (None when absent): seconds since the epoch, after it and before 2**33 (the year
    2242), which ``datetime`` takes on every platform."""
    number = _number(value, where, key)
    if number is not None and not 0 < number < TIME_MAX:
        raise InputError(OPTION, f"{where}: {key}: not a time after 1970 and before 2242 (seconds since the epoch): {value!r}")
    return number


def _count(value: Any, where: str, key: str) -> int | None:
    """A positive whole number of the layout (None when absent)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(OPTION, f"{where}: layout.{key}: not a positive whole number: {value!r}")
    return value


def _mapping(value: Any, where: str, key: str) -> Mapping[str, Any]:
    """A JSON object of a record ({} when absent)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InputError(OPTION, f"{where}: {key}: not a JSON object: {value!r}")
    return value


def _exit_code(record: Mapping[str, Any], passed: bool, where: str) -> int | None:
    """The job's exit code: the record's, else 0 for a passed run (the validation job exits 0 exactly
    when its verdict is passed), else unknown."""
    code = record.get("exit_code")
    if code is None:
        return 0 if passed else None
    if isinstance(code, bool) or not isinstance(code, int):
        raise InputError(OPTION, f"{where}: exit_code: not a whole number: {code!r}")
    return code


def _hosts(value: Any, where: str) -> list[str] | None:
    """The run's hosts (ReFrame's ``job_nodelist``), or None when the record has none."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise InputError(OPTION, f"{where}: hosts: not a list: {value!r}")
    return [_text(host, f"{where}: hosts") for host in value]


__all__ = ["CHECK_NAME", "PERF_VARIABLES", "SEPARATOR", "TIME_FORMAT", "header", "perflog_text", "reframe_name",
           "write_perflog"]
