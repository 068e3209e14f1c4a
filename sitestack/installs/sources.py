"""The source cache on the controller: download once, verify sha256, reuse.

``fetch(recipe, version, ...)`` returns a local path to the version's tarball whose sha256 is
the recipe's. It looks, in order, at: an explicit file (``--source``), the cache
(``$SITESTACK_SOURCE_CACHE`` or ``~/.cache/sitestack/sources``, one folder per sha256), mirror
directories (``--mirror``, the step's ``mirror`` argument, ``$SITESTACK_MIRROR``; a flat
folder or one subfolder per recipe), and last the recipe's URL. A file whose sha256 differs is
refused with both sums: nothing is built from it.
"""

from __future__ import annotations

import hashlib
import tarfile
import tempfile
import urllib.parse
from collections.abc import Iterable
from pathlib import Path

from sitestack.core import envvars
from sitestack.core.errors import SitestackError
from sitestack.core.files import atomic_stream, atomic_write
from sitestack.core.private import make_private, private_dir
from sitestack.core.redact import redact_known
from sitestack.model.recipe import FILE_NAME, Recipe, expand


class ChecksumMismatch(SitestackError):
    """A source file is not the one the recipe names."""


def cache_dir() -> Path:
    """The controller's source cache ($SITESTACK_SOURCE_CACHE, else ~/.cache/sitestack/sources, private;
    what sitestack makes under either is 0700, whatever the umask: :mod:`sitestack.core.private`)."""
    given = envvars.get("SITESTACK_SOURCE_CACHE")
    if given:
        return Path(given)
    return private_dir(Path.home() / ".cache" / "sitestack") / "sources"


def env_mirrors() -> list[Path]:
    return [Path(p) for p in envvars.get("SITESTACK_MIRROR") or ()]


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def url_of(recipe: Recipe, version: str) -> str:
    return expand(recipe.versions[version].url, {"name": recipe.name, "version": version})


def filename_of(recipe: Recipe, version: str) -> str:
    source = recipe.versions[version]
    if source.filename:
        return source.filename
    name = Path(urllib.parse.urlparse(url_of(recipe, version)).path).name
    if not FILE_NAME.fullmatch(name) or ".." in name:   # a URL ending in /.. must not name a directory
        return f"{recipe.name}-{version}.tar.gz"
    return name


def check_tarball(path: Path, label: str) -> None:
    """Refuse a tarball whose members would land outside the directory it is unpacked in.

    Every member goes through tarfile's ``data`` filter (PEP 706: no absolute names, no ``..``,
    no links pointing outside, no device files), checked here on the controller before anything
    reaches a host; a top-level member that is a symlink is refused as well (the build would run
    in the directory it points to).
    """
    try:
        with tarfile.open(path) as archive:
            for member in archive:
                if member.name.startswith("/"):   # tar would strip the slash; a source tarball has no such names
                    raise SitestackError(f"{label}: {path.name} is unsafe to unpack: absolute member name {member.name!r}")
                try:
                    tarfile.data_filter(member, "/unpack")
                except tarfile.FilterError as exc:
                    raise SitestackError(f"{label}: {path.name} is unsafe to unpack: {exc}") from None
                if (member.issym() or member.islnk()) and "/" not in member.name.strip("/").removeprefix("./"):
                    raise SitestackError(f"{label}: {path.name} is unsafe to unpack: its top-level member "
                                         f"{member.name!r} is a link")
    except (tarfile.TarError, OSError) as exc:
        raise SitestackError(f"{label}: {path.name} is not a readable tarball: {exc}") from None


def verify(path: Path, want: str, what: str) -> None:
    """Refuse ``path`` unless its sha256 is ``want`` (``what`` names it in the message)."""
    _verify(path, want, what)


def _verify(path: Path, want: str, what: str) -> None:
    have = sha256_file(path)
    if have != want:
        raise ChecksumMismatch(f"sha256 mismatch for {what}: the file has {have}, the recipe says {want}; "
                               "refusing it, nothing was built")


def fetch(recipe: Recipe, version: str, *, source: Path | None = None, mirrors: Iterable[Path] = (),
          cache: Path | None = None, timeout: float = 120) -> Path:
    """A verified local copy of the source tarball of ``recipe`` ``version``."""
    want = recipe.versions[version].sha256
    name = filename_of(recipe, version)
    label = f"{recipe.name} {version}"
    if want is None:
        raise SitestackError(f"{recipe.path or recipe.name}: no sha256 for {label} yet, so nothing is downloaded or "
                             f"accepted unverified: check the tarball (`invoke checksum {url_of(recipe, version)}`) "
                             "and write its sha256 into the recipe")
    if source is not None:
        source = Path(source)
        if not source.is_file():
            raise SitestackError(f"--source {source}: no such file")
        _verify(source, want, f"{source} ({label}, from --source)")
        return source
    cache = cache or cache_dir()
    cached = cache / want / name
    if cached.is_file():
        if sha256_file(cached) == want:
            return cached
        cached.unlink()  # corrupted cache entry: fetch again
    for mirror in mirrors:
        for candidate in (Path(mirror) / recipe.name / name, Path(mirror) / name):
            if candidate.is_file():
                _verify(candidate, want, f"{candidate} ({label}, from mirror {mirror})")
                _store(candidate, cached)
                return cached
    url = url_of(recipe, version)
    _download(url, cached, want, label, timeout)
    return cached


def _store(src: Path, dest: Path) -> None:
    """Copy a verified tarball into the cache atomically (a reader never sees part of it)."""
    make_private(dest.parent)
    atomic_write(dest, src.read_bytes(), 0o600)


def _download(url: str, dest: Path, want: str | None, label: str, timeout: float) -> str:
    """Download ``url`` to ``dest`` (atomically); verify against ``want`` when given; return the sha256."""
    digest = hashlib.sha256()
    import http.client  # here: they pull in ssl and email, which only a download needs
    import urllib.request

    make_private(dest.parent)
    with atomic_stream(dest, 0o600) as out:   # renamed into the cache only once verified
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:
                for block in iter(lambda: response.read(1 << 20), b""):
                    digest.update(block)
                    out.write(block)
        # URLError is an OSError; a malformed URL (a port that is not a number) an HTTPException
        except (OSError, ValueError, http.client.HTTPException) as exc:
            raise SitestackError(redact_known(f"cannot download {label} from {url}: {exc} (for an air-gapped site "
                                              f"put {dest.name} in a mirror directory, or pass --source FILE)",
                                              [url])) from None
        have = digest.hexdigest()
        if want is not None and have != want:
            raise ChecksumMismatch(f"sha256 mismatch for {label} downloaded from {url}: got {have}, the recipe "
                                   f"says {want}; refusing it, nothing was built")
    return have


def checksum(target: str, timeout: float = 120) -> tuple[str, str, int]:
    """sha256, file name and size of a local file or a URL (downloaded to a temporary file)."""
    path = Path(target)
    if path.is_file():
        return sha256_file(path), path.name, path.stat().st_size
    parsed = urllib.parse.urlparse(target)
    if parsed.scheme not in ("http", "https", "file"):
        raise SitestackError(f"{target}: no such file, and not an http(s) or file URL")
    with tempfile.TemporaryDirectory(prefix="sitestack-checksum-") as tmp:
        dest = Path(tmp) / (Path(parsed.path).name or "download")
        sha = _download(target, dest, None, target, timeout)
        return sha, dest.name, dest.stat().st_size
