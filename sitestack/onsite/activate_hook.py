"""extend-venv-activate: make a user's venv load the stack's module when it is activated.

A user makes a venv on top of the stack (``python3 -m venv --system-site-packages ~/myenv``
with the stack's module loaded) and runs ``extend-venv-activate ~/myenv`` (the command is in
the stack's ``bin/``). From then on:

- ``source ~/myenv/bin/activate`` loads the stack's module (after ``module use`` of the
  stack's module directory when it is not on MODULEPATH), puts the venv's own
  site-packages first on PYTHONPATH and the stack's right after it (a venv made from the stack's
  ``python3`` is based on the stack's base Python, so it sees the stack's packages only this way;
  the module itself sets no PYTHONPATH, so that a copy of the stack staged on node-local storage
  imports its own packages) and the venv's ``bin`` first on PATH. The stack's site-packages are
  those of the generation the module loaded, which the module names in
  ``__SITESTACK_GENERATION_<FAMILY>`` (the settings' "generation_var"), not the stable link's:
  the shell, and every job started from it, keep importing from the generation they loaded while
  an upgrade moves the link on to a new one (docs/operating.md). A module file that does not set
  the variable gets the stable path, as before generations;
- ``deactivate`` unloads the module (only if activating loaded it), takes back the
  ``module use``, and puts every environment variable activation changed back to the value it
  had before (bash, zsh and fish: exactly, by a snapshot of the environment taken before
  activation; csh: PATH and PYTHONPATH from their saved values, the rest through ``module unload``).

It is idempotent: the extended scripts are always made from the original ones, kept as
``bin/<script>.sitestack-orig``, so running it twice gives byte-identical files, and
``extend-venv-activate --undo VENV`` puts the originals back. bash/zsh (``activate``), fish
(``activate.fish``) and csh (``activate.csh``) are handled where the venv has them. Paths are
never pasted into sed programs or unquoted: the venv's location is taken from ``$VIRTUAL_ENV``
at activation, and every other value is quoted for the shell it is written for.

The command is this module, the entry of its package :mod:`.activate` (one module per concern: the
venv and its scripts, the settings, quoting, and one per shell). The ``venv-hook`` step installs the
modules it imports under ``<stack>/share/sitestack/onsite/``, the stack's settings beside them
(``extend-venv-activate.json``, read by :func:`.activate.stack_settings.read_settings`), and
``<stack>/bin/extend-venv-activate``, a launcher that runs this module as ``__main__``
(:func:`sitestack.core.shipped.installed`). Standard library only, Python 3.6+.
"""

import argparse
import os
import sys
from typing import Any, TextIO

from .activate import COMMAND, CSH_DEACTIVATE, ORIG, SCRIPTS, SETTINGS, Refused
from .activate.scriptfiles import read_text, write_if_changed
from .activate.stack_settings import read_settings
from .activate.venv import plan, read_venv


def extend(venv_path: str, config: "dict[str, Any]", out: TextIO = sys.stdout) -> "list[str]":
    """Extend the venv's activate scripts; return the paths that changed."""
    venv, writes, skipped = plan(venv_path, config)
    changed: list[str] = []
    for path, text, original in writes:
        if original is not None:
            write_if_changed(path + ORIG, original, like=path)
        if write_if_changed(path, text, like=path):
            changed.append(path)
        out.write("{} {}\n".format("extended " if path in changed else "unchanged", path))
    for reason in skipped:
        out.write(f"skipped   {reason}\n")
    if not venv["system_site_packages"]:
        out.write(f"note: {venv_path} was made without --system-site-packages: packages of the base Python are not "
                  "visible in it (the stack's are, through activation)\n")
    return changed


def undo(venv_path: str, out: TextIO = sys.stdout) -> None:
    """Put the original activate scripts back."""
    venv = read_venv(venv_path)
    bindir = os.path.join(venv["root"], "bin")
    for name in SCRIPTS:
        script = os.path.join(bindir, name)
        saved = script + ORIG
        if os.path.exists(saved):
            write_if_changed(script, read_text(saved), like=script)
            os.unlink(saved)
            out.write(f"restored  {script}\n")
    helper = os.path.join(bindir, CSH_DEACTIVATE)
    if os.path.exists(helper):
        os.unlink(helper)


def settings_path() -> str:
    """The installed command's settings: :data:`~.activate.SETTINGS` beside the ``onsite/`` directory that
    holds this module (``<stack>/share/sitestack/``)."""
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), SETTINGS)


def main(argv: "list[str] | None" = None, config: "dict[str, Any] | None" = None) -> int:
    """The command line: extend (or with --undo restore) one venv with ``config``, else the installed
    settings (:func:`settings_path`); 0, or 1 with the reason on stderr."""
    unread: Refused | None = None
    if config is None:
        try:
            config = read_settings(settings_path())
        except Refused as exc:
            unread = exc
    parser = argparse.ArgumentParser(
        prog=COMMAND,
        description="Extend a venv's activate scripts so that activating loads the module {} and deactivating "
                    "unloads it and restores the environment.".format(config["module"] if config else "of the stack"))
    parser.add_argument("venv", help="the venv (made with --system-site-packages on top of the stack)")
    parser.add_argument("--undo", action="store_true", help="put the original activate scripts back")
    args = parser.parse_args(argv)
    if config is None:
        sys.stderr.write(f"{COMMAND}: error: {unread}\n")
        return 1
    try:
        if args.undo:
            undo(args.venv)
        else:
            extend(args.venv, config)
    except (Refused, OSError) as exc:
        sys.stderr.write(f"{COMMAND}: error: {exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
