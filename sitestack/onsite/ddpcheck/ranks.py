"""Who this process is, under every launcher: rank, world size and local rank from the launcher's
environment (srun, torchrun, mpiexec from MPICH / Intel MPI / Open MPI / Cray PALS, horovodrun)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from .envvalues import whole


@dataclass(frozen=True)
class RankInfo:
    """Who this process is, and which launcher variables said so."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int | None
    launcher: str
    source: str  # the variables rank and world size came from


def _int(env: dict[str, str], name: str) -> int | None:
    """A rank, size or count variable of ``env``, None when unset or blank; an :class:`EnvError` naming
    it when it is not a whole number (digits only: ``-1``, ``1_0``, ``a[1]`` are refused)."""
    return whole(env, name)


def discover_rank(env: dict[str, str] | None = None) -> RankInfo:
    """Rank, world size and local rank from the launcher's environment.

    The order matters: a launcher started inside a Slurm job inherits the job's
    ``SLURM_PROCID=0`` and ``SLURM_NTASKS``, and an MPICH Hydra ``mpiexec`` starts its proxies
    through ``srun``, so the launcher's own variables win over Slurm's.
    """
    env = dict(os.environ if env is None else env)

    def pick(launcher: str, rank: str, size: str, local: str | None, local_size: str | None) -> RankInfo | None:
        r, n = _int(env, rank), _int(env, size)
        if r is None or n is None:
            return None
        lr = _int(env, local) if local else None
        ln = _int(env, local_size) if local_size else None
        if lr is None:
            lr = r if n == 1 else _local_from_slurm(env, r)
        return RankInfo(r, n, lr, ln, launcher, f"{rank}/{size}")

    if env.get("TORCHELASTIC_RUN_ID") is not None or env.get("TORCHELASTIC_RESTART_COUNT") is not None:
        found = pick("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
        if found:
            return found
    found = pick("horovodrun", "HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE")
    if found:
        return found
    found = pick("mpirun (Open MPI)", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                 "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE")
    if found:
        return found
    if "PMI_RANK" in env and "MPI_LOCALRANKID" in env:  # MPICH / Intel MPI Hydra
        found = pick("mpiexec (Hydra)", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")
        if found:
            return found
    if "PALS_RANKID" in env:  # HPE Cray PALS mpiexec
        found = pick("mpiexec (PALS)", "PALS_RANKID", "PMI_SIZE", "PALS_LOCAL_RANKID", None)
        if found:
            return found
    if env.get("SLURM_STEP_ID") is not None and "SLURM_PROCID" in env:
        size = "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in env else "SLURM_NTASKS"
        found = pick("srun", "SLURM_PROCID", size, "SLURM_LOCALID", None)
        if found:
            tpn = _tasks_on_this_node(env)
            return RankInfo(found.rank, found.world_size, found.local_rank, tpn, "srun", found.source)
    if "PMI_RANK" in env:  # a PMI launcher without Hydra's local variables
        found = pick("mpiexec (PMI)", "PMI_RANK", "PMI_SIZE", None, None)
        if found:
            return found
    found = pick("env", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    if found:
        return found
    return RankInfo(0, 1, 0, 1, "none", "single process (no launcher variables)")


def _local_from_slurm(env: dict[str, str], rank: int) -> int:
    """The local rank from SLURM_LOCALID where the launcher gave none (0 without it)."""
    local = _int(env, "SLURM_LOCALID")
    return local if local is not None else 0


def _tasks_on_this_node(env: dict[str, str]) -> int | None:
    """SLURM_STEP_TASKS_PER_NODE ('4(x2),3') for this node (SLURM_NODEID)."""
    text = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    node = _int(env, "SLURM_NODEID") or 0
    if not text:
        return None
    for part in text.split(","):
        match = re.fullmatch(r"([0-9]{1,7})(?:\(x([0-9]{1,7})\))?", part.strip())
        if not match:
            return None
        repeat = int(match.group(2) or 1)
        if node < repeat:
            return int(match.group(1))
        node -= repeat
    return None
