"""The ``venv-hook`` action: the extend-venv-activate command in the stack's ``bin/``.

The command is ``sitestack/onsite/activate_hook.py`` with this site's settings filled in
(:func:`hook_config`): run by a user, it extends their own venv so that activating it loads the
stack's module, and deactivating restores the environment as it was.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from sitestack.actions.action import Action, unified_diff
from sitestack.core.errors import SitestackError
from sitestack.core.host import Host
from sitestack.installs.venv_stack import Stack, generation_var, module_root, require_module_system, stack_for
from sitestack.model.context import RunContext
from sitestack.model.site import StepSpec
from sitestack.model.siteenv import INIT_CANDIDATES
from sitestack.onsite import activate_hook


def hook_config(ctx: RunContext, stack: Stack) -> dict[str, Any]:
    """What the installed extend-venv-activate needs to know about the stack and the site."""
    mods = ctx.facts.modules
    bash_inits = [mods.init] if mods.init else list(INIT_CANDIDATES)
    inits: dict[str, list[str]] = {"bash": [], "zsh": [], "fish": [], "csh": []}
    for path in bash_inits:
        head, tail = os.path.split(path)
        if tail == "bash":
            for shell in inits:
                inits[shell].append(f"{head}/{shell}")
        else:  # e.g. /etc/profile.d/modules.sh: sh syntax
            inits["bash"].append(path)
            inits["zsh"].append(path)
    roots = [*mods.use, module_root(ctx)]
    container = stack.source == "container"
    return {
        "site": ctx.site.name,
        "module": stack.name,
        "module_roots": list(dict.fromkeys(roots)),
        "init": inits,
        "python_version": stack.python_version,
        "stack": stack.path,
        # A user's venv is based on the stack's base Python: activation puts the stack's packages after the venv's
        # on PYTHONPATH (the module does not: a copy staged on node-local storage must import its own).
        "site_packages": None if container else stack.site_packages,
        # ... those of the generation the module loaded, named by this variable, so that a user's job keeps the
        # generation it loaded through an upgrade; the stable site-packages when the module does not set it.
        "generation_var": None if container else generation_var(stack),
    }


class VenvHook(Action):
    """The extend-venv-activate command in the stack's bin/: extends a user's venv so that activating it
    loads the stack's module and deactivating restores the environment."""

    action = "venv-hook"

    @dataclass(frozen=True)
    class Args:
        name: str | None = field(default=None, metadata={"doc": "the stack's name, as the stack-venv step has it"})

    def __init__(self, spec: StepSpec, args: Any, ctx: RunContext) -> None:
        super().__init__(spec, args, ctx)
        self.stack = stack_for(ctx, args.name)
        self.path = f"{self.stack.bin}/{activate_hook.COMMAND}"

    def describe(self) -> str:
        return f"install {self.path}"

    def render(self) -> str:
        return activate_hook.render_command(hook_config(self.ctx, self.stack))

    def pending(self, host: Host) -> str | None:
        require_module_system(facts=self.ctx.facts)
        current = host.read_text(self.path)
        if current is None:
            return f"{self.path} missing"
        if current != self.render():
            return f"{self.path} differs"
        out = host.probe(["stat", "-c", "%a", "--", self.path])
        if out.ok and out.stdout.strip() != "755":
            return f"{self.path} mode {out.stdout.strip()}, want 755"
        return None

    def diff(self, host: Host) -> str | None:
        return unified_diff(host.read_text(self.path), self.render(), self.path)

    def apply(self, host: Host) -> None:
        if not host.exists(f"{self.stack.bin}/python"):
            raise SitestackError(f"the stack environment {self.stack.path} is not installed (run the stack-venv "
                                 f"step first: invoke install-venv --site {self.ctx.site.name})")
        host.write_text(self.path, self.render(), 0o755)


__all__ = ["VenvHook", "hook_config"]
