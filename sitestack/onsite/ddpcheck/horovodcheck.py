"""The horovod check, where Horovod is part of the stack: Horovod's ranks are the launcher's, and an
allreduce through Horovod is exact.

Horovod finds its ranks through its controller: MPI (the ranks of an MPI launcher: srun with PMI,
mpiexec, horovodrun --mpi) or Gloo (the rendezvous server horovodrun starts and names in
``HOROVOD_GLOO_RENDEZVOUS_ADDR``). A launcher that starts no MPI ranks and no rendezvous server
(torchrun, or ranks started by hand with RANK/WORLD_SIZE) gives Horovod neither: ``hvd.init()``
falls back to an MPI singleton and sees one rank. There the check does what horovodrun's Gloo mode
does (``horovod/runner/gloo_run.py``: ``create_run_env_vars`` and ``create_slot_env_vars``): rank 0
runs Horovod's own rendezvous server with the slots of the ranks torch.distributed already joined,
and every rank sets the ``HOROVOD_*`` variables before ``hvd.init()``.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from ..launchers import rank_source
from .checks import HOROVOD
from .state import Run
from .verdicts import FAILED, PASSED, SKIPPED


def horovod(run: Run) -> None:
    """The horovod check: its size and an exact allreduce, through the controller this launcher gives."""
    try:
        import horovod.torch as hvd  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        run.set(HOROVOD.name, SKIPPED, "skipped: Horovod not in this stack")
        return
    how = "MPI or Gloo from the launcher"
    # a rank source that starts no MPI ranks and no Horovod rendezvous (see the module's docstring)
    if not rank_source(run.info.launcher).horovod and run.info.world_size > 1 and "HOROVOD_RANK" not in run.env:
        if not (callable(getattr(hvd, "gloo_built", None)) and hvd.gloo_built()):
            run.set(HOROVOD.name, SKIPPED, f"not run: {run.info.launcher} starts no MPI ranks and this Horovod is built "
                    "without Gloo, so it cannot find its ranks here; the srun, mpiexec or horovodrun job checks it")
            return
        os.environ.update(gloo_rendezvous(run))
        how = "Gloo, rendezvous on rank 0"
    hvd.init()
    try:
        problems, size = _allreduce(run, hvd)
    finally:
        # stop Horovod's background thread now: the process leaves through os._exit (see main.exit_now)
        with contextlib.suppress(Exception):
            hvd.shutdown()
    builds = [name for name, fn in (("MPI", "mpi_built"), ("Gloo", "gloo_built"), ("NCCL", "nccl_built"))
              if callable(getattr(hvd, fn, None)) and getattr(hvd, fn)()]
    if problems:
        run.set(HOROVOD.name, FAILED, problems[0], problems=problems, controller=how)
    else:
        run.set(HOROVOD.name, PASSED, f"{size}-rank allreduce exact (Horovod built with {', '.join(builds) or '?'}; "
                f"ranks from {how})", controller=how)


def _allreduce(run: Run, hvd: Any) -> tuple[list[str], int]:
    """Horovod's size against the launcher's, and a sum of rank+1 over every rank; (problems, size)."""
    torch = run.torch
    size, rank = hvd.size(), hvd.rank()
    problems = []
    if size != run.info.world_size:
        problems.append(f"Horovod sees {size} ranks, the launcher ({run.info.launcher}) started {run.info.world_size}: "
                        "Horovod's controller (MPI or Gloo) does not see this launcher's ranks")
    t = torch.tensor([float(rank + 1)])
    if run.dev.kind == "cuda":
        t = t.cuda()
    total = float(hvd.allreduce(t, op=hvd.Sum, name="sitestack.check").cpu()[0])
    if total != size * (size + 1) / 2:
        problems.append(f"Horovod allreduce gave {total:g}, expected {size * (size + 1) / 2:g}")
    return problems, size


def slots(places: list[tuple[str, int]]) -> list[dict[str, Any]]:
    """Horovod's slot of each rank from (host, local rank) by rank, as horovodrun assigns them
    (``horovod/runner/common/util/hosts.py``): local size = ranks on the host; the cross
    communicator of local rank L = the hosts (in order of first appearance) that have a rank L."""
    hosts = list(dict.fromkeys(host for host, _ in places))
    out = []
    for rank, (host, local) in enumerate(places):
        cross = [h for h in hosts if (h, local) in places]
        out.append({"hostname": host, "rank": rank, "local_rank": local, "cross_rank": cross.index(host),
                    "size": len(places), "local_size": sum(1 for h, _ in places if h == host),
                    "cross_size": len(cross)})
    return out


def gloo_rendezvous(run: Run) -> dict[str, str]:
    """Rank 0 starts Horovod's rendezvous server with every rank's slot; every rank gets the
    ``HOROVOD_*`` variables horovodrun would set for it (gloo_run.create_run_env_vars)."""
    places = run.all_gather((run.host, run.info.local_rank))
    plan = slots([(str(h), int(lr)) for h, lr in places])
    port: list[Any] = [None]
    if run.info.rank == 0:
        from horovod.runner.common.util.hosts import SlotInfo  # type: ignore[import-not-found, unused-ignore]
        from horovod.runner.http.http_server import RendezvousServer  # type: ignore[import-not-found, unused-ignore]

        server = RendezvousServer()
        port[0] = server.start()
        server.init([SlotInfo(**slot) for slot in plan])
        run.horovod_server = server  # serves until the process ends
    run.dist.broadcast_object_list(port, 0)
    mine = plan[run.info.rank]
    env = {"HOROVOD_GLOO_RENDEZVOUS_ADDR": run.env.get("MASTER_ADDR") or "127.0.0.1",
           "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port[0]), "HOROVOD_CONTROLLER": "gloo",
           "HOROVOD_CPU_OPERATIONS": "gloo", "HOROVOD_HOSTNAME": mine["hostname"]}
    env.update({f"HOROVOD_{key.upper()}": str(mine[key])
                for key in ("rank", "size", "local_rank", "local_size", "cross_rank", "cross_size")})
    iface = (run.env.get("GLOO_SOCKET_IFNAME") or "").split(",")[0].strip()
    if iface:  # the interface the site gives gloo (facts.env), as horovodrun's --network-interface
        env["HOROVOD_GLOO_IFACE"] = iface
    return env
