"""Running things in a stack environment on the host: the index probe, pip, and the scan of what
is installed. The two programs run on the host are real files in ``sitestack/onsite/``
(standard library only), passed to the interpreter with ``-c``, so nothing is copied first.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sitestack.core.errors import SitestackError
from sitestack.core.host import Completed, Host
from sitestack.core.pip_auth import Configured, pip_auth, uv_auth
from sitestack.core.redact import redact
from sitestack.core.shipped import single_file
from sitestack.installs.progress import Progress
from sitestack.installs.venv_manifest import BUNDLED_FILES
from sitestack.installs.venv_stack import Base, Stack, shared_with_group
from sitestack.installs.venv_uv import PipSettings, uv_install_argv, uv_uninstall_argv

#: pip >= 22.3 can install into another interpreter's environment (``--python``).
PIP_PYTHON_OPTION = (22, 3)


def program(name: str) -> str:
    """The text of ``sitestack/onsite/<name>.py``, as ``python -c`` runs it on the host."""
    return single_file(name)


#: Run by the environment's interpreter: every distribution in its own site-packages, as JSON.
SCAN = program("venv_scan")
#: Run by a python3 on the host: can the index be reached? (stdlib only; any Python 3)
INDEX_PROBE = program("index_probe")
#: Run by the interpreter pip runs with: where pip would look for packages (given to uv).
PIP_SETTINGS = program("pip_settings")


def check_index(host: Host, url: str | None, timeout: float = 15) -> None:
    """Raise a clear error when the wheel index cannot be reached from ``host``. The URL goes to the
    probe in its environment (it may hold credentials: never on a command line); the error shows it
    redacted."""
    if not url:
        return
    out = host.probe(["python3", "-c", INDEX_PROBE, str(timeout)], timeout=timeout + 15,
                     secrets={"SITESTACK_INDEX_URL": url})
    if out.rc == 127 and "not found" in (out.stderr + out.stdout):
        return  # no python3 to ask with: pip will say it
    if out.rc != 0:
        lines = out.stderr.strip().splitlines()[-1:]
        reason = out.stdout.strip() or (lines[0] if lines else "no answer")
        raise SitestackError(redact(f"wheel index {url} cannot be reached from {host.name}: {reason} "
                                    "(facts.torch.index_url; nothing was installed)"))


class EnvTools:
    """pip and the package scan for environments of one stack on one host (commands logged to ``log``)."""

    def __init__(self, host: Host, stack: Stack, base: Base, log: Path | None,
                 report: Callable[[str], None] | None = None, interval: float = 30.0) -> None:
        """``report``/``interval``: progress lines of long pip installs (the torch install is the longest
        step of a provision), as builds give them."""
        self.host, self.stack, self.base, self.log = host, stack, base, log
        self.report, self.interval = report, interval

    def run(self, argv: Sequence[str], env: Mapping[str, str] | None = None,
            secrets: Mapping[str, str] | None = None) -> Completed:
        return self.host.run(argv, env=env, log=self.log, secrets=secrets)

    def uv(self) -> str | None:
        """The uv to install with (its path on the host), or None for pip: facts.python.installer
        ``auto`` takes uv where the site's environment (modules loaded, or the image) has it on its
        PATH and the stack does not see the base's packages; ``uv`` requires both; ``pip`` never
        looks. Asked once per step."""
        if "_uv" in self.__dict__:
            return self.__dict__["_uv"]  # type: ignore[no-any-return]
        found: str | None = None
        if self.stack.system_site_packages:
            # uv does not count what the base's site-packages hold as installed (astral-sh/uv#4466,
            # #7358): it would put a second torch in a container's or a module's stack
            if self.stack.installer == "uv":
                raise SitestackError(f"[{self.host.name}] facts.python.installer is uv, but this stack sees the base "
                                     "Python's packages (system_site_packages), which uv ignores and would install "
                                     "again: use installer auto or pip; nothing was installed")
        elif self.stack.installer != "pip":
            out = self.host.probe(self.base.base(["sh", "-c", "command -v uv"]))
            lines = out.stdout.strip().splitlines() if out.ok else []
            found = lines[-1] if lines and lines[-1].startswith("/") else None
            if found is None and self.stack.installer == "uv":
                raise SitestackError(f"[{self.host.name}] facts.python.installer is uv, but uv is not on the PATH "
                                     f"of {self.host.name} (in the site's environment): install it (pip install uv) "
                                     "or set installer: auto or pip; nothing was installed")
        self.__dict__["_uv"] = found
        return found

    def pip_settings(self, root: str) -> PipSettings:
        """pip's index settings on the host, read by the interpreter pip would run with (once per step:
        with facts.torch.index ``only`` uv runs twice)."""
        if "_pip_settings" in self.__dict__:
            return self.__dict__["_pip_settings"]  # type: ignore[no-any-return]
        python = ["-c", PIP_SETTINGS]
        argv = self.base.env_python(root, python) if self.stack.source == "conda" else self.base.base(["python", *python])
        out = self.host.probe(argv)
        if not out.ok:
            raise SitestackError(f"[{self.host.name}] cannot read pip's index settings for uv: "
                                 f"{(out.stderr or out.stdout).strip()[-300:]}")
        settings = self.__dict__["_pip_settings"] = PipSettings.parse(out.stdout, self.host.name)
        return settings

    def installer_name(self) -> str:
        """"uv pip" or "pip": what installs into this stack's environments."""
        return "uv pip" if self.uv() else "pip"

    def uninstall(self, root: str, names: Sequence[str]) -> None:
        uv = self.uv()
        self.run(self.base.base(uv_uninstall_argv(uv, root, names)) if uv else
                 [*self.pip(root), "uninstall", "--yes", *names])

    def pip(self, root: str) -> list[str]:
        """How to run pip for the environment at ``root``."""
        if self.stack.source == "conda":
            return self.base.env_python(root, ["-m", "pip"])
        out = self.host.probe(self.base.base(["python", "-m", "pip", "--version"]))
        match = re.search(r"pip (\d+)\.(\d+)", out.stdout) if out.ok else None
        if match and (int(match[1]), int(match[2])) >= PIP_PYTHON_OPTION:
            return self.base.base(["python", "-m", "pip", "--python", f"{root}/bin/python"])
        # An old or absent pip in the base: give the environment its own (ensurepip, from the stdlib).
        if not self.host.exists(f"{root}/bin/pip"):
            self.run(self.base.env_python(root, ["-m", "ensurepip", "--default-pip"]))
        return self.base.env_python(root, ["-m", "pip"])

    def pip_install(self, root: str, requirements: Sequence[str], report: str, *extra: str) -> str | None:
        """``pip install`` ``requirements`` into ``root``; the text of pip's ``--report`` (then removed),
        or None when uv installed them (:meth:`uv`; uv writes no report).

        The torch line (the stack's pinned requirements) comes from facts.torch.index_url: as an extra
        index, or, with facts.torch.index ``only``, as the only one (pip ``--index-url``, as OLCF's
        Frontier guide), in a pip run of its own before the rest, which then comes from the default index."""
        url = self.stack.index_url
        if not (url and self.stack.index_only):
            return self._pip_install(root, requirements, report, ["--extra-index-url", url] if url else [], extra)
        own = [r for r in requirements if r in self.stack.requirements]
        rest = [r for r in requirements if r not in own]
        texts = [self._pip_install(root, own, report, ["--index-url", url], extra) if own else None,
                 self._pip_install(root, rest, report, [], extra) if rest else None]
        return merge_reports(texts)

    def _pip_install(self, root: str, requirements: Sequence[str], report: str, index: Sequence[str],
                     extra: Sequence[str]) -> str | None:
        uv = self.uv()
        # an index's credentials go to pip and uv by environment, never on the command line (pip_auth)
        if uv:
            argv, secrets = uv_auth(uv_install_argv(uv, root, self.pip_settings(root), index, extra, self.stack.compile,
                                                    shared=shared_with_group(self.base.facts)))
            argv = self.base.base(argv)
        else:
            auth = pip_auth(index, (), lambda: Configured(self.pip_settings(root).extra_index_urls,
                                                          self.pip_settings(root).find_links))
            argv, secrets = [*self.pip(root), "install", "--no-input", "--disable-pip-version-check", "--progress-bar",
                             "off", "--retries", "2", "--timeout", "60", "--report", report, *extra,
                             *auth.options], auth.env
            if not self.stack.compile:
                argv.append("--no-compile")
        if self.log is None or self.report is None:
            self.run([*argv, *requirements], secrets=secrets)
        else:
            with Progress(self.log, self.stack.name, self.report, self.interval,
                          shown=f"[{self.host.name}] {self.stack.name}") as progress:
                progress.phase(f"{self.installer_name()} install", ", ".join(requirements)[:200])
                self.run([*argv, *requirements], secrets=secrets)
                progress.phase("installed")
        if uv:
            return None
        text = self.host.read_text(report)
        self.host.probe(["rm", "-f", "--", report])
        return text

    def scan(self, root: str) -> dict[str, Any]:
        """What :data:`SCAN` says of the environment at ``root``; refuses a base Python of the wrong version."""
        sp = f"{root}/lib/python{self.stack.python_version}/site-packages"
        out = self.host.probe(self.base.env_python(root, ["-c", SCAN, sp, *BUNDLED_FILES]), timeout=300)
        try:
            data: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise SitestackError(f"cannot list the packages of {root}: {(out.stderr or out.stdout).strip()[-500:]}") from None
        major_minor = ".".join(data["python"].split(".")[:2])
        if major_minor != self.stack.python_version:
            raise SitestackError(f"the base Python is {data['python']}, the site says python.version "
                                 f"{self.stack.python_version} (facts.python)")
        return data


