"""The ``sitestack:`` section of Invoke's configuration: each setting's type and range, checked where
Invoke reads it, with one ``error:`` line naming the file (or variable) and key.

Invoke (https://docs.pyinvoke.org/en/stable/concepts/configuration.html) reads ``/etc/invoke.yaml``,
``~/.invoke.yaml``, the project's ``invoke.yaml`` beside ``tasks.py``, the file of ``-f FILE`` (or
``$INVOKE_RUNTIME_CONFIG``) and ``INVOKE_SITESTACK_*`` variables, and merges them itself: left alone, a
section that is not a mapping ends in its ``AmbiguousMergeError`` traceback, a file it cannot parse
(a YAML error, a ``!!python/...`` tag, which its safe loader never runs) in that error's traceback, and
an unknown key is ignored. Invoke has no hook for checking its configuration, so :func:`guard` wraps
three methods of a :class:`~invoke.config.Config` class: the file loaders (a file that cannot be read
or parsed), ``merge`` (every loaded file's ``sitestack:`` section, before it is merged) and
``load_shell_env`` (the ``INVOKE_SITESTACK_*`` variables, before Invoke casts them). The ``sitestack``
command uses :class:`SitestackConfig`; ``tasks.py`` guards Invoke's own class for ``invoke``, which
has read ``/etc/invoke.yaml`` and ``~/.invoke.yaml`` before it imports ``tasks.py``: there, a file
it cannot parse is Invoke's traceback still (docs/cli.md).
"""

from __future__ import annotations

import errno
import functools
import os
import stat
from collections.abc import Callable, Mapping
from typing import Any

from invoke.config import Config
from invoke.exceptions import Exit, UnknownFileType

from sitestack.core import envvars
from sitestack.core.errors import InputError
from sitestack.core.redact import redact
from sitestack.onsite.visible import escaped, printable

#: The settings and what each accepts (docs/cli.md). Null, or a key left out, is not set.
SETTING_KINDS = {"account": "an account name", "prefix": "an install prefix (an absolute path)",
                 "sources_dir": "an absolute path", "mirror": "an absolute path",
                 "log_dir": "an absolute path of sitestack's own", "forks": "a whole number from 1 to 1024",
                 "parallel_steps": "a whole number from 1 to 1024"}
#: The section Invoke is told of (``Collection.configure``): None is not set. Invoke only reads an
#: INVOKE_SITESTACK_X variable for a key declared here.
SETTINGS: dict[str, Any] = dict.fromkeys(SETTING_KINDS)
#: The SITESTACK_* environment variables that come before the configuration files.
SETTING_ENV = {"account": "SITESTACK_ACCOUNT", "log_dir": "SITESTACK_LOG_DIR"}
#: Invoke's configuration files, in the order it merges them (each ``_<level>`` of a Config).
FILE_LEVELS = ("system", "user", "project", "runtime")
#: What names an Invoke variable of the section.
ENV_PREFIX = "INVOKE_SITESTACK_"


def shown(key: object) -> str:
    """A key as a message may show it (:func:`sitestack.onsite.visible.escaped`)."""
    return escaped(str(key))


def check_value(key: str, value: object, where: str) -> None:
    """One setting's value from ``where`` (a file or variable); an :class:`InputError` naming both."""
    name = f"sitestack.{key}"
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (str, int)) or value == "":
        raise InputError(where, f"{value!r} is not {SETTING_KINDS[key]}", key=name)
    text = str(value)
    try:
        if key == "account":
            if not envvars.ACCOUNT.fullmatch(text) or ".." in text:
                raise InputError(name, f"{text!r} is not an account name (letters, digits, '.', '_' and '-')")
        elif key == "prefix":
            from sitestack.model.context import check_prefix  # the --prefix rule (imported late: tasks load fast)

            check_prefix(name, text)
        elif key in ("sources_dir", "mirror"):
            envvars.check_path(name, text)
        elif key == "log_dir":
            envvars.check_own_dir(name, text)
        elif not (text.isascii() and text.isdigit() and 1 <= int(text) <= 1024):
            raise InputError(name, f"{value!r} is not {SETTING_KINDS[key]}")
    except InputError as exc:
        raise InputError(where, exc.detail, key=name) from None


def check_file(data: object, where: str) -> None:
    """A configuration file's data: a mapping, whose ``sitestack:`` section (if any) is a mapping of
    known settings with values of their kind."""
    if data is None:
        return
    if not isinstance(data, Mapping):
        raise InputError(where, f"an Invoke configuration file holds a mapping, not {type(data).__name__}")
    if "sitestack" not in data:
        return
    section = data["sitestack"]
    if not isinstance(section, Mapping):
        raise InputError(where, f"must be a mapping of settings (key: value), not {section!r}"[:300], key="sitestack")
    for key, value in section.items():
        if key not in SETTING_KINDS:
            raise InputError(where, f"is not a setting (the settings: {', '.join(SETTING_KINDS)})",
                             key=f"sitestack.{shown(key)}")
        check_value(key, value, where)


def check_env() -> None:
    """The ``INVOKE_SITESTACK_*`` variables: each names a setting, with a value of its kind (empty: not set)."""
    for name, value in sorted(os.environ.items()):
        if not name.startswith(ENV_PREFIX):
            continue
        key = name[len(ENV_PREFIX):].lower()
        if key not in SETTING_KINDS:
            raise InputError(shown(name), f"is not a sitestack setting (the settings: {', '.join(SETTING_KINDS)})")
        if value:
            check_value(key, value, name)


