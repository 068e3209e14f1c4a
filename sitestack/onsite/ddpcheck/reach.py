"""Before the process group, on each rank: the socket interface its backend is told to use exists on
this rank's host, and MASTER_ADDR:MASTER_PORT answers from here. Either fault would otherwise show
as a wait of the other ranks until the init timeout, with this rank's own error lost."""

from __future__ import annotations

import errno
import socket

#: Seconds a rank waits for MASTER_ADDR to answer a TCP connect before it calls it unreachable. A
#: host on the job's network answers (accepts or refuses) in milliseconds; a dropped SYN is
#: retried by the kernel after 1 s and 3 s, so 4 s sees the second retry go unanswered too.
CONNECT_TIMEOUT = 4.0
#: Connect errors that say the address cannot be reached from here (connect(2)); a refusal is not
#: one: the host answered, and rank 0's store may not listen yet.
UNREACHABLE = (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN, errno.ENETDOWN, errno.EADDRNOTAVAIL)


def interface_variable(backend: str) -> str | None:
    """The variable that picks the socket interface of ``backend`` (gloo: GLOO_SOCKET_IFNAME; nccl,
    which RCCL also reads: NCCL_SOCKET_IFNAME); None for a backend that takes none."""
    return {"gloo": "GLOO_SOCKET_IFNAME", "nccl": "NCCL_SOCKET_IFNAME"}.get(backend)


def missing_interfaces(variable: str, value: str, present: list[str]) -> list[str]:
    """The interfaces ``value`` of ``variable`` names that none of ``present`` satisfies.

    GLOO_SOCKET_IFNAME is a comma-separated list of exact names, each of which gloo opens
    (torch/csrc/distributed/c10d/ProcessGroupGloo.cpp, pytorch v2.5: every name must exist).
    NCCL_SOCKET_IFNAME is a list of prefixes (``=`` before the list: exact names; ``^``: names to
    leave out), any of which may match (NCCL's docs, "Environment Variables"): it misses only when
    no interface matches any prefix; an exclusion list names nothing that must exist."""
    if variable == "GLOO_SOCKET_IFNAME":
        return [name for name in (n.strip() for n in value.split(",")) if name and name not in present]
    text = value.strip()
    if not text or text.startswith("^"):
        return []
    exact = text.startswith("=")
    wanted = [n.strip() for n in text.lstrip("=").split(",") if n.strip()]
    found = any((name == w) if exact else name.startswith(w) for w in wanted for name in present)
    return [] if found or not wanted else wanted


def interface_fault(env: dict[str, str], backend: str, host: str) -> str | None:
    """Why the backend's socket interface variable cannot be honoured on this host, or None."""
    variable = interface_variable(backend)
    value = env.get(variable or "")
    if not variable or not value:
        return None
    present = sorted(name for _, name in socket.if_nameindex())
    missing = missing_interfaces(variable, value, present)
    if not missing:
        return None
    return (f"{variable}={value} names {'an interface' if len(missing) == 1 else 'interfaces'} {host} does not have "
            f"({', '.join(missing)}; this host has {', '.join(present) or 'none'}): set it to one this node has "
            "(ip -brief address), or leave it unset")


def not_local(addr: str) -> str | None:
    """Why ``addr`` is not an address of this host (rank 0's, where the c10d store listens for every
    rank, itself included, to connect to MASTER_ADDR), or None when one of its addresses is. Binding
    an address only succeeds where the host holds it (bind(2), EADDRNOTAVAIL), so this needs no peer."""
    try:
        found = {str(info[4][0]) for info in socket.getaddrinfo(addr, None, type=socket.SOCK_STREAM)}
    except (OSError, UnicodeError) as exc:
        return str(exc) or type(exc).__name__
    for ip in sorted(found):
        family = socket.AF_INET6 if ":" in ip else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((ip, 0))
            except OSError:
                continue
            return None
    if found == {addr}:
        return f"this host does not hold {addr}"
    return f"{addr} is {', '.join(sorted(found))}, none of which this host holds"


def unreachable(addr: str, port: int, timeout: float = CONNECT_TIMEOUT) -> str | None:
    """Why ``addr``:``port`` cannot be reached from here (no answer within ``timeout``, no route),
    or None when the host answered (accepted, or refused: nobody listens yet, which rank 0 fixes)."""
    try:
        with socket.create_connection((addr, port), timeout=timeout):
            return None
    except ConnectionRefusedError:
        return None
    except TimeoutError:
        return f"no answer to a TCP connect in {timeout:.0f}s"
    except OSError as exc:
        if exc.errno in UNREACHABLE:
            return exc.strerror or str(exc)
        return None
