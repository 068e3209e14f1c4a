"""Who this process is, under every launcher: rank, world size and local rank from the launcher's
environment (srun, torchrun, mpiexec from MPICH / Intel MPI / Open MPI / Cray PALS, horovodrun)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from ..launchers import NO_LAUNCHER, RANK_SOURCES, RankSource
from .envvalues import whole


@dataclass(frozen=True)
class RankInfo:
    """Who this process is, and which launcher variables said so."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int | None
    launcher: str  # the label of the rank source that found it (launchers.RANK_SOURCES), "none" without one
    source: str  # the variables rank and world size came from


def _int(env: dict[str, str], name: str) -> int | None:
    """A rank, size or count variable of ``env``, None when unset or blank; an :class:`EnvError` naming
    it when it is not a whole number (digits only: ``-1``, ``1_0``, ``a[1]`` are refused)."""
    return whole(env, name)


def discover_rank(env: dict[str, str] | None = None) -> RankInfo:
    """Rank, world size and local rank from the launcher's environment: the first rank source of
    :data:`~..launchers.RANK_SOURCES` (in its order, which matters) whose variables are set."""
    env = dict(os.environ if env is None else env)
    for source in RANK_SOURCES:
        if (source.any_of and not any(name in env for name in source.any_of)) \
                or not all(name in env for name in source.all_of):
            continue
        found = _pick(env, source)
        if found:
            return found
    return RankInfo(0, 1, 0, 1, NO_LAUNCHER.label, "single process (no launcher variables)")


def _pick(env: dict[str, str], source: RankSource) -> RankInfo | None:
    """This process's rank by ``source``'s variables, None where its rank or size is not set."""
    size_var = next((name for name in source.size if name in env), source.size[-1])
    r, n = _int(env, source.rank), _int(env, size_var)
    if r is None or n is None:
        return None
    lr = _int(env, source.local) if source.local else None
    ln = _int(env, source.local_size) if source.local_size else None
    if lr is None:
        lr = r if n == 1 else _local_from_slurm(env, r)
    if source.tasks_per_node:
        ln = _tasks_on_this_node(env)
    return RankInfo(r, n, lr, ln, source.label, f"{source.rank}/{size_var}")


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
