"""The ``sitestack`` command: Invoke's ``Program`` over the namespace ``tasks.py`` gathers too.

``sitestack TASK ...`` is ``invoke TASK ...`` run from the checkout, from any directory: the same
tasks, options, core flags (``--list``, ``--help TASK``, ``--complete``,
``--print-completion-script``) and configuration (the ``sitestack:`` section of Invoke's
configuration files, INVOKE_SITESTACK_* variables; docs/cli.md), checked as Invoke loads it
(:class:`~sitestack.engine.settings.SitestackConfig`).
"""

from __future__ import annotations

from invoke.collection import Collection
from invoke.program import Program

from sitestack import __version__
from sitestack.cli import build_tasks, container_tasks, history_tasks, log_tasks, site_tasks, stack_tasks, tune_tasks
from sitestack.engine.settings import SETTINGS, SitestackConfig

#: The task modules, in the order ``--list`` shows them (alphabetical within Invoke's listing).
TASK_MODULES = (site_tasks, build_tasks, stack_tasks, log_tasks, container_tasks, tune_tasks, history_tasks)


def namespace() -> Collection:
    """The root namespace: every task, with the ``sitestack:`` settings declared so Invoke reads
    them from its configuration files and INVOKE_SITESTACK_* variables (docs/cli.md)."""
    ns = Collection()
    ns.configure({"sitestack": SETTINGS})
    for module in TASK_MODULES:
        for task in Collection.from_module(module).tasks.values():
            ns.add_task(task)
    return ns


def main() -> None:
    """The ``sitestack`` console script (pyproject.toml ``[project.scripts]``)."""
    Program(namespace=namespace(), name="sitestack", version=__version__, binary="sitestack",
            binary_names=["sitestack"], config_class=SitestackConfig).run()
