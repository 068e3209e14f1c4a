"""The blocks extend-venv-activate adds to a venv's ``activate.fish``: what :mod:`.bash`'s do, in fish."""

from typing import Any

from . import BEGIN, COMMAND, END, ORIG
from .shell_quote import fish_quote
from .stack_settings import pick_packages

FISH_PROLOGUE = """{begin}
# Added by the stack's extend-venv-activate (site {site}): activating also loads the module
# {module_text} and puts this venv's site-packages first on PYTHONPATH, then the stack's; deactivate unloads it and
# puts back every environment variable activation changed. The original is activate.fish{orig}.
if set -q _SITESTACK_VENV; and functions -q deactivate
    deactivate
end
if not functions -q module
    for _sitestack_f in {inits}
        if test -r $_sitestack_f
            source $_sitestack_f
            break
        end
    end
    set -e _sitestack_f
end
# Remember every exported variable before activation.
set -g _sitestack_names (set -nx)
for _sitestack_n in $_sitestack_names
    set -g _sitestack_old_$_sitestack_n $$_sitestack_n
end
{end}
"""

FISH_EPILOGUE = """
{begin}
set -g _SITESTACK_VENV $VIRTUAL_ENV
set -g _sitestack_module {module}
set -g _sitestack_used
set -g _sitestack_loaded 0
if functions -q module
    for _sitestack_r in {roots}
        if not contains -- $_sitestack_r (string split : -- "$MODULEPATH")
            if module use $_sitestack_r
                set -g -a _sitestack_used $_sitestack_r
            end
        end
    end
    if not contains -- $_sitestack_module (string split : -- "$LOADEDMODULES")
        if module load $_sitestack_module
            set -g _sitestack_loaded 1
        else
            echo "{command}: module load $_sitestack_module failed; the venv is active without the stack" >&2
        end
    end
else
    echo "{command}: no module command; the venv is active without the stack ($_sitestack_module)" >&2
end
set -gx PATH "$VIRTUAL_ENV/bin" $PATH
# The stack's packages after the venv's: the generation's the module loaded, where it says which.
{pick}set -gx PYTHONPATH "$VIRTUAL_ENV/lib/python{python}/site-packages" {stack_packages}$PYTHONPATH
# Keep the old values of exactly the variables activation changed.
set -g _sitestack_touched
for _sitestack_n in (printf '%s\\n' $_sitestack_names (set -nx) | LC_ALL=C sort -u)
    set -l _sitestack_old _sitestack_old_$_sitestack_n
    if contains -- $_sitestack_n $_sitestack_names
        if set -qx $_sitestack_n; and test "$$_sitestack_old" = "$$_sitestack_n"; and test (count $$_sitestack_old) = (count $$_sitestack_n)
            set -e $_sitestack_old
            continue
        end
    else if not set -qx $_sitestack_n
        continue
    end
    set -g -a _sitestack_touched $_sitestack_n
end
set -e _sitestack_names
set -e _sitestack_n
set -e _sitestack_r
functions -c deactivate _sitestack_orig_deactivate
function deactivate -d "Exit the virtual environment, unload the stack's module, restore the environment"
    if test "$_sitestack_loaded" = 1
        module unload $_sitestack_module
    end
    for _sitestack_r in $_sitestack_used
        module unuse $_sitestack_r
    end
    _sitestack_orig_deactivate $argv
    # The module system's own variables are put back only when it is back where it was.
    set -l _sitestack_back 1
    for _sitestack_n in LOADEDMODULES MODULEPATH
        if contains -- $_sitestack_n $_sitestack_touched
            set -l _sitestack_old _sitestack_old_$_sitestack_n
            if set -q $_sitestack_old
                if not set -qx $_sitestack_n; or test "$$_sitestack_n" != "$$_sitestack_old"
                    set _sitestack_back 0
                end
            else if set -qx $_sitestack_n; and test -n "$$_sitestack_n"
                set _sitestack_back 0
            end
        end
    end
    for _sitestack_n in $_sitestack_touched
        if string match -qr '^(_ModuleTable.*|__LMOD_.*|LMOD_FAMILY_.*|LOADEDMODULES|_LMFILES_|MODULEPATH|__MODULES_.*|MODULES_LM.*)$' -- $_sitestack_n
            if test $_sitestack_back = 0
                continue
            end
        end
        set -l _sitestack_old _sitestack_old_$_sitestack_n
        if set -q $_sitestack_old
            set -gx $_sitestack_n $$_sitestack_old
            set -e $_sitestack_old
        else
            set -e $_sitestack_n
        end
    end
    set -e _sitestack_touched
    set -e _sitestack_loaded
    set -e _sitestack_used
    set -e _sitestack_module
    set -e _SITESTACK_VENV
    if test "$argv[1]" != nondestructive
        functions -e _sitestack_orig_deactivate
    end
end
{end}
"""


def fish_text(original: str, config: "dict[str, Any]", python: str) -> str:
    """``activate.fish`` extended: the prologue and epilogue blocks around the original text."""
    inits = " ".join(fish_quote(p) for p in config.get("init", {}).get("fish", [])) or "''"
    prologue = FISH_PROLOGUE.format(begin=BEGIN, end=END, site=config.get("site", "?"), module_text=config["module"],
                                    orig=ORIG, inits=inits)
    epilogue = FISH_EPILOGUE.format(begin=BEGIN, end=END, module=fish_quote(config["module"]),
                                    roots=" ".join(fish_quote(r) for r in config["module_roots"]) or "''",
                                    command=COMMAND, python=python, **pick_packages(config, "fish"))
    return prologue + original + ("" if original.endswith("\n") else "\n") + epilogue
