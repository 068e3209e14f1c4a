"""MPI from Python: importing mpi4py (before torch), and the ping-pong the mpi4py check measures."""

from __future__ import annotations

import argparse
import os
from typing import Any

from .. import ddp_report
from ..launchers import rank_source
from .ranks import RankInfo

#: Latency samples whose maximum is this many times their median are flagged as noisy.
NOISE_FACTOR = ddp_report.NOISE_FACTOR


def latency_stats(samples_us: list[float]) -> dict[str, Any]:
    """min/median/max of latency samples (us) and whether they are noisy (the maximum far above the
    median: another process shared the CPU, or the network was busy)."""
    ordered = sorted(samples_us)
    if not ordered:
        return {}
    median = ordered[len(ordered) // 2]
    return {"min_us": ordered[0], "median_us": median, "max_us": ordered[-1], "samples": len(ordered),
            "noisy": bool(median > 0 and ordered[-1] > NOISE_FACTOR * median)}


def mpi_pingpong(MPI: Any, comm: Any, rank: int, size: int) -> tuple[dict[str, Any], float | None]:
    """Latency (8 B, half round trips, us: min/median/max of 200) and bandwidth (1 MiB, MB/s) between
    rank 0 and the last rank."""
    peer = size - 1
    samples: list[float] = []
    bandwidth = None
    for index, (nbytes, iters) in enumerate(((8, 200), (1 << 20, 20))):
        buf = bytearray(nbytes)
        comm.Barrier()
        start = MPI.Wtime()
        for _ in range(iters):
            begin = MPI.Wtime()
            if rank == 0:
                comm.Send([buf, MPI.BYTE], dest=peer, tag=7)
                comm.Recv([buf, MPI.BYTE], source=peer, tag=7)
            elif rank == peer:
                comm.Recv([buf, MPI.BYTE], source=0, tag=7)
                comm.Send([buf, MPI.BYTE], dest=0, tag=7)
            if index == 0:
                samples.append((MPI.Wtime() - begin) / 2 * 1e6)
        half = (MPI.Wtime() - start) / iters / 2
        if index == 1:
            bandwidth = nbytes / half / 1e6
    result: tuple[dict[str, Any], float | None] = comm.bcast((latency_stats(samples), bandwidth), root=0)
    return result


def mpi4py_failure(exc: BaseException, wanted: bool) -> str:
    """Why mpi4py cannot be used, in one line: missing, or broken (with the loader's own words)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, ModuleNotFoundError) and exc.name in ("mpi4py", None):
        where = "the site's stack includes it, but " if wanted else ""
        return f"mpi4py is missing: {where}this Python cannot import it ({text})"
    return f"mpi4py is broken: importing mpi4py.MPI failed with {type(exc).__name__}: {text[:300]}"


def import_mpi(info: RankInfo, args: argparse.Namespace, config: dict[str, Any]) -> tuple[Any, str | None, str | None]:
    """(mpi4py's MPI module, why it is not used, why that is a failure), imported before torch
    (cray-mpich's NIC_POLICY check needs that order). Where the site's stack includes mpi4py
    (check-config.json ``stack.includes``), a missing or broken mpi4py fails the mpi4py check:
    under a launcher that starts no MPI ranks its library is still loaded, without MPI_Init."""
    wanted = "mpi4py" in ((config.get("stack") or {}).get("includes") or [])
    if args.no_mpi:
        return None, "mpi4py not used (--no-mpi)", None
    source = rank_source(info.launcher)
    other = source.no_mpi_when if source.no_mpi_when and os.environ.get(source.no_mpi_when[0]) else None
    if not source.mpi or other:
        launcher = other[1] if other else info.launcher
        why = f"the launcher ({launcher}) starts no MPI ranks: run the srun or mpiexec job for the MPI checks"
        if wanted:
            try:
                import mpi4py  # type: ignore[import-not-found, unused-ignore]

                mpi4py.rc.initialize = mpi4py.rc.finalize = False  # load libmpi, do not start MPI
                from mpi4py import MPI  # type: ignore[import-not-found, unused-ignore]  # noqa: F401
            except Exception as exc:  # noqa: BLE001  (a broken mpi4py is a finding, not a crash)
                return None, None, mpi4py_failure(exc, wanted)
        return None, why, None
    try:
        from mpi4py import MPI  # type: ignore[import-not-found, unused-ignore]
    except Exception as exc:  # noqa: BLE001  (a missing or broken mpi4py is a finding, not a crash)
        failure = mpi4py_failure(exc, wanted)
        if wanted or not isinstance(exc, ModuleNotFoundError):
            return None, None, failure
        return None, "mpi4py is not installed in this stack (the site's stack does not include it)", None
    return MPI, None, None
