"""sitestack's command line: ``invoke --list`` shows the tasks, ``invoke --help TASK`` their options.

Each task parses its options, calls one library function, prints through the reporter and
exits with the library's code. The tasks live in ``sitestack/cli/``; this file gathers them into
Invoke's root namespace.
"""

from __future__ import annotations

from invoke.collection import Collection

from sitestack.cli import build_tasks, container_tasks, log_tasks, site_tasks, stack_tasks
from sitestack.engine.task_glue import SETTINGS

#: The root namespace: every task, with the ``sitestack:`` settings declared so Invoke reads them
#: from its configuration files and INVOKE_SITESTACK_* variables (docs/cli.md).
ns = Collection()
ns.configure({"sitestack": SETTINGS})
for _module in (site_tasks, build_tasks, stack_tasks, log_tasks, container_tasks):
    for _task in Collection.from_module(_module).tasks.values():
        ns.add_task(_task)
