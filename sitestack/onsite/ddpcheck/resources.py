"""What one rank's process may use: its resource limits (``ulimit``), its scratch directories and its
memory cgroup. Part of the environment check; the memory record also lets a fault report name an
out-of-memory kill as such rather than only "killed by SIGKILL".

- **Limits**: a soft limit below what a PyTorch rank needs is named with its value. Open files first:
  every rank opens a socket per peer and per channel (Gloo, NCCL's bootstrap and proxies), each
  shared library a descriptor, and MPI_Init its own; at ``ulimit -n 64`` a job dies or hangs inside
  MPI_Init or the process group, with "Too many open files" only in the job log.
- **Scratch**: TMPDIR (``tempfile``'s directory) and the cache directories the job sets (MIOpen's
  user database and kernel cache, Triton's and TorchInductor's caches, torch extensions) must take a
  file and have room: MIOpen writes its database there at the first kernel, and fails the run on a
  full or read-only one (ROCm/MIOpen docs, "Kernel cache" and "User database").
- **Memory**: the rank's cgroup (v2 ``memory.events``/``memory.max``, v1 ``memory.oom_control``/
  ``memory.limit_in_bytes``; https://docs.kernel.org/admin-guide/cgroup-v2.html#memory-interface-files):
  its out-of-memory kill count at start, read again when the rank was killed.
"""

from __future__ import annotations

import contextlib
import os
import resource
import tempfile
from collections.abc import Mapping
from typing import Any

from ..fileio import ReadError, read_text
from ..visible import short_line

#: The soft limits recorded: (name in result.json, resource, the ulimit option, what it limits).
LIMITS: tuple[tuple[str, int, str, str], ...] = (
    ("open_files", resource.RLIMIT_NOFILE, "-n", "open files"),
    ("processes", resource.RLIMIT_NPROC, "-u", "processes and threads"),
    ("address_space", resource.RLIMIT_AS, "-v", "virtual memory"),
    ("data", resource.RLIMIT_DATA, "-d", "data segment"),
    ("stack", resource.RLIMIT_STACK, "-s", "stack size"),
    ("locked_memory", resource.RLIMIT_MEMLOCK, "-l", "locked memory"),
)
#: The lowest soft limits a rank runs with. 1024 open files is the common default soft limit that
#: PyTorch jobs of a few nodes run under; 512 processes and threads (each rank starts OpenMP, Gloo
#: and NCCL threads); 8 GiB of address space or data (CUDA and ROCm reserve far more virtual memory
#: than they use: a finite RLIMIT_AS of a few GiB makes their initialisation fail).
MINIMUM: dict[str, int] = {"open_files": 1024, "processes": 512, "address_space": 8 << 30, "data": 8 << 30}
#: The limits counted in bytes (getrlimit gives bytes; ``ulimit`` shows KiB).
IN_BYTES = ("address_space", "data", "stack", "locked_memory")
#: The scratch directories a rank checks: TMPDIR always, the others where the job sets them.
SCRATCH_VARS = ("TMPDIR", "MIOPEN_USER_DB_PATH", "MIOPEN_CUSTOM_CACHE_DIR", "TRITON_CACHE_DIR",
                "TORCHINDUCTOR_CACHE_DIR", "TORCH_EXTENSIONS_DIR")
#: The room a scratch directory must have free, and the bytes written to prove it takes a file.
SCRATCH_ROOM = 64 << 20
PROBE_BYTES = 64 << 10
#: The most bytes read of a cgroup file; the most records read of the kernel's log.
CGROUP_MAX = 64 << 10
KMSG_RECORDS = 100_000


def limits() -> dict[str, int | None]:
    """This process's soft limits of :data:`LIMITS` (None: unlimited)."""
    out: dict[str, int | None] = {}
    for name, which, _, _ in LIMITS:
        soft = resource.getrlimit(which)[0]
        out[name] = None if soft == resource.RLIM_INFINITY else soft
    return out


def limit_problems(found: Mapping[str, Any]) -> list[str]:
    """Each soft limit of ``found`` (as :func:`limits` gives them) below :data:`MINIMUM`, named with its
    value and the ``ulimit`` option that sets it."""
    problems = []
    for name, _, option, what in LIMITS:
        value, least = found.get(name), MINIMUM.get(name)
        if least is not None and isinstance(value, int) and value < least:
            have, need = (size_words(value), size_words(least)) if name in IN_BYTES else (str(value), str(least))
            problems.append(f"the {what} limit (ulimit {option}) is {have}, below the {need} a PyTorch "
                            f"rank needs: raise it in the job (ulimit {option}) or the site's limits.conf")
    return problems


