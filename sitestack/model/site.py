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
import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from sitestack.core import schema
from sitestack.core.errors import InputError
from sitestack.core.paths import PLAYBOOK_DIR
from sitestack.core.yamlfile import MarkedDict, display_path, load_yaml

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


def _doc(text: str, **extra: Any) -> dict[str, Any]:
    return {"doc": text, **extra}


@dataclass(frozen=True)
class CpuBind:
    """How ranks are pinned to cores: one rank per GPU unit, cores near its GPU."""

    gpu_to_numa: tuple[int, ...] = field(metadata=_doc(
        "for GPU unit i (in the order the runtime numbers them), the NUMA domain / CCD closest to it"))
    cores_per_numa: int = field(metadata=_doc("cores in each NUMA domain / CCD"))
    reserved_cores: tuple[int, ...] = field(default=(), metadata=_doc(
        "cores the site reserves for the OS and cannot be used by jobs (LUMI: the first core of each CCD)"))
    threads_per_core: int = field(default=1, metadata=_doc("hardware threads per core used by jobs"))


@dataclass(frozen=True)
class Gpu:
    """The GPUs of a compute node."""

    vendor: Literal["nvidia", "amd", "intel", "none"] = field(metadata=_doc("GPU vendor, or none for CPU-only"))
    model: str | None = field(default=None, metadata=_doc("marketing name, e.g. MI250X, V100-SXM2-16GB"))
    arch: str | None = field(default=None, metadata=_doc("compiler target: gfx90a, sm_70, pvc"))
    unit: Literal["gpu", "gcd", "stack"] = field(default="gpu", metadata=_doc(
        "what one rank drives: a whole GPU, an MI250X GCD, or a PVC stack"))
    per_node: int = field(default=0, metadata=_doc("GPU units per node as the runtime sees them"))
    cores_per_gpu: int = field(default=0, metadata=_doc("CPU cores available per GPU unit"))
    cpu_bind: CpuBind | None = field(default=None, metadata=_doc("CPU binding per GPU unit"))

    def check(self) -> str | None:
        if self.vendor != "none" and self.per_node < 1:
            return "a GPU site needs per_node >= 1"
        if self.cpu_bind and len(self.cpu_bind.gpu_to_numa) != self.per_node:
            return f"cpu_bind.gpu_to_numa has {len(self.cpu_bind.gpu_to_numa)} entries, per_node is {self.per_node}"
        return None


@dataclass(frozen=True)
class Node:
    """A compute node."""

    cores: int = field(metadata=_doc("physical CPU cores per node"))
    memory_gb: int | None = field(default=None, metadata=_doc("memory per node in GB"))
    local_scratch: str | None = field(default=None, metadata=_doc("node-local scratch directory, e.g. /tmp or /mnt/bb/$USER"))


@dataclass(frozen=True)
class Modules:
    """The site's module system and the modules the stack builds and runs with."""

    system: Literal["lmod", "environment-modules", "none"] = field(metadata=_doc("module system on the host"))
    format: Literal["lua", "tcl"] = field(default="lua", metadata=_doc("format of the module files we install"))
    init: str | None = field(default=None, metadata=_doc(
        "script that defines `module` in a non-login bash (remote shells are non-login)"))
    use: tuple[str, ...] = field(default=(), metadata=_doc("directories added with `module use` first"))
    load: tuple[str, ...] = field(default=(), metadata=_doc("site modules loaded, in order, to build and run the stack"))
    install_root: str = field(default="{prefix}/modules", metadata=_doc("where sitestack installs its module files"))

    def check(self) -> str | None:
        if self.system == "none" and self.load:
            return "modules to load need a module system (system: none)"
        return None


@dataclass(frozen=True)
class Mpi:
    """The site MPI that mpi4py, Horovod and the MPI probe are built against."""

    flavour: Literal["cray-mpich", "mpich", "openmpi", "intel-mpi"] = field(metadata=_doc("MPI implementation"))
    cc: str = field(default="mpicc", metadata=_doc('C compiler wrapper, as a command line (Cray: "cc -shared")'))
    cxx: str = field(default="mpicxx", metadata=_doc("C++ compiler wrapper"))
    launcher: Literal["srun", "mpiexec", "mpirun"] = field(default="mpiexec", metadata=_doc("how MPI jobs start"))
    library_match: str = field(default="MPICH", metadata=_doc(
        "text that MPI_Get_library_version() must contain for the right MPI"))


