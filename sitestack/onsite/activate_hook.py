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

This module is standard library only and runs on Python 3.6+: sitestack installs it, with the
stack's settings in :data:`CONFIG`, as ``<stack>/bin/extend-venv-activate``.
"""

import argparse
import json
import os
import re
import sys
import tempfile
from collections.abc import Callable
from typing import Any, TextIO

COMMAND = "extend-venv-activate"
#: The installed command's settings (module, module directories, init scripts, Python version).
CONFIG = None

BEGIN = "# >>> sitestack extend-venv-activate >>>"
END = "# <<< sitestack extend-venv-activate <<<"
ORIG = ".sitestack-orig"
CSH_DEACTIVATE = "deactivate.sitestack.csh"
SCRIPTS = ("activate", "activate.fish", "activate.csh")

_MODULE_NAME = re.compile(r"[A-Za-z0-9._+-]+(/[A-Za-z0-9._+-]+)*")
_CSH_SAFE = re.compile(r"[A-Za-z0-9_./+,:@%=-]+")
_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class Refused(Exception):
    """A venv this command will not touch, with the reason for the user."""


# -- quoting ---------------------------------------------------------------------------------
def sh_quote(text: str) -> str:
    """A single-quoted word for bash/zsh."""
    return "'" + text.replace("'", "'\\''") + "'"


def fish_quote(text: str) -> str:
    """A single-quoted word for fish (which also escapes backslashes inside quotes)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def csh_quote(text: str) -> str:
    """A single-quoted word for csh and tcsh: ``'`` as ``'\\''``, and ``!`` as ``\\!`` (csh's history
    substitution happens inside single quotes too, in an interactive shell; the backslash is taken
    away with it, interactive or not). A newline cannot be quoted: values with one are refused first
    (:data:`_CSH_SAFE`)."""
    return "'" + text.replace("'", "'\\''").replace("!", "\\!") + "'"


# -- the venv ------------------------------------------------------------------------------------
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
    with open(cfg_path, encoding="utf-8", errors="replace") as handle:
        for line in handle:
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


# -- bash / zsh ----------------------------------------------------------------------------------
BASH_PROLOGUE = r"""{begin}
# Added by the stack's extend-venv-activate (site {site}). Activating also loads the module
# {module} and puts this venv's site-packages first on PYTHONPATH, then the stack's, so the venv's
# packages shadow the stack's; deactivate unloads the module and puts back every environment variable that
# activation changed. The original script is {script}{orig}; `{command} --undo VENV` restores it.
if [ -n "${{_SITESTACK_VENV:-}}" ] && command -v deactivate >/dev/null 2>&1; then
    deactivate
fi
if ! command -v module >/dev/null 2>&1; then
    if [ -n "${{ZSH_VERSION:-}}" ]; then _sitestack_inits={zsh_inits}; else _sitestack_inits={bash_inits}; fi
    while IFS= read -r _sitestack_f; do
        if [ -n "$_sitestack_f" ] && [ -r "$_sitestack_f" ]; then . "$_sitestack_f"; break; fi
    done <<_SITESTACK_EOF_
$_sitestack_inits
_SITESTACK_EOF_
    unset _sitestack_inits _sitestack_f
fi
_sitestack_env_names() {{
    command env -0 | command tr '\n\0' '\001\n' | command sed -n 's/^\([A-Za-z_][A-Za-z0-9_]*\)=.*/\1/p'
}}
# Remember every exported variable before activation.
_SITESTACK_NAMES=$(_sitestack_env_names)
while IFS= read -r _sitestack_n; do
    if [ -n "$_sitestack_n" ] && [ "$_sitestack_n" != _ ]; then
        eval "_SITESTACK_OLD_$_sitestack_n=\${{$_sitestack_n}}"
    fi
done <<_SITESTACK_EOF_
$_SITESTACK_NAMES
_SITESTACK_EOF_
{end}
"""

