"""The process-group check: init_process_group with the device's backend; a taken port, a missing rank
or an unreachable MASTER_ADDR is named, and a cause that stops every rank ends the run at once."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import socket
import threading
import time
from typing import Any

from .checks import PROCESS_GROUP
from .faults import report_fault
from .ranks import RankInfo
from .reach import interface_fault, not_local, unreachable
from .result_file import write_result
from .state import Run
from .verdicts import FAILED, PASSED


def free_port() -> int:
    """A TCP port nobody listens on now, on this host."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def port_in_use(port: int) -> str | None:
    """Why ``port`` cannot be listened on here (as the c10d store would), or None when it is free."""
    for family, addr in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue
        with sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((addr, port))
                sock.listen(1)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return f"bind: {os.strerror(exc.errno)}"
                continue
            return None
    return None


def explain_init_failure(exc: BaseException, addr: str, port: str, info: RankInfo, timeout: float) -> str:
    """Why init_process_group failed, in one line: a taken port, missing ranks, refused, unresolvable."""
    text = str(exc)
    low = text.lower()
    if "eaddrinuse" in low or "address already in use" in low:
        return f"MASTER_PORT {port} on {addr} is already in use: another job or process holds it"
    joined = re.search(r"(?<!\d)(\d+)/(\d+) clients joined", text)  # (?<!\d): each run of digits tried once
    if joined or "timed out" in low or "timeout" in low:
        seen = f" ({joined.group(1)} of {joined.group(2)} ranks joined)" if joined else ""
        return (f"timed out after {timeout:.0f}s waiting for {info.world_size} ranks at {addr}:{port}{seen}: "
                f"the launcher started fewer ranks than the world size {info.world_size} ({info.source}) says, "
                "or a rank cannot reach MASTER_ADDR")
    if "connection refused" in low or "econnrefused" in low:
        return f"cannot connect to {addr}:{port}: rank 0 is not listening there (MASTER_ADDR wrong, or rank 0 failed)"
    if "name or service not known" in low or "getaddrinfo" in low:
        return f"MASTER_ADDR {addr} does not resolve on this host"
    iface = re.search(r"Unable to find (?:address|interface) for:? (\S+)", text)
    if iface:  # gloo's device for GLOO_SOCKET_IFNAME (gloo/transport/tcp/device.cc)
        return (f"GLOO_SOCKET_IFNAME names an interface this host does not have ({iface.group(1)}: "
                f"{iface.group(0)}): set it to one of this node's interfaces (ip -brief address), or leave it unset")
    return f"init_process_group failed: {text.splitlines()[0] if text else type(exc).__name__}"


def process_group(run: Run) -> bool:
    """The process-group check: init_process_group through MASTER_ADDR/MASTER_PORT (or torchrun's store); True when it started."""
    from datetime import timedelta

    env = run.env
    agent_store = env.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    addr = env.get("MASTER_ADDR")
    port = env.get("MASTER_PORT")
    if run.info.world_size == 1 and (not addr or not port):
        # One rank started without a launcher (python ddp_check.py on one GPU): a process group
        # of one still initialises the backend (NCCL, XCCL, gloo) and runs every collective.
        addr, port = "127.0.0.1", str(free_port())
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = addr, port
    if not addr or not port:
        run.set(PROCESS_GROUP.name, FAILED, "MASTER_ADDR and MASTER_PORT are not set: the batch script sets them "
                "from the first host of the node list and the job id")
        return False
    known = before_init(run, addr, port, agent_store)
    if known:
        return fail_now(run, known)
    timeout = timedelta(seconds=run.args.init_timeout)
    kwargs: dict[str, Any] = {"backend": run.dev.backend, "init_method": "env://", "rank": run.info.rank,
                              "world_size": run.info.world_size, "timeout": timeout}
    if run.dev.kind == "cuda" and run.dev.index is not None:
        kwargs["device_id"] = run.torch.device("cuda", run.dev.index)
    start = time.perf_counter()
    # the store's own timeout does not cover a port held by a process that accepts and never answers
    stuck = threading.Timer(run.args.init_timeout + 15, on_stuck_init, args=(run, addr, port))
    stuck.daemon = True
    stuck.start()
    try:
        try:
            run.dist.init_process_group(**kwargs)
        except TypeError:  # torch without device_id
            kwargs.pop("device_id", None)
            run.dist.init_process_group(**kwargs)
    except Exception as exc:  # noqa: BLE001  (every failure becomes a reason)
        why = explain_init_failure(exc, addr, port, run.info, run.args.init_timeout)
        run.set(PROCESS_GROUP.name, FAILED, f"rank {run.info.rank} on {run.host}: {why}", error=str(exc)[:2000])
        if run.info.rank != 0 and why.startswith("timed out"):
            return False  # every rank times out at once: rank 0's store knows how many joined, and says so
        # this rank's own error ends the run at once: the others wait for it and would only time out
        return fail_now(run, why)
    finally:
        stuck.cancel()
    run.pg_ok = True
    # init_process_group returns once every rank has joined: the start-up time ends here (result.json startup.ready_s)
    run.set(PROCESS_GROUP.name, PASSED, f"{run.dev.backend} process group of {run.info.world_size} ranks via "
            f"{'torchrun rendezvous' if agent_store else f'{addr}:{port}'} in {time.perf_counter() - start:.2f}s",
            ready_at=round(time.time(), 3))
    return True


