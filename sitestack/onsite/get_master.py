#!/usr/bin/env python3
"""get-master: print the first host of a Slurm node list (the job's MASTER_ADDR).

Installed as ``$RUNSCRIPTS/get-master`` by the container-image step, beside ``hostlist.py``
(:mod:`sitestack.onsite.hostlist`, the one host-list parser, which it imports from its own
directory), and called by ``conda-python-distributed`` inside the container, where ``scontrol
show hostnames`` is not available. Standard library only, nothing of sitestack: it runs with the
container's Python. The site's own script (the get-master of LUMI's PyTorch container module,
https://lumi-supercomputer.github.io/LUMI-EasyBuild-docs/p/PyTorch/, written by its easyconfigs,
https://github.com/Lumi-supercomputer/LUMI-EasyBuild-containers/tree/main/easybuild/easyconfigs/p/PyTorch)
split the list on every comma before expanding brackets, so ``nid[001,005-007]`` broke;
hostlist.py reads Slurm's syntax whole.

Usage: ``get-master [--name NAME] [--] NODELIST`` (default ``$SLURM_JOB_NODELIST``, else
``$SLURM_NODELIST``) prints the first host; ``get-master --all NODELIST`` prints every host, one a
line. Exit 2 on a list that does not parse, with one message naming NAME (or the variable read).
"""

from __future__ import annotations

import os
import sys

from . import hostlist


def main(argv: list[str]) -> int:
    """``[--all] [--name NAME] [--] [NODELIST]``: the first host (every host with --all); exit 2 with one
    message naming NAME (else the variable the list was read from) on a bad list. Options come first;
    a NODELIST that starts with ``-`` is one only after ``--`` (it goes to hostlist.py after ``--`` too,
    so no list is ever taken for an option)."""
    every, name, args = False, [], list(argv)
    while args and args[0] in ("--all", "--name") and not (args[0] == "--name" and len(args) < 2):
        if args.pop(0) == "--all":
            every = True
        else:
            name = ["--name", args.pop(0)]
    if args[:1] == ["--"]:
        args = args[1:]
    elif args[:1] and args[0].startswith("-"):
        print(f"get-master: unknown option {args[0]!r}; usage: get-master [--all] [--name NAME] [--] [NODELIST]",
              file=sys.stderr)
        return 2
    if args:
        nodelist = args[0]
    else:
        var = "SLURM_JOB_NODELIST" if os.environ.get("SLURM_JOB_NODELIST") else "SLURM_NODELIST"
        nodelist, name = os.environ.get(var, ""), name or ["--name", var]
    return hostlist.main(([] if every else ["--first"]) + name + ["--", nodelist], prog="get-master")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
