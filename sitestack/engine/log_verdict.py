"""The verdict of ``invoke nccl-log``: read NCCL/RCCL logs a user already has, against a site's expectation.

The reading is :mod:`sitestack.onsite.nccl_log` (the same code the validation job ships beside
``ddp_check.py``); the expectation comes from the site's facts through
:func:`sitestack.validation.jobs.nccl_expectation`, as in the job's ``check-config.json``.
"""

from __future__ import annotations

import glob
from collections.abc import Sequence
from pathlib import Path

from sitestack.core.errors import InputError
from sitestack.model.site import Site
from sitestack.onsite import nccl_log
from sitestack.onsite.visible import printable
from sitestack.validation.jobs import nccl_expectation


def expectation(site: Site | None, multi_node: bool | None = None) -> nccl_log.Expectation:
    """The site's expectation (none without a site); a site whose collectives are not NCCL/RCCL
    has no NCCL logs to judge: an error naming ``--site``."""
    if site is None:
        return nccl_log.Expectation(multi_node=multi_node)
    expect = nccl_expectation(site.facts)
    if expect is None:
        raise InputError("--site", f"{site.name} uses {site.facts.collectives} collectives, which write no NCCL/RCCL logs")
    return nccl_log.Expectation(expect["transport"], expect["provider"], expect["plugin"], multi_node=multi_node)


def log_files(patterns: Sequence[str]) -> list[Path]:
    """The files ``patterns`` name (paths, globs, or directories: every file in one, as the job's
    ``nccl/`` holds one file per rank), in order; one that matches nothing is an error naming it."""
    if not patterns:
        raise InputError("FILE", "missing: name one or more NCCL_DEBUG=INFO log files")
    files: list[Path] = []
    for pattern in patterns:
        matches = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
        if not matches:
            raise InputError(pattern, "no file matches this pattern")
        for name in matches:
            path = Path(name)
            if path.is_dir():
                files.extend(sorted(p for p in path.iterdir() if p.is_file()))
                continue
            if not path.is_file():
                raise InputError(name, "no such file" if not path.exists() else "not a regular file")
            files.append(path)
    return files


def read_logs(patterns: Sequence[str], site: Site | None, multi_node: bool | None = None) -> nccl_log.Verdict:
    """The verdict on the logs ``patterns`` name, read together (one run's per-rank files), line by
    line within :func:`sitestack.onsite.nccl_lines.read_files`'s bounds (each line up to
    ``LINE_MAX`` bytes, at most ``MESSAGES_MAX`` messages kept: memory bounded whatever the files' size)."""
    expect = expectation(site, multi_node)
    try:
        return nccl_log.read_logs([str(p) for p in log_files(patterns)], expect)
    except OSError as exc:
        raise InputError(printable(str(exc.filename or "FILE")), f"cannot read: {exc.strerror or exc}") from None
