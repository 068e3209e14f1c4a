"""YAML loading that remembers where every key came from.

``load_yaml(path)`` parses with PyYAML's safe constructors only, and returns
:class:`MarkedDict` / :class:`MarkedList` nodes that carry the 1-based line of the node and
of each key or item, so schema errors can name ``file:line``. Duplicate keys are an error
(PyYAML silently keeps the last one).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from sitestack.core.errors import InputError


class MarkedDict(dict[Any, Any]):
    """A mapping from a YAML file; ``line`` is the mapping's line, ``lines[key]`` each key's."""

    line: int = 0
    lines: dict[Any, int]


class MarkedList(list[Any]):
    """A sequence from a YAML file; ``line`` is its line, ``lines[i]`` each item's."""

    line: int = 0
    lines: list[int]


class _Loader(yaml.SafeLoader):
    """SafeLoader whose mappings and sequences record line numbers."""


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
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(shown, "no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(shown, f"cannot read: {exc}") from None
    loader = _Loader(text)
    loader.name = shown
    try:
        data = loader.get_single_data()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 0
        raise InputError(f"{shown}:{line}", f"YAML syntax error: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise InputError(shown, f"YAML error: {exc}") from None
    finally:
        loader.dispose()
    if data is None:
        raise InputError(f"{shown}:1", "the file is empty")
    if not isinstance(data, MarkedDict):
        raise InputError(f"{shown}:{getattr(data, 'line', 1)}", f"the top level must be a mapping, not {_kind(data)}")
    return data


def _kind(value: Any) -> str:
    if isinstance(value, list):
        return "a list"
    return {str: "a string", int: "an integer", float: "a number", bool: "a boolean"}.get(type(value), type(value).__name__)
