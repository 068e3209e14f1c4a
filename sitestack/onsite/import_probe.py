"""Start-up probe: how long one rank takes to import a module (and to be ready in a gloo DDP group).

Standard library only; run by every rank of a job (the validation job's start-up section) and by
``invoke benchmark --name startup``::

    python import_probe.py --out DIR [--module torch] [--ddp] [--rank R --world-size W
                           --master-addr HOST --master-port PORT] [--timeout S]
    python import_probe.py --aggregate DIR --t0 EPOCH [--expect N] [--json FILE]
    python import_probe.py --combine OUT.json --shared-python PY --shared-summary FILE
                           [--staged-env DIR --staged-summary FILE --stage-s S]

A rank writes ``DIR/rank-<rank>.json`` (atomically, :mod:`.fileio`):

- ``started_at``: when this process started (``/proc/self/stat`` starttime, boot-relative, so a
  wrapper that ``exec``\\ s Python is counted from the wrapper's start), ``imported_at``,
  ``ddp_ready_at`` (epoch seconds) and ``imported_s`` / ``ddp_ready_s`` from its own start;
- ``io``: ``/proc/self/io`` ``rchar``, ``read_bytes`` and ``syscr`` once imported;
- ``lustre``: where the node is a Lustre client and its llite ``stats`` are readable, the change in
  the metadata counters (open, getattr, ...) while this rank imported. These are the whole
  client's (node's) counters, not the rank's own; absent elsewhere.

The rank, world size and rendezvous come from the options, else the launcher's variables
(``RANK``/``WORLD_SIZE``, Open MPI's, PMI's, Slurm's ``SLURM_PROCID``/``SLURM_NTASKS``) and
``MASTER_ADDR``/``MASTER_PORT``; every value read is checked (digits only, a host name of
letters, digits, ``.-:``) and a bad one is one line ``error: import_probe: ...`` with exit 1.

``--aggregate`` reads a directory of rank files and prints (or writes) one JSON summary:
``ranks``, ``all_imported_s`` (the last rank's ``imported_at`` minus ``--t0``, the launch time the
caller recorded), ``all_ddp_ready_s`` likewise, the median and maximum per-rank ``imported_s``, the
bytes read, and the ranks that failed or are missing (``--expect N``).

``--combine`` writes the validation job's ``startup.json`` (its report's start-up section) from the
aggregate of the ranks that imported from the shared prefix and, where the job staged the stack on
node-local storage, of those that imported from the copy, and prints one line of the two times.
"""

from __future__ import annotations

import argparse
import glob
import importlib
import json
import math
import os
import re
import socket
import statistics
import sys
import time
from typing import Any

from .fileio import ReadError, read_json, read_text, write_json

#: The launchers' variables, in this order: Slurm's last, as mpiexec inside a Slurm job leaves the batch
#: step's SLURM_PROCID (0) in every rank's environment.
RANK_VARS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")
SIZE_VARS = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS")
HOST_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9.:-]{0,253}")
MODULE_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
#: Where Lustre clients keep their per-mount llite counters (older clients: /proc; 2.12+: debugfs too).
LLITE_GLOBS = ("/proc/fs/lustre/llite/*/stats", "/sys/kernel/debug/lustre/llite/*/stats")
LLITE_KEYS = ("open", "close", "getattr", "inode_permission", "readdir", "statfs", "getxattr", "lookup")
IO_KEYS = ("rchar", "read_bytes", "syscr")
RANK_FILE = "rank-{:05d}.json"
#: The most bytes of a rank file or a summary read (each well under a KiB per rank).
RECORD_MAX = 16 << 20
#: The most bytes of a /proc or llite counters file read (each a few KiB).
PROC_MAX = 1 << 20


class ProbeError(Exception):
    """Bad input: reported as one line, exit 1."""


def digits(name: str, text: str, low: int = 0, high: int = 1 << 30) -> int:
    """``text`` as an integer in [low, high]; anything but plain digits is a :class:`ProbeError`."""
    if not re.fullmatch(r"[0-9]{1,10}", text or "") or not low <= int(text) <= high:
        raise ProbeError(f"{name}={text!r}: expected a whole number from {low} to {high}")
    return int(text)


def from_env(names: tuple[str, ...], low: int, high: int) -> int | None:
    """The first of the variables ``names`` that is set, checked; None when none is."""
    for name in names:
        if os.environ.get(name, "") != "":
            return digits(name, os.environ[name], low, high)
    return None


