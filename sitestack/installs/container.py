"""What the container steps share beyond the runtime (:mod:`sitestack.model.container_facts`): the
site's container facts or a clear error, and the labels ``<runtime> inspect --labels`` prints.
"""

from __future__ import annotations

from sitestack.core.errors import SitestackError
from sitestack.model.container_facts import Container
from sitestack.model.facts import Facts


def container_of(facts: Facts, what: str) -> Container:
    """The site's container facts; a clear error saying ``what`` needs them when the site has none."""
    if facts.container is None:
        raise SitestackError(f"{what} needs facts.container (runtime, image), which this site does not set")
    return facts.container


def parse_labels(text: str) -> dict[str, str]:
    """``inspect --labels`` output (``key: value`` lines) -> mapping."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip():
            out[key.strip()] = value.strip()
    return out
