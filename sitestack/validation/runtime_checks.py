"""The checks the shipped shell programs make of what they read when a job runs.

The launch helper, the run scripts of a container site, the stage helper and the batch scripts read
Slurm's, the MPI launchers' and the user's variables (``SLURM_JOB_ID``, ``SLURM_CPUS_ON_NODE``,
``PMI_RANK``, ``SITESTACK_RANKS_PER_NODE``, ...). bash evaluates the text of a variable inside
``$(( ))`` (and ``[[ -eq ]]``) as an expression, array subscripts included, so
``SLURM_JOB_ID='a[$(touch X)]'`` would run ``touch X``. Every such value is checked for its form
first, with ``case`` (which never evaluates anything), and a bad one stops the program with one
message naming the variable. These are POSIX sh functions, the same in bash (also as ``sh``),
dash and zsh; each program embeds the ones it needs (no file to find at run time).

- :data:`NUMBER` -- ``_sitestack_number PROG NAME VALUE MIN MAX``: VALUE is digits only, no sign,
  no leading zero (``010`` is octal in shell arithmetic), at most 10 digits, from MIN to MAX; an
  empty VALUE is a variable that is not set, which the caller's default replaces (Slurm never sets
  an empty one).
- :data:`WORD` -- ``_sitestack_word PROG NAME VALUE``: a user or generation name that becomes part
  of a path: letters, digits and ``._@+-``, not empty, not starting with ``.`` or ``-``.
- :data:`PRIVATE_DIR` -- ``_sitestack_private_dir PROG DIR``: per-job scratch (the MIOpen cache, the
  staged env) is at a name every task of the job can compute, so another user can compute it too
  and make it first (a directory open to all, or a symbolic link elsewhere). The directory is made
  with ``mkdir -m 700`` (which fails where anything is there) and then must be a directory, not a
  symbolic link, owned by this user, mode 0700 and nothing more (``ls -ld``: no ACL ``+``); one of
  this user's that no one else can write to (an earlier version's 0755) is made 0700. The directory
  it is in must not let anyone else rename or replace it: with every symbolic link resolved
  (``cd -P``), it is this user's or root's and writable by no one else unless it is sticky (``/tmp``);
  a symbolic link naming it is this user's or root's (a scratch parent made with ``mkdir -p``, such as
  Frontier's ``/mnt/bb/$USER``, may be another user's link to a directory open to all). Otherwise
  one message names it and nothing is written there. Every task may call it: the first
  makes it, the others find it theirs (mkdir is atomic), so no task waits for another.
- :data:`REMOVE_OWN` -- ``_sitestack_remove_own DIR``: removes DIR only where it is this user's
  directory and not a symbolic link (a job's clean-up never touches what another user planted).
"""

from __future__ import annotations

#: The largest job id (Slurm's are 32-bit), rank, task or CPU count a check accepts.
MAX_ID = 4294967295
#: The largest node, task-per-node or CPU count: far above any machine's (Frontier: 9,408 nodes of
#: 64 cores, https://docs.olcf.ornl.gov/systems/frontier_user_guide.html), and small enough that the
#: products the scripts compute (nodes x tasks) stay far from 64-bit overflow.
MAX_COUNT = 1000000

NUMBER = """\
# _sitestack_number PROG NAME VALUE MIN MAX: VALUE (of variable NAME) is a whole number from MIN to MAX,
# checked with case before any arithmetic sees it; empty is unset (the caller's default applies).
_sitestack_number() {
  case $3 in
    '') return 0 ;;
    *[!0-9]*|0?*|???????????*) ;;
    *) [ "$3" -ge "$4" ] && [ "$3" -le "$5" ] && return 0 ;;
  esac
  echo "$1: $2 must be a whole number from $4 to $5 (digits only)" >&2
  return 1
}"""

WORD = """\
# _sitestack_word PROG NAME VALUE: VALUE (of variable NAME) is a name that can be part of a path.
_sitestack_word() {
  case $3 in
    ''|[.-]*|*[!A-Za-z0-9._@+-]*) echo "$1: $2 must be a name of letters, digits and ._@+- (and set)" >&2; return 1 ;;
  esac
}"""

