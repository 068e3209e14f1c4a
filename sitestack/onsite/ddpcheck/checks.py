"""Every check of the validation job: one explicit table, in the order the checks run and are reported.

Adding a check means writing its module (a function that takes the rank's :class:`~.state.Run` and
records its result with ``run.set(ROW.name, ...)``) and adding one row here: its name, its function,
what it needs of the checks before it, and the phases before the checks whose faults it owns.
Everything else derives from :data:`ROWS`: the checks of result.json and their order
(:data:`CHECKS`), what the runner runs (:func:`.runner.run_checks`), what an earlier failure skips
(:meth:`.state.Run.skip_rest`) and which check a fault before the checks fails (:data:`PHASE_CHECK`).

The functions are named as ``"module:function"`` of this package and looked up when the runner
first calls them (as :data:`sitestack.actions.ACTIONS` names its classes), so this module imports
nothing: the watchdogs and the guard, which read the names, load no check. The runner imports each
row's module, so that the job ships it (:mod:`sitestack.core.shipped` follows imports;
tests/test_tables.py names a module it lacks).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

#: What a check can need of the checks before it (the runner's ``NEEDS`` says how each is decided):
#: torch loaded by the environment check; the world size the job expects, so the ranks can meet;
#: the process group started (or a single rank, which needs none).
TORCH, WORLD, GROUP = "torch", "world size", "process group"
#: A check that needs the ranks to have met, but not the process group (the MPI probe).
RANKS_MET = (TORCH, WORLD)
#: What most checks need: every rank in one process group.
IN_GROUP = (TORCH, WORLD, GROUP)


@dataclass(frozen=True)
class CheckRow:
    """One check (or one part of a check that runs in parts).

    ``needs``: its rule after a failure: it runs only when each need is met; the first unmet need
    marks every later check skipped with that need's reason. ``says_skipped``: False for a check that
    keeps its "not run" then (the MPI and Horovod checks: they report "not run" as they do when they
    do not apply). ``caught``: False for a step whose error must end the rank (the gather of the
    ranks' reports: a lost peer there is for the watchdogs to name), not fail the check.
    ``phases``: the phases before the checks (:data:`.rank_progress.PHASES`) whose faults fail it."""

    name: str
    function: str
    needs: tuple[str, ...] = IN_GROUP
    phases: tuple[str, ...] = ()
    says_skipped: bool = True
    caught: bool = True


ENVIRONMENT = CheckRow("environment", "env_check:environment", needs=(), phases=("startup", "import torch"))
PROCESS_GROUP = CheckRow("process-group", "procgroup:process_group", needs=RANKS_MET)
AFFINITY = CheckRow("affinity", "affinity:affinity")
COMPUTE = CheckRow("compute", "compute:compute")
COLLECTIVES = CheckRow("collectives", "collectives:collectives")
DDP_CHECK = CheckRow("ddp", "training:ddp")  # not DDP: the check modules import torch's class by that name
CHECKPOINT = CheckRow("checkpoint", "training:checkpoint_check")
BANDWIDTH = CheckRow("bandwidth", "bandwidth:bandwidth_sweep")
NET_PLUGIN = CheckRow("net-plugin", "netplugin:net_plugin_check")
MPI_PROBE = CheckRow("mpi-probe", "mpichecks:mpi_probe", needs=RANKS_MET, says_skipped=False)
MPI4PY = CheckRow("mpi4py", "mpichecks:mpi4py_check", phases=("MPI_Init",), says_skipped=False)
HOROVOD = CheckRow("horovod", "horovodcheck:horovod", says_skipped=False)

#: Every step, in the order the runner runs them. The process-group check runs in parts: the group,
#: then the ranks' clocks and starts at its first barrier, then a second group (subgroups.py). The
#: environment check runs in parts: before the
#: process group (one rank alone), once the ranks met (its libraries, then every rank's report
#: gathered and compared), and after the first collective (the libraries NCCL/RCCL open then).
ROWS: tuple[CheckRow, ...] = (
    ENVIRONMENT,
    PROCESS_GROUP,
    replace(PROCESS_GROUP, function="clocks:clocks_at_barrier", needs=IN_GROUP),
    replace(PROCESS_GROUP, function="subgroups:subgroups", needs=IN_GROUP),
    replace(ENVIRONMENT, function="libraries:record_libraries", needs=IN_GROUP, phases=()),
    replace(ENVIRONMENT, function="env_check:gather_ranks", needs=IN_GROUP, phases=(), caught=False),
    replace(ENVIRONMENT, function="env_check:environment_gathered", needs=IN_GROUP, phases=()),
    AFFINITY,
    COMPUTE,
    COLLECTIVES,
    replace(ENVIRONMENT, function="libraries:record_libraries_again", needs=IN_GROUP, phases=()),
    DDP_CHECK,
    CHECKPOINT,
    BANDWIDTH,
    NET_PLUGIN,
    MPI_PROBE,
    MPI4PY,
    HOROVOD,
)

#: The checks' names, in the order they run and result.json lists them.
CHECKS: tuple[str, ...] = tuple(dict.fromkeys(row.name for row in ROWS))
#: The check a fault in a phase before the checks belongs to.
PHASE_CHECK: dict[str, str] = {phase: row.name for row in ROWS for phase in row.phases}
#: The checks that keep "not run" when an earlier failure skips the rest (``says_skipped``).
KEEP_NOT_RUN: frozenset[str] = frozenset(row.name for row in ROWS if not row.says_skipped)
