"""Every action a playbook step can name: one module per action, one explicit table.

Adding an action means writing its module and adding one line to :data:`ACTIONS`; nothing
registers itself on import, so the table is the same whichever module is imported first. Each
module is imported the first time a playbook names its action.
"""

from __future__ import annotations

from sitestack.actions.action import Action
from sitestack.core.lazytable import LazyTable

#: action name (as playbooks write it) -> the Action class (imported when a playbook first names it:
#: a no-op provision of one site need not import the others' actions; :mod:`sitestack.core.lazytable`).
ACTIONS: LazyTable[type[Action]] = LazyTable({
    "directory": "sitestack.actions.directory:Directory",
    "require-tools": "sitestack.actions.require_tools:RequireTools",
    "modules-available": "sitestack.actions.modules_available:ModulesAvailable",
    "site-facts": "sitestack.actions.site_facts:SiteFacts",
    "apt-packages": "sitestack.actions.apt_packages:AptPackages",
    "command": "sitestack.actions.command:Command",
    "recipe-install": "sitestack.actions.recipe_install:RecipeInstall",
    "stack-venv": "sitestack.actions.stack_venv:StackVenv",
    "venv-hook": "sitestack.actions.venv_hook:VenvHook",
    "modulefiles": "sitestack.actions.modulefiles:ModuleFiles",
    "install-validation-job": "sitestack.actions.validation_job:InstallValidationJob",
    "stage-archive": "sitestack.actions.stage_archive:MakeStageArchive",
    "install-launch-env": "sitestack.actions.launch_env:InstallLaunchEnv",
    "pack-env": "sitestack.actions.pack_env:PackEnv",
    "container-image": "sitestack.actions.container_image:ContainerImage",
    "apptainer-image": "sitestack.actions.apptainer_image:ApptainerImage",
})

__all__ = ["ACTIONS", "Action"]
