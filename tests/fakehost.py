"""An in-memory host for engine tests: files in a dict, every mutation recorded."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from sitestack.core.errors import MutationRefused
from sitestack.core.host import Completed, Host


class FakeHost(Host):
    """Files live in ``self.files``; ``self.mutations`` lists every change made."""

    def __init__(self, name: str = "fake", *, read_only: bool = False) -> None:
        self.name = name
        self.read_only = read_only
        self.files: dict[str, str] = {}
        self.mutations: list[str] = []
        self.probes: list[str] = []
        self._identity = ("/home/fake", "fake")

    def probe(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
              cwd: str | None = None, timeout: float | None = 60) -> Completed:
        self.probes.append(" ".join(argv))
        if argv[0] == "test" and argv[1] == "-e":
            return Completed(0 if argv[2] in self.files else 1, "", "")
        return Completed(0, "", "")

    def run(self, argv: Sequence[str], **kwargs: Any) -> Completed:
        self._refuse_if_read_only(f"run {' '.join(argv)}")
        self.mutations.append("run " + " ".join(argv))
        return Completed(0, "", "")

    def read_text(self, path: str) -> str | None:
        return self.files.get(path)

    def read_tail(self, path: str, limit: int = 65536, *, follow: bool = True) -> str | None:
        text = self.files.get(path)
        return None if text is None else text[-limit:]

    def write_text(self, path: str, text: str, mode: int = 0o644) -> None:
        self._refuse_if_read_only(f"write {path}")
        self.mutations.append(f"write {path}")
        self.files[path] = text

    def put_file(self, local: Path, remote: str, mode: int = 0o644) -> None:
        self.write_text(remote, Path(local).read_text(), mode)

    def exists(self, path: str) -> bool:
        return path in self.files

    @contextlib.contextmanager
    def lock(self, path: str, *, wait: float = 0, report: Callable[[str], None] | None = None) -> Iterator[None]:
        self._refuse_if_read_only(f"lock {path}")
        yield

    def read_only_view(self) -> FakeHost:
        view = FakeHost(self.name, read_only=True)
        view.files = self.files
        view.mutations = self.mutations
        return view


__all__ = ["FakeHost", "MutationRefused"]


def read_only_view(host: Host) -> Host:
    """A view of a real host that probes but refuses every mutation, as check mode's hosts do."""
    view = object.__new__(type(host))
    view.__dict__.update(host.__dict__)
    view.read_only = True
    return view
