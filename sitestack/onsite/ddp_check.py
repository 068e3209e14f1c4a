#!/usr/bin/env python3
"""sitestack validation check: prove a PyTorch distributed stack works on this site, and how fast.

The entry point of the validation job's check program: ``ddp_check.py [OPTIONS]`` runs one rank
(one process per rank, under any launcher), ``ddp_check.py --guard ... -- LAUNCHER ...`` the
guard around the launcher. The program itself is the package ``ddpcheck/`` installed beside this
file (:mod:`sitestack.onsite.ddpcheck`, which documents the checks), with ``ddp_report.py``
(and its ``report_plot.py``), ``nccl_log.py``, ``nccl_lines.py``, ``nccl_parse.py``, ``nccl_nodes.py``, ``hostlist.py``
and ``visible.py``; Python puts
this file's directory first on ``sys.path``, so it runs with the site's Python and nothing of sitestack.
"""

from __future__ import annotations

import sys

from .ddpcheck.main import program

if __name__ == "__main__":
    program(sys.argv[1:])
