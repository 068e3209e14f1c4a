"""Site playbooks: hosts, facts and ordered steps, loaded from ``playbooks/<site>.yml``.

A site is data: adding one means adding one YAML file. ``load_site(name)`` parses the file,
validates it against the dataclasses below (unknown keys, wrong types and missing keys are
errors naming file, line and key), checks every ``{placeholder}`` against the fixed set in
:data:`PLACEHOLDERS`, and returns a frozen :class:`Site`. ``Site.resolve(...)`` fills the
placeholders and returns the facts a run uses.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from sitestack.core import placeholders, schema
from sitestack.core.errors import InputError
from sitestack.core.paths import PLAYBOOK_DIR
from sitestack.core.yamlfile import MarkedDict, display_path, load_yaml
from sitestack.model import comm_settings
from sitestack.model.facts import (
    BusBandwidth,
    Container,
    CpuBind,
    Facts,
    Gpu,
    Modules,
    Mpi,
    Network,
    Node,
    Python,
    Scheduler,
    Toolkit,
    Torch,
    Validation,
    _doc,
    facts_fields,
    type_name,
)
from sitestack.model.facts_layers import (
    LOCAL_FACTS,
    check_stack_keys,
    layered,
    local_layers,
    stack_overlays,
    with_local_facts,
)
from sitestack.model.options import normal_prefix

#: The placeholders a string in a playbook may use, with what each becomes.
PLACEHOLDERS: Mapping[str, str] = {
    "site": "the site's name (the playbook's file name)",
    "home": "the home directory of the user running the steps on the host ($HOME)",
    "user": "that user's name ($USER)",
    "account": "the project/account to charge (--account or $SITESTACK_ACCOUNT)",
    "prefix": "the install prefix (facts.prefix, or --prefix)",
    "python_version": "facts.python.version",
    "torch_version": "facts.torch.version",
    "rocm_version": "facts.rocm.version (sites with ROCm)",
    "cuda_version": "facts.cuda.version (sites with CUDA)",
}


#: A site name: it names playbooks/<site>.yml, directories, module files and logs.
SITE_NAME = re.compile(r"[a-z0-9][a-z0-9_-]*")

#: Host names and ssh-config aliases: letters, digits and . _ -, an optional user@ and :port are
#: separate fields. Anything else would reach ssh command lines and file names.
HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


#: A step name: kebab-case (``stack-venv``), the same spelling at every site, so ``--start-at``,
#: ``--tags`` and ``--skip-tags`` name a step the same way whichever playbook runs.
STEP_NAME = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")

#: Actions that were renamed: a playbook naming the old name is told the new one.
RENAMED_ACTIONS: Mapping[str, str] = {"pack-stack-env": "stage-archive", "packed-env": "pack-env"}


def host_name_problem(name: str, what: str = "name") -> str | None:
    """Why ``name`` is not a host name (None: it is one)."""
    if not HOST_NAME.fullmatch(name or ""):
        return f"{what}: {name!r} is not a host name (letters, digits, '.', '_' and '-')"
    return None


@dataclass(frozen=True)
class HostSpec:
    """A host the playbook runs on."""

    name: str = field(metadata=_doc("name shown in output; for ssh also the default address"))
    connection: Literal["local", "ssh"] = field(default="local", metadata=_doc(
        "local: run here; ssh: over SSH with the user's ~/.ssh/config"))
    address: str | None = field(default=None, metadata=_doc("host name or ssh-config alias (default: name)"))
    user: str | None = field(default=None, metadata=_doc("remote user"))
    port: int | None = field(default=None, metadata=_doc("SSH port", min=1, max=65535))

    def check(self) -> str | None:
        return host_name_problem(self.name) or (self.address is not None and host_name_problem(self.address, "address"))\
            or None


@dataclass(frozen=True)
class StepSpec:
    """One step of a playbook: an action with its arguments."""

    name: str = field(metadata=_doc("unique name of the step within the playbook"))
    action: str = field(metadata=_doc("the action that implements it (see `invoke actions`)"))
    args: Mapping[str, Any] = field(default_factory=dict, metadata=_doc("the action's arguments"))
    tags: tuple[str, ...] = field(default=(), metadata=_doc("tags for --tags / --skip-tags"))
    notify: tuple[str, ...] = field(default=(), metadata=_doc("handlers to run once at the end if this step changed"))
    become: bool = field(default=False, metadata=_doc("run mutations with sudo when not root"))
    stack: str | None = field(default=None, metadata=_doc(
        "run with the facts of this stack of the playbook's `stacks:` (default: the playbook's own facts)"))
    concurrent: bool | None = field(default=None, metadata=_doc(
        "whether the step may run at the same time as its neighbours that may too, when applying on a host "
        "with the cores (false: it runs alone, after every earlier step; default: its action says, e.g. "
        "recipe-install builds may)"))
    line: int = field(default=0, init=False, compare=False, metadata=_doc("line in the playbook (set by the loader)"))

    def check(self) -> str | None:
        if not self.name.strip():
            return "name: a step needs a name"
        if not STEP_NAME.fullmatch(self.name):
            return (f"name: {self.name!r} is not a step name (kebab-case: lower-case letters and digits "
                    "joined by '-', e.g. stack-venv)")
        for tag in self.tags:
            if not tag.strip() or "," in tag:
                return f"tags: {tag!r} is not a tag (no empty tags, no commas)"
        return None


@dataclass(frozen=True)
class Site:
    """A loaded playbook: ``playbooks/<name>.yml``."""

    name: str
    path: str
    hosts: tuple[HostSpec, ...]
    facts: Facts
    steps: tuple[StepSpec, ...]
    handlers: tuple[StepSpec, ...]
    raw_facts: Mapping[str, Any] = field(repr=False, compare=False)
    #: the playbook's own steps where this run makes others (a build task's one step): what the steps
    #: run build for (the stack env whose interpreter builds its packages) is read from them
    playbook_steps: tuple[StepSpec, ...] = field(default=(), repr=False, compare=False)
    #: the playbook's other stacks (``stacks:``): key -> (facts, raw facts), each its overlay over the facts
    stacks: Mapping[str, tuple[Facts, Mapping[str, Any]]] = field(default_factory=dict, repr=False, compare=False)
    #: the stack this view of the playbook is for (:meth:`for_stack`); None: the playbook's own facts
    stack: str | None = None

    #: the playbook with its own facts, where this is a stack's view of it
    own: Site | None = field(default=None, repr=False, compare=False)

    def for_stack(self, key: str | None) -> Site:
        """The playbook as the steps of stack ``key`` see it: that stack's facts (None: the playbook's own)."""
        if key == self.stack:
            return self
        own = self.own or self
        if key is None:
            return own
        facts, raw = own.stacks[key]
        return dataclasses.replace(own, facts=facts, raw_facts=raw, stack=key, own=own)

    def placeholder_values(self, *, home: str, user: str, account: str | None, prefix: str | None) -> dict[str, str]:
        """Values for every placeholder on a host with this ``home`` and ``user``."""
        values = {
            "site": self.name,
            "home": home,
            "user": user,
            "account": account or "{account}",
            "python_version": self.facts.python.version,
            "torch_version": self.facts.torch.version,
            "rocm_version": self.facts.rocm.version if self.facts.rocm else "{rocm_version}",
            "cuda_version": self.facts.cuda.version if self.facts.cuda else "{cuda_version}",
        }
        # spelled one way once, here: every path below it, and what gc compares, is built from it
        values["prefix"] = normal_prefix(prefix or expand(self.facts.prefix, {**values, "prefix": "{prefix}"}))
        return values

    def resolved_facts(self, values: Mapping[str, str]) -> dict[str, Any]:
        """The facts as plain data with every placeholder filled from ``values``."""
        data: dict[str, Any] = expand_all(plain_data(self.raw_facts), values)
        data["prefix"] = values["prefix"]
        return data

    def late_env(self, values: Mapping[str, str]) -> dict[str, str]:
        """facts.env with every placeholder filled but ``{home}`` and ``{user}``: those are bound late,
        by whoever uses the value (the job's ``$HOME``/``$USER``, the module's ``os.getenv``), because
        a shared stack or job serves every user, not the one who installed it."""
        env = (self.raw_facts or {}).get("env") or {}
        return {str(k): placeholders.bind_early(str(v), values, ("home", "user")) for k, v in env.items()}

    def resolve(self, *, home: str, user: str, account: str | None, prefix: str | None) -> Resolved:
        """The facts on a host with this ``home`` and ``user``: placeholder values, plain data, typed.

        The one place the three are derived from the playbook's raw facts, so they always agree.
        """
        values = self.placeholder_values(home=home, user=user, account=account, prefix=prefix)
        data = self.resolved_facts(values)
        return Resolved(values=values, data=data, facts=schema.build(Facts, data, self.path, line=0, key="facts"))


@dataclass(frozen=True)
class Resolved:
    """A site's facts resolved for one host (what :meth:`Site.resolve` returns)."""

    values: Mapping[str, str]  # every placeholder's value on the host
    data: Mapping[str, Any]  # the facts as plain data (JSON-able), placeholders filled
    facts: Facts  # the same, typed


