"""sitestack's command line: ``invoke --list`` shows the tasks, ``invoke --help TASK`` their options.

Each task parses its options, calls one library function, prints through the reporter and
exits with the library's code. The tasks live in ``sitestack/cli/``; this file gives Invoke their
root namespace, the one the installed ``sitestack`` command runs (sitestack/cli/program.py).
"""

from __future__ import annotations

from invoke.config import Config

from sitestack.cli.program import namespace
from sitestack.engine.settings import guard

#: ``invoke`` made its Config before it imported this file: its class is made to check the
#: configuration it loads from here on (the project's invoke.yaml, ``-f FILE``, the ``sitestack:``
#: section of every file, INVOKE_SITESTACK_* variables; sitestack/engine/settings.py).
guard(Config)
#: The root namespace: every task, with the ``sitestack:`` settings declared (docs/cli.md).
ns = namespace()