def list_dists(host: Host, stack: Stack, root: str | None = None) -> tuple[bool, set[str]]:
    """(interpreter present, dist-info names) of the environment at the stable path (or at ``root``).

    In a container stack, ``bin/python`` links to the image's interpreter (LUMI:
    /opt/miniconda3/envs/pytorch/bin/python), which the host does not have: there the link itself is
    the interpreter's presence (found on the Dawn twin: every provision rebuilt the stack, then failed)."""
    present = '[ -L "$1/bin/python" ]' if stack.source == "container" else '[ -x "$1/bin/python" ]'
    script = (present + ' || echo NOPYTHON; cd "$2" 2>/dev/null || exit 0; '
              'for d in *.dist-info *.egg-info; do [ -e "$d" ] && echo "$d"; done; exit 0')
    root = root or stack.path
    site_packages = f"{root}/lib/python{stack.python_version}/site-packages"
    out = host.probe(["sh", "-c", script, "sh", root, site_packages])
    lines = out.stdout.split()
    return "NOPYTHON" not in lines, {n for n in lines if n != "NOPYTHON"}


def merge_reports(texts: Sequence[str | None]) -> str | None:
    """One ``pip install --report`` text with the ``install`` items of several (None: no run)."""
    items: list[Any] = []
    given = [t for t in texts if t]
    for text in given:
        try:
            items += json.loads(text).get("install", [])
        except ValueError:
            continue
    return json.dumps({"install": items}) if given else None
