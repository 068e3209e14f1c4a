"""YAML loading that remembers where every key came from.

``load_yaml(path)`` parses with PyYAML's safe constructors only, and returns
:class:`MarkedDict` / :class:`MarkedList` nodes that carry the 1-based line of the node and
of each key or item, so schema errors can name ``file:line``. Duplicate keys are an error
(PyYAML silently keeps the last one).

Parsing keeps line numbers, so it runs PyYAML's pure-Python composer: a no-op provision spent a
third of its time parsing the playbook and recipes. A parsed file is therefore kept in
``~/.cache/sitestack/parsed`` (private to the user; :func:`~sitestack.core.paths.derived_cache`), keyed by the file's path, inode, size, mtime
and ctime, and loaded from there while the file is unchanged (:func:`_cached`).
``SITESTACK_PARSE_CACHE=off`` turns it off.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
import stat
import time
from pathlib import Path
from typing import Any

import yaml

from sitestack.core import envvars
from sitestack.core.errors import InputError
from sitestack.core.files import atomic_write, signature_of
from sitestack.core.paths import derived_cache
from sitestack.core.private import private_dir


class MarkedDict(dict[Any, Any]):
    """A mapping from a YAML file; ``line`` is the mapping's line, ``lines[key]`` each key's."""

    line: int = 0
    lines: dict[Any, int]


class MarkedList(list[Any]):
    """A sequence from a YAML file; ``line`` is its line, ``lines[i]`` each item's."""

    line: int = 0
    lines: list[int]


#: Data files are small: a playbook or recipe over this size is refused before it is parsed.
MAX_BYTES = 1 << 20
#: YAML aliases (``*name``) a file may use: an alias bomb (aliases of aliases) would expand to
#: billions of nodes while placeholders are checked; no data file of ours needs many.
MAX_ALIASES = 64
#: Nesting deeper than this is refused (Python's recursion would fail on it).
MAX_DEPTH = 100


class _Loader(yaml.SafeLoader):
    """SafeLoader whose mappings and sequences record line numbers, with limits on aliases and depth."""

    aliases = 0
    depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self.aliases += 1
            if self.aliases > MAX_ALIASES:
                mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
                raise InputError(f"{self.name}:{mark.line + 1}", f"more than {MAX_ALIASES} YAML aliases")
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
                raise InputError(f"{self.name}:{mark.line + 1}", f"nested more than {MAX_DEPTH} levels deep")
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def _construct_mapping(loader: _Loader, node: yaml.MappingNode) -> MarkedDict:
    loader.flatten_mapping(node)
    result = MarkedDict()
    result.line = node.start_mark.line + 1
    result.lines = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, (str, int, float, bool)) and key is not None:
            raise InputError(f"{loader.name}:{key_node.start_mark.line + 1}", "mapping keys must be scalars")
        if key in result:
            raise InputError(
                f"{loader.name}:{key_node.start_mark.line + 1}",
                f"duplicate key (first on line {result.lines[key]})",
                key=str(key),
            )
        result[key] = loader.construct_object(value_node, deep=True)
        result.lines[key] = key_node.start_mark.line + 1
    return result


def _construct_sequence(loader: _Loader, node: yaml.SequenceNode) -> MarkedList:
    result = MarkedList(loader.construct_object(child, deep=True) for child in node.value)
    result.line = node.start_mark.line + 1
    result.lines = [child.start_mark.line + 1 for child in node.value]
    return result


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_sequence)


def display_path(path: Path) -> str:
    """The path as the user should see it: relative to the working directory when inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def load_yaml(path: Path) -> MarkedDict:
    """Parse ``path`` into a :class:`MarkedDict`.

    Raises :class:`InputError` naming the file and line for unreadable files, YAML syntax
    errors, empty documents, duplicate keys and a top level that is not a mapping.
    """
    shown = display_path(path)
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):
            raise InputError(shown, "not a regular file")
        with open(path, "rb") as handle:   # read at most the cap: /dev/zero-like files never end
            raw = handle.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise InputError(shown, "no such file") from None
    except OSError as exc:
        raise InputError(shown, f"cannot read: {exc.strerror or exc}") from None
    key = _cache_key(path, info)
    cached = _cached(key)
    if cached is not None:
        return cached
    if len(raw) > MAX_BYTES:
        raise InputError(shown, f"larger than {MAX_BYTES // 1024} KiB: not a data file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(shown, f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if "\x00" in text:
        line = text.count("\n", 0, text.index("\x00")) + 1
        raise InputError(f"{shown}:{line}", "contains a NUL byte")
    try:
        loader = _Loader(text)
    except yaml.YAMLError as exc:
        raise InputError(shown, f"YAML error: {exc}") from None
    loader.name = shown
    try:
        data = loader.get_single_data()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 0
        raise InputError(f"{shown}:{line}", f"YAML syntax error: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise InputError(shown, f"YAML error: {exc}") from None
    except RecursionError:
        raise InputError(shown, "nested too deeply") from None
    finally:
        loader.dispose()
    if data is None:
        raise InputError(f"{shown}:1", "the file is empty")
    if not isinstance(data, MarkedDict):
        raise InputError(f"{shown}:{getattr(data, 'line', 1)}", f"the top level must be a mapping, not {_kind(data)}")
    _keep(key, data, info)
    return data


#: Bump when MarkedDict/MarkedList or what load_yaml checks changes: older entries are not read.
PARSE_FORMAT = 1
#: A file changed this recently (seconds) may still be being written: its parse is not kept.
RACY = 2.0


def _cache_key(path: Path, info: os.stat_result) -> str | None:
    if not envvars.switched_on("SITESTACK_PARSE_CACHE"):
        return None
    ident = f"{PARSE_FORMAT}|{path.resolve()}|" + "|".join(map(str, signature_of(info)))
    return hashlib.sha256(ident.encode()).hexdigest()[:40]


def _cached(key: str | None) -> MarkedDict | None:
    """The parse kept under ``key``; None when there is none (or it cannot be read)."""
    directory = derived_cache("parsed")
    if key is None or directory is None:
        return None
    try:
        with open(directory / f"{key}.pickle", "rb") as handle:
            # The cache directory is the user's own (0700), written only by load_yaml: what it unpickles
            # is what this process would have parsed.
            data = pickle.load(handle)
    except Exception:  # a missing, partial or stale entry: parse the file
        return None
    return data if isinstance(data, MarkedDict) else None


def _keep(key: str | None, data: MarkedDict, info: os.stat_result) -> None:
    """Store a parse, unless the file changed in the last :data:`RACY` seconds."""
    directory = derived_cache("parsed")
    if key is None or directory is None or max(info.st_mtime, info.st_ctime) >= time.time() - RACY:
        return
    with contextlib.suppress(OSError):
        private_dir(directory)
        atomic_write(directory / f"{key}.pickle", pickle.dumps(data, protocol=pickle.HIGHEST_PROTOCOL), 0o600)


def _kind(value: Any) -> str:
    if isinstance(value, list):
        return "a list"
    return {str: "a string", int: "an integer", float: "a number", bool: "a boolean"}.get(type(value), type(value).__name__)