def process_started_at() -> float:
    """When this process started (epoch seconds): /proc/self/stat starttime is clock ticks since boot,
    compared with CLOCK_BOOTTIME now (btime in /proc/stat has only one-second resolution)."""
    try:
        stat = read_text("/proc/self/stat", PROC_MAX, keep="head")
        # the command name (field 2) may hold spaces and parentheses: count fields after the last ')'
        fields = stat[stat.rindex(")") + 2:].split()
        ticks = int(fields[19])   # field 22 of the whole line
        hz = os.sysconf("SC_CLK_TCK")
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / hz
    except (OSError, ValueError, IndexError):  # ReadError is a ValueError
        return time.time()   # no /proc: count from now
    return time.time() - max(age, 0.0)


def proc_io() -> dict[str, int]:
    """``/proc/self/io``'s read counters (empty where unreadable, e.g. without CAP_SYS_PTRACE in some containers)."""
    out: dict[str, int] = {}
    try:
        lines = read_text("/proc/self/io", PROC_MAX, keep="head").splitlines()
    except ReadError:
        return out
    for line in lines:
        key, _, value = line.partition(":")
        if key in IO_KEYS and value.strip().isdigit():
            out[key] = int(value)
    return out


def llite_counters() -> dict[str, int]:
    """Sum over this node's Lustre mounts of the llite metadata counters (``name N samples ...``)."""
    out: dict[str, int] = {}
    for pattern in LLITE_GLOBS:
        for path in glob.glob(pattern):
            try:
                lines = read_text(path, PROC_MAX, keep="head").splitlines()
            except ReadError:
                continue
            for line in lines:
                parts = line.split()
                if len(parts) >= 2 and parts[0] in LLITE_KEYS and parts[1].isdigit():
                    out[parts[0]] = out.get(parts[0], 0) + int(parts[1])
        if out:
            break   # the same counters may be in both places
    return out


def rendezvous(args: argparse.Namespace) -> tuple[int, int, str, int]:
    """(rank, world size, master address, master port) from the options, else the launcher's variables."""
    rank = args.rank if args.rank is not None else from_env(RANK_VARS, 0, 1 << 24)
    world = args.world_size if args.world_size is not None else from_env(SIZE_VARS, 1, 1 << 24)
    addr = args.master_addr or os.environ.get("MASTER_ADDR", "") or "127.0.0.1"
    if not HOST_RE.fullmatch(addr):  # not match: "$" also matches before a trailing newline
        raise ProbeError(f"master address {addr!r}: expected a host name or IP address")
    port_text = str(args.master_port) if args.master_port is not None else os.environ.get("MASTER_PORT", "29500")
    port = digits("MASTER_PORT", port_text, 1, 65535)
    world = 1 if world is None else world
    rank = 0 if rank is None else rank
    if rank >= world:
        raise ProbeError(f"rank {rank} is not below the world size {world}")
    return rank, world, addr, port


def ddp_start(module: Any, rank: int, world: int, addr: str, port: int, timeout: float) -> None:
    """A short gloo DDP start: join the group, one forward/backward of a tiny model, leave."""
    import datetime

    dist = importlib.import_module("torch.distributed")
    ddp_cls = importlib.import_module("torch.nn.parallel").DistributedDataParallel
    dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout))
    try:
        model = ddp_cls(module.nn.Linear(8, 1))
        model(module.ones(4, 8)).sum().backward()   # the backward all-reduces the gradients once
        dist.barrier()
    finally:
        dist.destroy_process_group()


def probe(args: argparse.Namespace) -> int:
    """One rank: import, optionally start DDP, write its rank file. 0, or 1 when the import or DDP failed."""
    started_at = process_started_at()
    if not MODULE_RE.fullmatch(args.module):
        raise ProbeError(f"--module {args.module!r}: expected a dotted module name")
    if args.ddp and args.module != "torch":
        raise ProbeError("--ddp needs --module torch")
    rank, world, addr, port = rendezvous(args)
    if not os.path.isdir(args.out):
        raise ProbeError(f"--out {args.out}: not a directory")
    lustre_before = llite_counters()
    record: dict[str, Any] = {"rank": rank, "world_size": world, "pid": os.getpid(), "host": socket.gethostname(),
                              "module": args.module, "python": sys.executable, "started_at": started_at}
    code = 0
    try:
        module = importlib.import_module(args.module)
        record["imported_at"] = time.time()
        record["imported_s"] = record["imported_at"] - started_at
        record["io"] = proc_io()
        if args.ddp:
            ddp_start(module, rank, world, addr, port, args.timeout)
            record["ddp_ready_at"] = time.time()
            record["ddp_ready_s"] = record["ddp_ready_at"] - started_at
    except Exception as exc:   # the rank file says what failed; the aggregate counts it
        record["error"] = f"{type(exc).__name__}: {exc}"[:500]
        code = 1
    lustre_after = llite_counters()
    if lustre_after:
        record["lustre"] = {k: lustre_after[k] - lustre_before.get(k, 0) for k in lustre_after}
    write_json(os.path.join(args.out, RANK_FILE.format(rank)), record, indent=1)
    return code


