"""What is installed in a site's prefix (``invoke installed``, like ``spack find``), removing one
install (``invoke uninstall``), and trimming the build cache (``invoke gc``).

Everything is read from what the installs left: a recipe install is ``<prefix>/<recipe>/<version>``
with its stamp (``.sitestack/install.json``, :mod:`sitestack.installs.stamp`); a stack environment
is ``<prefix>/<name>`` with its manifest beside it (``<name>.manifest.json``); module files are
the files under ``facts.modules.install_root``. An install placed elsewhere with a step's ``dest``
is not listed. The host is the site's first (or ``--host``); listing changes nothing there.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sitestack.core.errors import InputError, SitestackError
from sitestack.core.host import Host
from sitestack.engine.playbook import connect, context_for
from sitestack.engine.select import select_hosts
from sitestack.installs.installer import CACHE_MARKER, build_cache
from sitestack.installs.stamp import STAMP, install_lock, lock_path
from sitestack.installs.venv_stack import module_root
from sitestack.model.context import RunOptions
from sitestack.model.site import Site
from sitestack.onsite.visible import escaped as printable

#: Lists ``<prefix>/*/*<suffix>`` that exist (a glob skips the hidden trees and half-made links).
_GLOB = 'for f in "$1"/*/*"$2"; do [ -e "$f" ] && printf "%s\\n" "$f"; done; exit 0'


#: A recipe name or a version in a spec (letters, digits, ``.``, ``_``, ``+``, ``-``; not first ``.``).
SPEC_WORD = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+-]{0,127}")


@dataclass
class Inventory:
    """What one host has under a site's prefix."""

    host: str
    prefix: str
    installs: list[dict[str, Any]] = field(default_factory=list)
    stacks: list[dict[str, Any]] = field(default_factory=list)
    modules: list[str] = field(default_factory=list)


def prefix_glob(host: Host, prefix: str, suffix: str) -> list[str]:
    out = host.probe(["bash", "-c", _GLOB, "sitestack", prefix, suffix])
    if not out.ok:
        raise SitestackError(f"cannot list {prefix} on {host.name}: {out.stderr.strip()}")
    return out.stdout.splitlines()


def open_site(site: Site, options: RunOptions, *, read_only: bool) -> tuple[Host, str, str | None]:
    """(host, prefix, module root) of the site's first selected host."""
    spec = select_hosts(site, options)[0]
    host = connect(spec, RunOptions(check=read_only, accept_new_host_keys=options.accept_new_host_keys))
    ctx = context_for(site, host, options, None)
    modules = module_root(ctx) if ctx.facts.modules.system != "none" else None
    return host, ctx.values["prefix"].rstrip("/"), modules


def scan(host: Host, prefix: str, modules: str | None) -> Inventory:
    """Read the prefix's stamps, manifests and module files (read-only)."""
    found = Inventory(host.name, prefix)
    for path in prefix_glob(host, prefix, "/" + STAMP):
        stamp = host.read_json(path) or {}
        dest = path[: -len("/" + STAMP)]
        installed = stamp.get("installed") or {}
        source = ((stamp.get("inputs") or {}).get("build") or {}).get("source") or {}
        found.installs.append({
            "name": stamp.get("recipe"), "version": stamp.get("version"), "path": dest,
            "digest": str(stamp.get("digest") or "")[:12], "installed_at": installed.get("at"),
            # the stamp records the source by its sum (what the build used, whatever the URL)
            "source": f"sha256:{source['sha256'][:12]}" if source.get("sha256") else None,
            "from_cache": (stamp.get("artefact") or {}).get("from_cache")})
    for path in prefix_glob(host, prefix, ".manifest.json"):
        manifest = host.read_json(path) or {}
        found.stacks.append({"name": manifest.get("name"), "path": manifest.get("path"),
                             "generation": manifest.get("generation"), "python": manifest.get("python"),
                             "packages": len(manifest.get("packages") or [])})
    if modules:
        out = host.probe(["find", modules, "-mindepth", "1", "(", "-type", "f", "-o", "-type", "l", ")",
                          "!", "-name", ".*"])
        found.modules = sorted(p[len(modules) + 1:] for p in out.stdout.splitlines()) if out.ok else []
    return found


def inventory_lines(found: Inventory) -> list[str]:
    """The human listing, grouped like ``spack find``."""
    lines = [f"-- {found.host}: {found.prefix}"]
    rows = [(str(i["name"]), str(i["version"]), i["digest"], str(i["installed_at"] or "-"), str(i["source"] or "-"))
            for i in sorted(found.installs, key=lambda i: (str(i["name"]), str(i["version"])))]
    lines.append(f"{len(rows)} recipe install(s)")
    if rows:
        widths = [max(len(r[k]) for r in rows) for k in range(4)]
        lines += [f"  {r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:<{widths[2]}}  {r[3]:<{widths[3]}}  {r[4]}"
                  for r in rows]
    lines.append(f"{len(found.stacks)} stack environment(s)")
    lines += [f"  {s['name']}  generation {s['generation']}  python {s['python']}  {s['packages']} packages"
              for s in found.stacks]
    lines.append(f"{len(found.modules)} module file(s)")
    lines += [f"  {m}" for m in found.modules]
    return lines


def parse_spec(value: str) -> tuple[str, str | None]:
    """``NAME`` or ``NAME@VERSION`` (Spack's spec syntax, the part sitestack uses)."""
    name, _, version = value.partition("@")
    # a recipe's name and a version as recipes spell them: no glob, path, blank or second @
    if not SPEC_WORD.fullmatch(name) or not (version == "" and "@" not in value or SPEC_WORD.fullmatch(version)):
        raise InputError("NAME", f"'{printable(value)}' is not NAME or NAME@VERSION")
    return name, version or None


