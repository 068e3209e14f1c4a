"""The mount table of the container runtime stand-in (tests/twins/runtime.py): the host's ``/`` with
binds and the image's tree laid over it, emitted as bubblewrap arguments.

A bind onto a path that does not exist gets a mount point the way Apptainer's "underlay" does: the
nearest existing directory is replaced by a tmpfs holding binds of its entries (bubblewrap cannot
create a mount point in a read-only bind).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field


class Fatal(Exception):
    """An error the runtime reports as ``FATAL: ...`` and exit status 255."""


# -- the mount table: host / with binds laid over it ---------------------------------------------------
@dataclass
class Node:
    """A path in the container: what is mounted there (None: nothing of its own) and below it."""

    source: str | None = None      # host path bound here; "" for a tmpfs
    ro: bool = True
    symlink: str | None = None
    children: dict[str, Node] = field(default_factory=dict)


class View:
    """The container's mount table, built bind by bind, emitted as bwrap arguments (``writable``: the
    host's entries bound read-write, as a site twin's namespace has them)."""

    def __init__(self, writable: bool = False) -> None:
        self.root = Node(source="")   # bwrap's own root is a tmpfs; the host's entries are bound into it
        self._fill(self.root, "/", ro=not writable)

    @staticmethod
    def _fill(node: Node, host_dir: str, ro: bool) -> None:
        for entry in sorted(os.listdir(host_dir)):
            if entry in node.children or (host_dir == "/" and entry in ("proc", "dev", "sys")):
                continue
            full = os.path.join(host_dir, entry)
            node.children[entry] = Node(symlink=os.readlink(full)) if os.path.islink(full) else Node(source=full, ro=ro)

    def lookup(self, parts: list[str]) -> tuple[str | None, bool]:
        """(what the container path ``parts`` shows: a host path, "" for a directory made in a tmpfs,
        None when nothing is there; whether it is read-only)."""
        node, base, depth, matched = self.root, self.root, 0, True
        for i, part in enumerate(parts):
            child = node.children.get(part)
            if child is None:
                matched = False
                break
            if child.symlink is not None:
                return None, True
            node = child
            if child.source is not None:
                base, depth = child, i + 1
        if base.source == "":
            return ("" if matched else None), base.ro
        assert base.source is not None
        host = os.path.join(base.source, *parts[depth:])
        return (host if os.path.lexists(host) else None), base.ro

    def exists(self, parts: list[str]) -> bool:
        return self.lookup(parts)[0] is not None

    def _underlay(self, parts: list[str]) -> None:
        """Make the directory ``parts`` a tmpfs holding binds of its entries (Apptainer's underlay)."""
        host, ro = self.lookup(parts)
        node = self.root
        for part in parts:
            node = node.children.setdefault(part, Node())
        if node.source == "":
            return
        node.source, node.symlink = "", None
        if host:
            self._fill(node, host, ro)

    def bind(self, source: str, dest: str, ro: bool) -> None:
        """Mount ``source`` at ``dest``, making a mount point where there is none."""
        parts = [p for p in os.path.normpath(dest).split("/") if p]
        if not parts:
            raise Fatal("cannot bind onto /")
        if not self.exists(parts):
            # the deepest existing directory on the way becomes a tmpfs; bwrap makes the rest in it
            k = len(parts) - 1
            while k > 0 and not self.exists(parts[:k]):
                k -= 1
            if k:
                self._underlay(parts[:k])
        node = self.root
        for part in parts:
            node = node.children.setdefault(part, Node())
        node.source, node.ro, node.symlink, node.children = source, ro, None, {}

    def overlay(self, tree: str, dest: str = "/", ro: bool = True) -> None:
        """Lay the image's ``tree`` over the view: merge directories both have, bind the rest
        (``ro=False``: writable, for %post; what it writes in a directory the host has too is lost)."""
        parent = [p for p in dest.split("/") if p]
        for entry in sorted(os.listdir(tree)):
            src, dst = os.path.join(tree, entry), os.path.join(dest, entry)
            host, _ = self.lookup([*parent, entry])
            if os.path.islink(src):
                if parent:
                    self._underlay(parent)
                node = self.root
                for part in parent:
                    node = node.children[part]
                node.children[entry] = Node(symlink=os.readlink(src))
            elif os.path.isdir(src) and host is not None and (host == "" or os.path.isdir(host)) \
                    and not os.path.islink(host or "/"):
                self.overlay(src, dst, ro)
            else:
                self.bind(src, dst, ro=ro)

    def argv(self) -> list[str]:
        out: list[str] = []

        def walk(node: Node, path: str) -> None:
            if path != "/":
                if node.symlink is not None:
                    out.extend(["--symlink", node.symlink, path])
                    return
                if node.source == "":
                    out.extend(["--tmpfs", path])
                elif node.source is not None:
                    out.extend(["--ro-bind" if node.ro else "--bind", node.source, path])
            for name in sorted(node.children):
                walk(node.children[name], os.path.join(path, name))

        walk(self.root, "/")
        return out
