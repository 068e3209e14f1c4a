"""An index's credentials for pip and uv: given by environment, never on a command line (which
``ps`` shows every user) nor in a file that stays.

A URL with a userinfo (``https://user:password@host/simple``, ``https://token@host/simple``) is
taken out of the options and requirement lines sitestack gives pip; what the command gets instead:

- ``--index-url URL``: ``PIP_INDEX_URL`` in its environment. A command-line ``--index-url`` and
  the variable both replace the configured index and leave the configured extra indexes in use
  (https://pip.pypa.io/en/stable/topics/configuration/#precedence-override-order).
- ``--extra-index-url URL`` (and ``--find-links URL``): ``PIP_EXTRA_INDEX_URL`` (``PIP_FIND_LINKS``),
  space-separated. The variable *replaces* pip's configured extra indexes where the command-line
  option adds to them, so the configured ones (read on the host by
  :mod:`sitestack.onsite.pip_settings`) are put in the variable first: pip looks in the same indexes.
- a requirement line naming a URL with a userinfo (``pkg @ https://token@host/pkg.whl``): written with
  ``${SITESTACK_INDEX_CREDENTIALS_N}`` in the userinfo's place, and that variable in the environment;
  pip expands ``${NAME}`` in a requirements file
  (https://pip.pypa.io/en/stable/reference/requirements-file-format/#using-environment-variables), so
  the file keeps no secret.
- uv reads neither pip's variables nor its configuration, and sitestack gives it every index itself
  (:func:`sitestack.installs.venv_uv.uv_index_args`): where one has credentials, all of them go to
  ``UV_INDEX_URL`` / ``UV_EXTRA_INDEX_URL`` / ``UV_FIND_LINKS``
  (https://docs.astral.sh/uv/reference/environment/), in the same order.

The environment reaches the command through :meth:`sitestack.core.hostbase.Host.run`'s ``secrets``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sitestack.core.errors import SitestackError
from sitestack.core.hostbase import Host
from sitestack.core.redact import has_secret, redact, split_credentials
from sitestack.core.shipped import single_file

#: The variable a requirement line's credentials are given in (``{n}``: 1, 2, ...).
CREDENTIALS_VAR = "SITESTACK_INDEX_CREDENTIALS_{n}"
#: pip's options that name an index or a link location, and pip's variable for each.
PIP_VARIABLES = {"--index-url": "PIP_INDEX_URL", "--extra-index-url": "PIP_EXTRA_INDEX_URL",
                 "--find-links": "PIP_FIND_LINKS"}
#: uv's variables for the same options, and how each separates several values.
UV_VARIABLES = {"--index-url": ("UV_INDEX_URL", " "), "--extra-index-url": ("UV_EXTRA_INDEX_URL", " "),
                "--find-links": ("UV_FIND_LINKS", ",")}


@dataclass(frozen=True)
class Configured:
    """What pip is configured with on the host (the extra indexes and find-links its variables would replace)."""

    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()


def configured_for(host: Host, python: Sequence[str]) -> Configured:
    """What pip run by ``python`` (argv: the interpreter, with its container) is configured with on
    ``host`` (:mod:`sitestack.onsite.pip_settings`, run by that interpreter)."""
    text = single_file("pip_settings")
    out = host.probe([*python, "-c", text])
    try:
        data: Any = json.loads(out.stdout.strip().splitlines()[-1] if out.ok else "null")
        return Configured(extra_index_urls=tuple(str(u) for u in data["extra_index_urls"]),
                          find_links=tuple(str(u) for u in data["find_links"]))
    except (ValueError, IndexError, KeyError, TypeError):
        raise SitestackError(redact(f"[{host.name}] cannot read pip's index settings: "
                                    f"{(out.stderr or out.stdout).strip()[-300:]}")) from None


@dataclass(frozen=True)
class PipAuth:
    """pip's options and requirement lines without credentials, and the environment that carries them."""

    options: list[str]
    lines: list[str]
    env: dict[str, str] = field(default_factory=dict)


def pip_auth(options: Sequence[str], lines: Sequence[str] = (),
             configured: Callable[[], Configured] = Configured) -> PipAuth:
    """pip's ``options`` (argv words: ``--extra-index-url URL`` ...) and requirement ``lines`` with their
    credentials moved to the environment (see the module's docstring). ``configured`` is asked (a probe
    on the host) only where an extra index or find-links location has credentials."""
    out: list[str] = []
    env: dict[str, str] = {}
    moved: dict[str, list[str]] = {}
    words = list(options)
    i = 0
    while i < len(words):
        word = words[i]
        if word in PIP_VARIABLES and i + 1 < len(words) and _secret(words[i + 1]):
            moved.setdefault(word, []).append(words[i + 1])
            i += 2
            continue
        out.append(word)
        i += 1
    if "--index-url" in moved:
        env["PIP_INDEX_URL"] = moved["--index-url"][-1]   # the last one wins, as on a command line
    if "--extra-index-url" in moved or "--find-links" in moved:
        have = configured()
        if "--extra-index-url" in moved:
            env["PIP_EXTRA_INDEX_URL"] = " ".join([*have.extra_index_urls, *moved["--extra-index-url"]])
        if "--find-links" in moved:
            env["PIP_FIND_LINKS"] = " ".join([*have.find_links, *moved["--find-links"]])
    return PipAuth(options=out, lines=[_line(line, env) for line in lines], env=env)


def _line(line: str, env: dict[str, str]) -> str:
    """``line`` with a direct URL's userinfo replaced by a ``${VAR}`` added to ``env``."""
    name, at, url = line.partition("@")
    if not at:
        return line
    bare, userinfo = split_credentials(url.strip())
    var = CREDENTIALS_VAR.format(n=sum(1 for k in env if k.startswith("SITESTACK_INDEX_CREDENTIALS_")) + 1)
    if userinfo is None:
        if not has_secret(url):
            return line
        # a token elsewhere in the URL (a signed URL's query, a path token): the whole URL by variable,
        # which pip expands anywhere in a requirements line
        env[var] = url.strip()
        return f"{name}@ ${{{var}}}"
    env[var] = userinfo
    scheme, _, rest = bare.partition("://")
    return f"{name}@ {scheme}://${{{var}}}@{rest}"


def _secret(url: str) -> bool:
    """Whether ``url`` holds a credential: a userinfo, or a token :func:`~sitestack.core.redact.redact`
    hides (``?token=``, a signed URL's signature, anaconda.org's ``/t/TOKEN/``)."""
    return split_credentials(url)[1] is not None or has_secret(url)


def uv_auth(argv: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """uv's index options (``--index-url U``, ``--extra-index-url U``, ``--find-links U``) in ``argv``
    moved to uv's variables, all of them, in order, where any has credentials; else ``argv`` as it is."""
    words = list(argv)
    pairs = [(i, w) for i, w in enumerate(words[:-1]) if w in UV_VARIABLES]
    if not any(_secret(words[i + 1]) for i, _ in pairs):
        return words, {}
    env: dict[str, list[str]] = {}
    drop = set()
    for i, option in pairs:
        env.setdefault(option, []).append(words[i + 1])
        drop |= {i, i + 1}
    values = {UV_VARIABLES[o][0]: UV_VARIABLES[o][1].join(v[-1:] if o == "--index-url" else v) for o, v in env.items()}
    return [w for i, w in enumerate(words) if i not in drop], values
