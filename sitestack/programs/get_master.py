#!/usr/bin/env python3
"""get-master: print the first host of a Slurm node list (the job's MASTER_ADDR).

Installed as ``$RUNSCRIPTS/get-master`` by the container-image step, beside ``hostlist.py``
(:mod:`sitestack.programs.hostlist`, the one host-list parser, which it imports from its own
directory), and called by ``conda-python-distributed`` inside the container, where ``scontrol
show hostnames`` is not available. Standard library only, nothing of sitestack: it runs with the
container's Python. The site's own script (the get-master of LUMI's PyTorch container module,
https://lumi-supercomputer.github.io/LUMI-EasyBuild-docs/p/PyTorch/, written by its easyconfigs,
https://github.com/Lumi-supercomputer/LUMI-EasyBuild-containers/tree/main/easybuild/easyconfigs/p/PyTorch)
split the list on every comma before expanding brackets, so ``nid[001,005-007]`` broke;
hostlist.py reads Slurm's syntax whole.

Usage: ``get-master NODELIST`` (default ``$SLURM_JOB_NODELIST``, else ``$SLURM_NODELIST``) prints
the first host; ``get-master --all NODELIST`` prints every host, one a line. Exit 2 on a list that
does not parse.
"""

from __future__ import annotations

import os
import sys

try:  # imported as part of sitestack (tests)
    from . import hostlist
except ImportError:  # run as get-master, beside hostlist.py
    import hostlist  # type: ignore[no-redef, import-not-found, unused-ignore]


def main(argv: list[str]) -> int:
    """``[--all] [NODELIST]``: the first host (every host with --all); exit 2 on a bad list."""
    every = "--all" in argv
    args = [a for a in argv if a != "--all"]
    nodelist = args[0] if args else os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST", "")
    return hostlist.main(([] if every else ["--first"]) + [nodelist], prog="get-master")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
