"""What every task module shares: help texts and the build lock wait."""

from __future__ import annotations

#: Builds wait this long for another run's lock on the same install (builds take long).
BUILD_LOCK_WAIT = 6 * 3600.0

SITE_HELP = "site name: one of the playbooks in playbooks/ (see `invoke sites`)"
PLAYBOOK_HELP = "use this playbook file instead of playbooks/<site>.yml"
PREFIX_HELP = "install prefix (overrides the site's facts.prefix)"
ACCOUNT_HELP = "project/account for {account} in the site facts (default: $SITESTACK_ACCOUNT)"
DEBUG_HELP = "show tracebacks of errors"
JSON_HELP = "write the outcome as JSON to FILE ('-': to stdout, instead of the human lines); docs/cli.md"
DATA_JSON_HELP = "write what this prints as JSON to FILE ('-': to stdout, instead of the human lines); docs/cli.md"
NO_CACHE_HELP = "build from source instead of using the build cache (the new build replaces the cached one)"
VERBOSE_HELP = "stream the output of build commands to the console too (it always goes to the log)"
