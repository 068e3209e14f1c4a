"""The blocks extend-venv-activate adds to a venv's ``activate`` (bash and zsh).

The prologue, before the venv's own script, deactivates a venv extended this way that is still
active, sets up ``module`` where the shell has none (the site's init script) and notes every exported
variable. The epilogue, after it, ``module use``s the stack's module directories and loads the stack,
puts the venv first on PATH and PYTHONPATH (the stack's site-packages next: :mod:`.stack_settings`), keeps
the old value of every variable that changed, and wraps ``deactivate`` so that it unloads what
activation loaded and puts every changed variable back (docs/venvs.md).
"""

import re
from typing import Any

from . import BEGIN, COMMAND, END, ORIG
from .shell_quote import sh_quote
from .stack_settings import pick_packages

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
