"""The shipped modules the check program uses beside its package: the report, the NCCL log reader, the
site's history and the host-list parser, standard library only like this package.

In the repository (tests, the controller) they are ``sitestack.validation.ddp_report``,
``sitestack.validation.nccl_log`` and ``sitestack.programs.hostlist``; in the installed job they sit
next to ``ddp_check.py``, whose directory Python puts first on ``sys.path``. The relative import
fails there (this package is top-level), so the plain one runs.
"""

from __future__ import annotations

try:  # imported as part of sitestack
    from ...programs import hostlist
    from .. import ddp_report, history, nccl_log
except ImportError:  # the installed job: beside ddp_check.py
    import ddp_report  # type: ignore[no-redef, import-not-found, unused-ignore]
    import history  # type: ignore[no-redef, import-not-found, unused-ignore]
    import hostlist  # type: ignore[no-redef, import-not-found, unused-ignore]
    import nccl_log  # type: ignore[no-redef, import-not-found, unused-ignore]

__all__ = ["ddp_report", "history", "hostlist", "nccl_log"]
