"""Progress of one install: phase lines in its build log, reported as they start, and a heartbeat
while a long phase runs (so a 40-minute compile is visibly alive)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sitestack.core.private import make_private, open_private
from sitestack.core.redact import redact


def _fmt(seconds: float) -> str:
    whole = int(seconds)
    return f"{whole // 60}m{whole % 60:02d}s" if whole >= 60 else f"{whole}s"


class Progress:
    """Phase lines in the build log, reported as they start; a heartbeat during long phases."""

    def __init__(self, log: Path, label: str, report: Callable[[str], None] | None, interval: float = 30.0,
                 shown: str | None = None) -> None:
        self.log = log
        self.label = label
        self.shown = shown or label
        self.report = report
        self.interval = interval
        self.start = time.monotonic()
        self.current = ""
        self._since = self.start
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        make_private(log.parent)   # build logs are the user's alone, whatever the umask

    def elapsed(self) -> str:
        return _fmt(time.monotonic() - self.start)

    def phase(self, name: str, detail: str = "") -> None:
        """Start phase ``name``: a ``==> sitestack: ... phase NAME (+ELAPSED)`` log line, and a report."""
        self.current = name
        self._since = time.monotonic()
        detail = redact(detail)  # a requirement may name a URL with credentials
        line = f"==> sitestack: {self.label}: phase {name} (+{self.elapsed()}){': ' + detail if detail else ''}"
        with open_private(self.log) as handle:
            handle.write(line + "\n")
        if self.report:
            self.report(f"    {self.shown}: {name} (+{self.elapsed()}){': ' + detail if detail else ''}")

    def note(self, text: str) -> None:
        """A line in the build log only."""
        with open_private(self.log) as handle:
            handle.write(redact(f"==> sitestack: {self.label}: {text}") + "\n")

    def __enter__(self) -> Progress:
        if self.report and self.interval > 0:
            self._thread = threading.Thread(target=self._beat, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()

    def _beat(self) -> None:
        while not self._stop.wait(self.interval):
            if self.report and self.current:
                self.report(f"    {self.shown}: still in {self.current} ({_fmt(time.monotonic() - self._since)} in this "
                            f"phase, +{self.elapsed()} in all; log: {self.log})")
