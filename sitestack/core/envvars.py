"""The ``SITESTACK_*`` environment variables sitestack reads on the controller: one table, :data:`VARIABLES`,
that is both the check and the documentation (docs/cli.md shows :func:`markdown_table`).

Each variable has a kind, and the kind is its type and range. An empty value is the same as an unset
one (the shell's convention: ``SITESTACK_LOG_DIR= invoke ...`` takes the default). Any other value that
does not fit is an :class:`~sitestack.core.errors.InputError` naming the variable, never a silent
fallback: a run refuses it before it does anything (:func:`check_all`, called when a task starts).

The variables that the programs sitestack ships read inside jobs (``SITESTACK_PYTHON`` and the
others of docs/validation.md) are checked by those programs, not here.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sitestack.core.errors import InputError
from sitestack.core.quoting import control_problem

#: --account and $SITESTACK_ACCOUNT: a project or account name (letters, digits, . _ -), never a path.
ACCOUNT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")

#: Directories no install prefix or cache may be: sitestack would take them over (a prefix's layout
#: step sets their mode to 0755: /tmp would lose its sticky bit; gc removes entries of a cache).
SYSTEM_DIRS = frozenset({"/", "/bin", "/boot", "/dev", "/dev/shm", "/etc", "/home", "/lib", "/lib32", "/lib64", "/media",
                         "/mnt", "/opt", "/proc", "/root", "/run", "/run/user", "/sbin", "/srv", "/sys", "/tmp", "/usr",
                         "/usr/bin", "/usr/lib", "/usr/local", "/usr/share", "/var", "/var/lib", "/var/log", "/var/tmp"})


def normal_path(path: str) -> str:
    """``path`` as the kernel resolves its spelling: ``.``, ``..``-free parts, repeated and trailing
    slashes gone, and a leading ``//`` too (POSIX lets ``//`` mean something else, so
    ``os.path.normpath`` keeps it; Linux does not, and ``//tmp`` is ``/tmp``)."""
    return "/" + os.path.normpath(path).lstrip("/") if path.startswith("/") else os.path.normpath(path)


def taken_dir_problem(path: str) -> str | None:
    """Why ``path`` cannot be a directory sitestack makes its own (an install prefix, a cache, the
    logs: it sets their modes and removes entries), or None: a system directory, or the home
    directory or one above it."""
    path = normal_path(path)
    home = normal_path(os.path.expanduser("~"))
    if path in SYSTEM_DIRS:
        return "is a system directory, not a directory of sitestack's own"
    if home == path or home.startswith(path.rstrip("/") + "/"):
        return "is your home directory or above it, not a directory of sitestack's own"
    return None

#: Values of an on/off switch (any case); the first four turn it on.
SWITCH = {"on": True, "1": True, "yes": True, "true": True, "off": False, "0": False, "no": False, "false": False}
#: A plain decimal number: no sign, exponent, ``nan``, ``inf``, ``_`` or other scripts' digits.
DECIMAL = re.compile(r"[0-9]+(?:\.[0-9]+)?")


@dataclass(frozen=True)
class Variable:
    """One variable: ``kind`` (its type and range: :data:`KINDS`), what it is when unset, what it does."""

    name: str
    kind: str
    default: str
    doc: str
    choices: tuple[str, ...] = ()   # kind "choice"
    low: float = 0.0                # kind "seconds"
    high: float = 0.0


#: What each kind accepts (the docs table's "type" column).
KINDS = {
    "account": "an account name: letters, digits, `.`, `_`, `-`",
    "cache": "an absolute path, no `..`; not a system directory, your home or a directory above it",
    "paths": "absolute paths, no `..`, `:`-separated",
    "file": "an absolute path of an existing file",
    "data": "an absolute path of a directory with `playbooks/`, `sources/`, `patches/`, `modulefiles/`, all yours or root's and not world-writable",
    "seconds": "a number of seconds",
    "choice": "one of",
    "switch": "`on` or `off` (also `1`/`0`, `yes`/`no`, `true`/`false`)",
}

VARIABLES = (
    Variable("SITESTACK_ACCOUNT", "account", "none", "the project/account for `{account}` in site facts (`--account`)"),
    Variable("SITESTACK_LOG_DIR", "cache", "`~/.cache/sitestack/logs`", "where run logs go (`sitestack.log_dir`)"),
    Variable("SITESTACK_BUILD_CACHE", "cache", "`~/.cache/sitestack/builds` on each host",
             "the build cache: built artefacts, source tarballs, build tools, stack templates"),
    Variable("SITESTACK_SOURCE_CACHE", "cache", "`~/.cache/sitestack/sources`", "downloaded source tarballs, on the controller"),
    Variable("SITESTACK_MIRROR", "paths", "none", "directories of source tarballs looked up before downloading (like `--mirror`)"),
    Variable("SITESTACK_FACTS", "paths", "none", "site-local facts files, merged over every playbook's facts in order"),
    Variable("SITESTACK_DATA_DIR", "data", "the checkout, else the installed package's data",
             "a site's own copy of the playbooks, recipes, patches and module-file templates"),
    Variable("SITESTACK_SSH_CONFIG", "file", "`~/.ssh/config`", "the SSH config to connect with"),
    Variable("SITESTACK_PROGRESS_INTERVAL", "seconds", "30", "seconds between a long build's progress lines",
             low=1, high=86400),
    Variable("SITESTACK_VENV_TEMPLATE", "choice", "link", "fill stack environments from a template by hard links, "
             "copies, or not at all (pip)", choices=("link", "copy", "off")),
    Variable("SITESTACK_PARSE_CACHE", "switch", "on", "keep parsed playbooks and recipes (`~/.cache/sitestack/parsed`)"),
    Variable("SITESTACK_RENDER_CACHE", "switch", "on", "keep rendered module files and job files (`~/.cache/sitestack/renders`)"),
    Variable("SITESTACK_PROBE_CACHE", "switch", "on", "keep the answers of slow probes (`~/.cache/sitestack/probes`)"),
    Variable("SITESTACK_TIME_LIMIT", "seconds", "from `scheduler.time`", "the validation job's time limit for its checks "
             "(the batch script takes it first; `invoke validate` compares it with the site's healthy runs)",
             low=1, high=30 * 86400),
)
BY_NAME = {v.name: v for v in VARIABLES}