def number(value: Any) -> float | None:
    """``value`` as a float where it is a finite number (not a boolean, NaN or an infinity), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        converted = float(value)
    except OverflowError:   # an integer of hundreds of digits
        return None
    return converted if math.isfinite(converted) else None


def read_ranks(directory: str) -> tuple[list[dict[str, Any]], list[str]]:
    """The rank files of ``directory`` that parse, and a note for each that does not."""
    good, bad = [], []
    for path in sorted(glob.glob(os.path.join(directory, "rank-*.json"))):
        try:
            data = read_json(path, RECORD_MAX)
        except ReadError as exc:
            bad.append(f"{os.path.basename(path)}: {exc.reason}")
            continue
        if type(data.get("rank")) is not int or data["rank"] < 0:   # not True, not 1.0
            bad.append(f"{os.path.basename(path)}: not a rank record")
            continue
        good.append(data)
    return good, bad


def spread(records: list[dict[str, Any]], *keys: str) -> dict[str, float] | None:
    """Median and maximum of the number at ``keys`` (a path into each record) over ``records`` that have one."""
    values = []
    for record in records:
        value: Any = record
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        if number(value) is not None:
            values.append(float(value))
    return {"median": statistics.median(values), "max": max(values)} if values else None


def aggregate(directory: str, t0: float, expect: int | None = None) -> dict[str, Any]:
    """The summary of a directory of rank files; ``t0`` is the launch time (epoch seconds) the caller
    recorded just before starting the ranks."""
    if not os.path.isdir(directory):
        raise ProbeError(f"{directory}: not a directory")
    ranks, unreadable = read_ranks(directory)
    failed = sorted(r["rank"] for r in ranks if r.get("error") or number(r.get("imported_at")) is None)
    ok = [r for r in ranks if r["rank"] not in failed]
    imported = [float(r["imported_at"]) for r in ok]
    ready = [float(r["ddp_ready_at"]) for r in ok if number(r.get("ddp_ready_at")) is not None]
    seen = {r["rank"] for r in ranks}
    out: dict[str, Any] = {
        "ranks": len(ranks), "imported": len(ok), "failed": failed, "unreadable": unreadable,
        "hosts": len({str(r.get("host")) for r in ranks}),
        "all_imported_s": max(imported) - t0 if imported and not failed else None,
        "all_ddp_ready_s": max(ready) - t0 if ready and len(ready) == len(ranks) else None,
        "imported_s": spread(ok, "imported_s"), "ddp_ready_s": spread(ok, "ddp_ready_s"),
        "read_bytes": spread(ok, "io", "read_bytes"), "rchar": spread(ok, "io", "rchar"),
        "errors": sorted({str(r["error"]) for r in ranks if r.get("error")})[:5],
    }
    if expect is not None:
        out["missing"] = sorted(set(range(expect)) - seen)
        if out["missing"]:
            out["all_imported_s"] = None
    return out


def _summary(path: str) -> dict[str, Any] | None:
    """The aggregate summary in ``path`` (``--aggregate --json``), None where there is none to read."""
    try:
        return read_json(path, RECORD_MAX) if path else None
    except ReadError:
        return None


def _seconds(value: Any) -> Any:
    """``value`` where it is a number of seconds (int or float, as it was written), else None."""
    return value if number(value) is not None else None


def _seconds_text(text: str) -> float | None:
    """The seconds the batch script measured (``awk``'s ``%.3f``), None where it measured none."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def combine(shared_python: str, shared_summary: str, staged_env: str = "", staged_summary: str = "",
            stage_s: str = "") -> dict[str, Any]:
    """The validation job's ``startup.json`` (the keys ``ddp_report``'s start-up section reads):
    ``shared_path`` (the Python the ranks imported with from the shared prefix), ``shared_s`` (its
    summary's ``all_imported_s``), ``staged_path`` (the staged copy; null where none was staged),
    ``staged_s``, ``stage_s`` (the seconds staging took; null where not measured), ``ranks`` (of the
    shared summary) and the two summaries whole (``shared``, ``staged``: null where one is missing,
    not JSON or not an object). Empty texts stand for what the job did not do."""
    shared = _summary(shared_summary)
    staged = _summary(staged_summary)
    return {"shared_path": shared_python, "shared_s": _seconds((shared or {}).get("all_imported_s")),
            "staged_path": staged_env or None, "staged_s": _seconds((staged or {}).get("all_imported_s")),
            "stage_s": _seconds_text(stage_s), "ranks": (shared or {}).get("ranks"), "shared": shared, "staged": staged}


