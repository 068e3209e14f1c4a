"""Real OpenSSH servers on loopback for remote tests.

:func:`start_sshd` runs ``/usr/sbin/sshd -D`` on a free 127.0.0.1 port with its own host
key and authorized key, and writes an ssh config (``Host`` alias, port, identity,
``UserKnownHostsFile``) that sitestack reads through ``$SITESTACK_SSH_CONFIG``.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tests.ports import free_port

SSHD = "/usr/sbin/sshd"


@dataclass
class Sshd:
    alias: str
    port: int
    directory: Path
    process: subprocess.Popen
    host_key_line: str

    def stop(self) -> None:
        """Stop the server and drop every connection it serves (sessions are its children)."""
        children = subprocess.run(["pgrep", "-P", str(self.process.pid)], capture_output=True, text=True).stdout.split()
        for pid in children:
            subprocess.run(["kill", "-KILL", pid], capture_output=True)
        self.process.terminate()
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()

    def drop_connections(self) -> None:
        """Kill the sessions of this server (as a network cut would), keeping it listening."""
        for pid in subprocess.run(["pgrep", "-P", str(self.process.pid)], capture_output=True, text=True).stdout.split():
            subprocess.run(["kill", "-KILL", pid], capture_output=True)

    def start(self) -> None:
        """Start (again) on the same port with the same keys."""
        self.process = _launch(self.directory, self.port)


def available() -> bool:
    return os.path.exists(SSHD) and shutil.which("ssh-keygen") is not None and os.geteuid() == 0


def start_sshd(directory: Path, alias: str, *, known: bool = True, home: Path | None = None,
               extra_client_config: str = "", sftp: bool = True) -> Sshd:
    """Start an sshd for ``alias``; with ``known`` its host key goes into the client's known_hosts.

    ``home`` becomes $HOME of the sessions (sshd's SetEnv), so each server is a "host" with its
    own home directory and so its own ``{home}`` prefix.
    """
    directory.mkdir(parents=True, exist_ok=True)
    Path("/run/sshd").mkdir(exist_ok=True)  # privilege separation directory sshd insists on
    host_key = directory / "host_ed25519"
    client_key = directory.parent / "client_ed25519"
    if not host_key.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)], check=True)
    if not client_key.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(client_key)], check=True)
    (directory / "authorized_keys").write_text(Path(f"{client_key}.pub").read_text())
    port = free_port()
    config = directory / "sshd_config"
    config.write_text(f"""Port {port}
ListenAddress 127.0.0.1
HostKey {host_key}
PidFile {directory}/sshd.pid
AuthorizedKeysFile {directory}/authorized_keys
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
PermitRootLogin prohibit-password
StrictModes no
UsePAM no
""" + ("Subsystem sftp /usr/lib/openssh/sftp-server\n" if sftp else "") + (f"SetEnv HOME={home}\n" if home else ""))
    if home:
        home.mkdir(parents=True, exist_ok=True)
    process = _launch(directory, port)
    key_type, key_data = Path(f"{host_key}.pub").read_text().split()[:2]
    line = f"[127.0.0.1]:{port} {key_type} {key_data}"
    server = Sshd(alias, port, directory, process, line)
    ssh_config = directory.parent / "ssh_config"
    known_hosts = directory.parent / "known_hosts"
    with open(ssh_config, "a") as handle:
        handle.write(f"""
Host {alias}
  HostName 127.0.0.1
  Port {port}
  User root
  IdentityFile {client_key}
  IdentitiesOnly yes
  UserKnownHostsFile {known_hosts}
{extra_client_config}""")
    if known:
        with open(known_hosts, "a") as handle:
            handle.write(line + "\n")
    else:
        known_hosts.touch()
    return server


def _launch(directory: Path, port: int) -> subprocess.Popen:
    with open(directory / "sshd.log", "a") as log:  # sshd keeps its own copy of the descriptor
        process = subprocess.Popen([SSHD, "-D", "-e", "-f", str(directory / "sshd_config")],
                                   stdout=subprocess.DEVNULL, stderr=log)
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return process
        except OSError:
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError(f"sshd did not start: {(directory / 'sshd.log').read_text()}") from None
            time.sleep(0.05)