_PLAYBOOK_KEYS = {"site", "description", "hosts", "facts", "stacks", "steps", "handlers"}


def list_sites(directory: Path = PLAYBOOK_DIR) -> list[str]:
    """Names of the sites with a playbook in ``directory``, sorted."""
    return sorted(p.stem for p in directory.glob("*.yml"))


def site_path(name: str, directory: Path = PLAYBOOK_DIR) -> Path:
    """The playbook file of site ``name``; an unknown site is an error listing the known ones."""
    if not SITE_NAME.fullmatch(name or ""):
        raise InputError("--site", f"{name!r} is not a site name (lower-case letters, digits, - and _)")
    path = directory / f"{name}.yml"
    if not path.is_file():
        known = ", ".join(list_sites(directory)) or "none"
        raise InputError("--site", f"unknown site {name!r} (known sites: {known})")
    return path


def load_site(name: str | None = None, *, path: Path | None = None, actions: Mapping[str, Any] | None = None) -> Site:
    """Load and validate a site playbook, by site name or by file path.

    ``actions`` (name -> action class) lets the loader reject steps naming an action that does
    not exist and check each step's arguments; the playbook module passes the registry.
    """
    if path is None:
        path = site_path(name or "")
    elif not SITE_NAME.fullmatch(path.stem):
        # The site name comes from the file name: it names directories, modules and log files.
        raise InputError("--playbook", f"{path.name!r}: the file name is the site name, and {path.stem!r} is not "
                         "one (lower-case letters, digits, - and _)")
    shown = display_path(path)
    data = load_yaml(path)
    top = schema._Where(shown, data.line, "")
    for key in data:
        if key not in _PLAYBOOK_KEYS:
            raise top.child(str(key), data.lines.get(key)).error(
                f"unknown key (known keys: {', '.join(sorted(_PLAYBOOK_KEYS))})")
    for key in ("site", "hosts", "facts", "steps"):
        if key not in data:
            raise top.error(f"missing required key '{key}'")
    site_name = data["site"]
    if site_name != path.stem:
        raise InputError(f"{shown}:{data.lines['site']}", f"must be {path.stem!r} (the file name), not {site_name!r}", key="site")
    if "description" in data and not isinstance(data["description"], str):
        raise InputError(f"{shown}:{data.lines['description']}", "expected a string", key="description")
    own, local = data, local_layers()
    data = with_local_facts(data, local)
    _check_placeholders(data, shown)   # the stacks' overlays and the site-local facts too
    hosts = _build_list(HostSpec, data, "hosts", shown, unique="name")
    if not hosts:
        raise InputError(f"{shown}:{data.lines['hosts']}", "a playbook needs at least one host", key="hosts")
    try:
        facts = schema.build(Facts, data["facts"], shown, line=data.lines["facts"], key="facts")
    except InputError as exc:
        if not os.environ.get(LOCAL_FACTS):
            raise
        raise InputError(exc.where, f"{exc.detail} (facts merged from ${LOCAL_FACTS}: {os.environ[LOCAL_FACTS]})",
                         key=exc.key) from None
    stacks = _stacks(own, shown, local)
    comm_settings.check_facts(facts, [(data["facts"], "facts")], shown)
    for key, (stack_facts, _) in stacks.items():
        overlay = stack_overlays(own, shown)[key]
        comm_settings.check_facts(stack_facts, [(data["facts"], "facts"), (overlay, f"stacks.{key}.facts")], shown)
    steps = _build_list(StepSpec, data, "steps", shown, unique="name")
    handlers = _build_list(StepSpec, data, "handlers", shown, unique="name") if "handlers" in data else ()
    handler_names = {h.name for h in handlers}
    check_stack_keys((*steps, *handlers), stacks, actions, shown)
    _check_steps(data, {"steps": steps, "handlers": handlers}, actions, facts, shown, stacks)
    clash = handler_names & {s.name for s in steps}
    if clash:
        raise InputError(f"{shown}:{data.lines['handlers']}", f"handler names clash with step names: {', '.join(sorted(clash))}", key="handlers")
    return Site(name=path.stem, path=shown, hosts=hosts, facts=facts, steps=steps, handlers=handlers,
                raw_facts=data["facts"], stacks=stacks)


