"""A real one-node Slurm cluster on this machine, for the validation job's integration tests.

``SlurmCluster(tmp).start()`` writes a ``slurm.conf`` into ``tmp`` (AuthType=auth/none,
CredType=cred/none: no munge; one CPU-only node with ``CPUs=4`` on this 2-core machine, which
``SlurmdParameters=config_overrides`` accepts; ports picked free), starts ``slurmctld`` and
``slurmd`` from Debian's slurm-wlm, and waits until the node is idle. ``env`` is what a client
command needs (``SLURM_CONF``); jobs inherit it. ``stop()`` ends both daemons by their pid.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from tests.ports import free_port, free_ports

#: ``sitestack_sbatch_wait ARGS``: ``sbatch --wait ARGS``, looking every 0.5 s. sbatch's own wait sleeps
#: 2 s, then 8 s, then 32 s between its looks while the sleep is under MinJobAge / 2 (SchedMD/slurm
#: src/sbatch/sbatch.c: _job_wait, MAX_WAIT_SLEEP_TIME 32; this cluster's MinJobAge is 600 s), so a job
#: of 1 s was seen done after 10 s and one of 12 s after 42 s. The same output ("Submitted batch job N",
#: or the id alone with --parsable) and exit status: the job's exit code, 1 when a signal ended it or
#: Slurm forgot it.
SBATCH_WAIT = r"""sitestack_sbatch_wait() {
  local id state parsable="" arg
  for arg in "$@"; do [ "$arg" = --parsable ] && parsable=1; done
  id=$(command sbatch --parsable "$@") || return
  if [ -n "$parsable" ]; then echo "$id"; else echo "Submitted batch job ${id%%;*}"; fi
  while state=$(scontrol show job -o "${id%%;*}" 2>/dev/null); do
    case $state in
      *JobState=PENDING*|*JobState=CONFIGURING*|*JobState=RUNNING*|*JobState=COMPLETING*|*JobState=SUSPENDED*|\
      *JobState=REQUEUE*|*JobState=RESIZING*|*JobState=SIGNALING*|*JobState=STAGE_OUT*) sleep 0.5 ;;
      *) break ;;
    esac
  done
  [[ $state =~ ExitCode=([0-9]+):([0-9]+) ]] || return 1
  [ "${BASH_REMATCH[2]}" = 0 ] || return 1
  return "${BASH_REMATCH[1]}"
}
"""

SLURMCTLD = shutil.which("slurmctld") or "/usr/sbin/slurmctld"
SLURMD = shutil.which("slurmd") or "/usr/sbin/slurmd"


def available() -> str | None:
    """Why a cluster cannot start here, or None when it can."""
    for tool in (SLURMCTLD, SLURMD):
        if not os.access(tool, os.X_OK):
            return f"{tool} not installed (apt-get install slurm-wlm)"
    for tool in ("sbatch", "srun", "squeue", "scontrol", "sinfo"):
        if not shutil.which(tool):
            return f"{tool} not on PATH"
    if os.geteuid() != 0:
        return "slurmd needs root"
    return None


class SlurmCluster:
    """slurmctld + slurmd with their state, spool and logs under ``root``."""

    def partition_lines(self) -> str:
        names = self.partition.split(",")
        return "\n".join(f"PartitionName={name} Nodes=ALL Default={'YES' if i == 0 else 'NO'} MaxTime=INFINITE State=UP"
                         f" {self.partition_options.get(name, '')}".rstrip() for i, name in enumerate(names))

    def __init__(self, root: Path, cpus: int = 4, partition: str = "debug", *, node: str = "", gres: str = "",
                 mpi_default: str = "none", launch: Callable[[list[str]], list[str]] | None = None,
                 partition_options: dict[str, str] | None = None) -> None:
        """``node``: more of the node's line (``RealMemory=``, ``Features=``); ``gres``: its GPUs as a
        count only (``gpu:8``: gres.conf names no device files, there are none); ``mpi_default``: the
        site's ``MpiDefault``; ``launch``: how the daemons are started (e.g. inside a site twin's mount
        namespace, so that its jobs see the twin's file system); ``partition``: one name, or several
        separated by commas over the same node (the first is the default); ``partition_options``: more
        of a partition's line, by name (``OverSubscribe=EXCLUSIVE``: each job gets whole nodes)."""
        self.root = Path(root)
        self.cpus = cpus
        self.partition = partition
        self.partition_options = dict(partition_options or {})
        self.node_extra, self.gres, self.mpi_default = node, gres, mpi_default
        self.launch = launch or (lambda argv: argv)
        self.node = socket.gethostname().split(".")[0]
        self.conf = self.root / "slurm.conf"
        self.env = {"SLURM_CONF": str(self.conf)}
        # Clusters of concurrent test runs on one machine number their jobs apart: the validation job's
        # MASTER_PORT is 20000 + job id % 10000, and two clusters' job 2 clashed on port 20002.
        self.first_job_id = 1 + (os.getpid() * 7919 + free_port()) % 9000

    def write_config(self) -> None:
        for sub in ("state", "spool", "log"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        r = self.root
        ctld_port, d_port = free_ports(2)
        self.conf.write_text(f"""\
ClusterName=sitestack-test
SlurmctldHost={self.node}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
MpiDefault={self.mpi_default}
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
MailProg=/bin/true
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SlurmdParameters=config_overrides
MinJobAge=600
FirstJobId={self.first_job_id}
{"GresTypes=gpu" if self.gres else ""}
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} {f"Gres={self.gres}" if self.gres else ""} {self.node_extra} State=UNKNOWN
{self.partition_lines()}
""")
        if self.gres:
            name, count = self.gres.split(":")
            (self.root / "gres.conf").write_text(f"NodeName={self.node} Name={name} Count={count}\n")

    def run(self, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, env={**os.environ, **self.env})

    def sbatch_wait(self, *args: str, timeout: float = 120, env: dict[str, str] | None = None,
                    ) -> subprocess.CompletedProcess[str]:
        """``sbatch --wait ARGS`` on this cluster, seeing the end within 0.5 s (:data:`SBATCH_WAIT`)."""
        return sbatch_wait(*args, timeout=timeout, env={**os.environ, **self.env, **(env or {})})

    def start(self, timeout: float = 60) -> SlurmCluster:
        self.write_config()
        for daemon in (SLURMCTLD, SLURMD):
            out = subprocess.run(self.launch([daemon, "-c", "-f", str(self.conf)]), capture_output=True, text=True,
                                 timeout=30, env={**os.environ, **self.env})
            if out.returncode != 0:
                self.stop()
                raise RuntimeError(f"{daemon} did not start: {out.stderr}{self.logs()}")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = self.run("sinfo", "-h", "-N", "-o", "%T")
            # one line per partition the node is in
            if out.returncode == 0 and set(out.stdout.split()) == {"idle"}:
                return self
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"the node did not become idle in {timeout}s{self.logs()}")

    def logs(self) -> str:
        text = ""
        for name in ("slurmctld.log", "slurmd.log"):
            path = self.root / "log" / name
            if path.exists():
                text += f"\n--- {name}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-20:])
        return text

    def stop(self) -> None:
        for name in ("slurmd.pid", "slurmctld.pid"):
            path = self.root / name
            try:
                pid = int(path.read_text().strip())
            except (OSError, ValueError):
                continue
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.2)
            else:
                os.kill(pid, signal.SIGKILL)


def sbatch_wait(*args: str, timeout: float, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``sbatch --wait ARGS`` with ``env`` (a cluster's client environment), looking every 0.5 s."""
    return subprocess.run(["bash", "-c", SBATCH_WAIT + 'sitestack_sbatch_wait "$@"', "sbatch", *args],
                          capture_output=True, text=True, timeout=timeout, env=env)