@dataclass(frozen=True)
class Network:
    """The interconnect."""

    fabric: str = field(metadata=_doc("e.g. slingshot-11, infiniband-edr, ethernet, loopback"))
    interfaces: tuple[str, ...] = field(default=(), metadata=_doc("interfaces collectives use, e.g. hsn0..hsn3"))
    libfabric_provider: str | None = field(default=None, metadata=_doc("libfabric provider, e.g. cxi"))
    net_plugin: str | None = field(default=None, metadata=_doc(
        "NCCL/RCCL network plugin the stack needs on multi-node runs (aws-ofi-rccl, aws-ofi-nccl) or none"))


@dataclass(frozen=True)
class Scheduler:
    """The batch system the validation job runs under."""

    kind: Literal["slurm", "none"] = field(metadata=_doc("batch system"))
    partition: str | None = field(default=None, metadata=_doc("partition / queue for GPU jobs"))
    account: str | None = field(default=None, metadata=_doc("account to charge; use {account}"))
    gres: str | None = field(default=None, metadata=_doc("--gres value, e.g. gpu:8"))
    time: str = field(default="00:30:00", metadata=_doc("wall time of the validation job"))
    options: tuple[str, ...] = field(default=(), metadata=_doc("further sbatch options, one per item, e.g. --exclusive"))


@dataclass(frozen=True)
class Python:
    """The base Python the stack venv is made from."""

    source: Literal["module", "conda", "system", "container"] = field(metadata=_doc(
        "where the base Python comes from"))
    version: str = field(metadata=_doc("major.minor, e.g. 3.11"))
    module: str | None = field(default=None, metadata=_doc("module providing it (source: module or conda)"))
    executable: str = field(default="python3", metadata=_doc("interpreter name or path once loaded"))

    def check(self) -> str | None:
        if not re.fullmatch(r"3\.\d+", self.version):
            return f"version must look like 3.11, not {self.version!r}"
        if self.source in ("module", "conda") and not self.module:
            return f"source {self.source} needs the module that provides Python"
        return None


@dataclass(frozen=True)
class Torch:
    """The PyTorch build the stack installs."""

    version: str = field(metadata=_doc("torch version, e.g. 2.2.2"))
    variant: str = field(metadata=_doc("wheel variant: cu121, rocm5.7, xpu, cpu"))
    index_url: str | None = field(default=None, metadata=_doc("pip index for the wheels; none for PyPI"))
    packages: Mapping[str, str] = field(default_factory=dict, metadata=_doc(
        "companion packages pinned with torch, e.g. torchvision: 0.17.2"))
    extras: tuple[str, ...] = field(default=(), metadata=_doc("further pip requirements (tensorboard, ...)"))


@dataclass(frozen=True)
class Toolkit:
    """A GPU toolkit (ROCm or CUDA)."""

    version: str = field(metadata=_doc("toolkit version, e.g. 5.7.1 or 12.1"))
    home: str = field(metadata=_doc("install directory, e.g. /opt/rocm-5.7.1"))


@dataclass(frozen=True)
class Container:
    """A container runtime the stack is run through."""

    runtime: Literal["singularity", "apptainer"] = field(metadata=_doc("container runtime"))
    image: str | None = field(default=None, metadata=_doc("image (SIF) the stack runs in"))
    bind: tuple[str, ...] = field(default=(), metadata=_doc("host paths bound into the container"))


@dataclass(frozen=True)
class BusBandwidth:
    """A reference allreduce bus bandwidth (busbw as nccl-tests defines it) the validation job must reach."""

    busbw_gbs: float = field(metadata=_doc("reference busbw in GB/s (1e9 bytes/s) at message_bytes"))
    lower: float = field(default=-0.05, metadata=_doc(
        "lowest accepted value as a fraction of the reference, ReFrame style: -0.05 accepts 95% and up"))
    message_bytes: int = field(default=134217728, metadata=_doc(
        "message size the reference is for; the job compares its sweep's row of that size (or its largest)"))
    source: str = field(default="", metadata=_doc("where the number comes from"))

    def check(self) -> str | None:
        if self.busbw_gbs <= 0:
            return "busbw_gbs must be positive"
        if not -1.0 < self.lower <= 0.0:
            return f"lower must be in (-1, 0], not {self.lower}"
        if self.message_bytes < 4:
            return "message_bytes must be at least 4"
        return None