PRIVATE_DIR = """\
# _sitestack_private_dir PROG DIR: DIR is made private (mkdir -m 700), or is already this user's own
# private directory; a directory of anyone else's, one open to others, or a symbolic link is refused.
# So is DIR where the directory it is in could let another user rename or replace it: that directory
# (every symbolic link resolved, cd -P) must be this user's or root's, and writable by no one else
# unless it has the sticky bit (/tmp); a symbolic link to it must be this user's or root's too.
_sitestack_private_dir() {
  case $2 in */*) _sitestack_up=${2%/*} ;; *) _sitestack_up=. ;; esac
  _sitestack_up=${_sitestack_up:-/}
  _sitestack_real=$(cd -P -- "$_sitestack_up" 2>/dev/null && pwd -P) || _sitestack_real=
  _sitestack_me=$(id -u)
  _sitestack_bad=
  # "MODE UID" of the directory named (of the link itself, where it is one), then of the real one, whose
  # mode is checked below (a group's or others' w without the t of a sticky directory)
  for _sitestack_d in "$(ls -ldn -- "$_sitestack_up" 2>/dev/null | { read -r m n u r && echo "$m $u"; })" \\
      "$(ls -ldn -- "${_sitestack_real:-/nonexistent/}" 2>/dev/null | { read -r m n u r && echo "$m $u"; })"; do
    case ${_sitestack_d#* } in 0|"$_sitestack_me") ;; *) _sitestack_bad=1 ;; esac
  done
  case $_sitestack_d in
    d????w*|d???????w*) case $_sitestack_d in d????????[tT]*) ;; *) _sitestack_bad=1 ;; esac ;;
    d*) ;;
    *) _sitestack_bad=1 ;;
  esac
  if [ -n "$_sitestack_bad" ]; then
    echo "$1: refusing $2: the directory it is in, $_sitestack_up (${_sitestack_real:-missing}), is not this user's or root's, or others can write to it (no sticky bit): another user could replace $2" >&2
    unset _sitestack_up _sitestack_real _sitestack_me _sitestack_bad _sitestack_d
    return 1
  fi
  unset _sitestack_up _sitestack_real _sitestack_me _sitestack_bad _sitestack_d
  mkdir -m 700 -- "$2" 2>/dev/null
  if [ -d "$2" ] && [ ! -h "$2" ] && [ -O "$2" ]; then
    case $(ls -ld -- "$2" 2>/dev/null) in
      'drwx------ '*|'drwx------. '*) return 0 ;;
      # this user's, which no one else could write to (an earlier run's, made 0755): made private
      'drwx'?-??-?' '*|'drwx'?-??-?'. '*) chmod 700 -- "$2" && return 0 ;;
    esac
  fi
  echo "$1: refusing $2: not a directory of this user's with mode 0700 (another user's, open to others, or a symbolic link); remove it or ask its owner to" >&2
  return 1
}"""

REMOVE_OWN = """\
# _sitestack_remove_own DIR: remove DIR where it is this user's directory (never through a symbolic link).
_sitestack_remove_own() {
  if [ -d "$1" ] && [ ! -h "$1" ] && [ -O "$1" ]; then rm -rf -- "$1"; fi
}"""


def functions(*names: str) -> str:
    """The text of the named checks (``number``, ``word``, ``private_dir``, ``remove_own``), one after
    the other, for a program to embed."""
    table = {"number": NUMBER, "word": WORD, "private_dir": PRIVATE_DIR, "remove_own": REMOVE_OWN}
    return "\n".join(table[name] for name in names)


def script(names: tuple[str, ...], *lines: str) -> str:
    """A script for ``sh -c`` (run by one task per node): the named checks without their comments,
    then ``lines``."""
    text = functions(*names).splitlines()
    return "\n".join([line for line in text if not line.lstrip().startswith("#")] + list(lines))


def job_context() -> dict[str, str | int]:
    """The template variables of the validation job's checks: the functions it embeds, the bounds, and
    the scripts one task per node runs to make the MIOpen cache private and to remove it."""
    return {
        "checks": functions("number", "word"),
        "max_id": MAX_ID,
        "max_count": MAX_COUNT,
        "miopen_private": script(("private_dir",), 'for d do _sitestack_private_dir "$0" "$d" || exit 1; done'),
        "miopen_remove": script(("remove_own",), 'for d do _sitestack_remove_own "$d"; done'),
    }
