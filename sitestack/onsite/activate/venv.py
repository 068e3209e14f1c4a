"""A user's venv as extend-venv-activate sees it: its ``pyvenv.cfg`` (:func:`read_venv`), the original of
each activate script (saved beside it as ``<script>.sitestack-orig`` the first time, recovered from
between the two marked blocks when that copy is gone), and what extending it writes (:func:`plan`).

The extended scripts are always made from the originals, so extending twice gives byte-identical
files; every file is written atomically, and only when its bytes change (:func:`.scriptfiles.write_if_changed`).
"""

import os
import re
from typing import Any

from . import BEGIN, CSH_DEACTIVATE, END, ORIG, SCRIPTS, Refused
from .bash import bash_text
from .csh import csh_texts
from .fish import fish_text
from .scriptfiles import read_text
from .stack_settings import check_config


def read_venv(path: str) -> "dict[str, Any]":
    """The venv at ``path``: its root and Python major.minor; Refused when it is not a venv."""
    if not os.path.lexists(path):
        raise Refused(f"{path} does not exist")
    if not os.path.isdir(path):
        raise Refused(f"{path} is not a directory (give the venv's top directory)")
    cfg_path = os.path.join(path, "pyvenv.cfg")
    if not os.path.isfile(cfg_path):
        raise Refused(f"{path} is not a Python venv (no pyvenv.cfg; make one with "
                      f"`python3 -m venv --system-site-packages {path}`)")
    cfg: dict[str, str] = {}
    for line in read_text(cfg_path, errors="replace").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            cfg[key.strip().lower()] = value.strip()
    version = cfg.get("version") or cfg.get("version_info") or ""
    match = re.match(r"(\d+)\.(\d+)", version)
    if not match:
        raise Refused(f"{cfg_path}: pyvenv.cfg does not say which Python the venv uses")
    if not os.path.isfile(os.path.join(path, "bin", "activate")):
        raise Refused(f"{path} is not a Python venv (no bin/activate)")
    return {"root": os.path.abspath(path), "python": f"{match.group(1)}.{match.group(2)}",
            "system_site_packages": cfg.get("include-system-site-packages", "false").lower() == "true"}


def original_of(script: str) -> "tuple[str, bool]":
    """The original text of ``script`` (saving it beside, the first time)."""
    current = read_text(script)
    saved = script + ORIG
    if BEGIN not in current:
        # never extended, or remade by `python -m venv` since: this is the original
        return current, (not os.path.exists(saved) or read_text(saved) != current)
    if os.path.exists(saved):
        return read_text(saved), False
    # The copy is gone: the original is what lies between our two blocks.
    recovered = strip_blocks(current)
    if recovered is None:
        raise Refused(f"{script} was extended, but its original ({os.path.basename(saved)}) is gone and the extension was edited: make the "
                      "venv again (python3 -m venv --clear VENV)")
    return recovered, True


def strip_blocks(text: str) -> "str | None":
    """The original script inside an extended one (None when the blocks are not intact)."""
    head = END + "\n"
    if not text.startswith(BEGIN) or head not in text:
        return None
    body = text[text.index(head) + len(head):]
    tail = body.rfind("\n" + BEGIN)
    if tail < 0 or not body.endswith(END + "\n"):
        return None
    body = body[:tail]
    return None if BEGIN in body or END in body else body


def plan(venv_path: str, config: "dict[str, Any]") -> "tuple[dict[str, Any], list[tuple[str, str, str | None]], list[str]]":
    """(the venv, [(path, new text, the original to save beside it or None)], [why a script is left as it is])
    for extending the venv at ``venv_path`` with ``config``; Refused if the venv or the settings are unfit."""
    check_config(config)
    venv = read_venv(venv_path)
    stack = config.get("stack")
    if stack and os.path.realpath(venv["root"]) == os.path.realpath(stack):
        raise Refused(f"{venv_path} is the stack itself; give your own venv")
    if venv["python"] != config["python_version"]:
        raise Refused("{} uses Python {}, the stack {} is Python {}: make the venv with the stack's Python "
                      "(module load {}; python3 -m venv --system-site-packages VENV)".format(
                          venv_path, venv["python"], config["module"], config["python_version"], config["module"]))
    bindir = os.path.join(venv["root"], "bin")
    writes: list[tuple[str, str, str | None]] = []
    skipped: list[str] = []
    for name in SCRIPTS:
        script = os.path.join(bindir, name)
        if not os.path.isfile(script):
            continue
        original, save = original_of(script)
        try:
            if name == "activate":
                writes.append((script, bash_text(original, config, venv["python"]), original if save else None))
            elif name == "activate.fish":
                writes.append((script, fish_text(original, config, venv["python"]), original if save else None))
            else:
                text, helper = csh_texts(original, config, venv["python"])
                writes.append((script, text, original if save else None))
                writes.append((os.path.join(bindir, CSH_DEACTIVATE), helper, None))
        except Refused as exc:
            skipped.append(str(exc))
    return venv, writes, skipped
