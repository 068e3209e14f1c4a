"""Stand-in probe for sitestack's site-command tests: ``python probe.py [NAME ...]`` prints where
torch is imported from and the named environment variables (standin.py, ``sitestack-probe:`` lines)."""

import sys

from standin import probe

if __name__ == "__main__":
    probe(*sys.argv[1:])
