"""Generations of a published path: made beside it, switched in, retired, then collected.

``<parent>/<leaf>`` (a stack environment, a recipe install) is a symlink to a hidden sibling, its
current *generation* (``.<leaf>.gen-TOKEN``, ``.<leaf>.tree-TOKEN``). A change never writes into a
generation that was published: it makes a new one and switches the link with one rename
(:mod:`sitestack.core.swap`). The generation switched out is *retired*, not deleted, because a
job that loaded it keeps reading it until it ends (Spack and Nix keep installs immutable for the
same reason). A retired generation is collected (removed) by a later run or ``invoke gc`` once

- no process on the host uses it (its files mapped or open, its directories a cwd, its path in a
  command line or environment: :data:`IN_USE_SCRIPT`; a process started from a stack holds its
  generation open, :mod:`sitestack.onsite.generation_pin`), and
- the longest job the scheduler allows has passed since the switch (:func:`grace_seconds`:
  ``facts.scheduler.max_job_time``, else the largest partition MaxTime of ``scontrol show
  partition``), so a job on a compute node, which this host cannot see, has ended.

The record ``<parent>/.<leaf>.generations.json`` lists every generation the path had: name,
when it was made and switched out, its digest and what changed. Which one is current is read
from the link itself, never from the record, so a run killed between writing the record and the
switch leaves a true answer. :func:`rollback` switches back to the newest retired generation
still on disk (itself undoable: the one it left becomes that).
"""

from __future__ import annotations

import json
import math
import os
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace

from sitestack.core.errors import SitestackError
from sitestack.core.host import Host
from sitestack.core.swap import swap_argv
from sitestack.model.site import Facts
from sitestack.model.slurmtime import slurm_seconds

RECORD_FORMAT = 1

#: Prints the pid and command of each process that uses one of the paths given: its exe, cwd or
#: root, a mapped or open file, or the path in its command line or environment (a shell that loaded
#: the stack's module has it on PATH). Each path is matched as given and as resolved (``readlink -f``:
#: /proc shows resolved paths, so a prefix given through a link, or with ``//`` or ``/./``, still finds
#: its users). The probe's own process and its ancestors (the SSH or sudo shell that started it,
#: whose command line holds the paths) are left out by pid, never by what a command line says.
#: Processes of other users are seen only by root (procfs' ptrace access check): the caller says so.
IN_USE_SCRIPT = r"""
tab=$(printf '\t') self=" " p=$$
while [ "${p:-0}" -gt 1 ] 2>/dev/null; do
  self="$self$p "; p=$(sed -n 's/^PPid:[[:space:]]*//p' "/proc/$p/status" 2>/dev/null)
done
pairs=""
for p; do r=$(readlink -f -- "$p" 2>/dev/null); pairs="$pairs$p$tab${r:-$p}
"; done
for proc in /proc/[0-9]*; do
  pid=${proc#/proc/}
  case $self in *" $pid "*) continue ;; esac
  cmd=$(tr '\0' '\n' <"$proc/cmdline" 2>/dev/null) || continue
  blob=$( { readlink "$proc/exe" "$proc/cwd" "$proc/root"; ls -l "$proc/fd" | sed -n 's/.* -> //p'
            cat "$proc/maps"; tr '\0' '\n' <"$proc/environ"; } 2>/dev/null)
  while IFS=$tab read -r p r; do
    [ -n "$p" ] || continue
    case "$cmd
$blob" in *"$p"*|*"$r"*)
      printf 'USE\t%s\t%s\t%s\n' "$p" "$pid" "$(printf '%s' "$cmd" | tr '\n' ' ' | cut -c1-120)" ;;
    esac
  done <<EOF
$pairs
EOF
done
exit 0
"""


@dataclass(frozen=True)
class Generation:
    """One generation of a path, as the record has it."""

    name: str                        # the sibling's name, e.g. .2.13.0-cpu.gen-5d5e98f1
    created: float                   # epoch seconds
    digest: str = ""                 # what identifies its content (a stack's plan digest, an install's digest)
    change: str = ""                 # why it was made ("torch==2.13.0: extras changed: +rich")
    retired: float | None = None     # when it was switched out; None while current or never switched out
    promoted: str = ""               # when and why it became its module directory's default (engine/promotion.py)
    pending: bool = False            # built beside the current one, switched in only once its validation passed

    def when(self, at: float | None) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at)) if at else "-"


