"""MIOpen's cache directory: the one rule every generated file follows (the stack's module, the users'
launch helper and job template, the validation job, the container site's run scripts).

MIOpen keeps its user database (SQLite, which needs file locking that Lustre lacks) and its kernel cache
where ``MIOPEN_USER_DB_PATH`` and ``MIOPEN_CUSTOM_CACHE_DIR`` say: OLCF puts them on node-local ``/tmp``
("Needed to bypass MIOpen, Disk I/O Errors", https://docs.olcf.ornl.gov/software/python/pytorch_frontier.html)
and LUMI too (https://lumi-supercomputer.github.io/LUMI-EasyBuild-docs/p/PyTorch/); both remove and remake
the directory when a job starts. A fixed directory is shared by every job of the user on a node, so two
jobs remove each other's database. Here it is one directory per job, ``/tmp/<user>-miopen-$SLURM_JOB_ID``
(facts.env's ``MIOPEN_*`` paths give way to it). Outside a job (a login node, where no GPU runs MIOpen)
``$SLURM_JOB_ID`` is empty: ``/tmp/<user>-miopen-``, one per user.

Every task of the job computes the name, so another user can compute it too and make it first. The
shipped programs that make it (the launch helper, LUMI's run script, the validation job) make it with
``mkdir -m 700`` and use it only where it is the user's own directory, mode 0700, not a symbolic link,
in a directory that is the user's or root's and that others cannot write unless it is sticky (``/tmp``);
otherwise they stop with one message naming it (:mod:`sitestack.validation.runtime_checks`). It stays
on node-local ``/tmp`` rather than ``$TMPDIR``, which some sites point at a shared file system.
"""

from __future__ import annotations

from sitestack.model.facts import Facts

#: The variables that name MIOpen's cache directories; both are the one per-job directory.
MIOPEN_KEYS = ("MIOPEN_USER_DB_PATH", "MIOPEN_CUSTOM_CACHE_DIR")
#: Node-local /tmp, per user ({user}: the user of the job, bound where the value is used).
BASE = "/tmp/{user}-miopen"
#: What makes the base one job's: the job's id, read where the value is used (shell, Lua, Tcl).
JOB_SUFFIX = "-$SLURM_JOB_ID"


def uses_miopen(facts: Facts) -> bool:
    """Whether the site runs MIOpen (AMD GPUs, or ROCm)."""
    return facts.gpu.vendor == "amd" or facts.rocm is not None


def miopen_cache(facts: Facts, user: str = "{user}") -> str | None:
    """The job's MIOpen cache directory as a fact string (``$SLURM_JOB_ID`` is the job's, read late), or
    None where the site has no MIOpen. ``user``: how the caller spells the user (``{user}`` for the module
    files, ``${USER}`` or ``$(id -un)`` for shell)."""
    if not uses_miopen(facts):
        return None
    return BASE.replace("{user}", user) + JOB_SUFFIX
