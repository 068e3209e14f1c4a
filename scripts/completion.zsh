# Zsh completion for sitestack: `sitestack` (installed) and `invoke`/`inv` (in the checkout). Task
# names and options come from the command itself (Invoke's `--complete`), the values of --site
# from `sitestack sites` (the playbooks). docs/cli.md; load it in ~/.zshrc, after compinit:
#
#     autoload -Uz compinit && compinit
#     source scripts/completion.zsh
#
# Another option's value falls back to file names.

# The site names, from the command being completed (`sitestack`, `invoke` or `inv`).
_sitestack_sites() {
    "$1" sites 2>/dev/null | awk '{print $1}'
}

_sitestack() {
    local cmd=${words[1]}
    local -a candidates
    if [[ ${words[CURRENT-1]} == --site ]]; then
        candidates=(${(f)"$(_sitestack_sites $cmd)"})
        compadd -a candidates
        return
    fi
    candidates=(${(f)"$($cmd --complete -- ${words[1,CURRENT]} 2>/dev/null)"})
    if (( ${#candidates} )); then
        compadd -a candidates
    else
        _files
    fi
}

compdef _sitestack sitestack invoke inv
