"""The parts of ``extend-venv-activate`` (:mod:`..activate_hook`, the command line): what a user's
venv is and how its scripts are kept (:mod:`.venv`), the stack's settings the command was installed
with (:mod:`.stack_settings`), the quoting of each shell (:mod:`.shell_quote`), its capped reads and
atomic writes (:mod:`.scriptfiles`) and the blocks added to each shell's activate script
(:mod:`.bash` for bash and zsh, :mod:`.fish`, :mod:`.csh`).

Here: the names every part shares. Standard library only, and no syntax newer than Python 3.6 (no
``from __future__ import annotations``: annotations that name newer types are strings), because
the command runs with the ``python3`` a user's shell finds.
"""

COMMAND = "extend-venv-activate"
#: The installed command's settings file, beside the ``onsite/`` directory it runs from (the
#: ``venv-hook`` step writes it; :func:`.stack_settings.read_settings` reads it).
SETTINGS = COMMAND + ".json"

#: The marks around each block added to an activate script.
BEGIN = "# >>> sitestack extend-venv-activate >>>"
END = "# <<< sitestack extend-venv-activate <<<"
#: The suffix of a saved original script (``bin/activate.sitestack-orig``).
ORIG = ".sitestack-orig"
#: The file csh's deactivate sources (a csh alias cannot hold ``if`` blocks).
CSH_DEACTIVATE = "deactivate.sitestack.csh"
#: The activate scripts extended, where the venv has them.
SCRIPTS = ("activate", "activate.fish", "activate.csh")


class Refused(Exception):
    """A venv, or settings, this command will not use, with the reason for the user."""