def check_files(config: Config) -> None:
    """Every configuration file ``config`` has loaded."""
    for level in FILE_LEVELS:
        if getattr(config, f"_{level}_found", None):
            check_file(getattr(config, f"_{level}"), str(getattr(config, f"_{level}_path")))


def _exit(exc: InputError) -> Exit:
    # a value may be a URL with credentials, or hold terminal sequences: shown neither
    return Exit(f"error: {printable(redact(str(exc)))}", code=1)


#: The largest Invoke configuration file read (a few settings: a few KiB).
CONFIG_FILE_MAX = 1 << 20


def _check_config_file(path: str) -> None:
    """``path`` is a regular file of at most :data:`CONFIG_FILE_MAX` bytes, looked at without blocking (a
    FIFO given as ``-f`` would hang Invoke's ``open``); an InputError otherwise. A missing file is
    Invoke's FileNotFoundError, so the next name is tried."""
    fd = os.open(os.path.expanduser(path), os.O_RDONLY | os.O_NONBLOCK)
    try:
        info = os.fstat(fd)
    finally:
        os.close(fd)
    if not stat.S_ISREG(info.st_mode):
        raise InputError(str(path), "not a regular file: not an Invoke configuration file")
    if info.st_size > CONFIG_FILE_MAX:
        raise InputError(str(path), f"larger than {CONFIG_FILE_MAX >> 20} MiB: not an Invoke configuration file")


def _guard_loader(load: Callable[[Config, str], Any]) -> Callable[[Config, str], Any]:
    @functools.wraps(load)
    def guarded(self: Config, path: str) -> Any:
        try:
            _check_config_file(path)
            return load(self, path)
        except InputError as exc:
            raise _exit(exc) from None
        except OSError as exc:
            if exc.errno == errno.ENOENT:   # Invoke's sign that the file is not there: the next name is tried
                raise
            raise _exit(InputError(str(path), f"cannot read the Invoke configuration file: {exc.strerror}")) from None
        except Exception as exc:  # noqa: BLE001 -- YAML, JSON, Python errors: each is the file's fault
            mark = getattr(exc, "problem_mark", None)   # a YAML error: its line, and the problem alone
            where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
            reason = getattr(exc, "problem", None) if mark is not None else None
            reason = " ".join(str(reason or exc).split())[:300]
            raise _exit(InputError(where, f"not a valid Invoke configuration file: {reason}")) from None
    return guarded


def _guard_merge(merge: Callable[[Config], None]) -> Callable[[Config], None]:
    @functools.wraps(merge)
    def guarded(self: Config) -> None:
        try:
            check_files(self)
            merge(self)
        except InputError as exc:
            raise _exit(exc) from None
        except ValueError as exc:   # AmbiguousMergeError: a file's value where Invoke has a mapping
            raise _exit(InputError(_conflict(self), f"cannot merge the Invoke configuration: {exc}"[:400])) from None
    return guarded


def _conflict(config: Config) -> str:
    """The file and key whose value is not a mapping where Invoke's defaults have one."""
    defaults = getattr(config, "_defaults", {})
    for level in FILE_LEVELS:
        data = getattr(config, f"_{level}", None)
        if getattr(config, f"_{level}_found", None) and isinstance(data, Mapping):
            for key, value in data.items():
                if isinstance(defaults.get(key), Mapping) and not isinstance(value, Mapping):
                    return f"{getattr(config, f'_{level}_path')}: {shown(key)}"
    return "invoke configuration"


def _guard_shell_env(load: Callable[[Config], None]) -> Callable[[Config], None]:
    @functools.wraps(load)
    def guarded(self: Config) -> None:
        try:
            check_env()
            load(self)
        except InputError as exc:
            raise _exit(exc) from None
        except Exception as exc:  # noqa: BLE001 -- Invoke's UncastableEnvVar, AmbiguousEnvVar, a failed int()
            raise _exit(InputError("INVOKE_* variables", " ".join(str(exc).split())[:300])) from None
    return guarded


def _guard_load_file(load: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(load)
    def guarded(self: Config, *args: Any, **kwargs: Any) -> None:
        try:
            load(self, *args, **kwargs)
        except UnknownFileType as exc:   # `-f FILE` with a name Invoke has no loader for: its traceback otherwise
            raise _exit(InputError(str(getattr(self, "_runtime_path", None) or "-f"),
                                   " ".join(str(exc).split())[:300])) from None
    return guarded


def guard(cls: type[Config]) -> type[Config]:
    """Make ``cls`` check what it loads (the module docstring); once per class."""
    if getattr(cls, "_sitestack_guarded", False):
        return cls
    for suffix in ("yaml", "yml", "json", "py"):
        setattr(cls, f"_load_{suffix}", _guard_loader(getattr(cls, f"_load_{suffix}")))
    cls._load_file = _guard_load_file(cls._load_file)  # type: ignore[method-assign]
    cls.merge = _guard_merge(cls.merge)  # type: ignore[method-assign,assignment]
    cls.load_shell_env = _guard_shell_env(cls.load_shell_env)  # type: ignore[method-assign,assignment]
    cls._sitestack_guarded = True  # type: ignore[attr-defined]
    return cls


class SitestackConfig(Config):
    """Invoke's configuration, checked as it is loaded (the ``sitestack`` command's)."""


guard(SitestackConfig)
