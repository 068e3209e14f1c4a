"""Text from logs, files and command output made safe to print on a terminal.

A log line or a command's output can hold terminal control sequences: colours (SGR), but also a
window title (OSC 0/2, ``ESC ] 0 ; TEXT BEL``), a hyperlink that shows one address and opens
another (OSC 8), device control strings (DCS), cursor moves and erases (CSI other than SGR),
8-bit C1 controls (0x80-0x9f, which some terminals read as ESC + a letter), BEL, backspace and a
carriage return that overwrites what was printed before it (ECMA-48, 5th edition, sections 5.4
and 8.3.89; https://invisible-island.net/xterm/ctlseqs/ctlseqs.html).

:func:`printable` shows every such character as a visible escape (``\\x1b``, ``\\x07``,
``\\x9b``, ``\\u202e``): what the text holds can still be read, and nothing of it acts on the
terminal. :func:`without_sequences` first replaces whole escape sequences (what a terminal would
act on, not show) with a space, for readers that match words in the text (the NCCL log reader).
:func:`short_line` keeps a value read from outside as one bounded line of the characters a record
allows (the history's texts, the toolchain's versions), anything else as ``?``; :func:`one_line`
folds whitespace alone (tabs and newlines: MPI libraries print both).

Standard library only, and nothing of sitestack: shipped beside the validation job's NCCL log
reader, and imported by sitestack itself wherever it prints what a run or a file said.
"""

from __future__ import annotations

import re

#: Characters never printed as they are: C0 controls, DEL, C1 controls, and the Unicode format
#: characters that reorder or hide text (bidirectional overrides and isolates, zero-width
#: characters, line and paragraph separators, the byte order mark).
_HIDDEN = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff]")
#: Whole escape sequences (7-bit forms; each alternative stops at the first character that cannot
#: continue it, so matching is linear in the text): CSI (``ESC [`` parameters, intermediates, a final
#: byte: colours, cursor moves), OSC (``ESC ]`` up to BEL or ST: titles, hyperlinks), and DCS, SOS,
#: PM, APC (``ESC P``, ``ESC X``, ``ESC ^``, ``ESC _`` up to ST).
_SEQUENCE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[PX^_][^\x1b]*\x1b\\")
#: What :func:`short_line` replaces: anything but printable ASCII (a history record's texts), or anything
#: but the characters of a version string (letters, digits, ``._+-:/@()~`` and space).
NOT_ASCII = re.compile(r"[^\x20-\x7e]")
NOT_VERSION = re.compile(r"[^A-Za-z0-9._+\-:/@()~ ]")
#: The most characters of a value :func:`short_line` looks at (its result is far shorter).
SHORT_LINE_INPUT = 1 << 16


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str, keep: str = "\n\t") -> str:
    """``text`` with every control or hidden-format character but those in ``keep`` written as a
    visible escape (``\\x1b``, ``\\u202e``); the rest unchanged."""
    if not _HIDDEN.search(text):
        return text
    return _HIDDEN.sub(lambda m: m.group() if m.group() in keep else _escape(m), text)


def escaped(text: str) -> str:
    """``text`` as one line of a message or listing: itself when printable, else every character
    Python would not print (controls, newlines, format and unassigned characters) written as Python
    writes it in a string literal (``a\\nb``, ``\\x1b``, ``\\u202e``): a name or value from outside
    (a file name, a key, an option's value) may hold any of them."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def without_sequences(text: str) -> str:
    """``text`` with each whole terminal escape sequence replaced by a space (the characters of
    an incomplete one stay, for :func:`printable` to show)."""
    return _SEQUENCE.sub(" ", text) if "\x1b" in text else text


def one_line(text: object) -> str:
    """``text`` with every run of whitespace (tabs, newlines) as one space, none at either end."""
    return " ".join(str(text).split())


def short_line(value: object, limit: int, unsafe: re.Pattern[str] = NOT_ASCII) -> str | None:
    """``value`` as one line (:func:`one_line`) of at most ``limit`` characters, each character
    ``unsafe`` matches written as ``?``; None for None and where nothing is left."""
    if value is None:
        return None
    return unsafe.sub("?", one_line(str(value)[:SHORT_LINE_INPUT]))[:limit].strip() or None