BASH_EPILOGUE = r"""
{begin}
_SITESTACK_VENV=$VIRTUAL_ENV
_SITESTACK_MODULE={module}
_SITESTACK_USED=
_SITESTACK_LOADED=
_sitestack_status=0
if command -v module >/dev/null 2>&1; then
    while IFS= read -r _sitestack_r; do
        if [ -n "$_sitestack_r" ]; then
            case ":${{MODULEPATH:-}}:" in
                *":$_sitestack_r:"*) ;;
                *) if module use "$_sitestack_r" </dev/null; then
                       _SITESTACK_USED="$_sitestack_r
$_SITESTACK_USED"
                   fi ;;
            esac
        fi
    done <<_SITESTACK_EOF_
{roots}
_SITESTACK_EOF_
    case ":${{LOADEDMODULES:-}}:" in
        *":$_SITESTACK_MODULE:"*) ;;
        *) if module load "$_SITESTACK_MODULE" </dev/null; then
               _SITESTACK_LOADED=1
           else
               _sitestack_status=1
               echo "{command}: module load $_SITESTACK_MODULE failed; the venv is active without the stack" >&2
           fi ;;
    esac
else
    _sitestack_status=1
    echo "{command}: no module command; the venv is active without the stack ($_SITESTACK_MODULE)" >&2
fi
# The venv first: its commands on PATH, its packages on PYTHONPATH ahead of the stack's (the generation's it loaded).
PATH="$VIRTUAL_ENV/bin${{PATH:+:$PATH}}"
export PATH
{pick}PYTHONPATH="$VIRTUAL_ENV/lib/python{python}/site-packages"{stack_packages}"${{PYTHONPATH:+:$PYTHONPATH}}"
export PYTHONPATH
hash -r 2>/dev/null
# Keep the old values of exactly the variables activation changed.
_SITESTACK_TOUCHED=
_sitestack_after=$(_sitestack_env_names)
while IFS= read -r _sitestack_n; do
    if [ -z "$_sitestack_n" ] || [ "$_sitestack_n" = _ ]; then continue; fi
    case "
$_SITESTACK_NAMES
" in *"
$_sitestack_n
"*) _sitestack_was=1 ;; *) _sitestack_was= ;; esac
    case "
$_sitestack_after
" in *"
$_sitestack_n
"*) _sitestack_now=1 ;; *) _sitestack_now= ;; esac
    _sitestack_same=
    if [ -n "$_sitestack_was" ] && [ -n "$_sitestack_now" ]; then
        if eval "[ \"\${{$_sitestack_n}}\" = \"\${{_SITESTACK_OLD_$_sitestack_n}}\" ]"; then _sitestack_same=1; fi
    elif [ -z "$_sitestack_was" ] && [ -z "$_sitestack_now" ]; then
        _sitestack_same=1
    fi
    if [ -n "$_sitestack_same" ]; then
        unset "_SITESTACK_OLD_$_sitestack_n"
    else
        _SITESTACK_TOUCHED="$_SITESTACK_TOUCHED$_sitestack_n
"
        if [ -z "$_sitestack_was" ]; then unset "_SITESTACK_OLD_$_sitestack_n"; fi
    fi
done <<_SITESTACK_EOF_
$(printf '%s\n%s\n' "$_SITESTACK_NAMES" "$_sitestack_after" | LC_ALL=C sort -u)
_SITESTACK_EOF_
unset _SITESTACK_NAMES _sitestack_after _sitestack_n _sitestack_was _sitestack_now _sitestack_same _sitestack_r _sitestack_p

# deactivate: the venv's own, wrapped.
_sitestack_def=$(typeset -f deactivate)
eval "_sitestack_orig_$_sitestack_def"
unset _sitestack_def
deactivate () {{
    if [ -n "${{_SITESTACK_LOADED:-}}" ]; then
        module unload "$_SITESTACK_MODULE" </dev/null || :
    fi
    while IFS= read -r _sitestack_r; do
        if [ -n "$_sitestack_r" ]; then module unuse "$_sitestack_r" </dev/null || :; fi
    done <<_SITESTACK_EOF_
$_SITESTACK_USED
_SITESTACK_EOF_
    _sitestack_orig_deactivate "$@"
    # The module system's own variables are put back only when it is back where it was (a module
    # loaded meanwhile keeps its bookkeeping); every other variable activation changed is put back.
    _sitestack_back=1
    for _sitestack_n in LOADEDMODULES MODULEPATH; do
        case "
$_SITESTACK_TOUCHED" in
            *"
$_sitestack_n
"*) if eval "[ -n \"\${{_SITESTACK_OLD_$_sitestack_n+x}}\" ]"; then
                    if ! eval "[ \"\${{$_sitestack_n-}}\" = \"\${{_SITESTACK_OLD_$_sitestack_n}}\" ]"; then _sitestack_back=; fi
                elif eval "[ -n \"\${{$_sitestack_n-}}\" ]"; then
                    _sitestack_back=
                fi ;;
        esac
    done
    while IFS= read -r _sitestack_n; do
        if [ -z "$_sitestack_n" ]; then continue; fi
        case "$_sitestack_n" in
            _ModuleTable*|__LMOD_*|LMOD_FAMILY_*|LOADEDMODULES|_LMFILES_|MODULEPATH|__MODULES_*|MODULES_LM*)
                if [ -z "$_sitestack_back" ]; then continue; fi ;;
        esac
        if eval "[ -n \"\${{_SITESTACK_OLD_$_sitestack_n+x}}\" ]"; then
            eval "$_sitestack_n=\${{_SITESTACK_OLD_$_sitestack_n}}; export $_sitestack_n" 2>/dev/null || :
            unset "_SITESTACK_OLD_$_sitestack_n"
        else
            unset "$_sitestack_n" 2>/dev/null || :
        fi
    done <<_SITESTACK_EOF_
$_SITESTACK_TOUCHED
_SITESTACK_EOF_
    hash -r 2>/dev/null
    unset _SITESTACK_VENV _SITESTACK_MODULE _SITESTACK_USED _SITESTACK_LOADED _SITESTACK_TOUCHED _sitestack_n _sitestack_r _sitestack_back
    unset -f _sitestack_orig_deactivate _sitestack_env_names 2>/dev/null || :
    if [ "${{1:-}}" = nondestructive ]; then :; else unset -f deactivate 2>/dev/null || :; fi
}}
if [ "$_sitestack_status" = 0 ]; then unset _sitestack_status; else unset _sitestack_status; return 1 2>/dev/null || :; fi
{end}
"""


