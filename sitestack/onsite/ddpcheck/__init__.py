"""sitestack validation check: prove a PyTorch distributed stack works on this site, and how fast.

Run one process per rank under any launcher (srun, torchrun, mpiexec from MPICH / Intel MPI /
Open MPI, horovodrun). Every rank runs the checks; rank 0 writes ``result.json``,
``summary.md`` and the plot (``bandwidth.png``, or ``bandwidth.svg`` without matplotlib) into
``--out``, each file atomically, and every rank exits 0 only when every check passed (a check
that does not apply is ``skipped`` with its reason, which does not fail the run).

Checks, in order:

1. ``environment``: ranks found under the launcher, world size as the job expects, versions
   (torch, numpy, NCCL/RCCL, MPI) the same on every rank and as the site facts say, device per
   rank; each rank's thread settings, and no more torch threads than CPUs (oversubscription); the
   shared libraries each rank mapped (:mod:`.libraries`): the stack's copies, one of each, the same on
   every rank.
2. ``process-group``: ``init_process_group`` with the backend for the device (nccl on CUDA
   and ROCm, xccl or ccl on Intel XPU, gloo on CPU); a taken port or a missing rank is named, and
   before it a socket interface a rank's host lacks or a MASTER_ADDR that does not answer
   (:mod:`.reach`); the ranks' clock skew and late starts at its barrier (:mod:`.clocks`); a second
   group (``new_group``) and an all-reduce on it (:mod:`.subgroups`).
3. ``affinity``: each rank's CPU set is what the site intended (the masks or the cores of the
   NUMA domain closest to its GPU), and ranks are not all pinned to one core.
4. ``compute``: every rank's rate on a fixed workload, timed in windows longer than a CPU
   quota's period; a rank 1.5x slower than the others, or 3x below the site's reference,
   fails with its likely cause (thread oversubscription, a CPU quota, stopped, a slower CPU).
5. ``collectives``: allreduce, allgather and broadcast give exactly the right values.
6. ``ddp``: every rank builds the same initial model; a few DDP steps on synthetic data
   lower the loss; parameters are identical on every rank afterwards.
7. ``checkpoint``: save, resume into a fresh model: the same state, and the same parameters
   after further steps.
8. ``bandwidth``: allreduce sweep; algbw = bytes / time and busbw = algbw * 2(n-1)/n, as
   nccl-tests defines them; compared with the site's reference.
9. ``net-plugin``: with NCCL_DEBUG=INFO logs, every host used the network the site expects
   between nodes (``nccl_log.py``: OFI with its provider, IB, IBext); a socket fallback, a missing
   or failed plugin, a wrong provider or plugin fails with its cause.
10. ``mpi-probe``: the site-built C MPI probe's latency/bandwidth and library.
11. ``mpi4py``: mpi4py sees the same ranks, the right MPI library, a correct allreduce.
12. ``horovod``: an allreduce through Horovod where Horovod is part of the stack.

The program needs torch; mpi4py, Horovod and matplotlib are used when present. It needs
nothing of sitestack: it is part of the on-site package (:mod:`sitestack.onsite`), installed in
the job directory as ``onsite/ddpcheck/`` with the modules it imports relatively (the report, the
NCCL log reader, the history, the host-list parser, :mod:`..fileio`, :mod:`..visible`) and run by
the launcher ``ddp_check.py`` beside ``onsite/``; it runs in the site's Python
(a container, a conda env, a venv).

Its modules, one concern each: :mod:`.ranks` (ranks under every launcher), :mod:`.devices`,
:mod:`.state` (one rank's run), the checks (:mod:`.environment` with :mod:`.libraries` and :mod:`.mapped`, :mod:`.procgroup`,
:mod:`.affinity`, :mod:`.compute` with :mod:`.threads`, :mod:`.collectives`, :mod:`.training` for ddp and checkpoint,
:mod:`.bandwidth`, :mod:`.netplugin`, :mod:`.mpichecks` with :mod:`.mpi`), :mod:`.checks` (their
table: name, function, needs, in order), :mod:`.runner` (walks it), :mod:`.report` and :mod:`.results` (what is written), :mod:`.progress`, :mod:`.procs`,
:mod:`.faults`, :mod:`.watchdog` and :mod:`.guard` (hangs and crashes), :mod:`.main` (the entry).

The tuning sweep: :mod:`.tuneplan` (the plan, checked), :mod:`.tune` (one point, in the ranks:
``--tune PLAN``) and :mod:`.sweep` (the driver around the launcher: ``--sweep PLAN``).

Fault injection, for testing this program: ``SITESTACK_CHECK_FAULT=seed@R`` makes rank R build
its model from another seed; ``allreduce@R`` makes rank R contribute a wrong value;
``collective-large@R`` and ``collective-half@R`` spoil one element of rank R's result at the largest
size only, or in half precision only (:mod:`.collectives`); at a tuning
point, ``hang@R`` makes rank R sleep in the measurement and ``crash@R`` end itself with SIGSEGV.
"""
