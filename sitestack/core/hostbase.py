"""The one execution seam (the base class; :mod:`sitestack.core.host` has the local host,
:mod:`sitestack.core.ssh` the SSH one): :class:`Host`, over this machine (``subprocess``) or a
Fabric Connection (SSH).

- ``probe(argv)`` always runs, is quiet and never raises: it returns a :class:`Completed`.
- ``run(argv)`` mutates: refused on a read-only host (check mode), raises
  :class:`~sitestack.core.errors.CommandFailed` on a non-zero exit, and streams its output to a
  log file when given one.
- ``read_text`` / ``write_text`` / ``put_file``: ``write_text`` is atomic (a temporary file
  beside the target, then a rename), locally and remotely.
- ``secrets``: variables for the command's environment that must appear on no command line (an
  index's credentials for pip): locally the process's environment; on another host a file made 0600
  in a private ``mktemp -d`` directory, sourced and removed before the command runs (a probe's
  line, sent on the remote shell's standard input, exports them itself).

Commands are argv lists; they are quoted into a shell line in exactly one place,
:func:`shell_line`.
"""

from __future__ import annotations

import contextlib
import io
import shlex
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import invoke
from invoke.context import Context

from sitestack.core.bounded import read_bounded
from sitestack.core.completed import Completed as Completed  # the outcome of a command: core/completed.py
from sitestack.core.errors import CommandFailed, MutationRefused, SitestackError
from sitestack.core.lock import OWNER_MAX, InvalidOwner, hold
from sitestack.core.private import open_private
from sitestack.core.redact import redact
from sitestack.onsite.fileio import ReadError, parse_json

#: Every command runs with this umask, whatever the admin's is: installed trees get directories
#: 0755 and files 0644 (0755 executables) under umask 000 as under 077 (a shared stack its users
#: cannot read, or anyone can write to, is broken either way). Modes set explicitly stay as set.
UMASK = "022"


#: The umask of a group-writable install (facts.install.mode: group-write): 0775 / 0664.
GROUP_UMASK = "002"

#: The largest record :meth:`Host.read_json` and file :meth:`Host.read_text` read (records are KiB).
RECORD_MAX, TEXT_MAX = 16 << 20, 64 << 20


def with_umask(line: str, umask: str = UMASK) -> str:
    """``line`` run under ``umask`` (:data:`UMASK` unless the site shares its installs with a group)."""
    return f"umask {umask}; {line}"


def shell_line(argv: Sequence[str], env: Mapping[str, str] | None = None, cwd: str | None = None) -> str:
    """The single place where an argv list becomes a shell command line."""
    if not argv:
        raise ValueError("empty argv")
    line = shlex.join(list(argv))
    if env:
        line = shlex.join(["env", *(f"{k}={v}" for k, v in env.items())]) + " " + line
    if cwd:
        line = f"cd {shlex.quote(cwd)} && {line}"
    return line


#: Variables that differ between two runs in the same environment (the shell's own, the SSH
#: connection's source port, the login session): left out of a probe's environment signature.
VOLATILE_ENV = ("_", "PWD", "OLDPWD", "SHLVL", "SSH_CLIENT", "SSH_CONNECTION", "SSH_TTY", "SSH_AUTH_SOCK",
                "XDG_SESSION_ID", "LS_COLORS")

#: Prints what :meth:`Host.file_signature` compares, for a host reached through a shell: the
#: environment's digest and CPUs (:data:`ENV_SCRIPT`, once per connection), then ``+`` or ``-`` per
#: path (exists or not, following symlinks: test builtins, no process) and one ``stat`` for those
#: that exist (a ``stat`` per path was most of a vouched probe's time: ~10 ms for a dozen).
ENV_SCRIPT = (
    'printf "ENV %s\\n" "$(env | LC_ALL=C grep -Ev "^($0)=" | LC_ALL=C sort | cksum)"; '
    'printf "CPUS %s\\n" "$(nproc 2>/dev/null || echo 1)"; '
)
FILES_SCRIPT = (
    'for f; do shift; if [ -e "$f" ]; then set -- "$@" "$f"; echo +; else echo -; fi; done; '
    '[ $# -eq 0 ] || stat -L -c "%i %s %Y %Z" -- "$@" 2>/dev/null'
)


