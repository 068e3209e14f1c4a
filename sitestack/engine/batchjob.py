"""Running an installed batch job of the validation directory on a host: what ``invoke validate`` and
``invoke tune`` share.

Before anything is submitted, :func:`preflight` checks what the job needs on the host (the stack's
manifest lists what the job imports, the launch helper it sources exists, the results directory is
writable). With Slurm the script is submitted with ``sbatch --parsable`` (:func:`submit`) and waited for
with ``squeue`` (:func:`wait_for`); without a scheduler it runs on the host with ``bash``, its output in
a log (:func:`run_here`). The job's last words in its log (:func:`await_words`) say its results are
complete: at a time limit squeue forgets the job while its guard still writes them.
"""

from __future__ import annotations

import posixpath
import re
import time
from collections.abc import Mapping
from typing import Any

from sitestack.core.bounded import read_bounded, read_json
from sitestack.core.errors import InputError, SitestackError
from sitestack.core.host import Host, local_host
from sitestack.core.report import Reporter
from sitestack.installs.venv_stack import normalize
from sitestack.onsite.fileio import ReadError, parse_json
from sitestack.validation.results_dir import results_check

FINISHED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL",
            "DEADLINE"}
#: Runs the batch script with its output in a log file on the host (script and log are $0 and $1:
#: no path is ever pasted into the shell text).
RUN_TO_LOG = 'exec bash "$0" >"$1" 2>&1'
#: The most bytes of check-config.json read (the installer writes a few KiB).
CONFIG_MAX = 1 << 20
#: The largest stack manifest read (a few hundred packages: tens of KiB).
MANIFEST_MAX = 16 << 20


def preflight(host: Host, directory: str, site_name: str, root: str, python: str | None,
              config: Mapping[str, Any] | None = None) -> None:
    """What the job needs on ``host`` before it is submitted: the stack has what it imports (unless
    ``python`` names another interpreter), the launch helper is installed, ``root`` can take the log.
    ``config``: the job's check-config.json as :func:`job_config` read it (None: read it now)."""
    config = job_config(host, directory, site_name) if config is None else config
    if not python:
        check_imports(host, directory, site_name, config)
    check_launch_env(host, directory, site_name, config)
    # the job's log goes there too: a root it cannot write would lose the job and its cause with it
    check = host.probe(results_check(root), timeout=60)
    if not check.ok:
        raise SitestackError(f"{(check.stderr or check.stdout).strip()}; the job's log and results go there "
                             "(choose another with --results)")


def check_imports(host: Host, directory: str, site_name: str, config: Mapping[str, Any] | None = None) -> None:
    """Before submitting: what the job imports (check-config.json ``stack.needs``: torch, numpy, mpi4py
    where the stack includes it) is in the stack's manifest, so a stack that lacks one fails here, in
    seconds and by name, not in the queue. Nothing to check for a job installed without a stack."""
    stack = _stack(job_config(host, directory, site_name) if config is None else config)
    path = stack.get("manifest")
    if not path or not isinstance(path, str):
        return
    manifest = read_bounded(host, path, MANIFEST_MAX,
                            f"not a stack manifest; re-run `invoke install-venv --site {site_name}`")
    if manifest is None:
        raise SitestackError(f"the stack the job validates has no manifest ({path} missing on {host.name}): "
                             f"provision it first (`invoke install-venv --site {site_name}`)")
    try:
        data = parse_json(manifest, path)
    except ReadError as exc:
        raise InputError(path, f"{exc.reason}; re-run `invoke install-venv --site {site_name}`") from None
    data = data if isinstance(data, dict) else {}
    # the environment's own packages, and its base's where it sees them (a container stack's torch)
    listed = [p for key in ("packages", "base_packages") if isinstance(data.get(key), list) for p in data[key]]
    have = {normalize(str(p.get("name", ""))) for p in listed if isinstance(p, dict)}
    needs = stack["needs"] if isinstance(stack.get("needs"), list) else []
    missing = [str(name) for name in needs if normalize(str(name)) not in have]
    if missing:
        raise SitestackError(f"the stack {stack.get('module') or path} lacks {', '.join(missing)}, which the validation "
                             f"job imports (its manifest {path}): re-run `invoke install-venv --site {site_name}`")


def check_launch_env(host: Host, directory: str, site_name: str, config: Mapping[str, Any] | None = None) -> None:
    """Before submitting: the users' launch helper the job sources (check-config.json ``stack.launch_env``)
    is installed, so a job installed before the install-launch-env step ran fails here, by name."""
    helper = _stack(job_config(host, directory, site_name) if config is None else config).get("launch_env")
    if isinstance(helper, str) and helper and not host.exists(helper):
        raise SitestackError(f"the validation job sources the launch helper {helper}, missing on {host.name}: "
                             f"install it first (`invoke provision --site {site_name} --tags launch`)")


