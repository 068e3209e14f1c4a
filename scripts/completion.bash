# Bash completion for sitestack: `sitestack` (installed) and `invoke`/`inv` (in the checkout). Task
# names and options come from the command itself (Invoke's `--complete`), the values of --site
# from `sitestack sites` (the playbooks). docs/cli.md; load it in ~/.bashrc or a shell:
#
#     source scripts/completion.bash
#
# Another option's value falls back to file names.

# The site names, from the command being completed (`sitestack`, `invoke` or `inv`).
_sitestack_sites() {
    "$1" sites 2>/dev/null | awk '{print $1}'
}

_sitestack_complete() {
    local cmd=${COMP_WORDS[0]} cur=${COMP_WORDS[COMP_CWORD]}
    local prev=${COMP_WORDS[COMP_CWORD-1]}
    if [[ $prev == --site ]]; then
        COMPREPLY=( $(compgen -W "$(_sitestack_sites "$cmd")" -- "$cur") )
        return 0
    fi
    COMPREPLY=( $(compgen -W "$("$cmd" --complete -- "${COMP_WORDS[@]:0:COMP_CWORD+1}" 2>/dev/null)" -- "$cur") )
}

complete -F _sitestack_complete -o default sitestack invoke inv
