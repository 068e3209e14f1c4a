"""Slurm's time values (``--time``, a partition's ``MaxTime``): their forms and their length."""

from __future__ import annotations

#: Slurm's --time forms (sbatch(1)): MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS.
SLURM_TIME = r"\d+(:\d+){0,2}|\d+-\d+(:\d+){0,2}"
SLURM_TIME_DOC = "a Slurm time (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS)"


def slurm_seconds(text: str) -> int:
    """Slurm's --time (``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``) in seconds."""
    days, _, rest = text.strip().rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    if days:
        parts += [0] * (3 - len(parts))
        hours, minutes, seconds = parts
    elif len(parts) == 3:
        hours, minutes, seconds = parts
    else:
        hours, minutes, seconds = 0, parts[0], parts[1] if len(parts) > 1 else 0
    return ((int(days or 0) * 24 + hours) * 60 + minutes) * 60 + seconds


def slurm_time(seconds: int) -> str:
    """``seconds`` as Slurm's ``HH:MM:SS``, or ``D-HH:MM:SS`` from a day on."""
    days, rest = divmod(max(0, int(seconds)), 86400)
    text = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{text}" if days else text