def _stacks(own: MarkedDict, shown: str, local: Sequence[Mapping[str, Any]]) -> dict[str, tuple[Facts, Mapping[str, Any]]]:
    """The playbook's ``stacks:``, each its overlay merged over the playbook's own facts and the site-local
    ones (``local``) over that (a site's hardware keys hold for every stack), checked as facts."""
    out = {}
    for key, overlay in stack_overlays(own, shown).items():
        raw = layered(own["facts"], overlay, *local)
        out[key] = (schema.build(Facts, raw, shown, line=overlay.line, key=f"stacks.{key}.facts"), raw)
    return out


def _build_list(cls: type[Any], data: MarkedDict, key: str, shown: str, *, unique: str) -> tuple[Any, ...]:
    items = data[key]
    if not isinstance(items, list):
        raise InputError(f"{shown}:{data.lines[key]}", "expected a list", key=key)
    out = []
    seen: dict[str, int] = {}
    for i, item in enumerate(items):
        line = schema.line_of(items, i)
        obj: Any = schema.build(cls, item, shown, line=line, key=f"{key}[{i}]")
        if hasattr(obj, "line"):
            object.__setattr__(obj, "line", line)
        ident = getattr(obj, unique)
        if ident in seen:
            raise InputError(f"{shown}:{line}", f"duplicate {unique} {ident!r} (first on line {seen[ident]})", key=f"{key}[{i}].{unique}")
        seen[ident] = line
        out.append(obj)
    return tuple(out)