class Host:
    """A machine steps run on. Use :func:`local_host` or :func:`ssh_host` to make one."""

    #: Whether :func:`sitestack.core.probecache.cached_probe` may keep this host's answers (a stand-in
    #: host of the tests answers what it is told: never kept).
    caches_probes = False
    #: Whether steps may run on this host from several threads at once (``provision`` runs independent
    #: steps together only where it is true). Not over SSH: every command there goes through one
    #: persistent shell, which answers one command at a time.
    concurrent_steps = False

    def __init__(self, name: str, context: Context, *, read_only: bool = False) -> None:
        self.name = name
        self.context = context
        self.read_only = read_only
        self.umask = UMASK  # the engine sets GROUP_UMASK for a group-writable site
        #: with ``--verbose`` the engine sets this: each line of run()'s output, redacted, as it arrives
        self.echo: Callable[[str], None] | None = None
        self._identity: tuple[str, str] | None = None

    # -- commands ------------------------------------------------------------------------
    def probe(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
              cwd: str | None = None, timeout: float | None = 60,
              secrets: Mapping[str, str] | None = None) -> Completed:
        """Run a read-only command and return its outcome, whatever its exit code.

        A command that cannot start has rc 127. Raises only :class:`ConnectionLost` when the
        host cannot be reached at all (no answer is better than a wrong one).
        """
        line, extra = self._probe_secrets(shell_line(argv, env, cwd), secrets)
        try:
            result = self._exec(line, hide=True, warn=True, in_stream=False, timeout=timeout, **extra)
        except invoke.exceptions.CommandTimedOut as exc:
            return Completed(124, exc.result.stdout, exc.result.stderr + f"\ntimed out after {timeout}s")
        except (invoke.exceptions.UnexpectedExit, OSError) as exc:  # pragma: no cover - warn=True
            return Completed(127, "", str(exc))
        return Completed(result.return_code, result.stdout, result.stderr)

    def run(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | None = None,
            log: Path | None = None, sudo: bool = False, timeout: float | None = None,
            secrets: Mapping[str, str] | None = None) -> Completed:
        """Run a mutating command; raise CommandFailed on a non-zero exit.

        With ``log``, output is appended to that controller-side file as it arrives and the
        error shows its last lines. ``sudo`` prefixes ``sudo -n`` unless already root.
        """
        self._refuse_if_read_only(f"run {shlex.join(list(argv))}")
        self.changed()
        if sudo and self.user() != "root":
            if secrets:
                raise ValueError("secrets are not passed through sudo")
            # sudo drops the caller's environment: pass it through env(1) behind sudo.
            argv = ["sudo", "-n", "--", "env", *(f"{k}={v}" for k, v in (env or {}).items()), *argv]
            env = None
        with contextlib.ExitStack() as stack:
            line, extra = stack.enter_context(self._run_secrets(shell_line(argv, env, cwd), secrets))
            buffer = io.StringIO()
            handle = None
            if log is not None:
                handle = stack.enter_context(open_private(log))   # logs are the user's alone
                handle.write(f"$ {redact(line)}\n")
                handle.flush()
            tee = _Tee(buffer, handle, self.echo)
            stack.callback(tee.close)
            try:
                result = self._exec(line, hide=True, warn=True, in_stream=False, out_stream=tee,
                                    err_stream=tee, timeout=timeout, **extra)
                rc = result.return_code
            except invoke.exceptions.CommandTimedOut:
                rc = 124
        if rc != 0:
            raise CommandFailed(list(argv), rc, buffer.getvalue(), str(log) if log else None)
        return Completed(rc, buffer.getvalue(), "")

    def _exec(self, line: str, **kwargs: Any) -> Any:
        """Run one shell line through the Context (the only place commands leave the Host)."""
        return self.context.run(with_umask(line, self.umask), **kwargs)

    # -- secrets in a command's environment (never on its command line) ---------------------
    def _probe_secrets(self, line: str, secrets: Mapping[str, str] | None) -> tuple[str, dict[str, Any]]:
        """``line`` exporting ``secrets`` first, and what :meth:`_exec` needs besides. Over SSH a probe's
        line is written to the remote shell's standard input, so no process's arguments show them."""
        if not secrets:
            return line, {}
        return "".join(f"export {k}={shlex.quote(v)}; " for k, v in secrets.items()) + line, {}

    @contextlib.contextmanager
    def _run_secrets(self, line: str, secrets: Mapping[str, str] | None) -> Iterator[tuple[str, dict[str, Any]]]:
        """``line`` taking ``secrets`` from a file made 0600 in a private temporary directory (mktemp
        -d: 0700), sourced and removed before the command starts; the directory is removed afterwards
        whatever happened. A command run over SSH is the remote shell's argument, which ``ps`` shows."""
        if not secrets:
            yield line, {}
            return
        out = self.probe(["mktemp", "-d"])
        tmp = out.stdout.strip()
        if not out.ok or not tmp.startswith("/"):
            raise SitestackError(f"[{self.name}] cannot make a private temporary directory: {out.stderr.strip()}")
        try:
            self.write_text(f"{tmp}/env", "".join(f"export {k}={shlex.quote(v)}\n" for k, v in secrets.items()), 0o600)
            yield f". {shlex.quote(tmp + '/env')} && rm -rf -- {shlex.quote(tmp)} && {line}", {}
        finally:
            self.probe(["rm", "-rf", "--", tmp])

    # -- identity ------------------------------------------------------------------------
    def user(self) -> str:
        return self._ids()[1]

    def home(self) -> str:
        return self._ids()[0]

    def _ids(self) -> tuple[str, str]:
        if self._identity is None:
            out = self.probe(["sh", "-c", 'printf "%s\\n%s\\n" "$HOME" "$(id -un)"'])
            if not out.ok:
                raise SitestackError(f"[{self.name}] cannot read $HOME and user: {out.stderr.strip()}")
            home, user = out.stdout.splitlines()[:2]
            self._identity = (home, user)
        return self._identity

    # -- what a cached probe is vouched by (sitestack.core.probecache) ---------------------
    def cache_identity(self) -> list[str]:
        """Who answers this host's probes: its kind, name, home and user."""
        return [type(self).__name__, self.name, self.home(), self.user()]

    def file_signature(self, paths: Sequence[str]) -> dict[str, Any]:
        """The environment commands get here (a digest) and each path's inode, size, mtime and
        ctime (following symlinks; ``[]`` for a missing one), in one command. The environment is
        read with the first signature only: every command of a connection runs in a subshell of
        the same remote shell (a vouched probe's signature was half environment: four processes)."""
        known: tuple[str, str] | None = self.__dict__.get("_signature_env")
        script = FILES_SCRIPT if known else ENV_SCRIPT + FILES_SCRIPT
        out = self.probe(["sh", "-c", script, "|".join(VOLATILE_ENV), *paths])
        lines = out.stdout.splitlines()
        head, lines = ([], lines) if known else (lines[:2], lines[2:])
        marks, stats = lines[:len(paths)], iter(lines[len(paths):])
        if not out.ok or len(marks) != len(paths) or len(lines) != len(paths) + marks.count("+") or len(head) != (0 if known else 2):
            return {"error": out.rc}  # (a file gone between the test and stat too) matches no stored signature: the probe runs
        env, cpus = known or (head[0].split(" ", 1)[-1], head[1].split(" ", 1)[-1])
        self.__dict__["_signature_env"] = (env, cpus)
        files = [[int(x) for x in next(stats).split()] if mark == "+" else [] for mark in marks]
        return {"env": env, "cpus": cpus, "files": files}

    # -- files -----------------------------------------------------------------------------
    def exists(self, path: str) -> bool:
        return self.probe(["test", "-e", path]).ok

    def read_text(self, path: str) -> str | None:
        """The text of ``path``, or None when it does not exist; a FIFO, device or directory there, or a file
        over :data:`TEXT_MAX`, is a :class:`SitestackError` naming it, never waited on (:func:`read_bounded`)."""
        return read_bounded(self, path, TEXT_MAX, "not a file sitestack wrote; move it aside")

    def read_tail(self, path: str, limit: int = 65536, *, follow: bool = True) -> str | None:
        """The last ``limit`` bytes of ``path`` as text (a job's log may be any size), or None when it
        does not exist; a :class:`SitestackError` when it is not a regular file (a FIFO would block),
        or, unless ``follow``, when it is a symbolic link."""
        out = self.probe(["sh", "-c", 'if [ "$3" = n ] && [ -L "$1" ]; then exit 3; fi; '
                          'if [ -f "$1" ]; then exec tail -c "$2" -- "$1"; elif [ -e "$1" ] || [ -L "$1" ]; '
                          'then exit 3; fi; exit 1', "sitestack", path, str(limit), "y" if follow else "n"])
        if out.rc == 3:
            raise SitestackError(f"[{self.name}] {path} is not a regular file")
        return out.stdout if out.ok else None

    def read_json(self, path: str, *, strict: bool = False) -> dict[str, Any] | None:
        """The JSON object in ``path`` (a record sitestack wrote: a stamp, a manifest, the generations
        record); None when the file is missing. A bad record (not a regular file, a FIFO never waited
        on; over :data:`RECORD_MAX`; not JSON with finite numbers; nested too deeply; not an object:
        :func:`sitestack.onsite.fileio.parse_json`) is one line on standard error naming it and reads
        as missing, or, ``strict`` (where acting on a missing record would do harm), a
        :class:`SitestackError` with that line. The text is kept until this host changes anything
        (:meth:`changed`: another run may have too), so a no-op run over SSH reads each once."""
        memo: dict[str, str | None | SitestackError] = self.__dict__.setdefault("_json_memo", {})
        if path not in memo:
            try:
                memo[path] = read_bounded(self, path, RECORD_MAX, "a record is a few KiB", follow=True)
            except SitestackError as exc:
                memo[path] = exc
        text = memo[path]
        try:
            if isinstance(text, SitestackError):
                raise text
            if text is None:
                return None
            data = parse_json(text, path)
            if not isinstance(data, dict):
                raise SitestackError(f"[{self.name}] {path}: not a JSON object")
            return data
        except (SitestackError, ReadError) as exc:
            line = str(exc) if isinstance(exc, SitestackError) else f"[{self.name}] {exc}"
            if strict:
                raise SitestackError(f"{line}: not a record sitestack wrote; move it aside") from None
            warned: set[str] = self.__dict__.setdefault("_json_warned", set())
            if path not in warned:
                warned.add(path)
                print(f"sitestack: {line}: not a record sitestack wrote, read as missing", file=sys.stderr)
            return None

    def changed(self) -> None:
        """Forget what :meth:`read_json` kept: this host (or, under a new lock, another run) changed files."""
        self.__dict__.pop("_json_memo", None)

    def write_text(self, path: str, text: str, mode: int = 0o644) -> None:
        """Write ``text`` to ``path`` atomically (temp file beside it, then rename)."""
        raise NotImplementedError

    def put_file(self, local: Path, remote: str, mode: int = 0o644) -> None:
        """Copy a controller file to the host, atomically."""
        raise NotImplementedError

    # -- locking ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def lock(self, path: str, *, wait: float = 0, report: Callable[[str], None] | None = None) -> Iterator[None]:
        """Hold the exclusive lock named ``path`` on the host while the block runs.

        One mechanism for every host (:mod:`sitestack.core.lock`: a directory made with mkdir and an
        owner file), so runs on this machine and runs over SSH exclude each other. Waits up to
        ``wait`` seconds, telling ``report`` once who holds it; then raises :class:`LockHeld`.
        """
        self._refuse_if_read_only(f"lock {path}")
        with hold(self, path, wait=wait, report=report):
            self.changed()  # what was read before the lock may have been changed by the run that held it
            yield

    # The lock's file operations (sitestack.core.lock.LockDirs), as shell commands: what works
    # over any Context; LocalHost does them through the OS.
    def lock_acquire(self, path: str, owner: str) -> bool:
        # One command (a no-op run over SSH takes a lock per install): the parent made (a lock file
        # of an older sitestack, flock, where the lock directory goes is replaced), the directory,
        # its owner file. Exit 1: held by another run.
        script = ('p=$(dirname -- "$1"); if [ -f "$p" ]; then rm -f -- "$p"; fi; mkdir -p -- "$p" || exit 2; '
                  'mkdir -- "$1" 2>/dev/null || exit 1; printf "%s" "$2" > "$1/owner" || exit 2')
        out = self.probe(["sh", "-c", script, "sh", path, owner])
        if out.rc in (0, 1):
            return out.rc == 0
        raise SitestackError(f"[{self.name}] cannot create lock {path}: {out.stderr.strip() or out.rc}")

    def lock_remove(self, path: str) -> None:
        self.probe(["rm", "-rf", "--", path])

    def lock_owner(self, path: str) -> str | None:
        # test -L/-f before reading: a FIFO's read would wait forever, a device never end; then at
        # most OWNER_MAX + 1 bytes (more: not an owner file sitestack wrote). Exit 1: no owner file.
        script = ('if [ -L "$1" ]; then echo "is a symlink"; exit 3; fi; [ -e "$1" ] || exit 1; '
                  'if [ ! -f "$1" ]; then echo "is not a regular file"; exit 3; fi; head -c "$2" -- "$1"')
        out = self.probe(["sh", "-c", script, "sh", path, str(OWNER_MAX + 1)])
        if out.rc == 3:
            raise InvalidOwner(out.stdout.strip())
        if out.rc == 1 or (out.rc != 0 and not self.exists(path)):
            return None
        if out.rc != 0:
            raise SitestackError(f"[{self.name}] cannot read {path}: {out.stderr.strip() or out.rc}")
        if len(out.stdout.encode("utf-8", errors="surrogateescape")) > OWNER_MAX:
            raise InvalidOwner(f"is larger than {OWNER_MAX} bytes")
        return out.stdout

    def lock_older(self, path: str, seconds: int) -> bool:
        minutes = max(1, -(-seconds // 60))  # find's -mmin counts minutes; "./" keeps a path that starts with "-" a path
        where = path if path.startswith("/") else "./" + path
        return bool(self.probe(["find", where, "-maxdepth", "0", "-mmin", f"+{minutes}", "-print"]).stdout.strip())

    def close(self) -> None:
        """Release the connection (nothing to do locally)."""

    def _refuse_if_read_only(self, what: str) -> None:
        if self.read_only:
            raise MutationRefused(f"[{self.name}] check mode: refusing to {what}")


class _Tee(io.TextIOBase):
    """Copies command output to a buffer (for errors) and to a log file, line by line,
    redacting secrets on the way to the log."""

    def __init__(self, buffer: io.StringIO, log: IO[str] | None, echo: Callable[[str], None] | None = None) -> None:
        self.buffer, self.log, self.echo, self.pending = buffer, log, echo, ""

    def write(self, text: str) -> int:
        self.buffer.write(text)
        if self.log is not None or self.echo is not None:
            self.pending += text
            *lines, self.pending = self.pending.split("\n")
            self._lines(lines)
        return len(text)

    def _lines(self, lines: list[str]) -> None:
        redacted = [redact(line) for line in lines]
        if self.log is not None and redacted:
            self.log.write("".join(line + "\n" for line in redacted))
            self.log.flush()
        if self.echo is not None:
            for line in redacted:
                self.echo(line)

    def close(self) -> None:
        if self.pending:
            self._lines([self.pending])
            self.pending = ""
