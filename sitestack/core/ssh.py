"""The SSH host: :class:`SshHost` over a Fabric Connection (a Connection is an Invoke Context),
and :func:`ssh_host`, which connects with the user's SSH config and checks host keys."""

from __future__ import annotations

import base64
import contextlib
import io
import os
import secrets
import select
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sitestack.core import envvars
from sitestack.core.errors import ConnectionLost, InputError, SitestackError
from sitestack.core.hostbase import Host, shell_line, with_umask
from sitestack.core.redact import redact
from sitestack.core.sshfiles import host_keys, ssh_config


@dataclass(frozen=True)
class ChannelResult:
    """What :meth:`SshHost._exec_channel` returns: the fields of an Invoke Result the Host reads."""

    return_code: int
    stdout: str
    stderr: str


class SshHost(Host):
    """A remote machine over SSH (Fabric). The remote shell is non-login."""

    caches_probes = True

    def __init__(self, name: str, connection: Any, *, read_only: bool = False) -> None:
        super().__init__(name, connection, read_only=read_only)
        self._sftp_missing = False  # learnt on the first write: then files go over the shell

    def close(self) -> None:
        self._drop_shell()
        self.context.close()

    def cache_identity(self) -> list[str]:
        """The host's name may be an alias: the address, port and user it reached are part of it."""
        c = self.context
        return [*super().cache_identity(), str(getattr(c, "host", "")), str(getattr(c, "port", "")),
                str(getattr(c, "user", ""))]

    def _exec(self, line: str, **kwargs: Any) -> Any:
        import paramiko

        result: Any
        try:
            if kwargs.get("out_stream") is None and not kwargs.get("in_stream"):
                # A probe: one exec channel read to its end here. Fabric's runner starts two reader
                # threads and polls every 10 ms per command; a no-op run is mostly probes.
                result = self._exec_in_shell(with_umask(line, self.umask), kwargs.get("timeout"))
            else:
                result = self.context.run(with_umask(line, self.umask), **kwargs)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise ConnectionLost(f"[{self.name}] connection lost: {exc or type(exc).__name__}") from None
        if result is None or result.return_code == -1:  # paramiko: the channel closed without an exit status
            raise ConnectionLost(f"[{self.name}] connection lost while running: {redact(line)[:200]}")
        return result

    def _exec_in_shell(self, line: str, timeout: float | None) -> ChannelResult:
        """Run ``line`` in this host's remote shell (one ``/bin/sh`` per connection, started on first
        use) and collect its output and exit status.

        The line runs in a subshell with standard input from /dev/null, so ``cd``, variables or
        ``exit`` cannot touch the next command; its end is told by a marker with a fresh random token
        written to stdout (with the exit status) and to stderr. A command costs the remote shell one
        fork instead of an sshd session and a shell start: a no-op provision sends ~35 of them per
        host. A timeout gives 124 and drops the shell (the next command starts another)."""
        channel = self._shell_channel()
        token = secrets.token_hex(8).encode()
        marker = b"\x00SITESTACK-" + token
        channel.sendall(b"( " + line.encode() + b"\n) </dev/null; printf '\\000SITESTACK-" + token +
                        b" %d\\n' $?; printf '\\000SITESTACK-" + token + b"\\n' >&2\n")
        out, err = bytearray(), bytearray()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            end_out, end_err = out.find(marker), err.find(marker)
            if end_out >= 0 and out.endswith(b"\n", end_out) and end_err >= 0 and err.endswith(b"\n", end_err):
                rc = int(out[end_out + len(marker):].split()[0])
                return ChannelResult(rc, out[:end_out].decode("utf-8", "replace"),
                                     err[:end_err].decode("utf-8", "replace"))
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                self._drop_shell()
                return ChannelResult(124, out.decode("utf-8", "replace"),
                                     err.decode("utf-8", "replace") + f"\ntimed out after {timeout}s")
            if channel.exit_status_ready() and not (channel.recv_ready() or channel.recv_stderr_ready()):
                self._drop_shell()
                transport = self.context.transport
                if transport is None or not transport.is_active():
                    raise EOFError("the SSH transport is closed")
                # the command ended the shell itself (killed its parent): its own failure, not the host's
                return ChannelResult(255, out.decode("utf-8", "replace"),
                                     err.decode("utf-8", "replace") + "\nthe remote shell ended while running this")
            select.select([channel], [], [], 1.0 if left is None else min(left, 1.0))
            while channel.recv_ready():
                out += channel.recv(1 << 16)
            while channel.recv_stderr_ready():
                err += channel.recv_stderr(1 << 16)

    def _shell_channel(self) -> Any:
        shell = self.__dict__.get("_shell")
        if shell is not None and not shell.closed and not shell.exit_status_ready():
            return shell
        transport = self.context.transport
        if transport is None or not transport.is_active():
            raise EOFError("the SSH transport is closed")
        shell = transport.open_session(timeout=30)
        shell.exec_command("exec /bin/sh")
        self.__dict__["_shell"] = shell
        return shell

    def _drop_shell(self) -> None:
        shell = self.__dict__.pop("_shell", None)
        if shell is not None:
            with contextlib.suppress(Exception):
                shell.close()

    def write_text(self, path: str, text: str, mode: int = 0o644) -> None:
        self._refuse_if_read_only(f"write {path}")
        self.changed()
        self._put_bytes(text.encode("utf-8"), path, mode)

    def put_file(self, local: Path, remote: str, mode: int = 0o644) -> None:
        self._refuse_if_read_only(f"copy {local} to {remote}")
        self.changed()
        self._put_bytes(Path(local).read_bytes(), remote, mode)

    def _put_bytes(self, data: bytes, path: str, mode: int) -> None:
        import paramiko

        parent = os.path.dirname(path)
        self.run(["mkdir", "-p", parent])
        tmp = f"{parent}/.{os.path.basename(path)}.{os.getpid()}.tmp"
        if self._sftp_missing:
            return self._put_over_shell(data, tmp, path, mode)
        try:
            sftp = self.context.sftp()
        except paramiko.SSHException:
            # An sshd without the SFTP subsystem (Subsystem sftp commented out): send the bytes
            # through the shell instead, as Ansible does when SFTP and SCP are unavailable.
            self._sftp_missing = True
            return self._put_over_shell(data, tmp, path, mode)
        try:
            with sftp.open(tmp, "wb") as handle:
                handle.write(data)
            sftp.chmod(tmp, mode)
            sftp.posix_rename(tmp, path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                sftp.remove(tmp)
            raise SitestackError(f"[{self.name}] cannot write {path}: {exc}") from None
        return None

    def _put_over_shell(self, data: bytes, tmp: str, path: str, mode: int) -> None:
        """Write ``data`` to ``path`` atomically with base64 on the remote shell's standard input."""
        script = 'base64 -d > "$1" && chmod "$3" "$1" && mv -f -- "$1" "$2" || { rm -f -- "$1"; exit 1; }'
        line = shell_line(["sh", "-c", script, "sh", tmp, path, f"{mode:o}"])
        encoded = base64.b64encode(data).decode("ascii")
        result = self._exec(line, hide=True, warn=True, in_stream=io.StringIO(encoded + "\n"))
        if result.return_code != 0:
            raise SitestackError(f"[{self.name}] cannot write {path} (over the shell, the host has no SFTP): "
                                 f"{result.stderr.strip()[-300:]}")


def _accept_for_this_run() -> Any:
    """--accept-new-host-keys: a policy that trusts an unknown key for this connection only and never
    writes it to known_hosts (paramiko's AutoAddPolicy saves it into the last known_hosts file loaded).
    Made on first use: paramiko is imported only when something connects over SSH."""
    import paramiko

    class AcceptForThisRun(paramiko.MissingHostKeyPolicy):
        def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
            client.get_host_keys().add(hostname, key.get_name(), key)  # in memory: nothing is saved

    return AcceptForThisRun()


def _verify_host_keys(connection: Any, accept_unknown_hosts: bool) -> None:
    """Check host keys against ~/.ssh/known_hosts and the config's UserKnownHostsFile, refusing an
    unknown key unless ``accept_unknown_hosts``. As paramiko's SSHClient does with
    ``load_system_host_keys`` and ``load_host_keys``, the host's keys in ~/.ssh/known_hosts come
    first and the other files are asked only when it has none; the keys found
    (:func:`~sitestack.core.sshfiles.host_keys`, each file parsed once per run) go into the
    client's own ``get_host_keys()`` table, which paramiko checks when it connects."""
    import paramiko

    client = connection.client
    # paramiko looks a host up by the name it connects to: "host", or "[host]:port" off port 22
    name = connection.host if connection.port == 22 else f"[{connection.host}]:{connection.port}"
    known = [path for path in (os.path.expanduser(p) for p in str(connection.ssh_config.get("userknownhostsfile", "")).split())
             if os.path.exists(path)]
    keys = host_keys(name, [os.path.expanduser("~/.ssh/known_hosts")]) or host_keys(name, known)
    table = client.get_host_keys()
    for keytype, key in keys.items():
        table.add(name, keytype, key)
    client.set_missing_host_key_policy(_accept_for_this_run() if accept_unknown_hosts else paramiko.RejectPolicy())


def _fabric_config(config_path: str | None) -> Any:
    """The Fabric ``Config`` of a connection, with the SSH config files read once
    (:func:`~sitestack.core.sshfiles.ssh_config`). Where Fabric's own settings would pick other files (``ssh_config_path``, ``load_ssh_configs:
    false`` in a fabric.yaml), Fabric reads them itself, as it always did."""
    import fabric

    paths = [config_path] if config_path else [os.path.expanduser("~/.ssh/config"), "/etc/ssh/ssh_config"]
    config = fabric.Config(ssh_config=ssh_config(paths), runtime_ssh_path=config_path)
    if config.ssh_config_path or not config.load_ssh_configs:
        return fabric.Config(runtime_ssh_path=config_path)
    return config


def check_ssh_config(target: str) -> None:
    """Refuse a bad SSH setup before anything connects, with one message: a
    ``$SITESTACK_SSH_CONFIG`` that is not a file, or a config whose ``Port`` for ``target`` is not
    a port number (Fabric would raise a bare ValueError from deep inside)."""
    config_path = envvars.get("SITESTACK_SSH_CONFIG")   # an existing file, or an error naming the variable
    path = config_path or os.path.expanduser("~/.ssh/config")
    if not os.path.isfile(path):
        return
    try:
        found = ssh_config([path]).lookup(target.rsplit("@", 1)[-1].split(":")[0])
    except Exception as exc:  # paramiko raises assorted errors for a malformed file
        raise InputError(path, f"cannot read the SSH config: {exc}") from None
    port = found.get("port")
    if port is not None and not (str(port).isdigit() and 1 <= int(port) <= 65535):
        raise InputError(path, f"Port {port!r} for host {target} is not a port number")


def ssh_host(name: str, address: str | None = None, *, user: str | None = None, port: int | None = None,
             read_only: bool = False, accept_unknown_hosts: bool = False, connect_timeout: float = 15) -> SshHost:
    """Connect to ``address`` (an ssh-config alias or host name) with the user's SSH config.

    The SSH config is ``~/.ssh/config``, or the file named by ``$SITESTACK_SSH_CONFIG``.
    Host keys are checked against ``~/.ssh/known_hosts`` and the config's
    ``UserKnownHostsFile``; an unknown host key is refused unless ``accept_unknown_hosts``
    (Fabric alone would accept any key: it sets paramiko's AutoAddPolicy).
    """
    import fabric
    import paramiko

    config = _fabric_config(envvars.get("SITESTACK_SSH_CONFIG"))
    target = address or name
    connection = fabric.Connection(target, user=user, port=port, connect_timeout=int(connect_timeout), config=config)
    # The target and every ProxyJump gateway Fabric made from the config check host keys alike.
    hop = connection
    while isinstance(hop, fabric.Connection):
        _verify_host_keys(hop, accept_unknown_hosts)
        hop = hop.gateway
    try:
        if connection.gateway is None:
            # Our own socket: TCP_NODELAY from the start, quick ACKs (:func:`_connect_socket`).
            # (a new dict: connect_kwargs is the Config's own, whose item assignment merges the config again)
            sock = _connect_socket(connection.host, connection.port, connect_timeout)
            connection.connect_kwargs = {**connection.connect_kwargs, "sock": sock}
        connection.open()
    except paramiko.SSHException as exc:
        if "not found in known_hosts" in str(exc):
            raise SitestackError(
                f"[{name}] host key of {target} is not in known_hosts: refusing to connect "
                "(check the key and add it to known_hosts, or pass --accept-new-host-keys)") from None
        raise SitestackError(f"[{name}] SSH to {target} failed: {exc}") from None
    except OSError as exc:
        raise SitestackError(f"[{name}] cannot connect to {target}: {exc}") from None
    _no_delay(connection)
    return SshHost(name, connection, read_only=read_only)


class _QuickAckSocket(socket.socket):
    """A TCP socket that acknowledges what it receives at once (Linux ``TCP_QUICKACK``, set again
    after each read: the kernel clears it, tcp(7)).

    After the authentication OpenSSH's sshd sends two messages nobody answers (the
    ``hostkeys-00@openssh.com`` global request without want-reply, a debug message), then, with
    Nagle's algorithm still on its socket until a session starts, holds its reply to our channel
    open until they are acknowledged: with the client's delayed ACK that was ~40 ms of each
    connection's ~80 (an strace of sshd: the confirmation written, the next request 40 ms later).
    One more syscall per read; no effect where the option does not exist."""

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        data = super().recv(bufsize, flags)
        with contextlib.suppress(OSError):
            self.setsockopt(socket.IPPROTO_TCP, _TCP_QUICKACK, 1)
        return data


_TCP_QUICKACK: int = getattr(socket, "TCP_QUICKACK", 0)


def _connect_socket(host: str, port: int, timeout: float) -> socket.socket:
    """A connected TCP socket to ``host``:``port`` (each address in turn, as
    :func:`socket.create_connection`), with TCP_NODELAY from the start: the handshake and the
    authentication are many small messages too (:func:`_no_delay`); on Linux a
    :class:`_QuickAckSocket`."""
    kind = _QuickAckSocket if _TCP_QUICKACK else socket.socket
    error: OSError = OSError(f"no address for {host}")
    for family, socktype, proto, _, address in socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM):
        sock = kind(family, socktype, proto)
        try:
            sock.settimeout(timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.connect(address)
            return sock
        except OSError as exc:
            sock.close()
            error = exc
    raise error


def _no_delay(connection: Any) -> None:
    """Send each SSH packet at once (TCP_NODELAY), as OpenSSH's client does. Every command opens a
    channel with two small requests back to back; with Nagle's algorithm the second waits for the
    server's delayed ACK, about 40 ms a command (a no-op provision runs ~40 of them). A transport over
    a ProxyJump channel has no socket option to set."""
    sock = getattr(connection.transport, "sock", None)
    if isinstance(sock, socket.socket) and sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