@dataclass(frozen=True)
class History:
    """The generations of ``<parent>/<leaf>`` (oldest first) and the one the link points at now."""

    parent: str
    leaf: str
    generations: tuple[Generation, ...] = ()
    current: str | None = None       # the link's target (a name in parent), read from the link
    on_disk: frozenset[str] = field(default_factory=frozenset)

    @property
    def record(self) -> str:
        return record_path(self.parent, self.leaf)

    def find(self, name: str) -> Generation | None:
        return next((g for g in self.generations if g.name == name), None)

    def retired(self) -> list[Generation]:
        """Generations switched out and still on disk, newest switch first (a pending one never was)."""
        out = [g for g in self.generations if g.name != self.current and g.name in self.on_disk and not g.pending]
        return sorted(out, key=lambda g: g.retired or g.created, reverse=True)

    def pending(self) -> Generation | None:
        """The newest generation on disk that waits for its validation before it is switched in."""
        waiting = [g for g in self.generations if g.pending and g.name in self.on_disk and g.name != self.current]
        return max(waiting, key=lambda g: g.created) if waiting else None

    def switched(self, new: Generation, now: float) -> History:
        """The history once the link points at ``new``: the current one retired at ``now``."""
        gens = [replace(g, retired=now) if g.name == self.current else g for g in self.generations
                if g.name != new.name]
        return replace(self, generations=(*gens, replace(new, retired=None, pending=False)), current=new.name,
                       on_disk=self.on_disk | {new.name})

    def parked(self, new: Generation, now: float) -> History:
        """The history once ``new`` waits beside the current generation (the link unchanged); a generation
        that waited before it is retired at ``now`` (only validation jobs ever ran on it)."""
        gens = [replace(g, pending=False, retired=now) if g.pending else g for g in self.generations
                if g.name != new.name]
        return replace(self, generations=(*gens, replace(new, retired=None, pending=True)),
                       on_disk=self.on_disk | {new.name})

    def to_json(self) -> str:
        data = {"format": RECORD_FORMAT, "path": f"{self.parent}/{self.leaf}",
                "generations": [{k: v for k, v in asdict(g).items() if k not in ("promoted", "pending") or v}
                                for g in self.generations]}
        return json.dumps(data, indent=2, sort_keys=True) + "\n"


def record_path(parent: str, leaf: str) -> str:
    return f"{parent}/.{leaf}.generations.json"


#: How far in the future a record's time may be (another host's clock, NTP not yet settled):
#: later is not a time this tool wrote, and the generation is kept as if just switched out.
CLOCK_SKEW = 300.0


