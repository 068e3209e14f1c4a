#!/bin/bash
# A job script for site local (this machine (Debian 12); CPU-only, MPICH, Lmod, gloo collectives): copy it, set the program, submit it with sbatch.
# Printed by `invoke job-template --site local` from playbooks/local.yml.
#SBATCH --job-name=pytorch-ddp
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#SBATCH --partition=debug
#SBATCH --time=00:10:00
#SBATCH --output=%x-%j.out
set -eo pipefail

# With `sbatch --export=NONE` (recommended where the login environment must not leak into jobs) srun
# would pass no environment to the tasks; unsetting this makes it pass the one built below.
unset SLURM_EXPORT_ENV

# The site's modules and the stack, loaded the way users load them.
if ! type module >/dev/null 2>&1; then
  for f in /usr/share/lmod/lmod/init/bash; do
    if [ -r "$f" ]; then . "$f"; break; fi
  done
fi
type module >/dev/null 2>&1 || { echo 'no module command (looked for /usr/share/lmod/lmod/init/bash)' >&2; exit 97; }
module use /opt/sitestack-golden/modules
module load pytorch/2.13.0-cpu

# NODELIST, WORLD_SIZE, TASKS_PER_NODE, CPUS_PER_TASK, MASTER_ADDR, a job-unique MASTER_PORT and
# the site's runtime settings (/opt/sitestack-golden/bin/sitestack-launch-env; `/opt/sitestack-golden/bin/sitestack-launch` adds RANK and LOCAL_RANK in each task).
. /opt/sitestack-golden/bin/sitestack-launch-env

echo "$WORLD_SIZE tasks on $NNODES nodes ($NODELIST), master $MASTER_ADDR:$MASTER_PORT"
# One torchrun agent per node, given every CPU the job has there (srun's default is one per task, which
# all its ranks would share); c10d rendezvous on the first node at the job's MASTER_PORT. Each rank pins
# itself (sitestack-bind-rank) to the CPUs srun would give its LOCAL_RANK, then runs your program.
srun --nodes="$NNODES" --ntasks="$NNODES" --ntasks-per-node=1 --cpus-per-task="${SLURM_CPUS_ON_NODE:-$(( TASKS_PER_NODE * CPUS_PER_TASK ))}" \
  /opt/sitestack-golden/bin/sitestack-launch python -m torch.distributed.run --nnodes="$NNODES" --nproc-per-node="$TASKS_PER_NODE" \
  --rdzv-backend=c10d --rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT" --rdzv-id="$SLURM_JOB_ID" \
  /opt/sitestack-golden/bin/sitestack-bind-rank -- python -u train.py   # your program and its arguments
