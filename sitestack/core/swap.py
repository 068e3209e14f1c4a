"""The generation swap: point a path at a new sibling tree with one rename.

``<parent>/<leaf>`` is a symlink to a hidden sibling (``.<leaf>.tree-TOKEN``,
``.<leaf>.gen-TOKEN``, ...). Switching it to a new sibling makes a new link
``.<leaf>.link-TOKEN`` and renames it over ``<leaf>`` (``mv -T``: rename(2), atomic), so a
reader sees the old tree or the new one, never neither. A real directory at ``<leaf>`` (a
foreign install) is first moved aside to ``.<leaf>.old-TOKEN``. The tree the link pointed at is
left in place: it is retired, and removed only when nothing can be using it any more
(:mod:`sitestack.installs.generations`). A killed swap leaves only hidden ``.<leaf>.*`` siblings,
which the caller's next run removes.
"""

from __future__ import annotations

SWAP_SCRIPT = r"""
set -e
parent=$1 leaf=$2 new=$3 token=$4
cd "$parent"
if [ -e "$leaf" ] && [ ! -L "$leaf" ]; then mv -T -- "$leaf" ".$leaf.old-$token"; fi
ln -s -- "$new" ".$leaf.link-$token"
mv -T -- ".$leaf.link-$token" "$leaf"
"""


def swap_argv(parent: str, leaf: str, new: str, token: str) -> list[str]:
    """The argv that points ``parent/leaf`` at the sibling ``new`` (a name in ``parent``) atomically.

    ``token`` names the temporary link (and the moved-aside directory): unique per run.
    """
    if "/" in new or "/" in leaf:
        raise ValueError(f"swap: {leaf!r} and {new!r} must be names inside {parent!r}, not paths")
    return ["bash", "-c", SWAP_SCRIPT, "sitestack", parent, leaf, new, token]


#: Makes $2 a symbolic link to $1 with one rename (a temporary link ``$2.link-$3`` renamed over it).
RELINK_SCRIPT = 'ln -sfn -- "$1" "$2.link-$3" && mv -T -- "$2.link-$3" "$2"'


def relink_argv(path: str, target: str, token: str) -> list[str]:
    """The argv that points the symbolic link ``path`` at ``target`` (a path relative to its directory,
    or absolute) atomically: a reader sees the old target or the new one (a regular file there is
    replaced). ``token`` names the temporary link: unique per run."""
    return ["sh", "-c", RELINK_SCRIPT, "sitestack", target, path, token]
