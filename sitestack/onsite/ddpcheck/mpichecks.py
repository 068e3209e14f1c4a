"""The mpi-probe and mpi4py checks: the site-built C MPI probe's result, and mpi4py's ranks, library and
allreduce."""

from __future__ import annotations

import contextlib
import os
from typing import Any

from .. import ddp_report
from ..fileio import ReadError, read_json, read_text
from ..visible import one_line
from .checks import MPI4PY, MPI_PROBE
from .mpi import mpi_pingpong
from .state import Run
from .verdicts import FAILED, PASSED, SKIPPED

#: timeout(1)'s exit status when it ended the command: 124 after its SIGTERM, 128 + 9 when the SIGKILL
#: of ``-k`` was needed (https://www.gnu.org/software/coreutils/manual/html_node/timeout-invocation.html).
TIMEOUT_CODES = (124, 137)
#: The most bytes of the probe's status and result read (each a few hundred bytes).
SMALL_MAX = 1 << 20


def probe_failure(result_path: str) -> str | None:
    """Why the batch script's MPI probe failed, from how it ended (``mpi-probe.status`` beside its
    result: ``{"exit_code": C, "limit_s": N}``): its timeout, or its exit code with the last line of
    its log; None when it exited 0 or the status is missing or unreadable."""
    stem = os.path.splitext(result_path)[0]
    ended: dict[str, Any] = {}
    with contextlib.suppress(ReadError):
        ended = read_json(stem + ".status", SMALL_MAX)
    code = ended.get("exit_code")
    if not isinstance(code, int) or code == 0:
        return None
    log = stem + ".log"
    if code in TIMEOUT_CODES:
        limit = ended.get("limit_s")
        within = f"within {limit} s" if isinstance(limit, int) else "within its time limit"
        return f"the MPI probe did not finish {within} (killed by timeout; see {log})"
    last = ""
    with contextlib.suppress(ReadError):
        lines = [s.strip(" =\t") for s in read_text(log, 4096, keep="tail").splitlines()]
        # the last line that says something (MPICH ends its banners with a row of "=")
        last = next((s for s in reversed(lines) if any(c.isalpha() for c in s)), "")
    return f"the MPI probe exited with code {code}" + (f": {one_line(last)[:200]}" if last else "") + \
        f" (see {log})"


def mpi_probe(run: Run) -> None:
    """The mpi-probe check: the C probe's result (its library, 2 ranks, allreduce, latency, bandwidth);
    a probe that timed out or exited non-zero fails with that cause, even where it wrote a result."""
    path = run.args.mpi_probe_result
    if not path:
        run.set(MPI_PROBE.name, SKIPPED, "the MPI probe was not run (not installed, or no MPI launcher for this job)")
        return
    failure = probe_failure(path)
    try:
        data = read_json(path, SMALL_MAX)
    except ReadError as exc:
        log = os.path.splitext(path)[0] + ".log"
        run.set(MPI_PROBE.name, FAILED, failure or f"the MPI probe left no result ({exc}); see {log}")
        return
    run.mpi_data["probe"] = data
    want = (run.config.get("mpi") or {}).get("library_match")
    library = str(data.get("library", "")).strip()
    first_line = one_line(library.splitlines()[0]) if library else "?"
    problems = [failure] if failure else []
    if want and want not in library:
        problems.append(f"the probe ran on \"{first_line}\", the site expects {want}")
    if int(data.get("size", 0)) < 2:
        problems.append(f"the probe ran with {data.get('size')} rank(s): the MPI launcher did not start 2")
    if not data.get("allreduce_ok", False):
        problems.append("MPI_Allreduce gave a wrong sum")
    bw = data.get("bandwidth") or []
    peak = max((b["mb_s"] for b in bw), default=0.0)
    hosts = data.get("hosts") or []
    where = f"{hosts[0]} <-> {hosts[-1]}" if hosts else "?"
    if problems:
        run.set(MPI_PROBE.name, FAILED, problems[0], problems=problems)
    else:
        run.set(MPI_PROBE.name, PASSED, f"{first_line}: latency "
                f"{data.get('latency_us', 0):.3g} us, bandwidth {peak:.4g} MB/s ({where})")


def mpi4py_check(run: Run) -> None:
    """The mpi4py check: the same ranks as the launcher, the site's MPI library, an exact allreduce, a ping-pong."""
    if run.mpi is None and run.mpi_data.get("failure"):
        run.set(MPI4PY.name, FAILED, run.mpi_data["failure"])
        return
    if run.mpi is None:
        reason = run.mpi_data.get("skip") or "mpi4py is not installed in this stack"
        run.set(MPI4PY.name, SKIPPED, reason)
        return
    MPI = run.mpi
    comm = MPI.COMM_WORLD
    size, rank = comm.Get_size(), comm.Get_rank()
    lines = MPI.Get_library_version().strip().splitlines()
    library = one_line(lines[0]) if lines else "?"
    problems = []
    if size != run.info.world_size:
        problems.append(f"mpi4py sees {size} rank(s), the launcher {run.info.launcher} started "
                        f"{run.info.world_size}: the MPI library cannot talk to this launcher's PMI "
                        "(srun --mpi=..., or the MPI is not the one mpi4py was built with)")
    want = (run.config.get("mpi") or {}).get("library_match")
    if want and want not in library:
        problems.append(f"mpi4py uses \"{library[:120]}\", the site expects {want}")
    total = comm.allreduce(rank, op=MPI.SUM) if size > 1 else 0
    if total != size * (size - 1) // 2:
        problems.append(f"MPI allreduce of ranks gave {total}, expected {size * (size - 1) // 2}")
    latency = bandwidth = None
    stats: dict[str, Any] = {}
    if size > 1 and not problems:
        stats, bandwidth = mpi_pingpong(MPI, comm, rank, size)
        latency = stats.get("median_us")
    reports = run.all_gather(problems) if run.pg_ok else [problems]
    bad = [(i, p) for i, ps in enumerate(reports) for p in ps]
    details = {"library": library[:120], "size": size, "latency_us": latency, "latency": stats,
               "bandwidth_mb_s": bandwidth}
    run.mpi_data["mpi4py"] = details
    if bad:
        run.set(MPI4PY.name, FAILED, f"rank {bad[0][0]}: {bad[0][1]}", problems=[f"rank {i}: {p}" for i, p in bad], **details)
    else:
        extra = f"; ping-pong {ddp_report.latency_text(stats)}, {bandwidth:.4g} MB/s at 1 MiB" if stats else ""
        run.set(MPI4PY.name, PASSED, f"{library[:60]}, {size} ranks, allreduce exact{extra}", **details)

