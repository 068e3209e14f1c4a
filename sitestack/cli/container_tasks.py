"""Tasks about containers and packed environments: pack-env."""

from __future__ import annotations

from typing import Any

from invoke.context import Context

from sitestack.cli.flags import RUN, Jobs
from sitestack.engine.task_glue import options_task, playbook_path, run_task


@options_task(*RUN, (Jobs, "name requirements dest"))
def pack_env(c: Context, o: Any) -> None:
    """Pack a Python environment (a requirements.txt or a conda env.yml) into one squashfs image, wrappers in <dest>/bin."""
    from sitestack.engine import partial_run  # imported by the task that uses it: the CLI starts light

    run_task(c, o, "pack-env", lambda options, report: partial_run.pack_env(
        site=o.site, playbook=playbook_path(o.playbook), name=o.name, requirements=o.requirements, dest=o.dest,
        options=options, reporter=report))
