"""The one seam where values become text of generated shell, Lua, Tcl and batch scripts.

Every value from a playbook, a recipe or the command line that ends up in a generated file
goes through this module: :func:`control_problem` refuses control characters when the value is
loaded (a newline would end a ``#SBATCH`` line, a comment or a Lua string and start a command),
:func:`sh` quotes a word for POSIX shells (``shlex.quote``), and :func:`sh_expanding` quotes a
value whose ``$NAME`` / ``${NAME}`` references must expand when the script runs while nothing
else does (no ``$(...)``, no backticks, no ``$((...))``); :func:`sh_default` is such a value as the
default of a variable, which a value the environment already has wins over.
"""

from __future__ import annotations

import re
import shlex

#: C0 and C1 control characters and DEL (not TAB), the Unicode line and paragraph separators
#: (Python's splitlines breaks there) and the bidirectional and zero-width format characters
#: that make text display other than it reads ("trojan source").
CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff]")
#: An environment variable name that every shell accepts.
SHELL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: A reference the value may keep: $NAME or ${NAME}.
_REFERENCE = re.compile(r"\$(?:\{[A-Za-z_][A-Za-z0-9_]*\}|[A-Za-z_][A-Za-z0-9_]*)")

_NAMES = {"\n": "a newline", "\r": "a carriage return", "\x00": "a NUL byte", "\x1b": "an escape character"}


def control_problem(value: str) -> str | None:
    """Why ``value`` cannot go into a generated file (a control character), or None."""
    found = CONTROL.search(value)
    if found is None:
        return None
    char = found.group()
    return f"contains {_NAMES.get(char, f'the control character {char!r}')}: values must be one line"


def in_prefix_problem(path: str, what: str) -> str | None:
    """Why ``path`` (a step argument) is not ``{prefix}`` or below it, or has a ``..`` part: what a
    step writes stays in the install prefix (None: it does)."""
    if not path.startswith(("/", "{")):
        return f"{what}: {path!r} must be absolute"
    if path != "{prefix}" and not path.startswith("{prefix}/"):
        return f"{what}: {path!r} must be {{prefix}} or a path below it"
    if ".." in path.split("/"):
        return f"{what}: {path!r} must not have a '..' part"
    return None


def sh(value: str) -> str:
    """``value`` as one shell word (single quotes where needed)."""
    return shlex.quote(value)



def sh_expanding(value: str) -> str:
    """``value`` in double quotes: ``$NAME`` and ``${NAME}`` expand when the script runs, nothing else.

    Every other ``$`` (``$(``, ``$((``, ``$1``, ``$$``), backticks, backslashes and double quotes
    are escaped, so the value cannot run a command.
    """
    return '"' + _expanding_body(value, r'([\\"`$])') + '"'


def sh_default(name: str, value: str) -> str:
    """``"${NAME:-value}"``: the variable's own value where it is set and not empty, else ``value``
    (quoted as :func:`sh_expanding` quotes it, so its ``$NAME`` references expand and nothing else does).

    A ``}`` in the value is escaped (``\\}``: the same in bash, dash and zsh). A ``'`` cannot be: bash
    (outside POSIX mode) reads it as a quote inside ``${...}``, so a value holding one goes in a
    double-quoted word of its own, ``"${NAME:-"value"}"``, which every POSIX shell reads alike.
    """
    if not SHELL_NAME.fullmatch(name):
        raise ValueError(f"{name!r} is not an environment variable name")
    if "'" in value:
        return f'"${{{name}:-{sh_expanding(value)}}}"'
    return f'"${{{name}:-' + _expanding_body(value, r'([\\"`$}])') + '}"'


def _expanding_body(value: str, special: str) -> str:
    """``value`` with its ``$NAME``/``${NAME}`` references as they are and every character of
    ``special`` (a regex group) outside them escaped with a backslash."""
    out = []
    pos = 0
    for match in _REFERENCE.finditer(value):
        out.append(re.sub(special, r"\\\1", value[pos:match.start()]))
        out.append(match.group())
        pos = match.end()
    out.append(re.sub(special, r"\\\1", value[pos:]))
    return "".join(out)