def before_init(run: Run, addr: str, port: str, agent_store: bool) -> str | None:
    """What stops every rank, known before init_process_group (which would only time out on it):
    MASTER_ADDR that does not resolve, is not rank 0's own or does not answer, the backend's socket
    interface missing on this host, MASTER_PORT taken on rank 0's. None when nothing is."""
    unresolved = does_not_resolve(addr)
    if unresolved:
        return (f"MASTER_ADDR {addr} does not resolve on {run.host} ({unresolved}): the batch script "
                "sets it from the job's first host; a name this node's resolver does not know (a typo, a "
                "short name where the site needs the high-speed network's name) stops every rank")
    bad_interface = interface_fault(run.env, run.dev.backend, run.host)
    if bad_interface:
        return bad_interface
    if run.info.rank == 0 and not agent_store:
        busy = port_in_use(int(port))
        if busy:
            return (f"MASTER_PORT {port} is already in use on {run.host} ({busy}): another job or "
                    "process holds it; the job derives the port from SLURM_JOB_ID, so a clash means a stray "
                    "process or a fixed port elsewhere")
        elsewhere = not_local(addr)
        if elsewhere:
            return (f"MASTER_ADDR {addr} (port {port}) is not an address of {run.host}, where rank 0's "
                    f"store listens ({elsewhere}): every rank would connect elsewhere and wait until the init "
                    "timeout; the batch script sets it to the job's first host: something in the ranks' "
                    "environment (a site hook, a module) set another")
    cut_off = unreachable(addr, int(port)) if run.info.rank != 0 else None
    if cut_off:
        return (f"MASTER_ADDR {addr} port {port} cannot be reached from {run.host} ({cut_off}): the "
                "ranks would wait for rank 0's store until the init timeout (a firewall, or an address of "
                "another network than this node's)")
    return None


def does_not_resolve(addr: str) -> str | None:
    """Why ``addr`` has no address here (the resolver's words), or None. c10d's store retries a name
    that does not resolve until its timeout, so the rank would wait the whole limit for nothing."""
    try:
        socket.getaddrinfo(addr, None, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        return exc.strerror or str(exc)
    except (OSError, UnicodeError) as exc:
        return str(exc) or type(exc).__name__
    return None


def fail_now(run: Run, summary: str) -> bool:
    """Fail the process-group check with ``summary`` and report it as the run's fault at once: the
    other ranks, waiting for this one, are ended within seconds (watchdog.FAULT_GRACE) instead of at
    the init timeout. False, as process_group returns for a failure."""
    run.set(PROCESS_GROUP.name, FAILED, f"rank {run.info.rank} on {run.host}: {summary}")
    report_fault(run.args.out, {"kind": "failed", "cause": f"process-group: rank {run.info.rank} on {run.host}: "
                                f"{summary}", "rank": run.info.rank, "host": run.host, "phase": PROCESS_GROUP.name,
                                "expected": run.args.expect_world_size, "site": run.config.get("site")})
    return False


def on_stuck_init(run: Run, addr: str, port: str) -> None:
    """A rank stuck in init_process_group past its timeout (a port that accepts and never answers): report and leave."""
    summary = (f"did not get through init_process_group in {run.args.init_timeout + 15:.0f}s: {addr}:{port} accepts "
               "connections but does not answer as rank 0's store (another process holds MASTER_PORT?)")
    fail_now(run, summary)
    run.skip_rest("not run: the process group did not start", PROCESS_GROUP.name)
    with contextlib.suppress(Exception):
        if run.info.rank == 0:
            run.ranks = run.ranks or [{**run.me, "problems": run.pre_problems}]
            write_result(run)
    run.log(run.checks[PROCESS_GROUP.name].summary)
    os._exit(1)
