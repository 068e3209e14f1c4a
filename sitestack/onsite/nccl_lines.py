"""The lines of NCCL/RCCL ``NCCL_DEBUG=INFO`` logs: each message's host, process, level and text
(:class:`Reader`, :func:`parse`, :func:`read_files`), the first half of ``nccl_log.py``'s reading
(:mod:`nccl_parse` names the network each host used from them; contract in :mod:`nccl_log`).

Time is linear in the logs' size and memory bounded whatever it is: each line is read up to
:data:`LINE_MAX` bytes, at most :data:`MESSAGES_MAX` messages are kept, only regular files are
opened, and every pattern here is tried once per position of a run of the characters it repeats.
Text that reaches a terminal later (hosts, messages) has its control characters shown as escapes.

Standard library only, and nothing of sitestack: installed on the site beside ``nccl_log.py`` and
``visible.py``, and imported from its own directory. The messages matched here, and the public logs
they come from, are listed beside each pattern; ``tests/data/nccl-logs/`` holds those logs.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import BinaryIO

from .visible import printable, without_sequences

NO_HOST = "?"

# A message head: anything before "host:pid:tid [dev]", then optional "func:line" (WARN lines:
# "create_nccl_ofi_component:459 NCCL WARN", aws/aws-ofi-nccl#24; "int nccl_net_ofi_create_plugin(
# nccl_net_ofi_plugin_t**):268 NCCL WARN", gpustack/gpustack#5553), then "NCCL INFO|WARN|TRACE".
# RCCL prints the same "NCCL INFO" prefix (ROCm/rccl#419). A physical line may hold several
# messages: CloudWatch exports repeat it in a second column (aws/aws-ofi-nccl#889), pastes join lines.
# Linear in the line's length: a host starts only right after one of the characters that may precede
# it, which it cannot hold itself (so a run of host characters is tried once, not from each of its
# characters); the function name starts with a non-space and holds no single ":" (so only the head
# just before it can reach its ":line"). A host redacted as "<cluster_name>" (NVIDIA/nccl#952) is one too.
_HEAD = re.compile(r"(?<![^\s:|\[\]>)\"'])(?P<host><[\w.-]{1,64}>|[^\s:|\[\]\"'>)]+):(?P<pid>\d+):(?P<tid>\d+)\s+\[(?P<dev>\d+)\]\s+"
                   r"(?:[^\s:](?:[^\n:]|::){0,200}:\d+\s+)?NCCL\s+(?P<level>INFO|WARN|TRACE)\s+")
# No host prefix: "[0] NCCL INFO ..." or "NCCL INFO ..." at the start, after a timestamp or a tag
# (aws/aws-ofi-nccl#801, NVIDIA/nccl#1292).
_BARE = re.compile(r"^(?:.*?\s)?(?:\[(?P<dev>\d+)\]\s+)?(?:\S+:\d+\s+)?NCCL\s+(?P<level>INFO|WARN)\s+(?P<msg>.*)")
# ISO timestamps (CloudWatch, journald, Kubernetes) hold colons that would pass for host:pid:tid.
_STAMP = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?")
_VERSION = re.compile(r"\b(?P<lib>NCCL|RCCL) version\s*(?::\s*)?(?P<v>\d+\.\d+\.\d+)")

# A line whose "host:pid:tid [dev] NCCL INFO" the user stripped is read only when it starts as one of
# the messages nccl_parse.py reads does, so that a program's own output is not taken for NCCL's: "NET/OFI Selected
# Provider is cxi", "Channel 00/0 : 0[0] -> 1[0] [send] via NET/AWS Libfabric/0", "NET/Plugin: Failed
# to find ncclNetPlugin_v6 symbol" (aws/aws-ofi-nccl#801 posts such lines), "comm 0x.. rank 0 nRanks 2 ...".
_STRIPPED = re.compile(r"^(?:NET/(?:OFI|Plugin|IB|Socket) ?:? \S|(?:Channel|Ring) \d+(?:/\d+)? : \d+(?:\[\w+\])? -> \d\S* .*via \S|"
                       r"Using (?:network|internal Network) [\w.-]+(?: [\w.-]+)?$|Bootstrap ?: ?Using \S|NCCL_[A-Z0-9_]+ set by environment to |"
                       r"(?:Initialized|Assigned|Failed to initiali[sz]e) NET plugin \S|Plugin Path : /|P2P plugin \S|"
                       r"(?:ncclCommInitRank\w* |ncclCommSplit )?comm 0x[0-9a-fA-F]+ rank \d+ n[Rr]anks \d+|"
                       r"Failed to open libibverbs|No plugin found \(lib[nr]ccl-net|Plugin load \(lib[nr]ccl-net)")


@dataclass(frozen=True)
class Line:
    """One NCCL line: where it came from and what it says."""

    host: str
    pid: str
    level: str
    msg: str
    lineno: int


#: The most bytes of one line that are kept: NCCL's own lines are shorter than 1 KiB, a CloudWatch
#: export's row of several columns a few KiB. The rest of a longer line is read in blocks of
#: :data:`SKIP_PIECE` bytes and dropped (so a file with no newline at all costs no memory).
LINE_MAX = 16 * 1024
SKIP_PIECE = 1 << 20
_LINE_END = re.compile(rb"\r\n|\r|\n")
#: The most NCCL messages kept from all the logs read together (a message holds a few hundred bytes:
#: some 100 MiB at most; 16 ranks write about 10 000 at NCCL_DEBUG=INFO). Past it the rest of the
#: logs is not read, and the verdict says so (:attr:`Reader.notes`).
MESSAGES_MAX = 250_000


class Reader:
    """The NCCL messages of logs, read line by line within :data:`LINE_MAX` and :data:`MESSAGES_MAX`,
    so that time is linear in the logs' size and memory bounded whatever it is.

    Each line's terminal escape sequences become spaces and its other control characters visible
    escapes (``\\x1b``: :mod:`visible`), so no message printed later acts on a terminal."""

    def __init__(self) -> None:
        self.lines: list[Line] = []
        self.version: str | None = None
        self.number = 0  # physical lines so far, over every file
        self.cut = 0  # lines longer than LINE_MAX
        self.full = False  # MESSAGES_MAX reached: nothing more is read

    def feed(self, text: str) -> None:
        """Read ``text`` (one line or several), each line cut at :data:`LINE_MAX` characters."""
        for raw in text.splitlines():
            if self.full:
                return
            self.number += 1
            if len(raw) > LINE_MAX:
                raw, self.cut = raw[:LINE_MAX], self.cut + 1
            self._line(raw)

    def read_file(self, handle: BinaryIO) -> None:
        """Read an open binary file to its end (or until :data:`MESSAGES_MAX`), in blocks of
        :data:`SKIP_PIECE` bytes cut into lines at each newline or carriage return (a progress bar's
        updates hold no newline: an NCCL warning after them is a line of its own)."""
        line, over = b"", False  # the line not ended yet (at most LINE_MAX bytes), whether it was longer
        while not self.full and (block := handle.read(SKIP_PIECE)):
            if b"\n" not in block and b"\r" not in block:  # memchr, not the pattern: GiB/s on a line with no end
                ended, rest = [], block
            else:
                *ended, rest = _LINE_END.split(block)
            for part in ended:
                self._bytes(line if over else line + part, over)
                line, over = b"", False
            if not over:
                line += rest
                if len(line) > LINE_MAX:
                    line, over = line[:LINE_MAX], True
        if (line or over) and not self.full:
            self._bytes(line, over)

    def _bytes(self, raw: bytes, over: bool) -> None:
        if not raw:   # an empty line (a run of carriage returns is many): counted, nothing to read
            self.number += 1
            return
        if over or len(raw) > LINE_MAX:
            raw, self.cut = raw[:LINE_MAX], self.cut + 1
        self.feed(raw.decode("utf-8", errors="replace"))

    def notes(self) -> list[str]:
        """What was left unread, in words (none when everything was read)."""
        out = []
        if self.cut:
            out.append(f"{self.cut} line{'s' if self.cut > 1 else ''} longer than {LINE_MAX // 1024} KiB "
                       "read only to that length")
        if self.full:
            out.append(f"the logs hold more than {MESSAGES_MAX} NCCL messages: only the first {MESSAGES_MAX} were read "
                       f"(to line {self.number})")
        return out

    def _line(self, raw: str) -> None:
        number = self.number
        clean = _STAMP.sub(" ", printable(without_sequences(raw), keep="\t"))
        if self.version is None and (v := _VERSION.search(clean)):
            self.version = f"{v.group('lib')} {v.group('v')}"
        if "NCCL" in clean:
            heads = list(_HEAD.finditer(clean))
            for i, head in enumerate(heads):
                end = heads[i + 1].start() if i + 1 < len(heads) else len(clean)
                # a log kept as JSON strings ({"log": "...\\n"}) ends each message at its escaped newline
                msg = clean[head.end():end].split("\\n", 1)[0].strip().rstrip("|").strip()
                self._add(head.group("host"), head.group("pid"), head.group("level"), msg, number)
            if heads:
                return
            if bare := _BARE.match(clean):
                self._add(NO_HOST, "", bare.group("level"), bare.group("msg").strip(), number)
                return
        if _STRIPPED.match(stripped := clean.strip()):
            self._add(NO_HOST, "", "INFO", stripped, number)

    def _add(self, host: str, pid: str, level: str, msg: str, number: int) -> None:
        if len(self.lines) >= MESSAGES_MAX:
            self.full = True
            return
        self.lines.append(Line(sys.intern(host), sys.intern(pid), sys.intern(level), msg, number))


# A host name as NCCL prints it (gethostname(), cut at the first "."; or redacted "<cluster_name>").
_HOST_NAME = re.compile(r"[A-Za-z0-9][\w.-]*|<[\w.-]+>")
#: The most characters of program output glued before a host name that :func:`unglue` takes off.
GLUE_MAX = 32


def unglue(lines: list[Line]) -> list[Line]:
    """``lines`` with a program's output glued before a host name taken off it. A program that
    prints with no newline before NCCL's line turns ``nid001049:12345:12345 [0] NCCL INFO`` into
    ``-1nid001049:12345:12345 [0] NCCL INFO``: the host is ``nid001049`` where its process's other
    lines name it (the same pid under a name that ends the glued one), or where the glued name
    could not be a host's (it starts with ``-``, holds ``=``) and ends with one of the log's hosts
    (at most :data:`GLUE_MAX` characters taken off; the first :data:`GLUE_NAMES` such names are
    looked at). Linear in the number of lines."""
    shortest: dict[str, str] = {}  # pid -> the shortest host name its lines show
    for ln in lines:
        if ln.host != NO_HOST and ln.pid and len(ln.host) < len(shortest.get(ln.pid, ln.host + "?")):
            shortest[ln.pid] = ln.host
    hosts = {ln.host for ln in lines if _HOST_NAME.fullmatch(ln.host)}
    lengths = sorted({len(h) for h in hosts})
    fixed: dict[tuple[str, str], str] = {}
    searched: dict[str, str] = {}  # a name that is not a host's -> the host that ends it (or itself)
    out = []
    for ln in lines:
        key = (ln.host, ln.pid)
        if key not in fixed:
            short = shortest.get(ln.pid, ln.host)
            if short != ln.host and ln.host.endswith(short) and len(ln.host) - len(short) <= GLUE_MAX:
                fixed[key] = short
            elif ln.host in hosts or ln.host == NO_HOST:
                fixed[key] = ln.host
            else:
                if ln.host not in searched and len(searched) < GLUE_NAMES:
                    searched[ln.host] = _ending_host(ln.host, hosts, lengths)
                fixed[key] = searched.get(ln.host, ln.host)
        out.append(ln if fixed[key] == ln.host else Line(fixed[key], ln.pid, ln.level, ln.msg, ln.lineno))
    return out


#: The most names that are not host names :func:`unglue` looks into (each costs a few look-ups).
GLUE_NAMES = 4096


def _ending_host(name: str, hosts: set[str], lengths: list[int]) -> str:
    """The host of ``hosts`` (whose name lengths are ``lengths``) that ends ``name`` after at most
    :data:`GLUE_MAX` other characters, the longest such; else ``name``."""
    for length in reversed(lengths):
        if 0 < len(name) - length <= GLUE_MAX and name[-length:] in hosts:
            return name[-length:]
    return name


def parse(text: str) -> tuple[list[Line], str | None]:
    """The NCCL messages of a log, and the NCCL/RCCL version it states (None when it does not);
    within :class:`Reader`'s bounds."""
    reader = Reader()
    reader.feed(text)
    return reader.lines, reader.version


def read_files(paths: Iterable[str], unreadable: list[str] | None = None) -> Reader:
    """The logs ``paths`` name, read together as one run's (:class:`Reader`). Only regular files
    are read (:func:`open_regular`: a FIFO would block, a device never end). A file that cannot be
    read raises OSError naming it, or, with ``unreadable``, is added to that list and left out."""
    reader = Reader()
    for path in paths:
        if reader.full:
            break
        try:
            with open_regular(path) as handle:
                reader.read_file(handle)
        except OSError as exc:
            if unreadable is None:
                raise OSError(exc.errno, exc.strerror or str(exc), path) from None
            unreadable.append(path)
    return reader


def open_regular(path: str) -> BinaryIO:
    """``path`` opened for reading in binary if it is a regular file; OSError otherwise. The open
    does not wait (O_NONBLOCK: a FIFO's open would wait for a writer), and the kind is checked on
    what was opened, not on the name."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb", buffering=SKIP_PIECE)
    except BaseException:
        os.close(fd)
        raise
