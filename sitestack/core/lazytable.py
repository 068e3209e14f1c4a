"""A name -> class table whose classes are imported when first looked up.

The action table and the package hooks table name every implementation; importing all of them
costs a no-op provision about a quarter of its import time (a container action pulls in the
validation job's renderers, the RCCL plugin's hooks its own checks) though a playbook uses a few.
:class:`LazyTable` keeps the one explicit table (names and where each class lives, in one place)
and imports a class the first time it is asked for. Iterating over values or items imports all.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from typing import Generic, TypeVar

T = TypeVar("T")


class LazyTable(Mapping[str, T], Generic[T]):
    """``name -> "package.module:Attribute"``, read as ``name -> the attribute`` (imported on first use).

    A table entry that does not import or name its attribute is a programming error: it raises
    :class:`ImportError` or :class:`AttributeError` when looked up, as the eager import would have at
    start-up (a test imports every entry)."""

    def __init__(self, where: Mapping[str, str]) -> None:
        self._where = dict(where)
        self._loaded: dict[str, T] = {}

    def __getitem__(self, name: str) -> T:
        found = self._loaded.get(name)
        if found is None:
            module, _, attr = self._where[name].partition(":")
            found = getattr(importlib.import_module(module), attr)
            self._loaded[name] = found
        return found

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, name: object) -> bool:
        return name in self._where
