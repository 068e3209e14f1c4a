#!/usr/bin/env python3
"""bind_rank: pin this rank to its share of the node's CPUs, then run COMMAND in its place.

    bind_rank.py [--cpu-masks MASKS] [--cores-per-rank N] COMMAND [ARG...]

A launcher that starts one agent per node and lets the agent fork the ranks (torchrun) binds no rank:
every rank inherits the agent's CPU set. Run as the agent's "training script", this program gives the
rank of ``LOCAL_RANK`` (of ``LOCAL_WORLD_SIZE``, both set by torchrun) the CPUs srun would have given
the task of that local rank, then ``exec``s COMMAND (searched on PATH), so the rank keeps its pid:

- ``--cpu-masks 0xfe,0xfe00,...``: the mask of its local rank (srun ``--cpu-bind=mask_cpu``);
- ``--cores-per-rank N``: the N CPUs of its block of the agent's CPUs (srun ``-c N --cpu-bind=cores``);
- neither: the agent's CPUs shared out in equal blocks, at least one each (srun's block distribution).

The agent's CPUs are what ``sched_getaffinity`` says (srun gives the agent ``--cpus-per-task`` = the
node's CPUs). A rank that cannot be bound says so on stderr and runs unbound: the affinity check then
names its CPUs. Without ``LOCAL_RANK`` (no launcher) it binds nothing. A bad argument is one line
naming it, exit 2. Standard library only, one file: the launch helpers install it as
``sitestack-bind-rank`` and the validation job ships it beside ``ddp_check.py``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

USAGE = "usage: bind_rank.py [--cpu-masks MASKS] [--cores-per-rank N] COMMAND [ARG...]"


def parse_mask(text: str) -> set[int]:
    """The CPUs of one hex mask (``0xfe``, ``fe``, or Linux's comma-grouped ``00ff,fe000000``)."""
    digits = text.strip().lower()
    digits = (digits[2:] if digits.startswith("0x") else digits).replace(",", "")
    if not digits or any(c not in "0123456789abcdef" for c in digits):
        raise ValueError(f"not a hex CPU mask: {text!r}")
    value = int(digits, 16)
    return {bit for bit in range(value.bit_length()) if value >> bit & 1}


def parse_masks(text: str) -> list[set[int]]:
    """The CPU sets of a ``mask_cpu`` list, one per local rank (``0xfe,0xfe00``)."""
    return [parse_mask(part) for part in text.split(",") if part.strip()]


def rank_cpus(local: int, local_size: int, allowed: set[int], masks: list[set[int]] | None = None,
              cores_per_rank: int = 0) -> set[int]:
    """The CPUs of local rank ``local`` (of ``local_size``) given the agent's ``allowed`` CPUs: its mask,
    else its block of ``cores_per_rank`` (or of an equal share) of the sorted CPUs; a block past the
    end wraps round (more ranks than CPUs share them, as srun's cyclic overcommit does)."""
    if masks is not None:
        if local >= len(masks):
            raise ValueError(f"--cpu-masks lists {len(masks)} masks, local rank {local} has none")
        return set(masks[local])
    cpus = sorted(allowed)
    if not cpus:
        raise ValueError("the agent has no CPUs")
    per = cores_per_rank or max(1, len(cpus) // max(1, local_size))
    start = (local * per) % len(cpus)
    return set((cpus + cpus)[start:start + min(per, len(cpus))])


def parse_args(argv: Sequence[str]) -> tuple[list[set[int]] | None, int, list[str]]:
    """(masks or None, cores per rank, command); ValueError naming a bad argument."""
    masks: list[set[int]] | None = None
    cores, i = 0, 0
    while i < len(argv) and argv[i] in ("--cpu-masks", "--cores-per-rank"):
        if i + 1 >= len(argv):
            raise ValueError(f"{argv[i]} needs a value")
        if argv[i] == "--cpu-masks":
            masks = parse_masks(argv[i + 1])
        elif not argv[i + 1].isdigit() or int(argv[i + 1]) < 1:
            raise ValueError(f"--cores-per-rank: {argv[i + 1]!r} is not a whole number >= 1")
        else:
            cores = int(argv[i + 1])
        i += 2
    if i < len(argv) and argv[i] == "--":
        i += 1
    if i >= len(argv):
        raise ValueError("no COMMAND to run")
    return masks, cores, list(argv[i:])


def bind(env: Mapping[str, str], masks: list[set[int]] | None, cores: int) -> str | None:
    """Pin this process as ``env``'s LOCAL_RANK; a line for stderr where it was not pinned, else None."""
    local, size = env.get("LOCAL_RANK", ""), env.get("LOCAL_WORLD_SIZE", "1")
    if not local.isdigit() or not size.isdigit():
        return None if not local else f"LOCAL_RANK={local!r}: not bound"
    try:
        want = rank_cpus(int(local), int(size), os.sched_getaffinity(0), masks, cores)
        os.sched_setaffinity(0, want)
    except (ValueError, OSError) as exc:
        return f"local rank {local} not bound: {exc}"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    try:
        masks, cores, command = parse_args(sys.argv[1:] if argv is None else argv)
    except ValueError as exc:
        print(f"bind_rank: {exc} ({USAGE})", file=sys.stderr)
        return 2
    problem = bind(os.environ, masks, cores)
    if problem:
        print("bind_rank: " + problem, file=sys.stderr)
    sys.stdout.flush()
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"bind_rank: cannot run {command[0]}: {exc}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main())
