# Fish completion for sitestack: `sitestack` (installed) and `invoke`/`inv` (in the checkout). Task
# names and options come from the command itself (Invoke's `--complete`), the values of --site
# from `sitestack sites` (the playbooks). docs/cli.md; load it in ~/.config/fish/config.fish:
#
#     source scripts/completion.fish

# The site names, from the command being completed (`sitestack`, `invoke` or `inv`).
function __sitestack_sites
    $argv[1] sites 2>/dev/null | string replace -r '\s.*' ''
end

function __sitestack_complete
    set -l tokens (commandline -opc)
    if test "$tokens[-1]" = --site
        __sitestack_sites $tokens[1]
        return
    end
    $tokens[1] --complete -- $tokens (commandline -ct) 2>/dev/null
end

for command in sitestack invoke inv
    complete --command $command --no-files --arguments '(__sitestack_complete)'
end