def _when(value: object, now: float) -> float | None:
    """A record's epoch time: a finite number not later than ``now`` + :data:`CLOCK_SKEW`, else None
    (``NaN`` or ``-inf`` would read as long past and let a generation in use go)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and 0 <= value <= now + CLOCK_SKEW else None


def _entries(data: object, now: float) -> list[Generation]:
    """The record's generations; a malformed entry is left out (the link and the disk still tell the truth).
    A ``retired`` that is not a time (:func:`_when`) reads as ``now``: kept its full grace."""
    gens = data.get("generations") if isinstance(data, dict) else None
    out: list[Generation] = []
    for item in gens if isinstance(gens, list) else []:
        name = item.get("name") if isinstance(item, dict) else None
        if not isinstance(name, str) or "/" in name or name in ("", ".", ".."):
            continue
        retired = None if item.get("retired") is None else (_when(item["retired"], now) or now)
        out.append(Generation(name, _when(item.get("created"), now) or 0.0, str(item.get("digest") or ""),
                              str(item.get("change") or ""), retired, str(item.get("promoted") or "")[:500],
                              item.get("pending") is True))
    return out


#: Prints the link's target and the generations on disk: directories of the generations' names, never a
#: link of such a name (a "generation" that points out of the prefix is none the tool made: rollback and gc
#: leave it alone).
LIST_SCRIPT = r"""
cd -- "$1" 2>/dev/null || exit 0
[ -L "$2" ] && printf 'CURRENT\t%s\n' "$(readlink -- "$2")"
for d in ."$2".gen-* ."$2".tree-*; do [ -d "$d" ] && [ ! -L "$d" ] && printf 'DIR\t%s\n' "$d"; done
exit 0
"""


def read_history(host: Host, path: str) -> History:
    """The generations of ``path`` (a link to a sibling): the record, the link and what is on disk."""
    parent, leaf = os.path.split(path.rstrip("/"))
    # strict: a record read as missing would make every retired generation look never published
    data = host.read_json(record_path(parent, leaf), strict=True)
    out = host.probe(["sh", "-c", LIST_SCRIPT, "sitestack", parent, leaf])
    current, dirs = None, set()
    for line in out.stdout.splitlines():
        kind, _, value = line.partition("\t")
        if kind == "CURRENT" and "/" not in value:
            current = value
        elif kind == "DIR":
            dirs.add(value)
    gens = _entries(data, time.time())
    known = {g.name for g in gens}
    # a generation made before the record existed (or by a run killed before writing it)
    gens += [Generation(name, 0.0, change="(not recorded)") for name in sorted(dirs - known) if name == current]
    return History(parent, leaf, tuple(gens), current, frozenset(dirs))


def switch(host: Host, history: History, new: Generation, now: float | None = None) -> History:
    """Record ``new`` and retire the current generation, then point the link at ``new`` (one rename).

    The record is written first: killed before the rename, it names a generation the link does not
    point at, which :func:`read_history` reads as not current (and a later run removes, never
    having been published)."""
    after = history.switched(new, time.time() if now is None else now)
    host.write_text(history.record, after.to_json(), 0o644)
    host.run(swap_argv(history.parent, history.leaf, new.name, secrets.token_hex(4)))
    return after


def park(host: Host, history: History, new: Generation, now: float | None = None) -> History:
    """Record ``new`` as pending beside the current generation; the link is not touched (:func:`switch`
    switches it in once its validation passed: sitestack.engine.generation_promotion)."""
    after = history.parked(new, time.time() if now is None else now)
    host.write_text(history.record, after.to_json(), 0o644)
    return after


#: Removes what killed runs left beside ``<parent>/<leaf>`` ($1, $2): generations (``.<leaf>.gen-*``,
#: ``.<leaf>.tree-*``) that the link does not point at and the record does not name ($3...), so were never
#: published; half-made links (``.link-*``) and trees moved aside (``.old-*``). A generation whose
#: ``root`` is mounted (a packed env's squashfuse image) is left to its user. Best effort: what cannot
#: be removed now is tried again by the next run.
STALE_SCRIPT = r"""
parent=$1 leaf=$2; shift 2
cur=""; [ -L "$parent/$leaf" ] && cur=$(readlink "$parent/$leaf")
for d in "$parent"/."$leaf".gen-* "$parent"/."$leaf".tree-* "$parent"/."$leaf".link-* "$parent"/."$leaf".old-*; do
  [ -e "$d" ] || [ -L "$d" ] || continue
  name=$(basename "$d")
  [ "$name" = "$cur" ] && continue
  for k in "$@"; do [ "$name" = "$k" ] && continue 2; done
  mountpoint -q "$d/root" 2>/dev/null && continue
  rm -rf -- "$d" 2>/dev/null || true
