"""What one point of the tuning sweep gets of its own (:mod:`sitestack.onsite.ddpcheck.sweep`): its
port, its rendezvous, its settings inside a container image, and the end of every process it started.

**Ports.** The validation job's ``MASTER_PORT`` is ``20000 + job id % 10000`` (20000-29999), so the job
ids J+1, J+2, ... of other jobs on a shared node use the ports J's port + 1, + 2, ...: a sweep's points
cannot take them. A sweep's points use their own range, 30000-32699 (below Linux's ephemeral ports,
32768 and up, which an outgoing connection may hold): point ``i`` of job ``J`` starts its search at
``30000 + (J * 100 + i) % 2700``, so the sweeps of consecutive job ids start 100 ports apart, and it
takes the first port from there (wrapping within the range) that this sweep has not used yet (a
previous point's sockets may hold theirs in TIME_WAIT) and that nothing on this node holds: a bind
test, on the node the driver runs on, the job's first node, which is ``MASTER_ADDR``.

**Rendezvous.** A launcher line such as torchrun's ``--rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT"
--rdzv-id="$JOB_ID"`` is expanded once by the batch script's shell, before the driver runs: every point
would join one rendezvous. In each point's argv the driver replaces the port of ``--rdzv-endpoint=HOST:PORT``
with the point's and appends ``-<point id>`` to ``--rdzv-id=ID`` (torchrun's options, before the script).

**Containers.** Where the ranks run in a Singularity/Apptainer image, the image's ``%environment`` wins
over the host's variables; ``<RUNTIME>ENV_NAME`` wins over it (Apptainer docs, "Environment and
metadata"). For every point the driver unsets ``SINGULARITYENV_NAME`` and ``APPTAINERENV_NAME`` of every
plan variable, always (on a site without a container nothing reads them, and a value the job inherited
would otherwise override each point inside the image), and sets the point's settings with the site's
runtime's prefix (``--container-env PREFIX``, from ``facts.container``) where the site has an image.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import os
import signal
import socket
from collections.abc import Callable, Mapping

from ..fileio import read_text
from .envvalues import EnvError
from .procs import STAT_MAX

#: The sweep's ports: 30000-32699, below Linux's ephemeral range (32768 and up) and above the
#: validation job's (20000-29999).
PORT_BASE, PORT_SPAN = 30000, 2700
#: The ports between the first points of the sweeps of consecutive job ids.
PORT_BLOCK = 100
#: The prefixes by which Singularity and Apptainer set a variable inside the image.
CONTAINER_PREFIXES = ("SINGULARITYENV_", "APPTAINERENV_")
#: torchrun's rendezvous options (both spellings torch.distributed.run accepts).
RDZV_ENDPOINT = ("--rdzv-endpoint", "--rdzv_endpoint")
RDZV_ID = ("--rdzv-id", "--rdzv_id")


def port_taken(port: int) -> bool:
    """Whether something on this node holds ``port`` (a listener, or connections in TIME_WAIT: the bind
    is tried without SO_REUSEADDR), on IPv4 or IPv6."""
    for family, address in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        try:
            probe = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue  # no IPv6 on this node
        with probe:
            try:
                probe.bind((address, port))
            except OSError as exc:
                if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                    return True
    return False


def point_port(job_id: int, index: int, used: set[int], taken: Callable[[int], bool] = port_taken) -> int:
    """Point ``index``'s port in the sweep of job ``job_id`` (module docstring), not in ``used``
    and not ``taken``; EnvError when the whole range is."""
    start = (job_id * PORT_BLOCK + index) % PORT_SPAN
    for step in range(PORT_SPAN):
        port = PORT_BASE + (start + step) % PORT_SPAN
        if port not in used and not taken(port):
            return port
    raise EnvError(f"no free port for a point in {PORT_BASE}-{PORT_BASE + PORT_SPAN - 1} on this node")


def point_command(command: list[str], port: int, rdzv_id: str) -> list[str]:
    """The launcher's argv for one point: ``--rdzv-endpoint=HOST:PORT`` with the point's port and
    ``--rdzv-id=ID`` as ``ID-<rdzv_id>``, up to the first ``*.py`` argument (the script, whose own
    options are left alone); every other argument as given."""
    out, script = [], False
    for arg in command:
        name, eq, value = arg.partition("=")
        if not script and eq and name in RDZV_ENDPOINT:
            host = value.rsplit(":", 1)[0] if ":" in value else value
            arg = f"{name}={host}:{port}"
        elif not script and eq and name in RDZV_ID:
            arg = f"{name}={value}-{rdzv_id}"
        script = script or arg.endswith(".py")
        out.append(arg)
    return out


def container_settings(env: dict[str, str], names: list[str], settings: Mapping[str, str], prefix: str | None) -> None:
    """In ``env``: every container variable of ``names`` unset, then ``settings`` under ``prefix``
    (one of :data:`CONTAINER_PREFIXES`) where the site runs its ranks in an image."""
    for name in names:
        for each in CONTAINER_PREFIXES:
            env.pop(each + name, None)
    if prefix:
        env.update({prefix + name: value for name, value in settings.items()})


def end_point(guard_pid: int) -> None:
    """SIGKILL everything a point left: the guard's process group (the driver starts the guard in its
    own session) and the sessions the guard started (it runs the launcher in one of its own), found
    while the guard is their parent (Linux's /proc; elsewhere the guard's group only)."""
    groups = {guard_pid}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = read_text(stat, STAT_MAX, keep="head").rsplit(")", 1)[1].split()
            if int(fields[1]) == guard_pid:  # ppid; fields[2] is its process group
                groups.add(int(fields[2]))
    for group in sorted(groups):
        with contextlib.suppress(OSError):
            os.killpg(group, signal.SIGKILL)
