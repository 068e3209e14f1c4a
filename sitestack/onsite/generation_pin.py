"""Keep a Python process on the stack generation it started from (installed into each generation's
site-packages as ``_sitestack_generation.py``, imported by ``_sitestack_generation.pth``).

A stack's stable path ``<parent>/<leaf>`` is a symlink to its current generation
``<parent>/.<leaf>.gen-TOKEN``. A process started as ``<parent>/<leaf>/bin/python`` has the stable
path on ``sys.path``: after an upgrade switches the link, its next imports would come from the new
generation (one process, two generations). At start-up this module

- rewrites every ``sys.path`` entry under the stable path to the same place in this generation, so
  every later import comes from the generation the process started with; and
- holds the generation's directory open for the life of the process, so that the generation is seen
  in use (``/proc/<pid>/fd``) and is not collected while the process runs
  (:mod:`sitestack.installs.generations`).

Standard library only; it runs at every start of the stack's interpreter, so it does no more than
two ``realpath`` calls and one ``open``. Any failure leaves the process as it was.
"""

import os
import sys


def _pin() -> "int | None":
    site_packages = os.path.dirname(os.path.abspath(__file__))
    generation = os.path.realpath(os.path.join(site_packages, "..", "..", ".."))
    parent, name = os.path.split(generation)
    if not name.startswith(".") or ".gen-" not in name:
        return None  # not in a generation (a copy staged elsewhere, a template): nothing to pin
    stable = os.path.join(parent, name[1:name.rindex(".gen-")])
    for i, entry in enumerate(sys.path):
        if entry == stable or entry.startswith(stable + os.sep):
            sys.path[i] = generation + entry[len(stable):]
    return os.open(generation, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))


try:
    HELD = _pin()
except OSError:
    HELD = None
