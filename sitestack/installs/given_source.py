"""A source given with ``--source`` where the recipe may have no sha256 (hooks with ``given_source``).

Some packages (the RCCL network plugin's forks) have no release tarball whose sum a recipe could
name. Their hooks set :attr:`~sitestack.packages.base.PackageHooks.given_source`, and then the
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


def source_sha256(host: Host, recipe: Recipe, version: str, label: str, dest: str, given: Path | None) -> str:
    """The sha256 of the source to build: the recipe's, else that of ``given`` (from :func:`source_file`),
    else the one the install at ``dest`` recorded; refused when there is none."""
    known = recipe.versions[version].sha256
    if given is not None:
        return known or sources_mod.sha256_file(given)
    if known:
        return known
    stamp = read_stamp(host, dest) or {}
    installed: str | None = stamp.get("inputs", {}).get("build", {}).get("source", {}).get("sha256")
    if installed:
        return installed
    url = sources_mod.url_of(recipe, version)
    raise SitestackError(f"{recipe.path} has no sha256 for {label} ({url}): pass the tarball or a checkout with "
                         f"--source, or check it (`invoke checksum {url}`) and write its sha256 into the recipe")


def keep_source(recipe: Recipe, version: str, given: Path, sha256: str | None) -> None:
    """Keep the given tarball in the controller's source cache under ``sha256`` (the sum the install uses)."""
    if not sha256 or sources_mod.sha256_file(given) != sha256:
        return   # a mismatch is refused by fetch, with both sums
    cached = sources_mod.cache_dir() / sha256 / sources_mod.filename_of(recipe, version)
    if not cached.is_file():
        sources_mod._store(given, cached)
