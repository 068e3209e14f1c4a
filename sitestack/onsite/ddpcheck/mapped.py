"""What a process has mapped, read from the kernel and the files themselves: the file-backed mappings of
``/proc/self/maps``, a shared library's ``DT_SONAME`` from its ELF dynamic section, and a version from a
library's file name or from the distribution a Python package directory belongs to.

Every read is bounded: ``/proc/self/maps`` up to :data:`MAPS_MAX` bytes (a process with torch maps a few
hundred lines; one that maps many files may have far more), an ELF file only its header, its program
headers (at most :data:`PHNUM_MAX`), its dynamic section (at most :data:`DYNAMIC_MAX` bytes) and the one
name (at most :data:`NAME_MAX` bytes). A file that cannot be read or is not ELF gives no soname, never an
error. Standard library only: this runs in each rank of the validation job.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import struct
from dataclasses import dataclass
from typing import BinaryIO

from ..fileio import ReadError, read_text

MAPS_MAX = 32 << 20
PHNUM_MAX = 512
DYNAMIC_MAX = 64 << 10
NAME_MAX = 256
#: What the kernel appends to the path of a mapping whose file was unlinked (fs/d_path.c, d_path()).
DELETED = " (deleted)"

# ELF constants (the System V ABI, https://refspecs.linuxfoundation.org/elf/gabi4+/ch5.dynamic.html)
PT_LOAD, PT_DYNAMIC = 1, 2
DT_NULL, DT_STRTAB, DT_SONAME = 0, 5, 14


@dataclass(frozen=True)
class Mapping:
    """One mapped file: its path as the kernel prints it (without :data:`DELETED`), whether it was
    deleted, and its device and inode (``"08:01"``, 1234): the same file under two paths is one copy."""

    path: str
    deleted: bool
    dev: str
    inode: int


def read_maps(path: str = "/proc/self/maps", limit: int = MAPS_MAX) -> str:
    """The text of ``path`` (this process's mappings), at most ``limit`` bytes; empty when unreadable."""
    try:
        return read_text(path, limit, keep="head")
    except ReadError:
        return ""


def parse_maps(text: str) -> list[Mapping]:
    """The file-backed mappings of a ``/proc/PID/maps`` text, each file once, in the order first mapped.

    A line is ``start-end perms offset dev inode [path]`` (proc(5)); the path is everything after the
    inode, spaces included. Anonymous mappings (no path), pseudo-files (``[heap]``, ``[vdso]``,
    ``[anon:...]``) and a last line cut short by the read limit are left out."""
    seen: dict[tuple[str, bool, str, int], None] = {}
    for line in text.split("\n"):
        fields = line.split(None, 5)
        if len(fields) < 6 or not fields[5].startswith("/") or not fields[4].isdigit():
            continue
        path, deleted = fields[5], fields[5].endswith(DELETED)
        if deleted:
            path = path[: -len(DELETED)]
        seen.setdefault((path, deleted, fields[3], int(fields[4])), None)
    return [Mapping(path, deleted, dev, inode) for path, deleted, dev, inode in seen]


def elf_soname(path: str) -> str | None:
    """The ``DT_SONAME`` of the ELF shared object at ``path``, or None (not a regular file, not ELF,
    no dynamic section or no soname, unreadable). Reads only what leads to the name (module docstring)."""
    with contextlib.suppress(OSError, ValueError, struct.error):
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        with os.fdopen(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                return None
            return _soname(handle)
    return None


def _read_at(handle: BinaryIO, offset: int, size: int) -> bytes:
    handle.seek(offset)
    return handle.read(size)


def _soname(handle: BinaryIO) -> str | None:
    head = _read_at(handle, 0, 64)
    if len(head) < 52 or head[:4] != b"\x7fELF" or head[4] not in (1, 2) or head[5] not in (1, 2):
        return None
    wide, order = head[4] == 2, "<" if head[5] == 1 else ">"
    if wide:
        phoff, = struct.unpack_from(order + "Q", head, 32)
        phentsize, phnum = struct.unpack_from(order + "HH", head, 54)
        phdr, dyn = order + "IIQQQQQQ", order + "qQ"
    else:
        phoff, = struct.unpack_from(order + "I", head, 28)
        phentsize, phnum = struct.unpack_from(order + "HH", head, 42)
        phdr, dyn = order + "IIIIIIII", order + "iI"
    if phnum > PHNUM_MAX or phentsize < struct.calcsize(phdr):
        return None
    table = _read_at(handle, phoff, phentsize * phnum)
    loads, dynamic = [], None
    for i in range(min(phnum, len(table) // phentsize)):
        fields = struct.unpack_from(phdr, table, i * phentsize)
        # 64-bit: type, flags, offset, vaddr, paddr, filesz; 32-bit: type, offset, vaddr, paddr, filesz
        kind, offset, vaddr, filesz = (fields[0], fields[2], fields[3], fields[5]) if wide else \
            (fields[0], fields[1], fields[2], fields[4])
        if kind == PT_LOAD:
            loads.append((vaddr, offset, filesz))
        elif kind == PT_DYNAMIC and dynamic is None:
            dynamic = (offset, min(filesz, DYNAMIC_MAX))
    if dynamic is None:
        return None
    entries = _read_at(handle, *dynamic)
    strtab = soname = None
    step = struct.calcsize(dyn)
    for i in range(len(entries) // step):
        tag, value = struct.unpack_from(dyn, entries, i * step)
        if tag == DT_NULL:
            break
        if tag == DT_STRTAB:
            strtab = value
        elif tag == DT_SONAME:
            soname = value
    if strtab is None or soname is None:
        return None
    # DT_STRTAB is an address: the PT_LOAD segment that holds it says where it is in the file
    base = next((offset + strtab - vaddr for vaddr, offset, filesz in loads if vaddr <= strtab < vaddr + filesz), None)
    if base is None:
        return None
    name = _read_at(handle, base + soname, NAME_MAX).split(b"\0", 1)[0]
    return name.decode("utf-8", "replace") or None


_SUFFIX = re.compile(r"\.so\.(\d+(?:\.\d+)*)$")


def name_soname(path: str) -> str:
    """A soname from the file name, where the file has none to read: ``libnccl.so.2.18.3`` -> ``libnccl.so.2``."""
    base = os.path.basename(path)
    match = _SUFFIX.search(base)
    return base[: match.start(1)] + match.group(1).split(".")[0] if match else base


def name_version(path: str) -> str | None:
    """The version in a library's file name (``libnccl.so.2.18.3`` -> ``2.18.3``), or None."""
    match = _SUFFIX.search(os.path.basename(path))
    return match.group(1) if match else None


def package_version(path: str, package: str) -> str | None:
    """The version of the distribution that installed the package directory ``package`` ``path`` lies
    in, from the name of its ``.dist-info`` beside it (``.../site-packages/numpy/_core/x.so`` ->
    ``numpy-2.1.3.dist-info`` -> ``2.1.3``); None where there is none."""
    parts = path.split("/")
    if package not in parts[:-1]:
        return None
    root = "/".join(parts[: len(parts) - 2 - parts[:-1][::-1].index(package)])  # the innermost one
    prefix = package.lower() + "-"  # a .dist-info is NAME-VERSION, NAME with "_" for "-" (the wheel format)
    with contextlib.suppress(OSError), os.scandir(root or "/") as entries:
        for entry in entries:
            if entry.name.endswith(".dist-info") and entry.name.lower().startswith(prefix):
                return entry.name[len(prefix): -len(".dist-info")] or None
    return None