def combine_main(args: argparse.Namespace) -> int:
    """``--combine``: write startup.json (atomically) and print the times in one line."""
    doc = combine(args.shared_python, args.shared_summary, args.staged_env, args.staged_summary, args.stage_s)
    write_json(args.combine, doc, indent=None)
    print(f"sitestack validation: every rank imported torch after {doc['shared_s']} s from the shared prefix, "
          f"{doc['staged_s']} s staged (staging {doc['stage_s']} s)")
    return 0


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="import_probe.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="directory for this rank's rank-<rank>.json")
    p.add_argument("--module", default="torch")
    p.add_argument("--ddp", action="store_true", help="a short gloo DDP start after the import")
    p.add_argument("--rank", default=None)
    p.add_argument("--world-size", default=None)
    p.add_argument("--master-addr", default=None)
    p.add_argument("--master-port", default=None)
    p.add_argument("--timeout", default="300", help="seconds the DDP rendezvous may take")
    p.add_argument("--aggregate", metavar="DIR", help="summarise a directory of rank files")
    p.add_argument("--t0", default=None, help="launch time (epoch seconds) for --aggregate")
    p.add_argument("--expect", default=None, help="the number of ranks --aggregate expects")
    p.add_argument("--json", default=None, help="write the summary here (default: print it)")
    p.add_argument("--combine", metavar="FILE", help="write the job's startup.json from the summaries")
    p.add_argument("--shared-python", default="", help="for --combine: the Python of the shared prefix")
    p.add_argument("--shared-summary", default="", help="for --combine: the summary of its ranks")
    p.add_argument("--staged-env", default="", help="for --combine: the staged copy of the stack ('': none)")
    p.add_argument("--staged-summary", default="", help="for --combine: the summary of its ranks ('': none)")
    p.add_argument("--stage-s", default="", help="for --combine: the seconds staging took ('': not staged)")
    args = p.parse_args(argv)
    args.rank = None if args.rank is None else digits("--rank", args.rank, 0, 1 << 24)
    args.world_size = None if args.world_size is None else digits("--world-size", args.world_size, 1, 1 << 24)
    args.master_port = None if args.master_port is None else digits("--master-port", args.master_port, 1, 65535)
    args.timeout = digits("--timeout", args.timeout, 1, 86400)
    args.expect = None if args.expect is None else digits("--expect", args.expect, 1, 1 << 24)
    if args.t0 is not None:
        if not re.fullmatch(r"[0-9]{1,12}(\.[0-9]{1,9})?", args.t0):
            raise ProbeError(f"--t0 {args.t0!r}: expected epoch seconds")
        args.t0 = float(args.t0)
    if sum(map(bool, (args.out, args.aggregate, args.combine))) != 1:
        raise ProbeError("give one of --out DIR (probe), --aggregate DIR or --combine FILE")
    if args.combine and not (args.shared_python and args.shared_summary):
        raise ProbeError("--combine needs --shared-python and --shared-summary")
    if args.aggregate and args.t0 is None:
        raise ProbeError("--aggregate needs --t0 (the launch time)")
    return args


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse(sys.argv[1:] if argv is None else argv)
        if args.out:
            return probe(args)
        if args.combine:
            return combine_main(args)
        summary = aggregate(args.aggregate, args.t0, args.expect)
        if args.json:
            write_json(args.json, summary)
        else:
            print(json.dumps(summary, indent=1))
        return 0
    except (ProbeError, OSError) as exc:
        print(f"error: import_probe: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
