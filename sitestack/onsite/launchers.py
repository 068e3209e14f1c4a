"""Every launcher of the validation job, and every rank source the check program detects: two explicit tables.

Two concepts, named apart:

- a **launcher** is the command a job script starts its ranks with (``srun``, ``mpiexec``, ``torchrun``,
  ``horovodrun``): the controller renders one batch script per launcher a site names, from the template
  :attr:`Launcher.template`;
- a **rank source** is what the check program finds its rank through, by the variables a launcher
  sets (``mpiexec (Hydra)``, ``mpirun (Open MPI)``, ``env``, ...): its label is the ``launcher`` of a
  rank's report and of result.json (:func:`.ddpcheck.ranks.discover_rank`). One launcher can give
  several (``mpiexec`` is Hydra's, Open MPI's or Cray PALS'), and some belong to no launcher of the job.

Adding a launcher means its batch template (``validation/templates/NAME.sbatch.j2``) and one row of
:data:`LAUNCHERS`, plus a row of :data:`RANK_SOURCES` where its ranks show in variables no row reads yet.
Everything else derives from these rows: the launchers a site may name, those that run without a
scheduler or that tune, the template's "on this node" line, and what the checks expect of the ranks.
This module is on-site (standard library only): the check program reads the rank sources, the
controller reads both.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RankSource:
    """One way a rank finds who it is. ``rank``/``size``/``local``/``local_size``: the variables (for
    ``size``, the first one set wins); ``any_of``/``all_of``: variables that must be set (present) before
    this source is tried. ``launcher``: the launcher it belongs to (None: not a launcher of the job).
    ``mpi``: its ranks are MPI ranks (False: the MPI checks are left to a job that starts some), except
    where ``no_mpi_when`` (variable, label) says the launcher used another rendezvous.
    ``horovod``: Horovod finds its ranks through it (an MPI launcher, or horovodrun's own rendezvous).
    ``sets_master``: it sets MASTER_ADDR itself (its own rendezvous), so the batch script's is not judged.
    ``tasks_per_node``: the local size comes from Slurm's tasks per node (SLURM_STEP_TASKS_PER_NODE)."""

    label: str
    launcher: str | None
    rank: str
    size: tuple[str, ...]
    local: str | None
    local_size: str | None
    any_of: tuple[str, ...] = ()
    all_of: tuple[str, ...] = ()
    mpi: bool = True
    no_mpi_when: tuple[str, str] | None = None
    horovod: bool = True
    sets_master: bool = False
    tasks_per_node: bool = False


#: The rank sources in the order the check program tries them. The order matters: a launcher started
#: inside a Slurm job inherits the job's ``SLURM_PROCID=0`` and ``SLURM_NTASKS``, and an MPICH Hydra
#: ``mpiexec`` starts its proxies through ``srun``, so a launcher's own variables win over Slurm's.
RANK_SOURCES: tuple[RankSource, ...] = (
    RankSource("torchrun", "torchrun", "RANK", ("WORLD_SIZE",), "LOCAL_RANK", "LOCAL_WORLD_SIZE",
               any_of=("TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT"), mpi=False, horovod=False,
               sets_master=True),
    # horovodrun --gloo starts its ranks through its own rendezvous (it names the server), not MPI's
    RankSource("horovodrun", "horovodrun", "HOROVOD_RANK", ("HOROVOD_SIZE",), "HOROVOD_LOCAL_RANK",
               "HOROVOD_LOCAL_SIZE", no_mpi_when=("HOROVOD_GLOO_RENDEZVOUS_ADDR", "horovodrun --gloo")),
    RankSource("mpirun (Open MPI)", "mpiexec", "OMPI_COMM_WORLD_RANK", ("OMPI_COMM_WORLD_SIZE",),
               "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    RankSource("mpiexec (Hydra)", "mpiexec", "PMI_RANK", ("PMI_SIZE",), "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
               all_of=("PMI_RANK", "MPI_LOCALRANKID")),  # MPICH / Intel MPI Hydra
    RankSource("mpiexec (PALS)", "mpiexec", "PALS_RANKID", ("PMI_SIZE",), "PALS_LOCAL_RANKID", None,
               all_of=("PALS_RANKID",)),  # HPE Cray PALS mpiexec
    RankSource("srun", "srun", "SLURM_PROCID", ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"), "SLURM_LOCALID", None,
               all_of=("SLURM_STEP_ID", "SLURM_PROCID"), tasks_per_node=True),
    RankSource("mpiexec (PMI)", "mpiexec", "PMI_RANK", ("PMI_SIZE",), None, None,
               all_of=("PMI_RANK",)),  # a PMI launcher without Hydra's local variables
    RankSource("env", None, "RANK", ("WORLD_SIZE",), "LOCAL_RANK", "LOCAL_WORLD_SIZE", mpi=False, horovod=False),
)
#: What a process started by no launcher is: a single rank (no MPI ranks; Horovod needs no controller
#: to find one rank).
NO_LAUNCHER = RankSource("none", None, "", (), None, None, mpi=False)


def rank_source(label: str) -> RankSource:
    """The rank source of a label; for a label no row has, one that claims nothing of its own
    (MPI ranks, a Horovod controller, MASTER_ADDR from the batch script)."""
    known = {s.label: s for s in (*RANK_SOURCES, NO_LAUNCHER)}
    return known.get(label) or RankSource(label, None, "", (), None, None)


@dataclass(frozen=True)
class Launcher:
    """One launcher a validation job can use. ``local``: its script also runs on a node without a
    scheduler (``bash SCRIPT``; ``invoke validate --scheduler none``). ``tunes``: the tuning sweep has a
    script for it (horovodrun brings its own rendezvous, not the sweep's MASTER_PORT). ``mpi``: it
    starts every rank itself, as an MPI launcher does, so ``invoke job-template`` can launch with it."""

    name: str
    local: bool
    tunes: bool
    mpi: bool

    @property
    def template(self) -> str:
        """Its batch script's template in ``validation/templates/``, a child of ``job.sbatch.j2``."""
        return f"{self.name}.sbatch.j2"

    @property
    def sources(self) -> tuple[RankSource, ...]:
        """The rank sources the check program can detect under it, with their rank variables."""
        return tuple(s for s in RANK_SOURCES if s.launcher == self.name)


#: launcher name -> its row, in the order the docs list them.
LAUNCHERS: dict[str, Launcher] = {row.name: row for row in (
    Launcher("srun", local=False, tunes=True, mpi=True),
    Launcher("mpiexec", local=True, tunes=True, mpi=True),
    Launcher("torchrun", local=True, tunes=True, mpi=False),
    Launcher("horovodrun", local=True, tunes=False, mpi=False),
)}


def local_launchers() -> tuple[str, ...]:
    """The launchers whose scripts run on a node without a scheduler."""
    return tuple(name for name, row in LAUNCHERS.items() if row.local)


def tune_launchers() -> tuple[str, ...]:
    """The launchers the tuning sweep has a script for."""
    return tuple(name for name, row in LAUNCHERS.items() if row.tunes)


def in_words(names: tuple[str, ...] | list[str]) -> str:
    """``a, b or c``."""
    return " or ".join(filter(None, (", ".join(names[:-1]), names[-1] if names else "")))


#: The launchers ``invoke job-template`` writes a job for: those that start every rank themselves (MPI
#: launchers), and torchrun, whose agents srun starts one per node.
TEMPLATE_LAUNCHERS: tuple[str, ...] = (*(name for name, row in LAUNCHERS.items() if row.mpi), "torchrun")
