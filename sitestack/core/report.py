"""All output of a run: Ansible-like lines per step and host, diffs, and the recap table.

The only module that prints. Thread-safe: hosts run in parallel and report as they go.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from sitestack.core.private import open_private
from sitestack.core.redact import redact
from sitestack.core.step import Result
from sitestack.onsite.visible import printable


@dataclass
class HostRun:
    """The outcome on one host."""

    host: str
    results: list[Result] = field(default_factory=list)
    error: str | None = None
    elapsed: float = 0.0

    @property
    def failed(self) -> bool:
        return self.error is not None or any(r.status == "failed" for r in self.results)

    @property
    def changed(self) -> bool:
        return any(r.status == "changed" for r in self.results)

    def counts(self) -> dict[str, int]:
        """The recap's numbers. A step that could not be probed (its state is unknown) counts as
        ``unprobed``, not as ``changed``: nothing is known to change."""
        counts = {s: sum(1 for r in self.results if r.status == s and (r.probed or s != "changed"))
                  for s in ("ok", "changed", "failed", "skipped")}
        counts["failed"] += 1 if self.error else 0
        counts["unprobed"] = sum(1 for r in self.results if not r.probed)
        return counts


class Reporter:
    """Prints step results as they happen and a recap at the end."""

    def __init__(self, stream: TextIO | None = None, *, show_diff: bool = False, debug: bool = False,
                 quiet: bool = False) -> None:
        """``quiet``: nothing on the console (``--json -`` prints the document instead); the hosts'
        logs still get every line."""
        self.stream = stream or sys.stdout
        self.show_diff = show_diff
        self.debug = debug
        self.quiet = quiet
        self.site: str | None = None
        self.log_dir: Path | None = None  # this run's log directory (set by start), for the recap and --json
        self._lock = threading.Lock()
        self._logs: dict[str, Path] = {}

    def _print(self, text: str, host: str | None = None) -> None:
        """``text`` to the console, shown with :func:`~sitestack.onsite.visible.printable` (a step's
        message may quote a command's output or a job's log: escape sequences in it are shown, not
        acted on), and as it is (redacted) to ``host``'s log."""
        text = redact(text)  # the console, as the logs, never shows a secret
        with self._lock:
            if not self.quiet:
                print(printable(text), file=self.stream, flush=True)
            if host in self._logs:
                with open_private(self._logs[host]) as handle:
                    handle.write(text + "\n")

    def log_host_to(self, host: str, path: Path) -> None:
        """Also append everything reported for ``host`` to ``path`` (its own log file, private:
        :func:`~sitestack.core.private.open_private`)."""
        open_private(path).close()
        self._logs[host] = path

    def start(self, site: str, hosts: Sequence[str], check: bool, log_dir: Path | None = None) -> None:
        mode = "check mode: nothing will be changed" if check else "applying"
        self.site, self.log_dir = site, log_dir
        self._print(f"PLAY site {site} on {', '.join(hosts)} ({mode})"
                    + (f"\nlogs: {log_dir}" if log_dir is not None else ""))

    def result(self, host: str, result: Result) -> None:
        name = f"handler {result.step}" if result.handler else result.step
        line = f"[{host}] {result.status:<8} {name}"
        if result.message:
            first, *rest = result.message.splitlines()
            line += f": {first}"
            if rest:
                line += "\n" + "\n".join(f"    {r}" for r in rest)
        lines = [line]
        if self.show_diff and result.diff:
            lines.append("\n".join(f"    {d}" for d in result.diff.rstrip("\n").splitlines()))
        if self.debug and result.detail:
            lines.append(result.detail.rstrip())
        self._print("\n".join(lines), host)

    def host_error(self, host: str, message: str) -> None:
        self._print(f"[{host}] failed   {message}", host)

    def output(self, host: str, line: str) -> None:
        """One line of a command's output (``--verbose``): to the console only; the command's
        own log file already has it."""
        if not self.quiet:
            with self._lock:
                print(printable(redact(f"[{host}] | {line}")), file=self.stream, flush=True)

    def note(self, text: str, host: str | None = None) -> None:
        """A progress line; with ``host``, also into that host's log (provision.log)."""
        self._print(text, host)

    def recap(self, runs: Sequence[HostRun]) -> None:
        header = ("host", "ok", "changed", "failed", "skipped", "unprobed", "time")
        rows = []
        for run in runs:
            counts = run.counts()
            rows.append((run.host, *(str(counts[k]) for k in header[1:-1]), f"{run.elapsed:.2f}s"))
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        # the log directory heads the recap; the table stays last (scripts read its rows)
        out = ["", *([f"logs: {self.log_dir}"] if self.log_dir is not None else []), "RECAP"]
        for row in [header, *rows]:
            out.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
        self._print("\n".join(out))
