"""The ``--source``, ``--sources-dir`` and ``--mirror`` options of the tasks that provision, checked
before anything connects (a module of its own: ``invoke provision`` imports it, and nothing of the
partial runs' builders)."""

from __future__ import annotations

import dataclasses
import tarfile
from pathlib import Path

from sitestack.core.errors import InputError, SitestackError
from sitestack.installs import sources as sources_mod
from sitestack.model.context import RunOptions
from sitestack.model.site import Site


def resolved_path(path: str | None) -> str | None:
    return str(Path(path).resolve()) if path else None


def checked_sources(loaded: Site, options: RunOptions, label: str) -> RunOptions:
    """``options`` with the paths of --source (one, or NAME=PATH per recipe), --sources-dir and
    --mirror made absolute, refused before anything connects or is written: a path that is not
    there, an unsafe tarball, a NAME=PATH whose recipe no step of the playbook installs."""
    sources = tuple((name, resolved_path(path) or path) for name, path in options.recipe_sources)
    options = dataclasses.replace(options, source=resolved_path(options.source), sources_dir=resolved_path(options.sources_dir),
                                  mirror=resolved_path(options.mirror), recipe_sources=sources)
    installed = sorted({str(s.args.get("recipe")) for s in loaded.steps if s.action == "recipe-install"})
    for name, path in sources:
        if name not in installed:
            raise InputError("--source", f"{name}={path}: no step of site {loaded.name} installs recipe {name} "
                             f"(its recipe-install steps install: {', '.join(installed) or 'nothing'})")
        _check_source(path, name)
    if options.source:
        _check_source(options.source, label)
    if options.mirror and not Path(options.mirror).is_dir():
        raise InputError("--mirror", f"{options.mirror}: not a directory")
    return options


def _check_source(path: str, label: str) -> None:
    if not (Path(path).is_file() or Path(path).is_dir()):
        raise InputError("--source", f"{path}: not a file or directory")
    # An unsafe tarball is refused here; one that is no tarball at all fails its sha256 check in the step.
    if Path(path).is_file() and tarfile.is_tarfile(path):
        try:
            sources_mod.check_tarball(Path(path), label)
        except SitestackError as exc:
            raise InputError("--source", " ".join(str(exc).split())) from None
