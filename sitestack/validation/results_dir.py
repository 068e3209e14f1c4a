"""The results directory of a validation run, checked before the job starts.

A job whose results directory cannot be made or written, or is full, would run for minutes and leave
no result and no cause (its log may not be writable either). The batch script checks the directory
first, before any module, probe or launcher runs, and `invoke validate` checks the directory it puts
the job's log in before it submits: the same bash function, :data:`RESULTS_CHECK`.
"""

from __future__ import annotations

#: The batch script's exit code when its results directory cannot be made or written, or is full: it
#: ends before any module, probe or launcher runs (the site's module codes are 97 and 98, siteenv).
OUT_REFUSED = 96
#: Free space (MiB) the results directory must have before the job starts. A result is small (the NCCL
#: INIT,NET logs are tens of KiB per rank, the ranks' records and result.json a few KiB per rank, the plot
#: about 100 KiB, the checkpoint of the ddp check under 100 KiB), a few MiB for a thousand ranks; 64 MiB
#: leaves room for that and for the job's log when it shares the file system, and refuses a full one.
RESULT_SPACE_MIB = 64
#: The check of a directory sitestack writes its own files into, a bash function: ``sitestack_dir_check
#: DIR UMASK [WHAT]`` makes DIR (and the directories above it it must make) under UMASK (077: private to the
#: user; 022: readable by all), or, where DIR is there already, takes it only if it is a directory, not a
#: symbolic link, owned by the user, and writable by no one else: a directory another user made, or one
#: others can write, lets them plant links there that a write would follow, or replace what was written
#: (``[ -O ]``: owned by the effective user, bash(1) CONDITIONAL EXPRESSIONS). Where it refuses it prints
#: one line naming DIR (as WHAT, default "results directory") and why and exits OUT_REFUSED.
DIR_CHECK = f"""sitestack_dir_check() {{
  local why mode what="${{3:-results directory}}"
  why=$( (umask "$2" && mkdir -p -- "$1") 2>&1) || {{ echo "sitestack: $what $1 cannot be made: ${{why##*: }}" >&2; exit {OUT_REFUSED}; }}
  if [ -L "${{1%/}}" ]; then
    echo "sitestack: $what $1 is a symbolic link: name the directory itself" >&2; exit {OUT_REFUSED}
  fi
  if [ ! -O "$1" ]; then
    echo "sitestack: $what $1 is owned by another user ($(stat -c %U -- "$1")): choose a directory of your own" >&2; exit {OUT_REFUSED}
  fi
  mode=$(stat -c %a -- "$1")
  if (( 8#$mode & 8#022 )); then
    echo "sitestack: $what $1 is writable by others (mode $mode): chmod go-w it or choose another" >&2; exit {OUT_REFUSED}
  fi
}}"""
#: The results directory's check, a bash function: ``sitestack_results_check DIR`` makes DIR private to
#: the user whatever the umask or checks the one there (:data:`DIR_CHECK`), makes and removes a file
#: there (a new name, mktemp(1), created exclusively: never a link planted there; then a line into it,
#: since an empty file fits on a full file system), and reads its free
#: space (df -Pk); where one fails it prints one line naming DIR and the cause (the error's last part:
#: "Read-only file system", "Permission denied") and exits OUT_REFUSED. The batch script runs it on OUT
#: before anything else; :func:`results_check` runs it on the directory `invoke validate` puts the job's
#: log in.
RESULTS_CHECK = DIR_CHECK + f"""
sitestack_results_check() {{
  local why free probe
  sitestack_dir_check "$1" 077
  if ! why=$(mktemp -- "$1/.sitestack-write-probe.XXXXXXXX" 2>&1); then
    echo "sitestack: results directory $1 is not writable: ${{why##*: }}" >&2; exit {OUT_REFUSED}
  fi
  probe=$why
  if ! why=$( {{ echo probe >>"$probe"; }} 2>&1 ); then
    rm -f -- "$probe"; echo "sitestack: results directory $1 is not writable: ${{why##*: }}" >&2; exit {OUT_REFUSED}
  fi
  rm -f -- "$probe"
  free=$(df -Pk -- "$1" 2>/dev/null | awk 'NR == 2 {{ print $4 }}')
  if [[ $free =~ ^[0-9]+$ ]] && [ "$free" -lt {RESULT_SPACE_MIB * 1024} ]; then
    echo "sitestack: results directory $1 has only $free KiB free (a result needs {RESULT_SPACE_MIB} MiB)" >&2; exit {OUT_REFUSED}
  fi
}}"""


def results_check(directory: str) -> list[str]:
    """The argv that checks ``directory`` as the job checks its results directory (:data:`RESULTS_CHECK`):
    exit 0, or :data:`OUT_REFUSED` with the one line on stderr."""
    return ["bash", "-c", RESULTS_CHECK + '\nsitestack_results_check "$1"', "sitestack", directory]


def dir_check(directory: str, private: bool = True, what: str = "results directory") -> list[str]:
    """The argv that makes ``directory`` (private to the user, or readable by all where not ``private``)
    or checks the one there (:data:`DIR_CHECK`): exit 0, or :data:`OUT_REFUSED` with the one line on
    stderr."""
    return ["bash", "-c", DIR_CHECK + '\nsitestack_dir_check "$1" "$2" "$3"', "sitestack", directory,
            "077" if private else "022", what]
