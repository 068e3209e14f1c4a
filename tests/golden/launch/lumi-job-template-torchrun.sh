#!/bin/bash
# A job script for site lumi (LUMI-G, HPE Cray EX, 4x AMD MI250X (8 GCDs) + 64-core EPYC Trento per node, Slingshot-11 (4x200 Gb/s)): copy it, set the program, submit it with sbatch.
# Printed by `invoke job-template --site lumi` from playbooks/lumi.yml.
#SBATCH --job-name=pytorch-ddp
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=8
#SBATCH --partition=standard-g
#SBATCH --account=proj
#SBATCH --gpus-per-node=8
#SBATCH --mem=480G
#SBATCH --time=00:30:00
#SBATCH --output=%x-%j.out
set -eo pipefail

# With `sbatch --export=NONE` (recommended where the login environment must not leak into jobs) srun
# would pass no environment to the tasks; unsetting this makes it pass the one built below.
unset SLURM_EXPORT_ENV

# The site's modules and the stack, loaded the way users load them.
if ! type module >/dev/null 2>&1; then
  for f in /opt/cray/pe/lmod/lmod/init/bash; do
    if [ -r "$f" ]; then . "$f"; break; fi
  done
fi
type module >/dev/null 2>&1 || { echo 'no module command (looked for /opt/cray/pe/lmod/lmod/init/bash)' >&2; exit 97; }
module use /appl/local/laifs/modules || exit 98
module load LUMI/24.03 || { echo 'cannot load module LUMI/24.03' >&2; exit 98; }
module load partition/G || { echo 'cannot load module partition/G' >&2; exit 98; }
module load PrgEnv-gnu || { echo 'cannot load module PrgEnv-gnu' >&2; exit 98; }
module use /opt/sitestack-golden/modules
module load pytorch/2.10.0-rocm7.0

# NODELIST, WORLD_SIZE, TASKS_PER_NODE, CPUS_PER_TASK, MASTER_ADDR, a job-unique MASTER_PORT, CPU_MASKS and
# the site's runtime settings (/opt/sitestack-golden/bin/sitestack-launch-env; `/opt/sitestack-golden/bin/sitestack-launch` adds RANK and LOCAL_RANK in each task).
. /opt/sitestack-golden/bin/sitestack-launch-env

# The job's MIOpen cache ($MIOPEN_USER_DB_PATH, made private by the helper) is removed on every node at the
# end, where it is this user's (never another user's directory at that path, nor through a symbolic link).
sitestack_end() {
  srun --nodes="$NNODES" --ntasks="$NNODES" --ntasks-per-node=1 \
    sh -c '_sitestack_remove_own() {
  if [ -d "$1" ] && [ ! -h "$1" ] && [ -O "$1" ]; then rm -rf -- "$1"; fi
}
for d do _sitestack_remove_own "$d"; done' sitestack "$MIOPEN_USER_DB_PATH" >/dev/null 2>&1 || :
}
trap sitestack_end EXIT

# The stack runs in the singularity image; the stack prefix and the site's host paths are bound.
SIF=${SIF:-/opt/sitestack-golden/container/lumi-multitorch-full-u24r70f21m50t210-20260415_130625.sif}
export SINGULARITY_BINDPATH="${SINGULARITY_BINDPATH:+$SINGULARITY_BINDPATH,}""/opt/sitestack-golden"

echo "$WORLD_SIZE tasks on $NNODES nodes ($NODELIST), master $MASTER_ADDR:$MASTER_PORT"
# One torchrun agent per node, given every CPU the job has there (srun's default is one per task, which
# all its ranks would share); c10d rendezvous on the first node at the job's MASTER_PORT. Each rank pins
# itself (sitestack-bind-rank) to the CPUs srun would give its LOCAL_RANK, then runs your program.
srun --nodes="$NNODES" --ntasks="$NNODES" --ntasks-per-node=1 --cpus-per-task="${SLURM_CPUS_ON_NODE:-$(( TASKS_PER_NODE * CPUS_PER_TASK ))}" \
  singularity exec "$SIF" /opt/sitestack-golden/bin/sitestack-launch python -m torch.distributed.run --nnodes="$NNODES" --nproc-per-node="$TASKS_PER_NODE" \
  --rdzv-backend=c10d --rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT" --rdzv-id="$SLURM_JOB_ID" \
  /opt/sitestack-golden/bin/sitestack-bind-rank --cpu-masks "$CPU_MASKS" -- python -u train.py   # your program and its arguments
