"""What packages' hooks share: the site environment on a host, ``$VARIABLES`` in paths, and a
recipe with site-specific additions."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from sitestack.core.errors import SitestackError
from sitestack.core.host import Host
from sitestack.model.recipe import Recipe
from sitestack.model.site import Facts
from sitestack.model.siteenv import probe_in_site_env

ENV_REF = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


def site_environment(host: Host, facts: Facts) -> dict[str, str]:
    """The environment with the site's modules loaded (for ``$VARIABLES`` in facts and paths)."""
    out = probe_in_site_env(host, facts, ["env", "-0"])
    if out.rc != 0:
        raise SitestackError(f"cannot read the site environment on {host.name}: {out.stderr.strip()}")
    env = {}
    for item in out.stdout.split("\0"):
        if "=" in item:
            key, value = item.split("=", 1)
            env[key] = value
    return env


def resolve_refs(text: str, env: Mapping[str, str], what: str) -> str:
    """``$NAME`` / ``${NAME}`` in ``text`` from ``env``; an unset variable is an error."""
    def one(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if name not in env:
            raise SitestackError(f"{what} is {text!r}, but ${name} is not set with the site's modules loaded")
        return env[name]
    return ENV_REF.sub(one, text)


def braces(text: str) -> str:
    """``text`` as a literal in a recipe string (whose ``{name}`` are placeholders)."""
    return text.replace("{", "{{").replace("}", "}}")


def replace_recipe(recipe: Recipe, **changes: Any) -> Recipe:
    """``recipe`` with ``changes``, still naming its file and patch directory (not init fields)."""
    new = dataclasses.replace(recipe, **changes)
    object.__setattr__(new, "path", recipe.path)
    object.__setattr__(new, "patch_dir", recipe.patch_dir)
    return new
