"""Free TCP ports for the servers and jobs the tests start.

A port asked of the kernel with ``bind(port 0)`` comes from the ephemeral range
(``/proc/sys/net/ipv4/ip_local_port_range``, 32768-60999 on Linux by default), the range every
outgoing connection and every listener that binds port 0 draws from too: between the test closing
the probe socket and the job binding the port, mpiexec's Hydra proxies or a gloo rank may take it,
and the job then fails its process group for a reason that is not the one tested. The ports here
are drawn below that range and outside the validation job's own MASTER_PORT span (20000-29999,
:func:`sitestack.validation.jobs.master_port`), and each is checked free before it is handed out.
"""

from __future__ import annotations

import random
import socket

LOW, HIGH = 10000, 19999


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(count: int) -> list[int]:
    """``count`` different ports, each free when drawn (outside the kernel's ephemeral range)."""
    chosen: list[int] = []
    draws = random.Random()
    for _ in range(2000):
        port = draws.randint(LOW, HIGH)
        if port not in chosen and _bindable(port):
            chosen.append(port)
            if len(chosen) == count:
                return chosen
    raise RuntimeError(f"no {count} free ports between {LOW} and {HIGH}")


def free_port() -> int:
    """One port, free when drawn (outside the kernel's ephemeral range)."""
    return free_ports(1)[0]