def uninstall(host: Host, found: Inventory, spec: str, report: Callable[[str], None]) -> str:
    """Remove one recipe install under its lock: its link is renamed away first (one rename, so a
    reader sees the install or nothing), then its tree is deleted. Returns what was removed."""
    name, version = parse_spec(spec)
    known = [i for i in found.installs if i["name"] == name]
    matches = [i for i in known if version is None or i["version"] == version]
    if not matches:
        have = ", ".join(sorted(f"{i['name']}@{i['version']}" for i in found.installs)) or "nothing"
        raise InputError("NAME", f"{spec} is not installed in {found.prefix} on {found.host} (installed: {have})")
    if len(matches) > 1:
        versions = ", ".join(sorted(f"{name}@{i['version']}" for i in matches))
        raise InputError("NAME", f"{spec} is installed in more than one version ({versions}): name one")
    dest = str(matches[0]["path"])
    gone = f"{dest.rsplit('/', 1)[0]}/.{dest.rsplit('/', 1)[1]}.gone-{secrets.token_hex(4)}"
    script = ('set -e; dest=$1 gone=$2; tree=""; '
              'if [ -L "$dest" ]; then tree=$(readlink "$dest"); fi; '
              'mv -T -- "$dest" "$gone"; rm -rf -- "$gone"; '
              # only a generation beside the link: never a path, nor . or .. (the prefix itself)
              'case "$tree" in ""|*/*|.|..) ;; *) rm -rf -- "$(dirname "$dest")/$tree" ;; esac')
    with install_lock(host, lock_path(dest), 600.0, report, f"[{host.name}] {name}@{matches[0]['version']}"):
        if not host.exists(f"{dest}/{STAMP}"):
            raise SitestackError(f"{dest} went away while waiting for its lock")
        host.run(["bash", "-c", script, "sitestack", dest, gone])
    return dest


#: Lists a build cache's artefacts, NUL-terminated (an entry's name may hold any character, a newline
#: too): ``mtime size entry``; refuses (exit 3) a directory that is not sitestack's cache ($2: the marker).
_CACHE_LIST = ('[ -d "$1" ] || exit 0; [ -f "$1/$2" ] || [ "$3" = legacy ] || exit 3; cd "$1" || exit 1; '
               'for d in */*/artefact.json; do [ -f "$d" ] || continue; d=${d%/*}; '
               's=$(du -sb -- "$d"); printf "%s %s %s\\0" "$(stat -c %Y -- "$d")" "${s%%[!0-9]*}" "$d"; done')


def gc_cache(host: Host, cache_root: str, *, max_age_days: float | None, max_bytes: int | None,
             dry_run: bool, legacy: bool = False) -> list[tuple[str, int]]:
    """Remove build artefacts (``<cache>/<recipe>/<digest>``, the entries with an artefact.json)
    stored more than ``max_age_days`` ago, then the oldest until the rest fits in ``max_bytes``.
    Source tarballs and build tools in the cache are kept (an air-gapped site may have no other
    copy). A run that needs a removed artefact builds it again. Returns (entry, bytes) removed
    (or, with ``dry_run``, that would be).

    ``cache_root`` must hold sitestack's marker (``.sitestack-cache``, which builds write), unless
    ``legacy`` (the default cache, which builds made before the marker existed): any other
    directory is refused, naming $SITESTACK_BUILD_CACHE, and nothing is removed."""
    out = host.probe(["bash", "-c", _CACHE_LIST, "sitestack", cache_root, CACHE_MARKER, "legacy" if legacy else ""])
    if out.rc == 3:
        raise InputError("SITESTACK_BUILD_CACHE", f"{printable(cache_root)} is not a sitestack build cache (it has no "
                         f"{CACHE_MARKER}, which a build that uses the cache writes): nothing removed")
    if not out.ok:
        raise SitestackError(f"cannot read the build cache {printable(cache_root)}: {printable(out.stderr.strip())}")
    entries = sorted((int(t), int(b), p) for t, b, p in (item.split(" ", 2) for item in out.stdout.split("\0") if item))
    now = time.time()
    doomed = [e for e in entries if max_age_days is not None and now - e[0] > max_age_days * 86400]
    kept = [e for e in entries if e not in doomed]
    while max_bytes is not None and kept and sum(e[1] for e in kept) > max_bytes:
        doomed.append(kept.pop(0))
    if not dry_run and doomed:
        host.run(["rm", "-rf", "--", *(f"{cache_root}/{p}" for _, _, p in doomed)])
    return [(f"{cache_root}/{p}", b) for _, b, p in doomed]


def installed(site: Site, options: RunOptions) -> Inventory:
    """``invoke installed``: the inventory of the site's prefix on its first selected host."""
    host, prefix, modules = open_site(site, options, read_only=True)
    try:
        return scan(host, prefix, modules)
    finally:
        host.close()


def remove(site: Site, options: RunOptions, spec: str, report: Callable[[str], None]) -> str:
    """``invoke uninstall``: remove the install ``spec`` names; returns its path."""
    parse_spec(spec)
    host, prefix, _ = open_site(site, options, read_only=False)
    try:
        return uninstall(host, scan(host, prefix, None), spec, report)
    finally:
        host.close()


def gc(site: Site, options: RunOptions, *, max_age_days: float | None, max_bytes: int | None,
       dry_run: bool) -> list[tuple[str, int]]:
    """``invoke gc``: trim the build cache of the site's first selected host."""
    host, _, _ = open_site(site, options, read_only=dry_run)
    try:
        return gc_cache(host, build_cache(host, options), max_age_days=max_age_days, max_bytes=max_bytes,
                        dry_run=dry_run, legacy=options.build_cache is None)
    finally:
        host.close()
