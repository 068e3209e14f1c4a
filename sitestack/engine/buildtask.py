"""One build step of a site, run through the playbook engine (the ``invoke build-*`` tasks).

A task such as ``invoke build-horovod`` makes one step (an action and its arguments), puts it
in the site's playbook in place of the playbook's own steps, and provisions: the site's hosts,
modules, check mode, locks and recap all work as for ``invoke provision``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sitestack.model.site import Site, StepSpec


def run_step(loaded: Site, spec: StepSpec, *, check: bool = False, diff: bool = False, hosts: Sequence[str] = (),
             prefix: str | None = None, account: str | None = None, source: str | None = None,
             sources_dir: str | None = None, mirror: str | None = None, jobs: int | None = None,
             accept_new_host_keys: bool = False, reporter: Any = None, lock_wait: float = 6 * 3600,
             extra: Mapping[str, Any] | None = None) -> list[Any]:
    """Provision ``loaded`` with ``spec`` as its only step; the options go to the step's context."""
    from sitestack.engine import playbook as pb

    single = dataclasses.replace(loaded, steps=(spec,), handlers=())
    options: dict[str, Any] = {"progress": reporter.note if reporter else None, "lock_wait": lock_wait}
    if source:
        options["source"] = str(Path(source).resolve())
    if sources_dir:
        options["sources_dir"] = str(Path(sources_dir).resolve())
    if mirror:
        options["mirror"] = str(Path(mirror).resolve())
    if jobs:
        options["jobs"] = int(jobs)
    if os.environ.get("SITESTACK_PROGRESS_INTERVAL"):
        options["progress_interval"] = float(os.environ["SITESTACK_PROGRESS_INTERVAL"])
    options.update(extra or {})
    run = pb.Options(check=check, diff=diff, hosts=tuple(hosts), prefix=prefix, account=account,
                     accept_new_host_keys=accept_new_host_keys, lock_wait=lock_wait, extra=options)
    return pb.provision(single, run, reporter)