def bash_text(original: str, config: "dict[str, Any]", python: str) -> str:
    """``activate`` extended: the prologue and epilogue blocks around the original text."""
    inits = config.get("init", {})
    prologue = BASH_PROLOGUE.format(
        begin=BEGIN, end=END, site=config.get("site", "?"), module=config["module"], script="activate", orig=ORIG,
        command=COMMAND, zsh_inits=sh_quote("\n".join(inits.get("zsh", []))),
        bash_inits=sh_quote("\n".join(inits.get("bash", []))))
    epilogue = BASH_EPILOGUE.format(
        begin=BEGIN, end=END, module=sh_quote(config["module"]), command=COMMAND, python=python,
        **pick_packages(config, "bash"),
        roots="\n".join(_heredoc_safe(r) for r in config["module_roots"]))
    return prologue + original + ("" if original.endswith("\n") else "\n") + epilogue


def _heredoc_safe(text: str) -> str:
    """A line for an unquoted here-document: $ ` \\ are escaped."""
    return re.sub(r"([$`\\])", r"\\\1", text)


# -- fish ------------------------------------------------------------------------------------------
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


# -- csh -------------------------------------------------------------------------------------------
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


# -- extending ----------------------------------------------------------------------------------------
def _write(path: str, text: str, like: "str | None" = None) -> bool:
    """Write ``text`` to ``path`` atomically (temp file + rename) unless it already holds it."""
    data = text.encode("utf-8")
    try:
        with open(path, "rb") as handle:
            if handle.read() == data:
                return False
    except FileNotFoundError:
        pass
    mode = os.stat(like).st_mode & 0o7777 if like and os.path.exists(like) else 0o644
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix="." + os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return True


def _read(path: str) -> str:
    with open(path, encoding="utf-8", newline="") as handle:
        return handle.read()


def original_of(script: str) -> "tuple[str, bool]":
    """The original text of ``script`` (saving it beside, the first time)."""
    current = _read(script)
    saved = script + ORIG
    if BEGIN not in current:
        # never extended, or remade by `python -m venv` since: this is the original
        return current, (not os.path.exists(saved) or _read(saved) != current)
    if os.path.exists(saved):
        return _read(saved), False
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
    """[(path, new text, mode-from path, original to save or None)] for the venv; Refused if unfit."""
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


def extend(venv_path: str, config: "dict[str, Any]", out: TextIO = sys.stdout) -> "list[str]":
    """Extend the venv's activate scripts; return the paths that changed."""
    venv, writes, skipped = plan(venv_path, config)
    changed: list[str] = []
    for path, text, original in writes:
        if original is not None:
            _write(path + ORIG, original, like=path)
        if _write(path, text, like=path):
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
            _write(script, _read(saved), like=script)
            os.unlink(saved)
            out.write(f"restored  {script}\n")
    helper = os.path.join(bindir, CSH_DEACTIVATE)
    if os.path.exists(helper):
        os.unlink(helper)


def main(argv: "list[str] | None" = None, config: "dict[str, Any] | None" = None) -> int:
    """The command line: extend (or with --undo restore) one venv; 0, or 1 with the reason on stderr."""
    config = config or CONFIG
    parser = argparse.ArgumentParser(
        prog=COMMAND,
        description="Extend a venv's activate scripts so that activating loads the module {} and deactivating "
                    "unloads it and restores the environment.".format(config["module"] if config else "of the stack"))
    parser.add_argument("venv", help="the venv (made with --system-site-packages on top of the stack)")
    parser.add_argument("--undo", action="store_true", help="put the original activate scripts back")
    args = parser.parse_args(argv)
    if config is None:
        sys.stderr.write(f"{COMMAND}: error: this copy has no stack settings (run the one in the stack's bin/)\n")
        return 1
    try:
        if args.undo:
            undo(args.venv)
        else:
            extend(args.venv, config)
    except Refused as exc:
        sys.stderr.write(f"{COMMAND}: error: {exc}\n")
        return 1
    except OSError as exc:
        sys.stderr.write(f"{COMMAND}: error: {exc}\n")
        return 1
    return 0


def render_command(config: "dict[str, Any]") -> str:
    """The text of the installed command: this module with ``config`` in :data:`CONFIG`."""
    with open(__file__.replace(".pyc", ".py"), encoding="utf-8") as handle:
        source = handle.read()
    settings = json.dumps(config, indent=4, sort_keys=True)
    if "CONFIG = None\n" not in source:
        raise RuntimeError("activate_hook.py lost its CONFIG line")
    body = source.replace("CONFIG = None\n", "CONFIG = " + settings + "\n", 1)
    return "#!/usr/bin/env python3\n# The stack's extend-venv-activate, installed by sitestack; do not edit.\n" + body


if __name__ == "__main__":
    sys.exit(main())