#: The most entries of a data directory checked (a site's copy holds a few hundred; more is not one).
DATA_ENTRIES_MAX = 20000


def untrusted_data(root: str) -> str | None:
    """Why the data directory ``root`` is not to be trusted, or None: it holds code (module-file templates
    run when rendered, recipes say what a build runs), so it, its four folders and everything in them
    (links followed) must be owned by the user or root and writable by no other user than those (group
    write is a site team's; world write is anyone's)."""
    paths = [root]
    for directory, dirs, files in os.walk(root):
        paths += (os.path.join(directory, name) for name in dirs + files)
        if len(paths) > DATA_ENTRIES_MAX:
            return f"{root} holds more than {DATA_ENTRIES_MAX} entries: not a data directory"
    for path in paths:
        try:
            info = os.stat(path)
        except OSError as exc:
            return f"{path} cannot be read ({exc.strerror})"
        if info.st_uid not in (os.geteuid(), 0):
            return (f"{path} is owned by another user (uid {info.st_uid}): a data directory holds code, "
                    "so its files are yours or root's")
        if info.st_mode & 0o002:
            return f"{path} is writable by every user (mode {info.st_mode & 0o7777:o}): a data directory holds code"
    return None


def check_path(name: str, text: str) -> str:
    """``text`` if it is an absolute, one-line path without a ``..`` part; else an error naming ``name``."""
    problem = control_problem(text)
    if problem:
        raise InputError(name, problem)
    if not text.startswith("/"):
        raise InputError(name, f"{text!r} must be an absolute path")
    if ".." in text.split("/"):
        raise InputError(name, f"{text!r} must not have a '..' part")
    return text


def check_own_dir(name: str, text: str) -> str:
    """A directory sitestack writes in and trims (a cache, the logs): a path as :func:`check_path`
    wants, and not a system directory, the home directory or a directory above it."""
    problem = taken_dir_problem(check_path(name, text))
    if problem:
        raise InputError(name, f"{text!r} {problem}")
    return text


def _seconds(var: Variable, text: str) -> float:
    if not DECIMAL.fullmatch(text) or not math.isfinite(float(text)):
        raise InputError(var.name, f"{text!r} is not a number of seconds (e.g. 30)")
    number = float(text)
    if not var.low <= number <= var.high:
        raise InputError(var.name, f"must be between {var.low:g} and {var.high:g} seconds, not {text}")
    return number


def _parse(var: Variable, text: str) -> Any:   # noqa: PLR0911 -- one return per kind
    if var.kind == "account":
        if not ACCOUNT.fullmatch(text) or ".." in text:
            raise InputError(var.name, f"{text!r} is not an account name (letters, digits, '.', '_' and '-')")
        return text
    if var.kind == "cache":
        return check_own_dir(var.name, text)
    if var.kind == "paths":
        return [check_path(var.name, part) for part in text.split(os.pathsep) if part]
    if var.kind == "file":
        if not os.path.isfile(check_path(var.name, text)):
            raise InputError(var.name, f"{text}: no such file")
        return text
    if var.kind == "data":
        missing = [f"{d}/" for d in ("playbooks", "sources", "patches", "modulefiles")
                   if not os.path.isdir(os.path.join(check_path(var.name, text), d))]
        if missing:
            raise InputError(var.name, f"{text} has no {', '.join(missing)} (a data directory has all four)")
        problem = untrusted_data(text)
        if problem:
            raise InputError(var.name, problem)
        return text
    if var.kind == "seconds":
        return _seconds(var, text)
    if var.kind == "choice":
        if text.lower() not in var.choices:
            raise InputError(var.name, f"{text!r} is not one of {', '.join(var.choices)}")
        return text.lower()
    if text.lower() not in SWITCH:
        raise InputError(var.name, f"{text!r} is not on or off")
    return SWITCH[text.lower()]


def get(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """The checked value of variable ``name`` (one of :data:`VARIABLES`) in ``environ`` (default: the
    process's): None when unset or empty, else a str, a list of paths (kind ``paths``), a float
    (``seconds``) or a bool (``switch``)."""
    var = BY_NAME[name]
    text = (os.environ if environ is None else environ).get(name, "")
    return _parse(var, text) if text else None


def switched_on(name: str) -> bool:
    """A switch's state: on unless the variable turns it off."""
    value = get(name)
    return True if value is None else bool(value)


def check_all() -> None:
    """Refuse the first variable of the table that is set to a value it does not accept."""
    for var in VARIABLES:
        get(var.name)


def markdown_table() -> str:
    """The table of docs/cli.md: name, type and range, default, what it does."""
    rows = ["| variable | value | default | what it does |", "|---|---|---|---|"]
    for var in VARIABLES:
        kind = KINDS[var.kind]
        if var.kind == "choice":
            kind += " " + ", ".join(f"`{c}`" for c in var.choices)
        elif var.kind == "seconds":
            kind += f", {var.low:g} to {var.high:g}"
        rows.append(f"| `{var.name}` | {kind} | {var.default} | {var.doc} |")
    return "\n".join(rows)