def _check_steps(data: MarkedDict, groups: Mapping[str, Sequence[StepSpec]], actions: Mapping[str, Any] | None,
                 facts: Facts, shown: str, stacks: Mapping[str, tuple[Facts, Any]]) -> None:
    """Every step and handler: the handlers it notifies exist; with ``actions``, its arguments (each
    step's own, then each action's steps together) and that they fit the site's facts."""
    handler_names = {h.name for h in groups["handlers"]}
    checked: list[tuple[str, StepSpec, Any]] = []
    for group, specs in groups.items():
        for i, spec in enumerate(specs):
            for target in spec.notify:
                if target not in handler_names:
                    raise InputError(f"{shown}:{spec.line}", f"notifies unknown handler {target!r}", key=f"{group}[{i}].notify")
            if actions is not None:
                raw = data[group][i].get("args") if isinstance(data[group][i], dict) else None
                args = _check_action(spec, raw, actions, shown, f"{group}[{i}]")
                problem = actions[spec.action].site_problem(args, stacks[spec.stack][0] if spec.stack else facts)
                if problem:
                    raise InputError(f"{shown}:{spec.line}", f"step {spec.name!r}: {problem}", key=f"{group}[{i}]")
                checked.append((f"{group}[{i}]", spec, args))
    if actions is not None:
        _check_together(checked, actions, {None: facts, **{k: f for k, (f, _) in stacks.items()}}, shown)


