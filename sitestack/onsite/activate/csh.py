"""The blocks extend-venv-activate adds to a venv's ``activate.csh``, and the file its ``deactivate`` sources.

csh gets the load and unload of the module and the PATH and PYTHONPATH of :mod:`.bash`; the rest of
the environment is put back by ``module unload``. A value csh cannot quote (a space in a module
directory) leaves ``activate.csh`` as venv wrote it, with a note (:func:`csh_texts`).
"""

import re
from typing import Any

from . import BEGIN, COMMAND, CSH_DEACTIVATE, END, ORIG, Refused
from .stack_settings import pick_packages, stack_packages

#: What a value written into a csh script may hold: csh has no quoting for the rest.
_CSH_SAFE = re.compile(r"[A-Za-z0-9_./+,:@%=-]+")

CSH_PROLOGUE = """{begin}
# Added by the stack's extend-venv-activate (site {site}): activating also loads the module
# {module}; deactivate unloads it. The original script is activate.csh{orig}.
if ( $?_SITESTACK_VENV ) then
    deactivate
endif
{end}
"""

CSH_EPILOGUE = """
{begin}
set _SITESTACK_VENV = "$VIRTUAL_ENV"
if ( "`alias module`" == "" ) then
    foreach _sitestack_f ( {inits} )
        if ( -r "$_sitestack_f" ) then
            source "$_sitestack_f"
            break
        endif
    end
endif
if ( $?PYTHONPATH ) then
    set _sitestack_old_pythonpath = "$PYTHONPATH"
endif
{uses}set _sitestack_load = 1
if ( $?LOADEDMODULES ) then
    if ( ":${{LOADEDMODULES}}:" =~ *:{module}:* ) set _sitestack_load = 0
endif
if ( $_sitestack_load == 1 ) then
    module load {module}
    if ( $?LOADEDMODULES ) then
        if ( ":${{LOADEDMODULES}}:" =~ *:{module}:* ) set _sitestack_loaded = 1
    endif
    if ( ! $?_sitestack_loaded ) echo "{command}: module load {module} failed; the venv is active without the stack"
endif
setenv PATH "${{VIRTUAL_ENV}}/bin:${{PATH}}"
# The stack's packages after the venv's: the generation's the module loaded, where it says which.
{pick}if ( $?PYTHONPATH ) then
    setenv PYTHONPATH "${{VIRTUAL_ENV}}/lib/python{python}/site-packages{stack_packages}:${{PYTHONPATH}}"
else
    setenv PYTHONPATH "${{VIRTUAL_ENV}}/lib/python{python}/site-packages{stack_packages}"
endif
unset _sitestack_load _sitestack_p
rehash
alias deactivate 'source "$VIRTUAL_ENV/bin/{deactivate}"; {original}'
{end}
"""

CSH_USE = """set _sitestack_use = 1
if ( $?MODULEPATH ) then
    if ( ":${{MODULEPATH}}:" =~ *:{root}:* ) set _sitestack_use = 0
endif
if ( $_sitestack_use == 1 ) then
    module use {root}
    set _sitestack_used_{i} = 1
endif
unset _sitestack_use
"""

CSH_DEACTIVATE_TEXT = """# sitestack extend-venv-activate: sourced by deactivate (see activate.csh): unload the stack's
# module if activating loaded it, take back `module use`, put PYTHONPATH back.
if ( $?_sitestack_loaded ) then
    module unload {module}
endif
{unuses}if ( $?_sitestack_old_pythonpath ) then
    setenv PYTHONPATH "$_sitestack_old_pythonpath"
else
    unsetenv PYTHONPATH
endif
unset _sitestack_loaded _sitestack_old_pythonpath _SITESTACK_VENV{used_vars}
"""

CSH_UNUSE = """if ( $?_sitestack_used_{i} ) then
    module unuse {root}
endif
"""


def csh_texts(original: str, config: "dict[str, Any]", python: str) -> "tuple[str, str]":
    """(activate.csh, the file its deactivate sources); Refused when csh cannot say it safely."""
    match = re.search(r"^alias deactivate '([^'\n]*)'\s*$", original, re.M)
    if not match:
        raise Refused("activate.csh: not extended (its deactivate alias is not the one venv writes)")
    values = [config["module"], python, *config["module_roots"], *config.get("init", {}).get("csh", []),
              *([stack_packages(config)] if stack_packages(config) else [])]
    for value in values:
        if not _CSH_SAFE.fullmatch(value):
            raise Refused(f"activate.csh: not extended (csh cannot quote {value!r} safely)")
    roots = config["module_roots"]
    uses = "".join(CSH_USE.format(root=r, i=i) for i, r in enumerate(roots))
    unuses = "".join(CSH_UNUSE.format(root=r, i=i) for i, r in enumerate(roots))
    inits = " ".join(config.get("init", {}).get("csh", [])) or "/dev/null"
    prologue = CSH_PROLOGUE.format(begin=BEGIN, end=END, site=config.get("site", "?"), module=config["module"],
                                   orig=ORIG)
    epilogue = CSH_EPILOGUE.format(begin=BEGIN, end=END, module=config["module"], inits=inits, uses=uses,
                                   command=COMMAND, python=python, deactivate=CSH_DEACTIVATE,
                                   original=match.group(1), **pick_packages(config, "csh"))
    helper = CSH_DEACTIVATE_TEXT.format(module=config["module"], unuses=unuses,
                                        used_vars="".join(f" _sitestack_used_{i}" for i in range(len(roots))))
    return prologue + original + ("" if original.endswith("\n") else "\n") + epilogue, helper
