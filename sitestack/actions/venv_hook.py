"""The ``venv-hook`` action: the extend-venv-activate command in the stack's ``bin/``.

The command is ``sitestack/onsite/activate_hook.py``, installed into the stack (:func:`hook_files`):
the on-site modules it imports under ``<stack>/share/sitestack/onsite/``, this site's settings
(:func:`hook_config`) beside them as JSON, and ``<stack>/bin/extend-venv-activate``, the launcher
that runs it (:func:`sitestack.core.shipped.installed`). Run by a user, it extends their own venv so
that activating it loads the stack's module, and deactivating restores the environment as it was.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sitestack.actions.action import Action, files_diff, files_pending, under, write_files
from sitestack.core.errors import SitestackError
from sitestack.core.host import Host
from sitestack.core.shipped import installed
from sitestack.installs.venv_stack import Stack, generation_var, module_root, require_module_system, stack_for
from sitestack.model.context import RunContext
from sitestack.model.site import StepSpec
from sitestack.model.siteenv import INIT_CANDIDATES
from sitestack.onsite.activate import COMMAND, SETTINGS

#: Where in the stack the command's modules (``onsite/``) and settings are, relative to its root.
PACKAGE = "share/sitestack"


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


def hook_files(config: dict[str, Any]) -> dict[str, tuple[str, int]]:
    """The command's files, relative to the stack's root -> (text, mode): its modules, its settings
    ``config``, and last the launcher ``bin/extend-venv-activate`` (written in this order, the command
    is never there before what it runs)."""
    files = installed(COMMAND, package=PACKAGE)
    launcher = files.pop(f"bin/{COMMAND}")
    files[f"{PACKAGE}/{SETTINGS}"] = (json.dumps(config, indent=4, sort_keys=True) + "\n", 0o644)
    files[f"bin/{COMMAND}"] = launcher
    return files


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
        self.path = f"{self.stack.bin}/{COMMAND}"

    def describe(self) -> str:
        return f"install {self.path}"

    def files(self) -> dict[str, tuple[str, int]]:
        return hook_files(hook_config(self.ctx, self.stack))

    def rendered(self, earlier: Mapping[str, str]) -> dict[str, tuple[str, int]]:
        return under(self.stack.path, self.files())

    def pending(self, host: Host) -> str | None:
        require_module_system(facts=self.ctx.facts)
        reasons = [f"{self.stack.path}/{reason}" for reason in files_pending(host, self.stack.path, self.files())]
        if reasons:
            return "; ".join(reasons[:2]) + (f"; and {len(reasons) - 2} more" if len(reasons) > 2 else "")
        mode = self._mode(host)
        return None if mode is None else f"{self.path} mode {mode}, want 755"

    def _mode(self, host: Host) -> str | None:
        """The command's mode where it is not 755 (None: it is, or ``stat`` cannot say)."""
        out = host.probe(["stat", "-c", "%a", "--", self.path])
        return out.stdout.strip() if out.ok and out.stdout.strip() != "755" else None

    def diff(self, host: Host) -> str | None:
        return files_diff(host, self.stack.path, self.files())

    def apply(self, host: Host) -> None:
        if not host.exists(f"{self.stack.bin}/python"):
            raise SitestackError(f"the stack environment {self.stack.path} is not installed (run the stack-venv "
                                 f"step first: invoke install-venv --site {self.ctx.site.name})")
        files = self.files()
        write_files(host, self.stack.path, files)
        if self._mode(host) is not None:
            host.write_text(self.path, files[f"bin/{COMMAND}"][0], 0o755)


__all__ = ["VenvHook", "hook_config", "hook_files"]