def job_config(host: Host, directory: str, site_name: str | None = None) -> dict[str, Any]:
    """The installed job's ``check-config.json`` in ``directory`` on ``host``: the one reader of it on the
    controller (``invoke validate`` reads it once and passes it on). {} without the file. Read bounded
    (:data:`CONFIG_MAX`) and only as a regular file that is no symbolic link (a FIFO is never waited on:
    a :class:`SitestackError`); larger, not JSON, or not the installed job's object (``stack`` an object,
    ``history_dir`` a string, where present): an :class:`InputError` naming the file."""
    path = f"{directory}/check-config.json"
    again = f"re-install the job (`invoke install-validation-job{' --site ' + site_name if site_name else ''}`)"
    data = read_json(host, path, CONFIG_MAX, f"not the installed job's configuration; {again}", follow=False)
    if data is None:
        return {}
    if not isinstance(data, dict) or not isinstance(data.get("stack"), dict | None) \
            or not isinstance(data.get("history_dir"), str | None):
        raise InputError(path, "not the installed job's configuration (a JSON object with a `stack` object and a "
                         f"`history_dir` string); {again}")
    history = data.get("history_dir")
    if history is not None and not normalised_absolute(history):
        raise InputError(path, f"`history_dir` {history!r} is not an absolute path without '.', '..' or '//' "
                         f"(a record would land outside the prefix); {again}")
    return data


def normalised_absolute(path: str) -> bool:
    """``path`` is absolute and as :func:`posixpath.normpath` writes it: no ``.``, ``..``, ``//`` or trailing
    ``/`` (a path read back from a file the job's directory holds is confined to what it says)."""
    return path.startswith("/") and not path.startswith("//") and posixpath.normpath(path) == path


def _stack(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """check-config.json's ``stack`` ({} without one)."""
    return config.get("stack") or {}


def job_env(ranks_per_node: int, python: str | None) -> dict[str, str]:
    """The variables the job reads from the submitting environment (ranks per node, the checks' Python)."""
    env: dict[str, str] = {}
    if ranks_per_node:
        env["SITESTACK_RANKS_PER_NODE"] = str(ranks_per_node)
    if python:
        env["SITESTACK_PYTHON"] = python
    return env


def submit(host: Host, script: str, root: str, env: Mapping[str, str], *, nodes: int, ranks_per_node: int,
           tasks_per_node: bool) -> str:
    """Submit ``script`` with ``sbatch --parsable`` on ``host`` (working directory ``root``; ``--nodes`` and,
    where the script takes it from sbatch, ``--ntasks-per-node``, when given); the job id."""
    argv = ["sbatch", "--parsable", f"--chdir={root}"]
    if nodes:
        argv.append(f"--nodes={nodes}")
    if ranks_per_node and tasks_per_node:
        argv.append(f"--ntasks-per-node={ranks_per_node}")
    argv.append(script)
    # probe, not run: run merges stderr into stdout, and sbatch's warnings must not reach the job id.
    out = host.probe(argv, env=dict(env), timeout=120)
    if not out.ok:
        raise SitestackError(f"sbatch refused the job: {(out.stderr or out.stdout).strip()}")
    return out.stdout.strip().split(";")[0]


def wait_for(host: Host, job_id: str, reporter: Reporter, later: str, *, timeout: float, poll: float) -> int | None:
    """Wait until Slurm job ``job_id`` on ``host`` ended (its state on each change reported, asked every
    ``poll`` seconds); its exit code (None once Slurm forgot it). Past ``timeout`` seconds an error that
    says ``later`` (how to read the job's outcome later; the job keeps running)."""
    deadline = time.monotonic() + timeout
    state = None
    while True:
        out = host.probe(["squeue", "-h", "-j", job_id, "-o", "%T"], timeout=60)
        current = out.stdout.strip()
        if not out.ok or not current or current in FINISHED:
            break
        if current != state:
            reporter.note(f"job {job_id}: {current}")
            state = current
        if time.monotonic() > deadline:
            raise SitestackError(f"job {job_id} still {current} after {timeout:.0f}s (it keeps running; "
                                 f"{later})")
        time.sleep(poll)
    return slurm_exit_code(job_id, host)


def slurm_exit_code(job_id: str, host: Host | None = None) -> int | None:
    """The batch script's exit code from ``scontrol show job`` (None once Slurm forgot the job)."""
    out = (host or local_host()).probe(["scontrol", "show", "job", "-o", job_id], timeout=60)
    match = re.search(r"\bExitCode=(\d+):(\d+)", out.stdout)
    return int(match.group(1)) if match else None


def run_here(host: Host, script: str, log: str, root: str, env: Mapping[str, str], timeout: float) -> int:
    """Run ``script`` on ``host`` with ``bash``, without a scheduler, its output in ``log``; its exit code."""
    # probe, not run: a failing job is an outcome to report (its results say why), not an error.
    return host.probe(["sh", "-c", RUN_TO_LOG, script, log], env=dict(env), cwd=root, timeout=timeout).rc


def await_words(host: Host, log: str, words: re.Pattern[str], wait: float) -> bool:
    """Whether ``log`` on ``host`` has the job's last ``words``, waiting at most ``wait`` seconds for them."""
    end = time.monotonic() + wait
    while not words.search(host.read_tail(log) or ""):
        if time.monotonic() >= end:
            return False
        time.sleep(1.0)
    return True


def script_path(directory: str, name: str) -> str:
    """``directory/jobs/name``, the installed batch script."""
    return posixpath.join(directory, "jobs", name)
