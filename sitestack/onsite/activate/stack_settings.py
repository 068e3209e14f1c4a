"""The stack's settings extend-venv-activate was installed with, and what activation puts on PYTHONPATH
from them.

The ``venv-hook`` step writes the settings as JSON beside the ``onsite/`` directory the command runs
from (``<stack>/share/sitestack/extend-venv-activate.json``): the module's name, the module
directories, the module system's init script per shell, the stack's Python major.minor, its stable
path and site-packages, and the variable its module names the loaded generation in.
:func:`read_settings` reads them (bounded, every key's type checked); :func:`check_config` refuses a
value that would be unsafe in a shell script, whichever way the settings came.
"""

import re
from collections.abc import Callable
from typing import Any

from ..fileio import ReadError, parse_json
from . import COMMAND, Refused
from .scriptfiles import read_bytes
from .shell_quote import csh_quote, fish_quote, sh_quote

_MODULE_NAME = re.compile(r"[A-Za-z0-9._+-]+(/[A-Za-z0-9._+-]+)*")
_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

#: The most bytes of settings read: a few hundred in practice.
SETTINGS_LIMIT = 1 << 16


def _text(value: Any) -> bool:
    return isinstance(value, str)


def _optional_text(value: Any) -> bool:
    return value is None or isinstance(value, str)


def _texts(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _inits(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and _texts(v) for k, v in value.items())


#: Each key of the settings: whether it must be there, the test of its value, and what the test wants.
FIELDS: "dict[str, tuple[bool, Callable[[Any], bool], str]]" = {
    "site": (False, _text, "a string"),
    "module": (True, _text, "a string"),
    "module_roots": (True, _texts, "a list of strings"),
    "init": (False, _inits, "an object of shell name -> list of strings"),
    "python_version": (True, _text, "a string"),
    "stack": (False, _optional_text, "a string or null"),
    "site_packages": (False, _optional_text, "a string or null"),
    "generation_var": (False, _optional_text, "a string or null"),
}


def read_settings(path: str) -> "dict[str, Any]":
    """The settings in the JSON file ``path``; Refused, naming the file (and line or key), when it is
    missing, larger than :data:`SETTINGS_LIMIT`, not JSON, or a key is missing, unknown or of the wrong
    type. The values' safety is :func:`check_config`'s."""
    try:
        data = read_bytes(path, SETTINGS_LIMIT)
    except FileNotFoundError:
        raise Refused(f"this copy has no stack settings ({path} is missing: run the one in the stack's bin/)") from None
    except OSError as exc:
        raise Refused(f"{path}: cannot read the settings: {exc.strerror}") from None
    try:   # the one parser of what sitestack reads back: finite numbers, nesting bounded
        settings = parse_json(data, path)
    except ReadError as exc:
        if exc.reason.startswith("not JSON (not UTF-8"):
            raise Refused(f"{path}: the settings are not UTF-8 text") from None
        raise Refused(f"{path}{f':{exc.line}' if exc.line else ''}: the settings are {exc.reason}") from None
    if not isinstance(settings, dict):
        raise Refused(f"{path}: the settings are not a JSON object")
    for key, (required, test, want) in FIELDS.items():
        if key in settings and not test(settings[key]):
            raise Refused(f"{path}: key {key!r}: must be {want}")
        if required and key not in settings:
            raise Refused(f"{path}: key {key!r} is missing")
    unknown = sorted(set(settings) - set(FIELDS))
    if unknown:
        raise Refused(f"{path}: key {unknown[0]!r} is not a setting of this command")
    return settings


def stack_packages(config: "dict[str, Any]") -> str:
    """The stack's site-packages that activation puts after the venv's on PYTHONPATH, or "" (a stack in a
    container image, whose packages the container's own PYTHONPATH names)."""
    return str(config.get("site_packages") or "")


#: Per shell: its quoting; the line that sets ``_sitestack_p``, the stack's site-packages for PYTHONPATH, to the
#: stable path; the lines that make it the site-packages of the generation the module loaded, where the module names
#: that in {var} (an older module file does not; a value that is not an absolute path of plain characters is
#: not used: bash and zsh say so); the word for ``_sitestack_p`` in PYTHONPATH.
PICK: "dict[str, tuple[Callable[[str], str], str, str, str]]" = {
    "bash": (sh_quote, "_sitestack_p={stable}\n",
             'case "${{{var}:-}}" in *[!A-Za-z0-9_./+@=,-]*) echo "' + COMMAND + ': {var} is not a path of letters, digits'
             ' and ./_+@=,-: the stack\'s stable site-packages are used" >&2 ;; /*) _sitestack_p="${var}"{suffix} ;; esac\n',
             ':"$_sitestack_p"'),
    "fish": (fish_quote, "set -l _sitestack_p {stable}\n",
             "string match -qr -- '^/[A-Za-z0-9_./+@=,-]*$' \"${var}\"; and set _sitestack_p \"${var}\"{suffix}\n",
             "$_sitestack_p "),
    "csh": (csh_quote, "set _sitestack_p = {stable}\n",
            'if ( $?{var} ) then\n    if ( "${var}" =~ /* ) set _sitestack_p = "${var}"{suffix}\nendif\n',
            ":${_sitestack_p}"),
}


def pick_packages(config: "dict[str, Any]", shell: str) -> "dict[str, str]":
    """The template fields for the stack's site-packages in ``shell`` (bash, fish, csh): ``pick``, :data:`PICK`'s lines
    (the stable path only with settings older than "generation_var"), and ``stack_packages``, their word in PYTHONPATH;
    both "" for a stack without site-packages of its own (a container's). The generation's, so that a job keeps the
    generation it loaded while an upgrade moves the stable link on (docs/operating.md)."""
    packages, var = stack_packages(config), config.get("generation_var")
    root = str(config.get("stack") or "").rstrip("/")
    if not packages:
        return {"pick": "", "stack_packages": ""}
    quote, stable, choose, word = PICK[shell]
    pick = stable.format(stable=quote(packages))
    if var and root and packages.startswith(root + "/"):  # else no generation holds these site-packages
        pick += choose.format(var=var, suffix=quote(packages[len(root):]))
    return {"pick": pick, "stack_packages": word}


def check_config(config: "dict[str, Any]") -> None:
    """Refuse settings that would put an unsafe module name, directory or variable name into a shell script."""
    if not _MODULE_NAME.fullmatch(config["module"]):
        raise Refused("bad module name {!r} in this command's settings".format(config["module"]))
    for root in config["module_roots"]:
        if "\n" in root or not root.startswith("/"):
            raise Refused(f"bad module directory {root!r} in this command's settings")
    packages = stack_packages(config)
    if packages and ("\n" in packages or not packages.startswith("/")):
        raise Refused(f"bad stack site-packages {packages!r} in this command's settings")
    var = config.get("generation_var")
    if var is not None and not _VARIABLE.fullmatch(str(var)):
        raise Refused(f"bad generation variable {var!r} in this command's settings")
