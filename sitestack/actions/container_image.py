"""The ``container-image`` action: the site's container image installed into the prefix, checked by
sha256, and the run scripts of the container module (LUMI's PyTorch container module,
https://lumi-supercomputer.github.io/LUMI-EasyBuild-docs/p/PyTorch/; its easyconfigs copy the SIF and write the scripts:
https://github.com/Lumi-supercomputer/LUMI-EasyBuild-containers/tree/main/easybuild/easyconfigs/p/PyTorch).

- ``facts.container.source`` (the site's central copy) is copied to ``facts.container.image``
  (``install: copy``: the user decides when it goes away, as LUMI's module does), or linked there
  (``install: link``). The copy is made beside the image under a temporary name, its sha256
  checked, and renamed into place: a reader sees the old image or the new one.
- ``facts.container.sha256``, when set, must match: a source that differs is refused with one
  message and nothing is installed. The digest found is recorded in a stamp beside the image
  (``.<image name>.json``) with the source's size and modification time, so a re-run does not
  hash a multi-GB image again unless the source changed.
- ``<prefix>/runscripts``: conda-python-simple, conda-python-distributed, get-master
  (:mod:`sitestack.installs.runscripts`).
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sitestack.actions.action import Action, under
from sitestack.core.errors import InputError, SitestackError
from sitestack.core.host import Host
from sitestack.installs.container import container_of
from sitestack.installs.runscripts import scripts
from sitestack.model.context import RunContext
from sitestack.model.site import StepSpec, expand


class ContainerImage(Action):
    """The site's image at facts.container.image (copied or linked from its source, sha256 checked),
    and the run scripts in <prefix>/runscripts."""

    action = "container-image"

    @dataclass(frozen=True)
    class Args:
        runscripts: bool = field(default=True, metadata={"doc": "install conda-python-simple, "
                                                                "conda-python-distributed and get-master"})

    def __init__(self, spec: StepSpec, args: Any, ctx: RunContext) -> None:
        super().__init__(spec, args, ctx)
        c = container_of(ctx.facts, "the container-image step")
        if not c.source or not c.image:
            raise InputError(f"{ctx.site.path}:{spec.line}", "container-image needs facts.container.source (the "
                             "site's image) and facts.container.image (where it is installed)", key="facts.container")
        self.container = c
        self.source = expand(c.source, ctx.values)
        self.image = expand(c.image, ctx.values)
        folder, name = os.path.split(self.image)
        self.stamp = f"{folder}/.{name}.json"
        self.runscripts_dir = f"{ctx.values['prefix'].rstrip('/')}/runscripts"

    def describe(self) -> str:
        return f"install {self.source} at {self.image}"

    def rendered(self, earlier: Mapping[str, str]) -> dict[str, tuple[str, int]]:
        """The run scripts (the image is copied or linked from the site's own)."""
        return under(self.runscripts_dir, scripts(self.ctx.site.name, self.ctx.facts)) if self.args.runscripts else {}

    def _source_stat(self, host: Host) -> str | None:
        out = host.probe(["stat", "-L", "-c", "%s %Y", "--", self.source])
        return out.stdout.strip() if out.ok else None

    def pending(self, host: Host) -> str | None:
        """Why the image or the run scripts need installing; SitestackError where the source is gone from
        the site (an archived image removed): that fails this step (and, of a further stack, only that
        stack's steps: core/step.py), in check mode too, rather than planning a copy of nothing."""
        c = self.container
        reasons = []
        if self._source_stat(host) is None:
            raise SitestackError(f"no such image: {self.source} (facts.container.source) is not on the host; "
                                 "the site may have removed or archived it: point the stack at an image it has")
        stamp = host.read_json(self.stamp)
        if c.install == "link":
            if host.probe(["readlink", "--", self.image]).stdout.strip() != self.source:
                reasons.append(f"{self.image} is not a link to {self.source}")
        elif not host.exists(self.image):
            reasons.append(f"{self.image} missing")
        if not reasons:
            if stamp is None or stamp.get("source") != self.source or stamp.get("install") != c.install:
                reasons.append("not installed from this source yet")
            elif c.sha256 and stamp.get("sha256") != c.sha256:
                reasons.append(f"sha256 {stamp.get('sha256')} is not facts.container.sha256 {c.sha256}")
            elif stamp.get("source_stat") != self._source_stat(host):
                reasons.append(f"{self.source} changed")
        if self.args.runscripts:
            for name, (text, _) in scripts(self.ctx.site.name, self.ctx.facts).items():
                if host.read_text(f"{self.runscripts_dir}/{name}") != text:
                    reasons.append(f"runscripts/{name} differs")
        return "; ".join(reasons) or None

    def _sha256(self, host: Host, path: str) -> str:
        out = host.probe(["sha256sum", "--", path], timeout=None)
        if not out.ok:
            raise SitestackError(f"cannot read {path}: {out.stderr.strip()}")
        return out.stdout.split()[0]

    def apply(self, host: Host) -> None:
        c = self.container
        stat = self._source_stat(host)
        if stat is None:
            raise SitestackError(f"{self.source}: no such image (facts.container.source) on {host.name}")
        stamp = host.read_json(self.stamp)
        installed = host.exists(self.image) or host.probe(["test", "-L", self.image]).ok
        current = (stamp is not None and installed and stamp.get("source") == self.source
                   and stamp.get("install") == c.install and stamp.get("source_stat") == stat
                   and (not c.sha256 or stamp.get("sha256") == c.sha256))
        if not current:
            self._install(host, stat)
        if self.args.runscripts:
            files = scripts(self.ctx.site.name, self.ctx.facts)  # get-master's onsite/ package included
            folders = sorted({os.path.dirname(f"{self.runscripts_dir}/{name}") for name in files})
            host.run(["mkdir", "-p", "--", *folders])
            for name, (text, mode) in files.items():
                host.write_text(f"{self.runscripts_dir}/{name}", text, mode)

    def _install(self, host: Host, stat: str) -> None:
        c = self.container
        self.ctx.note(f"sha256 of {self.source}")
        digest = self._sha256(host, self.source)
        if c.sha256 and digest != c.sha256:
            raise SitestackError(f"{self.source}: sha256 is {digest}, but facts.container.sha256 is {c.sha256}: "
                                 "not installed (a different or corrupted image)")
        folder, name = os.path.split(self.image)
        tmp = f"{folder}/.{name}.tmp-{secrets.token_hex(4)}"
        host.run(["mkdir", "-p", "--", folder])
        try:
            if c.install == "link":
                host.run(["ln", "-s", "--", self.source, tmp])
            else:
                self.ctx.note(f"copying {self.source} to {self.image}")
                host.run(["cp", "--", self.source, tmp])
                copied = self._sha256(host, tmp)
                if copied != digest:
                    raise SitestackError(f"{tmp}: the copy's sha256 {copied} differs from the source's {digest}")
            host.run(["mv", "-T", "--", tmp, self.image])
        except BaseException:
            host.probe(["rm", "-f", "--", tmp])
            raise
        record = {"source": self.source, "install": c.install, "sha256": digest, "source_stat": stat}
        host.write_text(self.stamp, json.dumps(record, indent=2, sort_keys=True) + "\n")