def _check_together(checked: Sequence[tuple[str, StepSpec, Any]], actions: Mapping[str, Any],
                    facts: Mapping[str | None, Facts], shown: str) -> None:
    """Each action's steps taken together (``steps_problem``: e.g. two stacks claiming one default)."""
    for action in dict.fromkeys(spec.action for _, spec, _ in checked):
        mine = [(key, spec, args) for key, spec, args in checked if spec.action == action]
        found = actions[action].steps_problem([(spec, args, facts[spec.stack]) for _, spec, args in mine])
        if found is not None:
            key, spec, _ = mine[found[0]]
            raise InputError(f"{shown}:{spec.line}", f"step {spec.name!r}: {found[1]}", key=f"{key}.args")


def _check_action(spec: StepSpec, raw_args: Any, actions: Mapping[str, Any], shown: str, key: str) -> Any:
    """The step's arguments, checked against its action's (an unknown action is an error)."""
    action = actions.get(spec.action)
    if action is None and spec.action in RENAMED_ACTIONS:
        raise InputError(f"{shown}:{spec.line}", f"action {spec.action!r} is now called "
                         f"{RENAMED_ACTIONS[spec.action]!r}: rename it in the playbook", key=f"{key}.action")
    if action is None:
        raise InputError(f"{shown}:{spec.line}", f"unknown action {spec.action!r} (known actions: {', '.join(sorted(actions))})", key=f"{key}.action")
    line = getattr(raw_args, "line", spec.line)
    return action.check_args(raw_args, shown, line, f"{key}.args")


def _check_placeholders(node: Any, shown: str) -> None:
    """Every ``{name}`` in every string must be a known placeholder (``{{``/``}}`` escape)."""
    placeholders.check(node, PLACEHOLDERS, shown)


def expand(text: str, values: Mapping[str, str]) -> str:
    """Fill the placeholders of one playbook string (validated at load time); one without a value
    (``{account}`` before --account, ``{rocm_version}`` on a CUDA site) stays as it is."""
    return placeholders.expand(text, values, missing="keep")


def expand_all(node: Any, values: Mapping[str, str]) -> Any:
    """Fill placeholders in every string of a plain data tree; as :func:`expand` for missing values."""
    return placeholders.expand_all(node, values, missing="keep")


def plain_data(node: Any) -> Any:
    """Mappings and sequences (read-only or marked) as plain dicts and lists."""
    if isinstance(node, Mapping):
        return {k: plain_data(v) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        return [plain_data(v) for v in node]
    return node


def host_env_defaults() -> tuple[str, str]:
    """Home and user of the local user, for placeholders on local hosts."""
    return os.path.expanduser("~"), os.environ.get("USER") or os.environ.get("LOGNAME") or "root"


__all__ = ["PLACEHOLDERS", "BusBandwidth", "Container", "CpuBind", "Facts", "Gpu", "HostSpec", "Modules", "Mpi",
           "Network", "Node", "Python", "Resolved", "Scheduler", "Site", "StepSpec", "Toolkit", "Torch", "Validation", "expand",
           "expand_all", "facts_fields", "host_env_defaults", "list_sites", "load_site", "plain_data", "site_path",
           "type_name"]