@dataclass(frozen=True)
class Validation:
    """The validation DDP job: which launchers get a batch script, its geometry, the bandwidth to reach."""

    launchers: tuple[str, ...] = field(default=(), metadata=_doc(
        "launchers to install a batch script for (srun, mpiexec, torchrun, horovodrun); the first is "
        "the one `invoke validate` submits (default: mpi.launcher)"))
    ranks_per_node: int | None = field(default=None, metadata=_doc(
        "ranks per node of the job (default: gpu.per_node, or 2 on a CPU-only site)"))
    sbatch_tasks: bool = field(default=True, metadata=_doc(
        "whether the batch script asks for tasks in #SBATCH lines (legacy Cirrus rejects them: false)"))
    bind: Literal["mask", "gpu-closest", "launcher"] | None = field(default=None, metadata=_doc(
        "how ranks are bound to cores: mask (srun --cpu-bind=mask_cpu, masks derived from gpu.cpu_bind), "
        "gpu-closest (srun -c<cores_per_gpu> --gpus-per-task=1 --gpu-bind=closest), launcher (left to the "
        "launcher); default: mask where gpu.cpu_bind is set, else launcher"))
    single_node: BusBandwidth | None = field(default=None, metadata=_doc(
        "allreduce busbw reference for a one-node run; null: measured and reported, not judged"))
    multi_node: BusBandwidth | None = field(default=None, metadata=_doc(
        "allreduce busbw reference for a run on two or more nodes; null: measured and reported, not judged"))

    def check(self) -> str | None:
        for launcher in self.launchers:
            if launcher not in ("srun", "mpiexec", "torchrun", "horovodrun"):
                return f"launchers: {launcher!r} is not one of srun, mpiexec, torchrun, horovodrun"
        if len(set(self.launchers)) != len(self.launchers):
            return "launchers: each launcher once"
        if self.ranks_per_node is not None and self.ranks_per_node < 1:
            return "ranks_per_node must be >= 1"
        return None


@dataclass(frozen=True)
class Facts:
    """Everything sitestack knows about a site."""

    description: str = field(metadata=_doc("one line: system, GPUs, interconnect"))
    marker: str | None = field(metadata=_doc(
        "a path that exists on every host of the site (e.g. /opt/cray/pe); on a host without it "
        "check mode plans without probing and apply mode refuses; null where any host will do"))
    prefix: str = field(metadata=_doc("install prefix for the stack; may use {home}, {user}, {account}, {site}"))
    node: Node
    gpu: Gpu
    modules: Modules
    mpi: Mpi
    network: Network
    scheduler: Scheduler
    python: Python
    torch: Torch
    collectives: Literal["nccl", "rccl", "oneccl", "gloo"] = field(default="nccl", metadata=_doc(
        "collective library torch.distributed uses on the GPUs"))
    rocm: Toolkit | None = None
    cuda: Toolkit | None = None
    container: Container | None = None
    env: Mapping[str, str] = field(default_factory=dict, metadata=_doc(
        "runtime settings set by the stack's module and the validation job (NCCL_*, FI_*, MIOPEN_*)"))
    validation: Validation | None = field(default=None, metadata=_doc(
        "the validation DDP job (launchers, ranks per node, bandwidth references)"))
    build_jobs: int | None = field(default=None, metadata=_doc("parallel build jobs; default: the host's cores"))
    references: tuple[str, ...] = field(default=(), metadata=_doc("where these facts come from"))

    def check(self) -> str | None:
        if self.gpu.vendor == "amd" and self.rocm is None:
            return "an AMD GPU site needs rocm: {version, home}"
        if self.gpu.vendor == "nvidia" and self.cuda is None:
            return "an NVIDIA GPU site needs cuda: {version, home}"
        return None


