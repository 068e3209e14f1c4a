# Bash completion for sitestack's `invoke`: task names and options (Invoke's own completion,
# `invoke --print-completion-script bash`), plus the values of --site (the playbooks, from
# `invoke sites`) and --recipe-like task arguments left to Invoke. Load it in a shell started in
# the checkout (docs/cli.md):
#
#     source scripts/completion.bash
#
# Invoke completes task names and flags only; a flag's value falls back to file names.

eval "$(invoke --print-completion-script bash)"

_sitestack_complete() {
    local prev=${COMP_WORDS[COMP_CWORD-1]}
    if [[ $prev == --site ]]; then
        COMPREPLY=( $(compgen -W "$(invoke sites 2>/dev/null | cut -d' ' -f1)" -- "$2") )
        return 0
    fi
    _complete_invoke "$@"
}

complete -F _sitestack_complete -o default invoke inv
