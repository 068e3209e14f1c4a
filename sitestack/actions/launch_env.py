"""The ``install-launch-env`` action: the users' launch helpers in ``{prefix}/bin``
(:mod:`sitestack.validation.launch_helpers`; docs/launch.md).

One step makes true: ``<dir>/sitestack-launch-env`` (sourced), ``<dir>/sitestack-launch``
(a wrapper that sources it and runs a command) and, on a site that stages its env on node-local
storage, ``<dir>/sitestack-stage-env``, each as rendered from the site's facts. Files are compared
before they are written.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sitestack.actions.action import Action, files_diff, files_pending, under, write_files
from sitestack.core import placeholders
from sitestack.core.host import Host
from sitestack.core.quoting import in_prefix_problem
from sitestack.installs.site_stack import job_inputs, site_stack
from sitestack.installs.staging import stack_packs
from sitestack.installs.venv_stack import module_root
from sitestack.model.context import RunContext
from sitestack.model.site import expand
from sitestack.validation.launch_helpers import LaunchInputs, helper_files

#: {user} and {home} in a helper are the job's, not the installer's: a shared stack serves every user.
RUNTIME = {"user": "${USER}", "home": "${HOME}"}


def launch_inputs(ctx: RunContext, bin_dir: str) -> LaunchInputs:
    """The helpers' inputs for a run context (the same late-bound facts.env as the validation job)."""
    env = job_inputs(ctx, "", None).env
    raw = ((ctx.site.raw_facts or {}).get("node") or {}).get("local_scratch")
    scratch = expand(placeholders.bind_early(str(raw), ctx.values, ("home", "user")), RUNTIME) if raw else None
    stack = site_stack(ctx)
    return LaunchInputs(
        site=ctx.site.name, facts=ctx.facts, bin=bin_dir.rstrip("/"), env=env, scratch=scratch,
        packs=stack_packs(ctx) if ctx.facts.node.stage_env else (), stack_module=stack.name if stack else "",
        module_root=module_root(ctx))


class InstallLaunchEnv(Action):
    """The users' launch helpers (sitestack-launch-env, sitestack-launch, sitestack-stage-env) are installed."""

    action = "install-launch-env"
    own_stack = True   # the playbook's own stack (docs/playbooks.md): a step's `stack:` is refused

    @dataclass(frozen=True)
    class Args:
        dir: str = field(default="{prefix}/bin", metadata={"doc": "where the helpers are installed"})

        def check(self) -> str | None:
            return in_prefix_problem(self.dir, "dir")

    def describe(self) -> str:
        return f"install the launch helpers in {self.args.dir}"

    def files(self) -> dict[str, tuple[str, int]]:
        return helper_files(launch_inputs(self.ctx, self.args.dir))

    def rendered(self, earlier: Mapping[str, str]) -> dict[str, tuple[str, int]]:
        return under(self.args.dir, self.files())

    def pending(self, host: Host) -> str | None:
        return "; ".join(files_pending(host, self.args.dir, self.files())) or None

    def diff(self, host: Host) -> str | None:
        return files_diff(host, self.args.dir, self.files())

    def apply(self, host: Host) -> None:
        write_files(host, self.args.dir, self.files())
