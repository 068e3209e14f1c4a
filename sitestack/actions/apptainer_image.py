"""The ``apptainer-image`` action: the site's image built from a definition file rendered from its
facts (Dawn, https://github.com/kh296/dawn-containers: ``apptainer build pytorch2.8.sif pytorch2.8.def`` from Intel's PyTorch XPU
image; definition: :mod:`sitestack.installs.image_def`).

- The definition file is written beside the image (``<image without .sif>.def``).
- The image is current when its ``org.sitestack.definition-sha256`` label (``<runtime> inspect
  --labels``) is the digest of the definition: a re-run builds nothing, a changed package list or
  base version rebuilds, and check mode reports a missing or stale image as "would build".
- The build goes to a temporary file beside the image, its label is checked, and it is renamed
  into place: the old image stays in use until the new one is complete, and a failed build leaves
  no partial file.
- ``facts.container.build.where``: ``login`` builds on the step's host; ``slurm`` submits the build
  as a batch job and waits for it (``sbatch --wait``), with the runtime's temporary directory on
  the node's local scratch (Dawn's build puts APPTAINER_TMPDIR on /ramdisks).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sitestack.actions.action import Action, log_name, unified_diff
from sitestack.core.errors import CommandFailed, InputError, SitestackError
from sitestack.core.host import Host
from sitestack.installs.container import container_of, parse_labels
from sitestack.installs.image_def import DIGEST_LABEL, build_job, definition
from sitestack.model.container_facts import runtime_of
from sitestack.model.context import RunContext
from sitestack.model.site import StepSpec, expand


class ApptainerImage(Action):
    """The site's image (facts.container.image) built from the definition its facts describe."""

    action = "apptainer-image"

    @dataclass(frozen=True)
    class Args:
        pass

    def __init__(self, spec: StepSpec, args: Any, ctx: RunContext) -> None:
        super().__init__(spec, args, ctx)
        c = container_of(ctx.facts, "the apptainer-image step")
        if c.build is None or not c.image:
            raise InputError(f"{ctx.site.path}:{spec.line}", "apptainer-image needs facts.container.build (the "
                             "definition) and facts.container.image (where the image goes)", key="facts.container")
        self.build = c.build
        self.runtime = runtime_of(c)
        self.image = expand(c.image, ctx.values)
        self.folder, self.file = os.path.split(self.image)
        stem = self.file[:-4] if self.file.endswith(".sif") else self.file
        self.definition_file = f"{self.folder}/{stem}.def"
        self.text, self.digest = definition(ctx.site.name, c.build)

    def describe(self) -> str:
        return f"build {self.image} from {self.definition_file}"

    def rendered(self, earlier: Mapping[str, str]) -> dict[str, tuple[str, int]]:
        """The definition file (the image is built from it on the site)."""
        return {self.definition_file: (self.text, 0o644)}

    def _built_from(self, host: Host, image: str) -> str | None:
        """The definition digest the image at ``image`` carries (None: no image, or no label)."""
        if not host.exists(image):
            return None
        out = host.probe(self.runtime.inspect_labels_argv(image), timeout=300)
        return parse_labels(out.stdout).get(DIGEST_LABEL) if out.ok else None

    def pending(self, host: Host) -> str | None:
        if not host.exists(self.image):
            return f"would build: {self.image} missing"
        got = self._built_from(host, self.image)
        if got != self.digest:
            return (f"would build: {self.image} was built from another definition "
                    f"({got[:12] if got else 'no sitestack label'}, want {self.digest[:12]})")
        if host.read_text(self.definition_file) != self.text:
            return f"{self.definition_file} differs"
        return None

    def diff(self, host: Host) -> str | None:
        return unified_diff(host.read_text(self.definition_file), self.text, self.definition_file)

    def apply(self, host: Host) -> None:
        host.run(["mkdir", "-p", "--", self.folder])
        host.write_text(self.definition_file, self.text)
        if self._built_from(host, self.image) == self.digest:
            return
        log = self.ctx.log_dir / log_name(self.name) if self.ctx.log_dir else None
        token = secrets.token_hex(4)
        tmp = f"{self.folder}/.{self.file}.tmp-{token}"
        script = f"{self.folder}/.{self.file}.build-{token}.sbatch"
        self.ctx.note(f"{self.runtime.command} build {self.image} ({self.build.where})")
        try:
            if self.build.where == "slurm":
                self._in_job(host, tmp, script, log)
            else:
                host.run(self.runtime.build_argv(tmp, self.definition_file), log=log)
            if self._built_from(host, tmp) != self.digest:
                raise SitestackError(f"the image built at {tmp} does not carry the definition's digest label")
            host.run(["mv", "-T", "--", tmp, self.image])
        finally:
            host.probe(["rm", "-f", "--", tmp, script])

    def _in_job(self, host: Host, tmp: str, script: str, log: Any) -> None:
        """Build in a batch job on a compute node; wait for it."""
        sched = self.ctx.facts.scheduler
        job_log = f"{self.folder}/.{self.file}.build.log"
        sbatch = ["--job-name=sitestack-image", "--nodes=1", "--ntasks=1", f"--time={self.build.time}",
                  f"--output={job_log}"]
        if sched.partition:
            sbatch.append(f"--partition={expand(sched.partition, self.ctx.values)}")
        if sched.account:
            sbatch.append(f"--account={expand(sched.account, self.ctx.values)}")
        sbatch += [expand(o, self.ctx.values) for o in self.build.slurm_options]
        scratch = self.ctx.facts.node.local_scratch or "/tmp"
        host.write_text(script, build_job(self.runtime, out=tmp, definition_file=self.definition_file,
                                          scratch=scratch, sbatch=sbatch), 0o755)
        try:
            host.run(["sbatch", "--wait", script], log=log)
        except CommandFailed as exc:
            tail = "\n".join((host.read_tail(job_log, 1 << 16) or "").rstrip().splitlines()[-15:])
            raise SitestackError(f"the image build job failed (exit {exc.rc}); job log {job_log}:\n{tail}") from None