@dataclass(frozen=True)
class HostSpec:
    """A host the playbook runs on."""

    name: str = field(metadata=_doc("name shown in output; for ssh also the default address"))
    connection: Literal["local", "ssh"] = field(default="local", metadata=_doc(
        "local: run here; ssh: over SSH with the user's ~/.ssh/config"))
    address: str | None = field(default=None, metadata=_doc("host name or ssh-config alias (default: name)"))
    user: str | None = field(default=None, metadata=_doc("remote user"))
    port: int | None = field(default=None, metadata=_doc("SSH port"))


@dataclass(frozen=True)
class StepSpec:
    """One step of a playbook: an action with its arguments."""

    name: str = field(metadata=_doc("unique name of the step within the playbook"))
    action: str = field(metadata=_doc("the action that implements it (see `invoke actions`)"))
    args: Mapping[str, Any] = field(default_factory=dict, metadata=_doc("the action's arguments"))
    tags: tuple[str, ...] = field(default=(), metadata=_doc("tags for --tags / --skip-tags"))
    notify: tuple[str, ...] = field(default=(), metadata=_doc("handlers to run once at the end if this step changed"))
    become: bool = field(default=False, metadata=_doc("run mutations with sudo when not root"))
    line: int = field(default=0, init=False, compare=False, metadata=_doc("line in the playbook (set by the loader)"))


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
        values["prefix"] = prefix or expand(self.facts.prefix, {**values, "prefix": "{prefix}"})
        return values

    def resolved_facts(self, values: Mapping[str, str]) -> dict[str, Any]:
        """The facts as plain data with every placeholder filled from ``values``."""
        data = expand_all(plain_data(self.raw_facts), values)
        data["prefix"] = values["prefix"]
        return data


_PLAYBOOK_KEYS = {"site", "description", "hosts", "facts", "steps", "handlers"}


def list_sites(directory: Path = PLAYBOOK_DIR) -> list[str]:
    """Names of the sites with a playbook in ``directory``, sorted."""
    return sorted(p.stem for p in directory.glob("*.yml"))


def site_path(name: str, directory: Path = PLAYBOOK_DIR) -> Path:
    """The playbook file of site ``name``; an unknown site is an error listing the known ones."""
    if not re.fullmatch(r"[a-z0-9][a-z0-9_-]*", name or ""):
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
    _check_placeholders(data, shown)
    hosts = _build_list(HostSpec, data, "hosts", shown, unique="name")
    if not hosts:
        raise InputError(f"{shown}:{data.lines['hosts']}", "a playbook needs at least one host", key="hosts")
    facts = schema.build(Facts, data["facts"], shown, line=data.lines["facts"], key="facts")
    steps = _build_list(StepSpec, data, "steps", shown, unique="name")
    handlers = _build_list(StepSpec, data, "handlers", shown, unique="name") if "handlers" in data else ()
    handler_names = {h.name for h in handlers}
    for group, specs in (("steps", steps), ("handlers", handlers)):
        for i, spec in enumerate(specs):
            for target in spec.notify:
                if target not in handler_names:
                    raise InputError(f"{shown}:{spec.line}", f"notifies unknown handler {target!r}", key=f"{group}[{i}].notify")
            if actions is not None:
                raw = data[group][i].get("args") if isinstance(data[group][i], dict) else None
                _check_action(spec, raw, actions, shown, f"{group}[{i}]")
    clash = handler_names & {s.name for s in steps}
    if clash:
        raise InputError(f"{shown}:{data.lines['handlers']}", f"handler names clash with step names: {', '.join(sorted(clash))}", key="handlers")
    return Site(name=path.stem, path=shown, hosts=hosts, facts=facts, steps=steps, handlers=handlers, raw_facts=data["facts"])


def _build_list(cls: type, data: MarkedDict, key: str, shown: str, *, unique: str) -> tuple:
    items = data[key]
    if not isinstance(items, list):
        raise InputError(f"{shown}:{data.lines[key]}", "expected a list", key=key)
    out = []
    seen: dict[str, int] = {}
    for i, item in enumerate(items):
        line = schema.line_of(items, i)
        obj = schema.build(cls, item, shown, line=line, key=f"{key}[{i}]")
        if hasattr(obj, "line"):
            object.__setattr__(obj, "line", line)
        ident = getattr(obj, unique)
        if ident in seen:
            raise InputError(f"{shown}:{line}", f"duplicate {unique} {ident!r} (first on line {seen[ident]})", key=f"{key}[{i}].{unique}")
        seen[ident] = line
        out.append(obj)
    return tuple(out)


