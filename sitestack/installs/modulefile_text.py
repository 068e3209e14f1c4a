"""Values in module files and how each language quotes them.

A :class:`Text` is literal parts and environment variables read when the module is loaded;
:func:`lua` and :func:`tcl` (and the long-text forms for help) turn it into an expression of
that language, so a fact's ``$VAR`` or ``{user}`` is the loading user's, never the installer's.
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sitestack.core.errors import SitestackError
from sitestack.core.quoting import control_problem

#: Placeholders that must be the loading user's, not the installing user's.
RUNTIME = {"user": "USER", "home": "HOME"}

_ENV_REF = re.compile(r"\$(?:\x00([A-Za-z_][A-Za-z0-9_]*)\x00|([A-Za-z_][A-Za-z0-9_]*))")


@dataclass(frozen=True)
class Text:
    """A value in a module file: literal parts and environment variables read at load time."""

    parts: tuple[tuple[str, str], ...]  # ("lit", text), ("env", NAME) or ("gen", LINK)

    def __str__(self) -> str:
        return "".join(t if k in ("lit", "gen") else f"${{{t}}}" for k, t in self.parts)


#: The variable a module file keeps its stack's generation in (see ``generation`` in the base templates).
GENERATION_VAR = "sitestack_root"


def in_generation(link: str, rest: str) -> Text:
    """``rest`` under the generation the link ``link`` points at when the module is loaded (and under the
    same one when it is unloaded): the module file resolves the link once, not the shell at each use."""
    return Text((("gen", link), ("lit", rest)))


def literal(text: str) -> Text:
    return Text((("lit", text),))


def _env_refs(text: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    for match in _ENV_REF.finditer(text):
        if match.start() > pos:
            out.append(("lit", text[pos:match.start()]))
        out.append(("env", match.group(1) or match.group(2)))
        pos = match.end()
    if pos < len(text):
        out.append(("lit", text[pos:]))
    return out


def text_of(raw: str, values: Mapping[str, str]) -> Text:
    """A fact string as a module value: ``{user}``/``{home}`` and ``$VAR`` are read at load time,
    other placeholders are filled from ``values``."""
    parts: list[tuple[str, str]] = []
    raw = re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", "$\x00\\1\x00", raw)  # ${VAR} is not a placeholder
    for lit, name, _spec, _conv in string.Formatter().parse(raw):
        if lit:
            parts += _env_refs(lit)
        if name is None:
            continue
        if name in RUNTIME:
            parts.append(("env", RUNTIME[name]))
        elif name in values:
            parts += _env_refs(values[name])
        else:
            parts.append(("lit", "{" + name + "}"))
    merged: list[tuple[str, str]] = []
    for kind, text in parts:
        if merged and kind == "lit" and merged[-1][0] == "lit":
            merged[-1] = ("lit", merged[-1][1] + text)
        elif text or kind == "env":
            merged.append((kind, text))
    return Text(tuple(merged) or (("lit", ""),))


# -- messages users read (a deprecation notice) ---------------------------------------------------------
#: What a message in a module file may not hold besides control characters: quotes, backslashes,
#: brackets, braces, ``$`` and backticks. :func:`lua` and :func:`tcl` would quote them, but a notice
#: needs none of them, and without them the text reads the same in the file as on the terminal.
MESSAGE_FORBIDDEN = re.compile(r"[\\\"`$\[\]{}]")


def message_problem(text: str, *, placeholders: bool = False) -> str | None:
    """Why ``text`` cannot be a message a module file prints (None: it can): one line, none of
    :data:`MESSAGE_FORBIDDEN`; ``placeholders``: ``{name}`` placeholders (filled in later) are allowed."""
    if not text.strip():
        return "must not be empty"
    problem = control_problem(text)
    if problem:
        return problem
    found = MESSAGE_FORBIDDEN.search(re.sub(r"\{[A-Za-z_][A-Za-z0-9_]*\}", "", text) if placeholders else text)
    if found:
        return (f"{found.group()!r} is not allowed: a message holds no double quotes, backslashes, brackets, "
                "braces, $ or backticks")
    return None


def comment(text: str) -> str:
    """``text`` as the rest of a comment line of either language (after Lua's ``--``, Tcl's ``#``): one
    line without the characters :data:`MESSAGE_FORBIDDEN` names (a Tcl comment ending in a backslash
    would take the next line; braces count in a Tcl comment inside a braced body), else an error."""
    problem = message_problem(text)
    if problem:
        raise SitestackError(f"{text!r} cannot be a module file comment: {problem}")
    return text


# -- quoting for each language ------------------------------------------------------------------------
def _lua_string(text: str) -> str:
    out = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    return '"' + re.sub(r"[\x00-\x08\x0b\x0c\x0e-\x1f]", lambda m: f"\\{ord(m.group()):03d}", out) + '"'


def lua(value: Any) -> str:
    """A Lua expression for a string or :class:`Text`."""
    if not isinstance(value, Text):
        return _lua_string(str(value))
    pieces = [_lua_string(t) if k == "lit" else GENERATION_VAR if k == "gen" else f'(os.getenv({_lua_string(t)}) or "")'
              for k, t in value.parts]
    return " .. ".join(pieces) if pieces else '""'


def lua_long(text: str) -> str:
    """A Lua long string holding ``text`` verbatim."""
    level = 0
    while f"]{'=' * level}]" in text:
        level += 1
    eq = "=" * level
    return f"[{eq}[\n{text.rstrip()}\n]{eq}]"


def _tcl_escape(text: str) -> str:
    return re.sub(r'([\\"$\[\]{}])', r"\\\1", text).replace("\n", "\\n").replace("\r", "\\r")


def tcl_text(text: str) -> str:
    """A double-quoted Tcl word for text that may span lines (help)."""
    return '"' + re.sub(r'([\\"$\[\]{}])', r"\\\1", text.rstrip()) + '"'


def tcl(value: Any) -> str:
    """A double-quoted Tcl word for a string or :class:`Text`."""
    if not isinstance(value, Text):
        return '"' + _tcl_escape(str(value)) + '"'
    # an unset variable reads as "" (as in Lua), not as an error: SLURM_JOB_ID outside a job
    return '"' + "".join(_tcl_part(k, t) for k, t in value.parts) + '"'


def _tcl_part(kind: str, text: str) -> str:
    if kind == "lit":
        return _tcl_escape(text)
    if kind == "gen":
        return "${" + GENERATION_VAR + "}"
    return f'[expr {{[info exists ::env({text})] ? $::env({text}) : ""}}]'

