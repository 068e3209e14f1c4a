"""Version numbers and version ranges, as recipes write them: PEP 440, through ``packaging``.

A version is anything PEP 440 accepts, which covers every version torch has shipped: ``4.1.2``,
``2.8.0rc1`` (pre-release), ``2.6.0.dev20241112`` (dev release), ``2.1.0+cu121`` and
``2.3.0a0+6ddf5cf85e.nv24.04`` (local labels). :func:`parse` drops the local label: it names a
build of a release (``+cu121``, ``+rocm6.2``), not another release, and site facts write the
release alone (``torch: {version: 2.1.0, variant: cu121}``).

A range (specifier) is ``*`` or empty (any version) or a PEP 440 specifier set: comma-separated
clauses that must all hold: ``>=4.0``, ``<5``, ``==4.1.*``, ``!=4.1.0``, ``~=4.1``. Comparisons
pad with zeros (``5.7 == 5.7.0``). Pre-releases and dev releases are in a range whenever PEP 440
orders them inside it (``2.8.0rc1`` is in ``>=2.7`` but not in ``>=2.8``: it comes before 2.8.0;
write ``>=2.8.0rc1`` or ``>=2.8.0.dev0`` to take them in).

Every malformed version or range raises :class:`VersionError`, a :class:`SitestackError` (the CLI
shows its message) that is also a ValueError, so ``except ValueError`` around a parse still works.
"""

from __future__ import annotations

from collections.abc import Callable

from packaging.specifiers import InvalidSpecifier, Specifier, SpecifierSet
from packaging.version import InvalidVersion
from packaging.version import Version as _PackagingVersion

from sitestack.core.errors import SitestackError


class VersionError(SitestackError, ValueError):
    """A version or version range that PEP 440 does not accept."""


class Version(_PackagingVersion):
    """A PEP 440 version; indexing gives the parts of its release (``parse("12.1")[0] == 12``)."""

    def __getitem__(self, index: int) -> int:
        return self.release[index]


def parse(version: str) -> Version:
    """``"2.1.0+cu121"`` -> ``Version("2.1.0")``: the release, pre/post/dev parts kept, local label dropped.

    Raises :class:`VersionError` for text PEP 440 does not accept.
    """
    return Version(_full(version).public)


def _full(version: str) -> _PackagingVersion:
    """``version`` with its local label; :class:`VersionError` for text PEP 440 does not accept."""
    try:
        return _PackagingVersion(str(version).strip())
    except InvalidVersion:
        raise VersionError(f"{version!r} is not a version (PEP 440, e.g. 4.1.2, 2.8.0rc1, 2.1.0+cu121)") from None


def specifier(spec: str) -> SpecifierSet:
    """Range ``spec`` as a SpecifierSet (``*`` and empty: any version).

    Raises :class:`VersionError` naming the first malformed clause.
    """
    text = (spec or "").strip()
    if text == "*":
        return SpecifierSet()
    clauses = [c.strip() for c in text.split(",") if c.strip()]
    for clause in clauses:
        try:
            Specifier(clause)
        except InvalidSpecifier:
            raise VersionError(f"bad version range clause {clause!r} (PEP 440: use e.g. >=4.0, <5, ==4.1.*, "
                               "~=4.1; a wildcard only goes with == or !=, ~= needs two parts)") from None
    return SpecifierSet(",".join(clauses))


def check_version(version: str) -> str | None:
    """A problem with ``version`` (not PEP 440), or None when it parses."""
    return _problem(_full, version)


def check_spec(spec: str) -> str | None:
    """A problem with range ``spec``, or None when it parses."""
    return _problem(specifier, spec)


def _problem(parse: Callable[[str], object], text: str) -> str | None:
    try:
        parse(text)
    except VersionError as exc:
        return str(exc)
    return None


def matches(spec: str, version: str) -> bool:
    """Whether ``version`` is in range ``spec`` (PEP 440, pre-releases included where ordered inside).

    Raises :class:`VersionError` for a malformed range or version.
    """
    return specifier(spec).contains(_full(version), prereleases=True)


def sort_key(version: str) -> tuple[bool, _PackagingVersion, str]:
    """Sort versions in PEP 440 order; anything that is not a version (a git ref) sorts first, by text."""
    try:
        return (True, _PackagingVersion(str(version).strip()), version)
    except InvalidVersion:
        return (False, _PackagingVersion("0"), version)