def _check_action(spec: StepSpec, raw_args: Any, actions: Mapping[str, Any], shown: str, key: str) -> None:
    action = actions.get(spec.action)
    if action is None:
        raise InputError(f"{shown}:{spec.line}", f"unknown action {spec.action!r} (known actions: {', '.join(sorted(actions))})", key=f"{key}.action")
    line = getattr(raw_args, "line", spec.line)
    action.check_args(raw_args, shown, line, f"{key}.args")


def _check_placeholders(node: Any, shown: str, line: int = 1, key: str = "") -> None:
    """Every ``{name}`` in every string must be a known placeholder (``{{``/``}}`` escape)."""
    if isinstance(node, dict):
        for k, v in node.items():
            _check_placeholders(v, shown, schema.line_of(node, k), f"{key}.{k}" if key else str(k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            _check_placeholders(v, shown, schema.line_of(node, i), f"{key}[{i}]")
    elif isinstance(node, str):
        try:
            fields = [f for _, f, _, _ in string.Formatter().parse(node) if f is not None]
        except ValueError as exc:
            raise InputError(f"{shown}:{line}", f"bad placeholder syntax in {node!r}: {exc}", key=key) from None
        for name in fields:
            if name not in PLACEHOLDERS:
                raise InputError(
                    f"{shown}:{line}",
                    f"unknown placeholder {{{name}}} (known: {', '.join('{' + p + '}' for p in PLACEHOLDERS)})",
                    key=key,
                )


class _Keep(dict):
    def __missing__(self, key: str) -> str:  # only reached for known-but-unset placeholders
        return "{" + key + "}"


def expand(text: str, values: Mapping[str, str]) -> str:
    """Fill the placeholders of one string (validated at load time)."""
    return text.format_map(_Keep(values))


def expand_all(node: Any, values: Mapping[str, str]) -> Any:
    """Fill placeholders in every string of a plain data tree."""
    if isinstance(node, dict):
        return {k: expand_all(v, values) for k, v in node.items()}
    if isinstance(node, list):
        return [expand_all(v, values) for v in node]
    if isinstance(node, str):
        return expand(node, values)
    return node


def plain_data(node: Any) -> Any:
    """Mappings and sequences (read-only or marked) as plain dicts and lists."""
    if isinstance(node, Mapping):
        return {k: plain_data(v) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        return [plain_data(v) for v in node]
    return node


def facts_fields(cls: type = Facts, prefix: str = "") -> list[tuple[str, str, str]]:
    """(key, type, doc) for every fact, for the reference in ``docs/playbooks.md``."""
    import typing

    rows = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        key = f"{prefix}{schema.yaml_key(f)}"
        tp = hints[f.name]
        nested = [a for a in (tp, *typing.get_args(tp)) if dataclasses.is_dataclass(a)]
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        doc = f.metadata.get("doc") or (nested[0].__doc__ if nested else "") or ""
        rows.append((key, type_name(tp) + ("" if required else ", optional"), doc))
        if nested:
            rows.extend(facts_fields(nested[0], key + "."))
    return rows


def type_name(tp: Any) -> str:
    """A reader's name for a schema type: 'string', 'list of strings', 'one of: a, b', ..."""
    import typing

    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return "one of: " + ", ".join(str(a) for a in args)
    if origin in (typing.Union, __import__("types").UnionType):
        inner = [a for a in args if a is not type(None)]
        return " or ".join(type_name(a) for a in inner) + (" or null" if len(inner) < len(args) else "")
    if origin is tuple:
        return f"list of {type_name(args[0])}s"
    if origin in (Mapping, dict) or tp is Mapping:
        return f"mapping of {type_name(args[1])}s"
    if dataclasses.is_dataclass(tp):
        return "mapping"
    return {str: "string", int: "integer", bool: "boolean", float: "number"}.get(tp, str(tp))


def host_env_defaults() -> tuple[str, str]:
    """Home and user of the local user, for placeholders on local hosts."""
    return os.path.expanduser("~"), os.environ.get("USER") or os.environ.get("LOGNAME") or "root"
