"""Where pip would look for packages on this host, as JSON on stdout, for installing with uv instead.

uv reads neither pip's configuration files nor its ``PIP_*`` variables
(https://docs.astral.sh/uv/pip/compatibility/#configuration-files-and-environment-variables), so a
site whose mirror or wheel directory is set in ``/etc/pip.conf`` would get packages from PyPI
through uv. Run by the base interpreter (``python -c <this file's text>``), standard library only,
this reads what pip reads, in pip's order (``pip/_internal/configuration.py``: global files, the
user's, the interpreter's own ``pip.conf``, ``$PIP_CONFIG_FILE``, then ``PIP_*`` variables; the
``[install]`` section over ``[global]``) and prints one line:
``{"index_url": str|null, "extra_index_urls": [...], "find_links": [...], "no_index": bool,
"trusted_hosts": [...]}``.
"""

import configparser
import json
import os
import sys

KEYS = ("index-url", "extra-index-url", "find-links", "no-index", "trusted-host")


def config_files() -> "list[str]":
    """pip's configuration files, lowest precedence first (PIP_CONFIG_FILE last)."""
    env_file = os.environ.get("PIP_CONFIG_FILE")
    if env_file == os.devnull:
        return []  # pip: no configuration file at all
    xdg = os.environ.get("XDG_CONFIG_DIRS", "/etc/xdg").split(os.pathsep)
    files = [os.path.join(d, "pip", "pip.conf") for d in xdg] + ["/etc/pip.conf"]
    if not (env_file and os.path.exists(env_file)):  # pip skips the user's files when the env file exists
        config_home = os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
        files += [os.path.expanduser("~/.pip/pip.conf"), os.path.join(config_home, "pip", "pip.conf")]
    files.append(os.path.join(sys.prefix, "pip.conf"))
    if env_file:
        files.append(env_file)
    return files


def settings() -> "dict[str, str]":
    """key -> raw value, as pip resolves it for ``pip install``."""
    found: dict[str, str] = {}  # not evaluated: any Python 3 runs this
    for path in config_files():
        parser = configparser.RawConfigParser()
        try:
            parser.read(path, encoding="utf-8")
        except (OSError, configparser.Error):
            continue
        for section in ("global", "install"):  # [install] wins over [global] within a file
            if parser.has_section(section):
                for key in KEYS:
                    if parser.has_option(section, key):
                        found[key] = parser.get(section, key)
    for key in KEYS:
        value = os.environ.get("PIP_" + key.upper().replace("-", "_"))
        if value is not None:
            found[key] = value
    return found


def truthy(value: "str | None") -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


if __name__ == "__main__":
    s = settings()
    print(json.dumps({
        "index_url": (s.get("index-url") or "").strip() or None,
        "extra_index_urls": (s.get("extra-index-url") or "").split(),
        "find_links": (s.get("find-links") or "").split(),
        "no_index": truthy(s.get("no-index")),
        "trusted_hosts": (s.get("trusted-host") or "").split(),
    }))
