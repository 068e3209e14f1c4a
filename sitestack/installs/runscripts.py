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
  removed each other's; the one rule, :mod:`sitestack.model.miopen`), made private by the first rank
  on the node and refused where another user made it first (no rank waits for another).
- Slurm's values are checked for their form before use (:mod:`sitestack.validation.runtime_checks`):
  a bad one stops the rank with one message naming it.
- The site's NCCL_* and FI_* settings come from its facts (``facts.env``).

Like the site's, both scripts run ``$WITH_CONDA`` before Python (:func:`activate`), so what the
image's conda activation sets is there; the stack's venv stays first on PATH.
"""

from __future__ import annotations

import shlex

from sitestack.core.quoting import sh_default, sh_expanding
from sitestack.core.shipped import shipped
from sitestack.model.facts import Facts
from sitestack.model.miopen import miopen_cache
from sitestack.validation import runtime_checks
from sitestack.validation.jobs import PORT_BASE, PORT_SPAN
from sitestack.validation.runtime_checks import MAX_COUNT, MAX_ID


def activate(facts: Facts) -> str:
    """Shell lines that activate the image's conda environment, as the site's run scripts do
    (``$WITH_CONDA`` first), and keep the stack's venv first on PATH.

    ``WITH_CONDA`` is what the image defines (LUMI's images: ``source /opt/miniconda3/bin/activate
    pytorch``); where the image defines none, facts.container.with_conda. Activation puts the conda
    env's ``bin`` in front of the PATH the module set, so the venv the module put first (the Python
    found before activation, when it is a venv: its ``pyvenv.cfg``) is put back in front."""
    fallback = facts.container.with_conda if facts.container else None
    default = f'[ -n "${{WITH_CONDA:-}}" ] || WITH_CONDA={shlex.quote(fallback)}\n' if fallback else ""
    return (f"# The image's conda environment, activated first as the site's own run scripts do.\n{default}"
            'venv=$(command -v python 2>/dev/null || true); venv=${venv%/bin/python}\n'
            '[ -n "$venv" ] && [ -f "$venv/pyvenv.cfg" ] || venv=\n'
            "# WITH_CONDA runs as a command, its words split and never parsed (the site's scripts run it so);\n"
            "# only the form images define is run: source FILE [ENV] (or . FILE [ENV]), no wildcards\n"
            'case ${WITH_CONDA:-} in\n'
            "  *[*?[]*) ;;\n"
            "  ''|'source '?*|'. '?*) with_conda=ok ;;\n"
            'esac\n'
            '[ -n "${with_conda:-}" ] || { echo "${0##*/}: WITH_CONDA must be \'source FILE [ENV]\' (no wildcards)" >&2; exit 1; }\n'
            "$WITH_CONDA\n"
            '# the stack venv the module put first on the container\'s PATH stays first\n'
            'if [ -n "$venv" ]; then export PATH="$venv/bin:$PATH" VIRTUAL_ENV=$venv; fi\n')


def simple(site: str, facts: Facts) -> str:
    return (f"#!/bin/bash -e\n# conda-python-simple, written by sitestack for {site}: the container's Python (the\n"
            "# stack's venv first on PATH, set by the module) with this script's arguments. Run it in the\n"
            "# container: singularity exec $SIF conda-python-simple -c 'import torch'\n"
            f'{activate(facts)}exec python "$@"\n')


def distributed(site: str, facts: Facts) -> str:
    """``conda-python-distributed``: one rank of a Slurm job step (srun), then Python."""
    # a value the rank's environment already has (not empty) is kept, as the module and the launch helper keep it
    env = [f"export {k}={sh_default(k, v)}" for k, v in sorted(facts.env.items()) if k.startswith(("NCCL_", "FI_"))]
    checks = runtime_checks.functions("number", "word", "private_dir")
    gpu = "export ROCR_VISIBLE_DEVICES=$SLURM_LOCALID   # one GCD per task (LUMI)\n" \
        if facts.gpu.vendor == "amd" else ""
    return f"""#!/bin/bash -e
