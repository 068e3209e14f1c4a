"""Installing a stack's packages with uv (``uv pip install``) where the host has it, as pip would.

uv installs the same wheels as pip, several times faster (a torch stack, the whole
``install-venv`` process: 1.4 s against 13.8 s with pip on the development machine,
benchmarks/provision_warm.py), but it is not a drop-in:

- it reads neither pip's configuration files nor ``PIP_*`` variables: a site's mirror or wheel
  directory set for pip is read on the host by :mod:`sitestack.onsite.pip_settings` and given
  to uv on its command line (:func:`uv_index_args`);
- it takes a package from the first index that has it, where pip compares every index's
  versions: ``--index-strategy unsafe-best-match`` is pip's behaviour
  (https://docs.astral.sh/uv/pip/compatibility/#packages-that-exist-on-multiple-indexes), so a
  stack resolves to the same versions whichever tool installs it;
- it hard-links files from its per-user cache, as it does for every environment (the cache's
  files are never changed in place): 0.6 s for a torch stack, where a copy of its 800 MB takes 2-8
  s here. A stack given to a group (facts.install mode group-write, or a group) gets copies
  (``--link-mode copy``): its modes and group are set on its files, which would change the cache's;
- it writes no ``--report``: the manifest's origins come from the installed metadata
  (:func:`sitestack.installs.venv_manifest.origin_from_metadata`).

Nothing here runs: argv lists and the parsing of the settings program's answer.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from sitestack.core.errors import SitestackError

#: pip's index semantics for uv: the best version over every index, not the first index's.
INDEX_STRATEGY = "unsafe-best-match"
#: pip install options the stack uses, and uv's names for them.
OPTIONS = {"--force-reinstall": "--reinstall", "--no-deps": "--no-deps"}


@dataclass(frozen=True)
class PipSettings:
    """Where pip looks on the host (pip.conf files and PIP_* variables), as pip_settings prints it."""

    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    no_index: bool = False
    trusted_hosts: tuple[str, ...] = field(default=())

    @classmethod
    def parse(cls, text: str, host: str) -> PipSettings:
        """The settings program's JSON line; a clear error when it is not one."""
        try:
            data = json.loads(text.strip().splitlines()[-1])
            return cls(index_url=data.get("index_url") or None,
                       extra_index_urls=tuple(str(u) for u in data.get("extra_index_urls", [])),
                       find_links=tuple(str(u) for u in data.get("find_links", [])),
                       no_index=bool(data.get("no_index")),
                       trusted_hosts=tuple(str(h) for h in data.get("trusted_hosts", [])))
        except (ValueError, IndexError, AttributeError, TypeError):
            raise SitestackError(f"[{host}] cannot read pip's index settings for uv: {text.strip()[-300:]!r}") from None


def uv_index_args(settings: PipSettings, index: Sequence[str]) -> list[str]:
    """uv's options for pip's settings plus the stack's own ``index`` options (``--index-url U`` or
    ``--extra-index-url U``, as given to pip): a command-line ``--index-url`` replaces the configured
    one, extra indexes and find-links add to the configured ones, as pip treats them."""
    index = list(index)
    given_index = index[index.index("--index-url") + 1] if "--index-url" in index else None
    extras = [index[i + 1] for i, a in enumerate(index) if a == "--extra-index-url"]
    out: list[str] = ["--no-index"] if settings.no_index else []
    primary = given_index or settings.index_url
    if primary:
        out += ["--index-url", primary]
    for url in [*settings.extra_index_urls, *extras]:
        out += ["--extra-index-url", url]
    for link in settings.find_links:
        out += ["--find-links", link]
    for host in settings.trusted_hosts:
        out += ["--allow-insecure-host", host]
    return out


def uv_install_argv(uv: str, root: str, settings: PipSettings, index: Sequence[str], extra: Sequence[str],
                    compile: bool, shared: bool = False) -> list[str]:
    """``uv pip install`` into the environment at ``root`` (requirements to be appended); ``shared``:
    the site gives its installs to a group (copies, not links into the cache)."""
    unknown = [o for o in extra if o not in OPTIONS]
    if unknown:
        raise ValueError(f"no uv equivalent known for pip options {unknown}")
    argv = [uv, "pip", "install", "--python", f"{root}/bin/python", "--no-progress",
            "--link-mode", "copy" if shared else "hardlink",
            "--index-strategy", INDEX_STRATEGY, *uv_index_args(settings, index), *(OPTIONS[o] for o in extra)]
    if compile:
        argv.append("--compile-bytecode")  # pip compiles by default; uv only when asked
    return argv


def uv_uninstall_argv(uv: str, root: str, names: Sequence[str]) -> list[str]:
    return [uv, "pip", "uninstall", "--python", f"{root}/bin/python", *names]
