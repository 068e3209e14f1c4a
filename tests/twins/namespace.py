"""A mount namespace in which a site's own paths exist: where a twin's stand-ins sit.

The product and the site's user commands must run with the site's paths (``/opt/rocm-5.7.1``,
``/lustre/orion``, ``/appl/local/containers``, ...), yet this machine's root file system must not
change. So each twin gets a mount namespace made by bubblewrap (root here: no user namespace): a
tmpfs root with every entry of the host's ``/`` bound into it read-write (the checkout, caches and
``/tmp`` stay shared), and the site's paths bound over it from the twin's directories. A path
whose parent exists on the host (``/usr/bin/singularity``) gets a mount point the way the container
runtime stand-in makes them (tests/twins/mounts.py: the parent becomes a tmpfs holding binds of
its entries).

A ``sleep`` process holds the namespace; every command enters it with ``nsenter`` (root, cwd,
environment as given), so the test Slurm cluster's daemons started through :meth:`argv` fork jobs
that see the same file system as the login commands.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

from tests.twins.mounts import View

TOOLS = ("bwrap", "nsenter")


def available() -> str | None:
    """Why a site namespace cannot be made here, or None."""
    for tool in TOOLS:
        if not shutil.which(tool):
            return f"{tool} not installed (apt-get install bubblewrap util-linux)"
    if os.geteuid() != 0:
        return "mount namespaces with binds over / need root here"
    return None


class SiteNamespace:
    """``binds`` (site path -> host path) laid over the host's ``/`` in a namespace of their own."""

    def __init__(self, binds: Mapping[str, Path | str]) -> None:
        self.binds = {site: str(host) for site, host in binds.items()}
        self._holder: subprocess.Popen[bytes] | None = None
        self.pid = 0

    def view(self) -> View:
        view = View(writable=True)
        # shortest first: a bind inside another bound site path lands in it
        for site in sorted(self.binds, key=lambda p: (p.count("/"), p)):
            view.bind(self.binds[site], site, ro=False)
        return view

    def start(self) -> SiteNamespace:
        argv = ["bwrap", "--die-with-parent", "--dev-bind", "/dev", "/dev", "--proc", "/proc", "--bind", "/sys", "/sys",
                *self.view().argv(), "--", "sleep", "infinity"]
        self._holder = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self._holder.poll() is not None:
                raise RuntimeError(f"bwrap exited {self._holder.returncode} making the site namespace")
            children = Path(f"/proc/{self._holder.pid}/task/{self._holder.pid}/children").read_text().split()
            # bwrap's child becomes the holder once the mounts are made: it has exec'd sleep by then
            if children and Path(f"/proc/{children[0]}/comm").read_text().strip() == "sleep":
                self.pid = int(children[0])
                return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError("the site namespace did not come up in 20 s")

    def argv(self, argv: list[str], cwd: str | Path | None = None) -> list[str]:
        """``argv`` run inside the namespace (root and working directory of the namespace)."""
        if not self.pid:
            raise RuntimeError("the site namespace is not running")
        # nsenter's own --wd resolves the directory before the root changes: env -C does it inside
        return ["nsenter", "-t", str(self.pid), "-m", "-r", "--", "env", "-C", str(cwd or os.getcwd()), *argv]

    def run(self, argv: list[str], *, env: Mapping[str, str] | None = None, cwd: str | Path | None = None,
            timeout: float = 600, input: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(argv, cwd), env=dict(env) if env is not None else None, input=input,
                              capture_output=True, text=True, timeout=timeout)

    def stop(self) -> None:
        if self._holder is not None and self._holder.poll() is None:
            self._holder.kill()
            self._holder.wait(timeout=10)
        self._holder, self.pid = None, 0