done
exit 0
"""


def clean_stale(host: Host, history: History) -> None:
    """Remove what killed runs left beside the path of ``history`` (:data:`STALE_SCRIPT`), before a new
    generation is made: every generation the record names stays, retired ones included."""
    host.run(["bash", "-c", STALE_SCRIPT, "sitestack", history.parent, history.leaf,
              *sorted(g.name for g in history.generations)])


# -- when a retired generation may go --------------------------------------------------------------------
PARTITIONS_SCRIPT = "scontrol show partition -o 2>/dev/null | tr ' ' '\\n' | sed -n 's/^MaxTime=//p'"


def grace_seconds(host: Host, facts: Facts) -> tuple[int | None, str]:
    """How long a retired generation is kept after its switch, and where that comes from. None: for
    ever (a partition without a time limit, and no ``facts.scheduler.max_job_time`` to bound it)."""
    sched = facts.scheduler
    if sched.max_job_time:
        return slurm_seconds(sched.max_job_time), f"facts.scheduler.max_job_time {sched.max_job_time}"
    if sched.kind != "slurm":
        return 0, "no scheduler: only the processes on this host can use it"
    out = host.probe(["sh", "-c", PARTITIONS_SCRIPT])
    limits = [v.strip() for v in out.stdout.split() if v.strip()]
    if not out.ok or not limits:
        # a login node's scontrol may fail for a while; jobs may still run: never a reason to delete
        return None, "the scheduler did not answer (scontrol show partition); set facts.scheduler.max_job_time"
    if any(v.upper() in ("UNLIMITED", "INFINITE") for v in limits):
        return None, "a partition has MaxTime=UNLIMITED; set facts.scheduler.max_job_time to bound it"
    try:
        longest = max(slurm_seconds(v) for v in limits)
    except ValueError:
        return None, f"cannot read the partitions' MaxTime ({', '.join(limits)}); set facts.scheduler.max_job_time"
    return longest, f"the longest partition MaxTime ({longest} s, scontrol show partition)"


def in_use(host: Host, paths: Sequence[str]) -> dict[str, list[str]]:
    """path -> ``pid command`` of the processes on the host that use it."""
    if not paths:
        return {}
    out = host.probe(["sh", "-c", IN_USE_SCRIPT, "sitestack", *paths], timeout=120)
    found: dict[str, list[str]] = {}
    for line in out.stdout.splitlines():
        parts = line.split("\t")
        if parts[0] == "USE" and len(parts) == 4:
            found.setdefault(parts[1], []).append(f"{parts[2]} {parts[3].strip()}")
    return found


@dataclass(frozen=True)
class Verdict:
    """What a collection did (or would do) with one retired generation, and why."""

    path: str
    removed: bool
    why: str


def verdicts(host: Host, history: History, grace: tuple[int | None, str], now: float | None = None,
             users: Mapping[str, list[str]] | None = None) -> list[Verdict]:
    """For each retired generation on disk: may it be removed now, and why (not) — removes nothing.
    ``users``: :func:`in_use` of its generations where the caller asked already (else asked here, for
    those past their grace only)."""
    now = time.time() if now is None else now
    seconds, source = grace
    out: list[Verdict] = []
    due: list[str] = []
    for g in history.retired():
        path = f"{history.parent}/{g.name}"
        retired = g.retired if g.retired is not None else g.created
        if seconds is None:
            out.append(Verdict(path, False, f"kept: {source}"))
        elif now - retired < seconds:
            left = int(seconds - (now - retired))
            out.append(Verdict(path, False, f"kept for {left} s more: jobs may run for {source}"))
        else:
            due.append(path)
    users = in_use(host, due) if users is None else users
    for path in due:
        if users.get(path):
            out.append(Verdict(path, False, f"kept: in use by {'; '.join(users[path][:3])}"))
        else:
            out.append(Verdict(path, True, f"removed: switched out over {source} ago and no process here uses it"))
    return out


def collect(host: Host, history: History, grace: tuple[int | None, str], *, dry_run: bool = False,
            note: Callable[[str], None] | None = None) -> list[Verdict]:
    """Remove the retired generations that :func:`verdicts` allows (``dry_run``: only say which)."""
    found = verdicts(host, history, grace)
    for v in found:
        if v.removed and not dry_run:
            host.run(["rm", "-rf", "--", v.path])
        if note is not None:
            note(f"{v.path}: {v.why if not dry_run or not v.removed else 'would be ' + v.why}")
    return found


def collect_retired(host: Host, history: History, facts: Facts, *, note: Callable[[str], None] | None = None) -> None:
    """After a switch: :func:`collect` the retired generations of ``history`` by the site's grace
    (:func:`grace_seconds`, asked only where there is a retired generation)."""
    if history.retired():
        collect(host, history, grace_seconds(host, facts), note=note)


def rollback(host: Host, path: str) -> tuple[Generation, Generation]:
    """Point ``path`` back at the newest retired generation still on disk; (from, to)."""
    history = read_history(host, path)
    if history.current is None:
        raise SitestackError(f"{path} is not a link to a generation: nothing to roll back")
    previous = history.retired()
    if not previous:
        raise SitestackError(f"{path}: no earlier generation is left on disk to roll back to "
                             f"(see `invoke generations`)")
    leaving = history.find(history.current) or Generation(history.current, 0.0)
    switch(host, history, previous[0])
    return leaving, previous[0]
