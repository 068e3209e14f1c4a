"""Every action a playbook step can name: one module per action, one explicit table.

Adding an action means writing its module and adding one line to :data:`ACTIONS`; nothing
registers itself on import, so the table is the same whichever module is imported first.
"""

from __future__ import annotations

from sitestack.actions.action import Action
from sitestack.actions.apptainer_image import ApptainerImage
from sitestack.actions.apt_packages import AptPackages
from sitestack.actions.command import Command
from sitestack.actions.container_image import ContainerImage
from sitestack.actions.directory import Directory
from sitestack.actions.launch_env import InstallLaunchEnv
from sitestack.actions.modulefiles import ModuleFiles
from sitestack.actions.modules_available import ModulesAvailable
from sitestack.actions.pack_env import PackEnv
from sitestack.actions.recipe_install import RecipeInstall
from sitestack.actions.require_tools import RequireTools
from sitestack.actions.site_facts import SiteFacts
from sitestack.actions.stack_venv import StackVenv
from sitestack.actions.stage_archive import MakeStageArchive
from sitestack.actions.validation_job import InstallValidationJob
from sitestack.actions.venv_hook import VenvHook

#: action name (as playbooks write it) -> the Action class.
ACTIONS: dict[str, type[Action]] = {cls.action: cls for cls in (
    Directory, RequireTools, ModulesAvailable, SiteFacts, AptPackages, Command,
    RecipeInstall,
    StackVenv, VenvHook, ModuleFiles, InstallValidationJob, MakeStageArchive, InstallLaunchEnv,
    PackEnv, ContainerImage, ApptainerImage,
)}

__all__ = ["ACTIONS", "Action"]
