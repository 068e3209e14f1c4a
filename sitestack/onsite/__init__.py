"""Everything sitestack runs on a site's nodes: the validation job's check program (:mod:`.ddp_check`
and its package :mod:`.ddpcheck`), its report (:mod:`.ddp_report`), the NCCL/RCCL log reader
(:mod:`.nccl_log`), the site's history of runs (:mod:`.history`), the host's fingerprint (:mod:`.fingerprint`), the start-up probe
(:mod:`.import_probe`), the Slurm host-list parser (:mod:`.hostlist`), the stack's ``extend-venv-activate``
(:mod:`.activate_hook` and its package :mod:`.activate`) and the programs the controller runs on a host
(:mod:`.venv_scan`, :mod:`.venv_clone`, ...).

Standard library only, and nothing of sitestack outside this package (``tests/test_layers.py``): it
runs with whatever Python a node has, the site's own or a container's. Its modules import each other
relatively, so the package works both as ``sitestack.onsite`` in a checkout and as ``onsite/`` beside
the programs a job directory holds (:mod:`sitestack.core.shipped` ships it whole, with one small
launcher per entry in :data:`ENTRY_POINTS`). A stack's ``extend-venv-activate`` runs with whatever
``python3`` a user's shell finds, so this file, and the modules that command imports, keep to Python 3.6
syntax (no ``from __future__ import annotations``).

Shared helpers live here once: :mod:`.fileio` (atomic write, bounded read, bounded JSON read) and
:mod:`.visible` (what is shown of text read from outside).
"""

#: The programs sitestack installs by name: the file a user or a batch script runs -> the module it
#: runs (``python3 FILE ARGS`` runs ``onsite/MODULE.py`` as ``__main__``). A job directory (or a
#: run-scripts directory) holds them beside ``onsite/``; a stack's ``bin/extend-venv-activate`` runs
#: the ``onsite/`` under the stack's ``share/sitestack/`` (:func:`sitestack.core.shipped.installed`).
ENTRY_POINTS = {
    "ddp_check.py": "ddp_check",
    "ddp_report.py": "ddp_report",
    "nccl_log.py": "nccl_log",
    "history.py": "history",
    "fingerprint.py": "fingerprint",
    "import_probe.py": "import_probe",
    "hostlist.py": "hostlist",
    "bind_rank.py": "bind_rank",
    "get-master": "get_master",
    "extend-venv-activate": "activate_hook",
}

#: Programs shipped as one file (run with ``python -c`` and the file's text, or copied into a venv or
#: a pack on their own): they import nothing but the standard library, not even this package.
SINGLE_FILE = ("bind_rank", "generation_pin", "hostlist", "index_probe", "pip_settings", "torch_probe",
               "venv_clone", "venv_scan", "venv_unpack")
