"""A source given with ``--source`` where the recipe may have no sha256 (hooks with ``given_source``).

Some packages (the RCCL network plugin's forks) have no release tarball whose sum a recipe could
name. Their hooks set :attr:`~sitestack.packages.hooks.PackageHooks.given_source`, and then the
install's source sha256 is, in order: the recipe's; that of ``--source`` (a tarball, or a checkout
directory packed reproducibly by :func:`pack_dir`); the sum recorded in the install's stamp (so
later runs need no ``--source``). The given tarball is kept in the controller's source cache under
its sum (:func:`keep_source`).
"""

from __future__ import annotations

import gzip
import os
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path

from sitestack.core.errors import SitestackError
from sitestack.core.host import Host
from sitestack.installs import sources as sources_mod
from sitestack.installs.stamp import read_stamp
from sitestack.model.recipe import Recipe


def pack_dir(directory: Path, name: str, out_dir: Path) -> Path:
    """A reproducible tar.gz of ``directory`` (sorted, no owners, mtime 0) named ``name``."""
    directory = Path(directory).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / name
    top = directory.name

    def reset(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mtime = 0
        return info

    with open(out, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.GNU_FORMAT) as tar:
        tar.add(directory, arcname=top, recursive=False, filter=reset)
        for root, dirs, files in os.walk(directory):
            dirs.sort()
            for entry in sorted(dirs + files):
                path = Path(root) / entry
                tar.add(path, arcname=f"{top}/{path.relative_to(directory)}", recursive=False, filter=reset)
    return out


def source_file(recipe: Recipe, version: str, given: str) -> Path:
    """The tarball ``--source`` stands for: the file itself, or the directory packed into a temporary one."""
    path = Path(given)
    if path.is_dir():
        return pack_dir(path, sources_mod.filename_of(recipe, version), Path(tempfile.mkdtemp(prefix="sitestack-source-")))
    if not path.is_file():
        raise SitestackError(f"--source {given}: no such file or directory")
    return path


def source_sha256(host: Host, recipe: Recipe, version: str, label: str, dest: str, given: Path | None,
                  mirrors: Sequence[Path] = ()) -> str:
    """The sha256 of the source to build: the recipe's, else that of ``given`` (from :func:`source_file`),
    else the one the install at ``dest`` recorded, else that of a tarball in ``mirrors`` whose sum is
    one of the version's checked ``archives``; refused when there is none."""
    known = recipe.versions[version].sha256
    if given is not None:
        return known or sources_mod.sha256_file(given)
    if known:
        return known
    stamp = read_stamp(host, dest) or {}
    installed: str | None = stamp.get("inputs", {}).get("build", {}).get("source", {}).get("sha256")
    if installed:
        return installed
    mirrored = mirrored_archive(recipe, version, mirrors)
    if mirrored:
        return mirrored
    url = sources_mod.url_of(recipe, version)
    where = f" (none in --mirror {', '.join(map(str, mirrors))} has one of its checked sums)" if mirrors else ""
    raise SitestackError(f"{recipe.path} has no sha256 for {label} ({url}){where}: pass the tarball or a checkout with "
                         f"--source, put a checked archive in --mirror, or check it (`invoke checksum {url}`) and write "
                         "its sha256 into the recipe")


def mirrored_archive(recipe: Recipe, version: str, mirrors: Sequence[Path]) -> str | None:
    """The sum of the version's tarball in a mirror (``<mirror>/<recipe>/<file>`` or ``<mirror>/<file>``)
    when it is one of the version's checked ``archives``; a tarball with another sum is refused."""
    name = sources_mod.filename_of(recipe, version)
    archives = recipe.versions[version].archives
    for mirror in mirrors:
        for candidate in (Path(mirror) / recipe.name / name, Path(mirror) / name):
            if not candidate.is_file():
                continue
            sha = sources_mod.sha256_file(candidate)
            if sha not in archives:
                raise SitestackError(f"{candidate} (--mirror) has sha256 {sha}, which is none of the checked sums of "
                                     f"{recipe.name} {version} in {recipe.path} ({', '.join(archives) or 'none'}): "
                                     "refused")
            return sha
    return None


def keep_source(recipe: Recipe, version: str, given: Path, sha256: str | None) -> None:
    """Keep the given tarball in the controller's source cache under ``sha256`` (the sum the install uses)."""
    if not sha256 or sources_mod.sha256_file(given) != sha256:
        return   # a mismatch is refused by fetch, with both sums
    cached = sources_mod.cache_dir() / sha256 / sources_mod.filename_of(recipe, version)
    if not cached.is_file():
        sources_mod._store(given, cached)
