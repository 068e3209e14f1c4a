"""The run scripts of a container site's module (LUMI's PyTorch container module,
https://lumi-supercomputer.github.io/LUMI-EasyBuild-docs/p/PyTorch/):
``conda-python-simple``, ``conda-python-distributed`` and ``get-master``, installed in
``$RUNSCRIPTS`` (``<prefix>/runscripts``) and put on the container's PATH by the stack module
(``<P>ENV_PREPEND_PATH``).

Where they differ from the site's scripts (https://github.com/Lumi-supercomputer/LUMI-EasyBuild-containers/tree/main/easybuild/easyconfigs/p/PyTorch), and why:

- MASTER_PORT is unique per job (the validation job's rule, :func:`sitestack.validation.jobs.master_port`),
  not 29500: two jobs can share a node (LUMI's page warns that its fixed port forbids it).
- MASTER_ADDR comes from ``get-master``, which expands Slurm's hostlist syntax fully with
  ``hostlist.py`` installed beside it (``nid[001,005-007]`` -> ``nid001``; the site's split on
  commas first and broke on it).
- LOCAL_RANK and LOCAL_WORLD_SIZE are set too (the site's script set neither).
- The MIOpen cache is per job on node-local storage (the site's was per node, so two jobs on a node
  removed each other's; the one rule, :mod:`sitestack.model.miopen`), and the other ranks wait for
  local rank 0 to make it instead of sleeping a fixed 2 s.
- The site's NCCL_* and FI_* settings come from its facts (``facts.env``).
"""

from __future__ import annotations

from pathlib import Path

from sitestack.core.quoting import sh_expanding
from sitestack.model.facts import Facts
from sitestack.model.miopen import miopen_cache
from sitestack.validation.jobs import PORT_BASE, PORT_SPAN

PROGRAMS = Path(__file__).resolve().parent.parent / "programs"


def simple(site: str) -> str:
    return (f"#!/bin/bash -e\n# conda-python-simple, written by sitestack for {site}: the container's Python (the\n"
            "# stack's venv first on PATH, set by the module) with this script's arguments. Run it in the\n"
            "# container: singularity exec $SIF conda-python-simple -c 'import torch'\n"
            'exec python "$@"\n')


def distributed(site: str, facts: Facts) -> str:
    """``conda-python-distributed``: one rank of a Slurm job step (srun), then Python."""
    env = [f"export {k}={sh_expanding(v)}" for k, v in sorted(facts.env.items()) if k.startswith(("NCCL_", "FI_"))]
    gpu = "export ROCR_VISIBLE_DEVICES=$SLURM_LOCALID   # one GCD per task (LUMI)\n" \
        if facts.gpu.vendor == "amd" else ""
    return f"""#!/bin/bash -e
# conda-python-distributed, written by sitestack for {site}: sets up one rank of a distributed
# PyTorch job started by srun, then runs the container's Python with this script's arguments:
#   srun singularity exec $SIF conda-python-distributed -u train.py
here=$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)
: "${{SLURM_PROCID:?run me under srun}}"
# Rank, world size and local rank from Slurm.
export RANK=$SLURM_PROCID
export WORLD_SIZE=${{SLURM_NTASKS:-$SLURM_NPROCS}}
export LOCAL_RANK=$SLURM_LOCALID
export LOCAL_WORLD_SIZE=${{SLURM_NTASKS_PER_NODE:-${{SLURM_TASKS_PER_NODE%%(*}}}}
LOCAL_WORLD_SIZE=${{LOCAL_WORLD_SIZE%%,*}}
# The first host of the job; get-master parses Slurm's hostlist syntax (no scontrol in the container).
export MASTER_ADDR=$("$here/get-master" "${{SLURM_JOB_NODELIST:-$SLURM_NODELIST}}")
# Unique per job, so that two jobs can share a node (below the ephemeral port range).
export MASTER_PORT=$(( {PORT_BASE} + SLURM_JOB_ID % {PORT_SPAN} ))
# MIOpen's cache needs file locking that Lustre lacks: node-local, per job (LUMI).
miopen_user=$(id -un)
export MIOPEN_USER_DB_PATH={sh_expanding(miopen_cache(facts, user="${miopen_user}") or "")}
export MIOPEN_CUSTOM_CACHE_DIR=$MIOPEN_USER_DB_PATH
if [ "$SLURM_LOCALID" -eq 0 ]; then
  rm -rf -- "$MIOPEN_USER_DB_PATH"
  mkdir -p -- "$MIOPEN_USER_DB_PATH"
else
  for _ in $(seq 100); do [ -d "$MIOPEN_USER_DB_PATH" ] && break; sleep 0.1; done
fi
{gpu}# The site's network settings (facts.env).
{chr(10).join(env)}
exec python "$@"
"""


def scripts(site: str, facts: Facts) -> dict[str, tuple[str, int]]:
    """name -> (text, mode) of the three run scripts and the host-list parser get-master imports."""
    return {"conda-python-simple": (simple(site), 0o755),
            "conda-python-distributed": (distributed(site, facts), 0o755),
            "get-master": ((PROGRAMS / "get_master.py").read_text(), 0o755),
            "hostlist.py": ((PROGRAMS / "hostlist.py").read_text(), 0o644)}
