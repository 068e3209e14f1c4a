"""``invoke job-template``: a site's job script for users to copy (docs/launch.md).

The script is rendered for the local user's view of the site (its prefix, the helpers' paths as
the playbook's install-launch-env step installs them); it sources ``sitestack-launch-env`` and
loads the stack module the way users do.
"""

from __future__ import annotations

from sitestack.actions import ACTIONS
from sitestack.actions.launch_env import launch_inputs
from sitestack.core import user_file
from sitestack.core.errors import InputError
from sitestack.model.context import RunContext, RunOptions
from sitestack.model.site import Site, host_env_defaults
from sitestack.onsite.launchers import TEMPLATE_LAUNCHERS, in_words
from sitestack.validation.launch_helpers import render_job_template


def job_template(site: Site, options: RunOptions, launcher: str | None = None) -> str:
    """The job script of ``site`` starting its ranks with ``launcher`` (one of
    :data:`~sitestack.validation.launch_helpers.TEMPLATE_LAUNCHERS`; None: the site's own); InputError
    where the playbook installs no launch helpers."""
    spec = next((s for s in site.steps if s.action == "install-launch-env"), None)
    if spec is None:
        raise InputError(site.path, "the playbook has no install-launch-env step, so there is no launch helper "
                         "for a job to source")
    home, user = host_env_defaults()
    ctx = RunContext.resolve(site, home=home, user=user, account=options.account, prefix=options.prefix,
                             options=options, actions=ACTIONS)
    args = ACTIONS[spec.action].from_spec(spec, ctx).args
    return render_job_template(launch_inputs(ctx, args.dir), launcher)


def check_launcher(launcher: str | None) -> None:
    """``--launcher``: one of :data:`~sitestack.onsite.launchers.TEMPLATE_LAUNCHERS` or None (InputError)."""
    if launcher is not None and launcher not in TEMPLATE_LAUNCHERS:
        raise InputError("--launcher", f"must be {in_words(TEMPLATE_LAUNCHERS)}, not {launcher!r}")


def check_output(output: str | None) -> None:
    """``--output``: a regular file (or a new one) in a directory that exists, or ``-`` for stdout;
    checked before the script is rendered (:func:`sitestack.core.user_file.check`)."""
    user_file.check("--output", output)


def write_template(text: str, output: str) -> None:
    """Write the script to ``output`` by the one rule of :mod:`sitestack.core.user_file` (a new
    file is executable, 0755 less the umask, as a job script is run)."""
    user_file.write("--output", output, text, mode=0o755)
