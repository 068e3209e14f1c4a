"""What a step knows about its run: the site, its facts resolved for one host, the run's options."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sitestack.model.site import Facts, Site


@dataclass(frozen=True)
class RunContext:
    """What a step knows about the run: the site, its facts resolved for this host, options."""

    site: Site
    facts: Facts
    resolved: Mapping[str, Any]  # the facts as plain data, placeholders filled
    values: Mapping[str, str]  # placeholder values for this host
    check: bool = False
    log_dir: Path | None = None
    options: Mapping[str, Any] = field(default_factory=dict)  # task options (e.g. --source)
    actions: Mapping[str, Any] = field(default_factory=dict)  # the action table (sitestack.actions.ACTIONS)
