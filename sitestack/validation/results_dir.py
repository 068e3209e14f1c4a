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
#: The results directory's check, a bash function: ``sitestack_results_check DIR`` makes DIR (and
#: the directories above it it must make) private to the user whatever the umask, writes
#: and removes a file there, and reads its free space (df -Pk); where one fails it prints one line
#: naming DIR and the cause (the error's last part: "Read-only file system", "Permission denied")
#: and exits OUT_REFUSED. The batch script runs it on OUT before anything else; :func:`results_check`
#: runs it on the directory `invoke validate` puts the job's log in.
RESULTS_CHECK = f"""sitestack_results_check() {{
  local why free
  why=$( (umask 077 && mkdir -p -- "$1") 2>&1) || {{ echo "sitestack: results directory $1 cannot be made: ${{why##*: }}" >&2; exit {OUT_REFUSED}; }}
  if ! why=$( {{ echo probe >"$1/.sitestack-write-probe.$$"; }} 2>&1 ); then
    echo "sitestack: results directory $1 is not writable: ${{why##*: }}" >&2; exit {OUT_REFUSED}
  fi
  rm -f -- "$1/.sitestack-write-probe.$$"
  free=$(df -Pk -- "$1" 2>/dev/null | awk 'NR == 2 {{ print $4 }}')
  if [[ $free =~ ^[0-9]+$ ]] && [ "$free" -lt {RESULT_SPACE_MIB * 1024} ]; then
    echo "sitestack: results directory $1 has only $free KiB free (a result needs {RESULT_SPACE_MIB} MiB)" >&2; exit {OUT_REFUSED}
  fi
}}"""


def results_check(directory: str) -> list[str]:
    """The argv that checks ``directory`` as the job checks its results directory (:data:`RESULTS_CHECK`):
    exit 0, or :data:`OUT_REFUSED` with the one line on stderr."""
    return ["bash", "-c", RESULTS_CHECK + '\nsitestack_results_check "$1"', "sitestack", directory]
