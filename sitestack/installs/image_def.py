"""The definition file of a site's image (Dawn's Apptainer image from Intel's PyTorch XPU image,
https://github.com/kh296/dawn-containers), rendered from ``facts.container.build``, and the batch script that builds it on a node.

The definition (Apptainer docs, "Definition files")::

    Bootstrap: docker
    From: intel/intel-extension-for-pytorch:2.8.10-xpu
    %post          the site's extra pip packages (Dawn's README, s2.1)
    %environment   the site's variables, each a default: export NAME="${NAME:-value}"
    %labels        org.sitestack.definition-sha256: the sha256 of everything above it

The label makes the image say which definition it was built from: the apptainer-image step reads it
back (``inspect --labels``) to decide whether the image is current, so an image replaced by hand or
built from an older definition is rebuilt, and a re-run with the same facts builds nothing.

Every ``%environment`` entry keeps a value the caller passes in. Apptainer runs ``%environment`` after
it has copied the host's environment in, so a plain ``export`` there overrides the caller's choice
(Apptainer docs, "Environment and metadata"): a Dawn job submitted with
``ZE_FLAT_DEVICE_HIERARCHY=COMPOSITE`` (one rank per card, https://github.com/kh296/dawn-containers)
would run with the image's FLAT. The image's values are what the image falls back on when run
by hand without the stack's module or a job; sitestack's jobs and launch helper also pass the
choice as ``APPTAINERENV_NAME``, which wins over ``%environment`` (also in images built before).
"""

from __future__ import annotations

import hashlib

from sitestack.core.errors import SitestackError
from sitestack.core.quoting import sh, sh_default, sh_expanding
from sitestack.model.container_facts import IMAGE_BASES, ImageBuild, Runtime

DIGEST_LABEL = "org.sitestack.definition-sha256"


def definition(site: str, build: ImageBuild) -> tuple[str, str]:
    """(text of the definition file, the sha256 its label carries)."""
    if build.base not in IMAGE_BASES:  # the facts' check refuses it at load time; this is for direct callers
        raise SitestackError(f"unknown base image {build.base!r} (known: {', '.join(IMAGE_BASES)})")
    agent, source = IMAGE_BASES[build.base]
    lines = [f"Bootstrap: {agent}", f"From: {source.format(version=build.version)}", "",
             f"# Written by sitestack for {site} from facts.container.build; do not edit.", ""]
    if build.packages:
        lines += ["%post",
                  "    export PIP_ROOT_USER_ACTION=ignore",
                  "    export PIP_NO_CACHE_DIR=1",
                  "    python -m pip install " + " ".join(sh(p) for p in build.packages), ""]
    if build.environment:
        lines += ["%environment", *(f"    export {k}={sh_default(k, v)}" for k, v in sorted(build.environment.items())),
                  ""]
    body = "\n".join(lines) + "\n"
    digest = hashlib.sha256(body.encode()).hexdigest()
    return body + f"%labels\n    org.sitestack.site {site}\n    {DIGEST_LABEL} {digest}\n", digest


def build_job(runtime: Runtime, *, out: str, definition_file: str, scratch: str, sbatch: list[str]) -> str:
    """The batch script that builds ``out`` from ``definition_file`` on a compute node, with the
    runtime's temporary directory on node-local storage (/ramdisks on Dawn)."""
    tmpdir = f"{runtime.prefix}_TMPDIR"
    head = "\n".join(f"#SBATCH {line}" for line in sbatch)
    return f"""#!/bin/bash
{head}
# Written by sitestack: builds {out} from {definition_file}.
set -euo pipefail
export {tmpdir}={sh_expanding(scratch)}/"sitestack-image-$SLURM_JOB_ID"
mkdir -p -- "${tmpdir}"
trap 'rm -rf -- "${tmpdir}"' EXIT
{" ".join(sh(a) for a in runtime.build_argv(out, definition_file))}
"""