def size_words(n: int) -> str:
    """``2.0 GiB``, ``512 MiB``, ``12 KiB``, ``100 B``."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.3g} {unit}"
    return f"{n} B"


def scratch_dirs(env: Mapping[str, str]) -> list[tuple[str, str]]:
    """(variable, directory) of each scratch directory the rank uses: TMPDIR as :mod:`tempfile` resolves
    it (``/tmp`` where unset), the others of :data:`SCRATCH_VARS` where set."""
    out = [("TMPDIR", env.get("TMPDIR") or tempfile.gettempdir())]
    out += [(var, env[var]) for var in SCRATCH_VARS[1:] if env.get(var)]
    return out


def scratch_problem(var: str, path: str, room: int = SCRATCH_ROOM) -> str | None:
    """What is wrong with the scratch directory ``path`` (of ``var``): not a directory (one not made yet
    is judged by its nearest existing parent, where the library will make it), a file cannot be
    written there, or less than ``room`` bytes free. None when it is fine."""
    where = path
    while not os.path.exists(where) and os.path.dirname(where) != where:
        where = os.path.dirname(where)
    if not os.path.isdir(where):
        return f"{var}={path} is not a directory"
    try:
        with tempfile.TemporaryFile(dir=where) as probe:
            probe.write(b"\0" * PROBE_BYTES)
            probe.flush()
            os.fsync(probe.fileno())
        stat = os.statvfs(where)
    except OSError as exc:
        return f"{var}={path} cannot take a file: {exc.strerror or exc}" + (f" ({where})" if where != path else "")
    free = stat.f_bavail * stat.f_frsize
    if free < room:
        return (f"{var}={path} is full: {size_words(free)} free of {size_words(stat.f_blocks * stat.f_frsize)}, "
                f"below the {size_words(room)} a rank's scratch needs")
    return None


def scratch_problems(env: Mapping[str, str]) -> list[str]:
    """:func:`scratch_problem` of every directory of :func:`scratch_dirs`."""
    return [p for var, path in scratch_dirs(env) if (p := scratch_problem(var, path))]


def memory_cgroup(proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> dict[str, Any]:
    """This process's memory cgroup: ``events`` (the file that counts its out-of-memory kills), ``oom_kill``
    (the count now), ``limit`` (bytes, None: unlimited) and ``limit_file``; ``{}`` where none is readable.
    cgroup v2 (the ``0::`` line) is preferred over v1 (the ``memory`` controller's line)."""
    try:
        lines = read_text(proc_cgroup, CGROUP_MAX).splitlines()
    except ReadError:
        return {}
    v1 = v2 = None
    for line in lines:
        number, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if number == "0" and controllers == "":
            v2 = path
        elif "memory" in controllers.split(","):
            v1 = path
    places = []
    if v2 is not None:
        places.append((f"{root}/{v2.strip('/')}".rstrip("/"), "memory.events", "memory.max"))
    if v1 is not None:
        places.append((f"{root}/memory/{v1.strip('/')}".rstrip("/"), "memory.oom_control", "memory.limit_in_bytes"))
    for directory, events, limit in places:
        count = oom_kills(f"{directory}/{events}")
        if count is not None:
            return {"events": f"{directory}/{events}", "oom_kill": count, "limit_file": f"{directory}/{limit}",
                    "limit": memory_limit(f"{directory}/{limit}")}
    return {}


def oom_kills(path: str) -> int | None:
    """The ``oom_kill`` count of a cgroup's ``memory.events`` (v2) or ``memory.oom_control`` (v1)."""
    with contextlib.suppress(ReadError, ValueError):
        for line in read_text(path, CGROUP_MAX).splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    return None


def memory_limit(path: str) -> int | None:
    """A cgroup's memory limit in bytes; None where unlimited (``max``, or v1's page-rounded 2^63) or unreadable."""
    with contextlib.suppress(ReadError, ValueError):
        text = read_text(path, CGROUP_MAX).strip()
        if text != "max" and int(text) < 1 << 62:
            return int(text)
    return None


def oom_words(record: Mapping[str, Any], pid: object = None) -> str | None:
    """"out of memory: ..." when the cgroup of a rank's ``memory`` record (as :func:`memory_cgroup` gave
    it at start) counts more kills now than then, or the kernel's log says it killed ``pid`` (a node's
    own OOM, which a cgroup v1 does not count); None otherwise."""
    events, before = record.get("events"), record.get("oom_kill")
    now = oom_kills(events) if isinstance(events, str) and isinstance(before, int) else None
    said = kernel_oom_line(pid) if isinstance(pid, int) else None
    if isinstance(events, str) and isinstance(before, int) and now is not None and now > before:
        limit = record.get("limit")
        bound = (f"its cgroup's memory limit of {size_words(limit)} ({record.get('limit_file')})"
                 if isinstance(limit, int) else f"memory (its cgroup {os.path.dirname(events)} has no limit: the node's)")
        return (f"out of memory: the kernel's OOM killer ended it for exceeding {bound}; oom_kill {before} -> {now} "
                f"in {events}" + (f"; the kernel: {said}" if said else ""))
    return f"out of memory: the kernel: {said}" if said else None


def kernel_oom_line(pid: int, path: str = "/dev/kmsg") -> str | None:
    """The kernel's "Killed process PID" message of its OOM killer, where its log is readable (root, or
    ``kernel.dmesg_restrict=0``): each read of ``/dev/kmsg`` is one record
    (https://docs.kernel.org/admin-guide/abi-testing.html, "/dev/kmsg"); at most :data:`KMSG_RECORDS`."""
    needle = f"Killed process {pid} ".encode()
    found = None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        for _ in range(KMSG_RECORDS):
            try:
                record = os.read(fd, 8192)
            except BlockingIOError:  # the end of the log
                break
            except OSError:  # EPIPE: a record overwritten while reading; the next read goes on
                continue
            if needle in record:
                found = record.split(b";", 1)[-1].split(b"\n", 1)[0]
    finally:
        os.close(fd)
    return short_line(found.decode("utf-8", "replace"), 200) if found else None