# conda-python-distributed, written by sitestack for {site}: sets up one rank of a distributed
# PyTorch job started by srun, then runs the container's Python with this script's arguments:
#   srun singularity exec $SIF conda-python-distributed -u train.py
here=$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)
: "${{SLURM_PROCID:?run me under srun}}"
# Every value read from Slurm is checked for its form first (runtime_checks: bash would evaluate the
# text of SLURM_JOB_ID in $(( )) as an expression); a bad one is one message naming it.
{checks}
P=conda-python-distributed
_sitestack_number $P SLURM_PROCID "$SLURM_PROCID" 0 {MAX_ID} || exit 1
_sitestack_number $P SLURM_JOB_ID "${{SLURM_JOB_ID:-x}}" 0 {MAX_ID} || exit 1
_sitestack_number $P SLURM_LOCALID "${{SLURM_LOCALID:-x}}" 0 {MAX_ID} || exit 1
_sitestack_number $P SLURM_NTASKS "${{SLURM_NTASKS:-}}" 1 {MAX_ID} || exit 1
_sitestack_number $P SLURM_NPROCS "${{SLURM_NPROCS:-}}" 1 {MAX_ID} || exit 1
_sitestack_number $P SLURM_NTASKS_PER_NODE "${{SLURM_NTASKS_PER_NODE:-}}" 1 {MAX_COUNT} || exit 1
first=${{SLURM_TASKS_PER_NODE:-}}; first=${{first%%[(,]*}}  # the first count: 8 of "8(x2),4"
_sitestack_number $P SLURM_TASKS_PER_NODE "$first" 1 {MAX_COUNT} || exit 1
{activate(facts)}# Rank, world size and local rank from Slurm.
export RANK=$SLURM_PROCID
export WORLD_SIZE=${{SLURM_NTASKS:-$SLURM_NPROCS}}
export LOCAL_RANK=$SLURM_LOCALID
export LOCAL_WORLD_SIZE=${{SLURM_NTASKS_PER_NODE:-$first}}
# The first host of the job; get-master parses Slurm's hostlist syntax (no scontrol in the container) and
# refuses a list it cannot read (exit 2, one message).
if [ -n "${{SLURM_JOB_NODELIST:-}}" ]; then nodes=SLURM_JOB_NODELIST; else nodes=SLURM_NODELIST; fi
MASTER_ADDR=$("$here/get-master" --name "$nodes" -- "${{SLURM_JOB_NODELIST:-${{SLURM_NODELIST:-}}}}") || exit 1
export MASTER_ADDR
# Unique per job, so that two jobs can share a node (below the ephemeral port range).
export MASTER_PORT=$(( {PORT_BASE} + SLURM_JOB_ID % {PORT_SPAN} ))
# MIOpen's cache needs file locking that Lustre lacks: node-local, per job (LUMI), this user's and private
# (another user could make the directory first: refused); whichever rank comes first on the node makes it.
miopen_user=$(id -un)
_sitestack_word $P "the user name" "$miopen_user" || exit 1
export MIOPEN_USER_DB_PATH={sh_expanding(miopen_cache(facts, user="${miopen_user}") or "")}
export MIOPEN_CUSTOM_CACHE_DIR=$MIOPEN_USER_DB_PATH
_sitestack_private_dir $P "$MIOPEN_USER_DB_PATH" || exit 1
{gpu}# The site's network settings (facts.env).
{chr(10).join(env)}
exec python "$@"
"""


def scripts(site: str, facts: Facts) -> dict[str, tuple[str, int]]:
    """name -> (text, mode) of the run scripts, get-master and the on-site package it runs from
    (:func:`sitestack.core.shipped.shipped`: ``onsite/`` holds the host-list parser)."""
    return {"conda-python-simple": (simple(site, facts), 0o755),
            "conda-python-distributed": (distributed(site, facts), 0o755), **shipped(("get-master",))}
