"""A site's facts: the typed dataclasses ``facts:`` of a playbook is validated into.

Everything sitestack knows about a site (nodes, GPUs, modules, MPI, network, scheduler, Python,
torch, toolkits, validation job) as frozen dataclasses; each field's ``doc`` metadata is what
``docs/playbooks.md`` shows (:func:`facts_fields`).
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from sitestack.core import envvars, schema, versions
from sitestack.core.quoting import SHELL_NAME
from sitestack.core.redact import has_secret
from sitestack.model.container_facts import Container as Container
from sitestack.model.slurmtime import SLURM_TIME, SLURM_TIME_DOC, slurm_seconds
from sitestack.model.toolkits import Cuda as Cuda
from sitestack.model.toolkits import Rocm as Rocm
from sitestack.model.toolkits import Toolkit as Toolkit
from sitestack.model.tuning_facts import GUARD_GRACE
from sitestack.model.tuning_facts import Tuning as Tuning
from sitestack.model.tuning_facts import TuningVariable as TuningVariable
from sitestack.model.validation_facts import BusBandwidth as BusBandwidth
from sitestack.model.validation_facts import ComputeRate as ComputeRate
from sitestack.model.validation_facts import Regression as Regression
from sitestack.model.validation_facts import Validation as Validation
from sitestack.onsite.launchers import LAUNCHERS


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
    threads_per_core: int = field(default=1, metadata=_doc(
        "hardware threads per core used by jobs: 2 adds each core's hyperthread sibling (core + node.cores, "
        "as Linux numbers them) to the rank's CPU mask; 1: physical cores only"))


@dataclass(frozen=True)
class Gpu:
    """The GPUs of a compute node."""

    vendor: Literal["nvidia", "amd", "intel", "none"] = field(metadata=_doc("GPU vendor, or none for CPU-only"))
    model: str | None = field(default=None, metadata=_doc("marketing name, e.g. MI250X, V100-SXM2-16GB"))
    arch: str | None = field(default=None, metadata=_doc("compiler target: gfx90a, sm_70, pvc"))
    unit: Literal["gpu", "gcd", "stack"] = field(default="gpu", metadata=_doc(
        "what one rank drives: a whole GPU, an MI250X GCD, or a PVC stack"))
    per_node: int = field(default=0, metadata=_doc("GPU units per node as the runtime sees them", min=0, max=1024))
    cores_per_gpu: int = field(default=0, metadata=_doc("CPU cores available per GPU unit", min=0, max=65536))
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

    cores: int = field(metadata=_doc("physical CPU cores per node", min=1, max=65536))
    memory_gb: int | None = field(default=None, metadata=_doc("memory per node in GB"))
    local_scratch: str | None = field(default=None, metadata=_doc(
        "node-local scratch directory, an absolute path, e.g. /tmp or /mnt/bb/{user}"))
    stage_env: bool = field(default=False, metadata=_doc(
        "jobs copy the packed stack env to local_scratch with sbcast and run from there (Frontier's NVMe: "
        "2 s to import torch instead of 51 s from Lustre); the stage-archive step makes the pack"))

    def check(self) -> str | None:
        # jobs cd and copy into it on every node, from whatever directory the job starts in
        if self.local_scratch is not None and not self.local_scratch.startswith(("/", "{")):
            return f"local_scratch: {self.local_scratch!r} must be an absolute path (e.g. /tmp or /mnt/bb/{{user}})"
        if self.stage_env and self.local_scratch is None:
            return "stage_env needs local_scratch: an absolute node-local directory"
        return None


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
        for key, path in (("install_root", self.install_root), ("init", self.init), *(("use", u) for u in self.use)):
            if path is not None and (not path.startswith(("/", "{")) or ".." in path.split("/")):
                return f"{key}: {path!r} must be an absolute path without '..'"
        return None


@dataclass(frozen=True)
class Mpi:
    """The site MPI that mpi4py, Horovod and the MPI probe are built against."""

    flavour: Literal["cray-mpich", "mpich", "openmpi", "intel-mpi"] = field(metadata=_doc("MPI implementation"))
    cc: str = field(default="mpicc", metadata=_doc('C compiler wrapper, as a command line (Cray: "cc -shared")'))
    cxx: str = field(default="mpicxx", metadata=_doc("C++ compiler wrapper, as a command line"))
    launcher: Literal["srun", "mpiexec", "mpirun"] = field(default="mpiexec", metadata=_doc("how MPI jobs start"))
    library_match: str = field(default="MPICH", metadata=_doc(
        "text that MPI_Get_library_version() must contain for the right MPI"))

    def check(self) -> str | None:
        for key, value in (("cc", self.cc), ("cxx", self.cxx)):
            try:
                words = shlex.split(value)
            except ValueError as exc:
                return f"{key}: {value!r} is not a command line ({exc})"
            if not words:
                return f"{key}: the compiler command is empty"
        return None


@dataclass(frozen=True)
class Network:
    """The interconnect."""

    fabric: str = field(metadata=_doc("e.g. slingshot-11, infiniband-edr, ethernet, loopback"))
    interfaces: tuple[str, ...] = field(default=(), metadata=_doc("interfaces collectives use, e.g. hsn0..hsn3"))
    libfabric_provider: str | None = field(default=None, metadata=_doc("libfabric provider, e.g. cxi"))
    # the plugins of sources/comm/libraries.yml (tests/test_tables.py keeps the two the same)
    net_plugin: Literal["aws-ofi-rccl", "aws-ofi-nccl"] | None = field(default=None, metadata=_doc(
        "the NCCL/RCCL network plugin sitestack builds for the stack (its recipe-install step; ROCm or CUDA) and "
        "its module loads; the validation job's net-plugin check then requires NCCL's logs to show it loaded (by "
        "the names it registers; NCCL_NET is not forced). null where none is needed (InfiniBand) or the site "
        "provides its own: a module in modules.load, or the container (facts.container.net_plugin)"))


@dataclass(frozen=True)
class Scheduler:
    """The batch system the validation job runs under."""

    kind: Literal["slurm", "none"] = field(metadata=_doc("batch system"))
    partition: str | None = field(default=None, metadata=_doc("partition / queue for GPU jobs"))
    account: str | None = field(default=None, metadata=_doc("account to charge; use {account}"))
    gres: str | None = field(default=None, metadata=_doc("--gres value, e.g. gpu:8"))
    time: str = field(default="00:30:00", metadata=_doc(
        "wall time of the validation job (Slurm --time)", pattern=SLURM_TIME, pattern_doc=SLURM_TIME_DOC))
    options: tuple[str, ...] = field(default=(), metadata=_doc("further sbatch options, one per item, e.g. --exclusive"))
    launcher_options: Mapping[str, tuple[str, ...]] = field(default_factory=dict, metadata=_doc(
        "each launcher's own options, one per item, added to its command in the validation job and the job "
        "template: srun's rank step, torchrun's agent step (srun), mpiexec's and horovodrun's command line; "
        "e.g. {srun: [--mem-bind=local], torchrun: [--cpu-bind=none]}",
        key_pattern="|".join(LAUNCHERS), key_doc="a launcher (" + ", ".join(LAUNCHERS) + ")"))
    max_job_time: str | None = field(default=None, metadata=_doc(
        "the longest job the scheduler allows: a stack generation that was switched out is kept this long "
        "(docs/operating.md); default: the largest partition MaxTime `scontrol show partition` reports",
        pattern=SLURM_TIME, pattern_doc=SLURM_TIME_DOC))


@dataclass(frozen=True)
class Python:
    """The base Python the stack venv is made from."""

    source: Literal["module", "conda", "system", "container"] = field(metadata=_doc(
        "where the base Python comes from"))
    version: str = field(metadata=_doc("major.minor, e.g. 3.11"))
    module: str | None = field(default=None, metadata=_doc("module providing it (source: module or conda)"))
    executable: str = field(default="python3", metadata=_doc("interpreter name or path once loaded"))
    installer: Literal["auto", "pip", "uv"] = field(default="auto", metadata=_doc(
        "what installs the stack's packages: uv where the host has it on its PATH (with the index settings "
        "pip would use) and the stack does not see the base's packages, else pip (auto); or always pip; or "
        "always uv (refused where uv is missing or the stack uses system site packages)"))

    def check(self) -> str | None:
        if not re.fullmatch(r"3\.[0-9]+", self.version):
            return f"version must look like 3.11, not {self.version!r}"
        if self.source in ("module", "conda") and not self.module:
            return f"source {self.source} needs the module that provides Python"
        return None


def requirement_problem(text: str) -> str | None:
    """Why ``text`` is not one pip requirement (PEP 508, or an absolute path or URL of a wheel or
    sdist); None when it is. Never an option: ``--index-url=...`` would change where pip looks."""
    if text.startswith("-"):
        return f"{text!r} is a pip option, not a requirement"
    if text.startswith("/") or re.match(r"(https?|file)://", text):
        if re.search(r"[\s'\"`$;]", text) or ".." in text.split("/"):
            return f"{text!r} is not a plain path or URL"
        return None
    # packaging's parser is imported only for a playbook that names torch packages (a no-op's imports)
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        Requirement(text)
    except InvalidRequirement as exc:
        return f"{text!r} is not a requirement (PEP 508): {exc}"
    return None


@dataclass(frozen=True)
class Torch:
    """The PyTorch build the stack installs."""

    version: str = field(metadata=_doc("torch version, e.g. 2.2.2 (PEP 440)"))
    variant: str = field(metadata=_doc("wheel variant: cu121, rocm5.7, xpu, cpu"))
    index_url: str | None = field(default=None, metadata=_doc("pip index for the wheels; none for PyPI"))
    index: Literal["extra", "only"] = field(default="extra", metadata=_doc(
        "how index_url is used for torch and its companions: extra (pip --extra-index-url: PyPI too) or only "
        "(--index-url: every package of that install from index_url, as OLCF's Frontier line does); "
        "the other packages always come from the default index"))
    packages: Mapping[str, str] = field(default_factory=dict, metadata=_doc(
        "companion packages pinned with torch, e.g. torchvision: 0.17.2"))
    extras: tuple[str, ...] = field(default=(), metadata=_doc("further pip requirements (tensorboard, ...)"))

    def check(self) -> str | None:
        problem = versions.check_version(self.version)
        if problem:
            return f"version: {problem}"
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._]*", self.variant, re.ASCII):
            return f"variant: {self.variant!r} is not a wheel variant (letters, digits, . and _)"
        for name, version in self.packages.items():
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name, re.ASCII) or versions.check_version(version):
                return f"packages: {name}: {version!r} must be a project name and a version"
        for extra in self.extras:
            problem = requirement_problem(extra)
            if problem:
                return f"extras: {problem}"
            if has_secret(extra):   # the stack's manifest lists its requirements for every user to read
                return ("extras: a requirement holds a credential: put it in ~/.netrc, or give the index by "
                        "index_url (its credentials reach pip by environment only)")
        if self.index_url is not None and not re.match(r"(https?|file)://[^\s'\"`$]+$", self.index_url):
            return f"index_url: {self.index_url!r} must be an http(s) or file URL"
        return None


@dataclass(frozen=True)
class Install:
    """Who owns what sitestack installs, and who may write it."""

    group: str | None = field(default=None, metadata=_doc(
        "Unix group given everything installed under the prefix (directories setgid so new files keep it); "
        "null: the installing user's"))
    mode: Literal["read", "group-write"] = field(default="read", metadata=_doc(
        "read: directories 0755, files 0644 (0755 executables), whatever the umask; group-write: 0775 / 0664, "
        "so the group's admins can update the stack"))

    def check(self) -> str | None:
        if self.group is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]*\$?", self.group):
            return f"group: {self.group!r} is not a group name"
        return None


@dataclass(frozen=True)
class Facts:
    """Everything sitestack knows about a site."""

    description: str = field(metadata=_doc("one line: system, GPUs, interconnect"))
    marker: str | None = field(metadata=_doc(
        "an absolute path that exists on every host of the site (e.g. /opt/cray/pe); on a host without it "
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
    rocm: Rocm | None = None
    cuda: Cuda | None = None
    container: Container | None = None
    env: Mapping[str, str] = field(default_factory=dict, metadata=_doc(
        "runtime settings set by the stack's module, the launch helper and the validation job (NCCL_*, FI_*, "
        "MIOPEN_*), each only where the environment has no value or an empty one (a user's value wins); "
        "values may refer to $VARIABLES of the job's environment",
        key_pattern=SHELL_NAME.pattern, key_doc="an environment variable name (letters, digits, _)"))
    allow_known_issues: tuple[str, ...] = field(default=(), metadata=_doc(
        "ids of known_issues in sources/comm/libraries.yml whose setting this site uses knowingly (a setting known to "
        "break the stack's NCCL/RCCL version is refused otherwise)"))
    env_defaults: tuple[str, ...] = field(default=(), metadata=_doc(
        "names of env entries that are a choice users make (e.g. ZE_FLAT_DEVICE_HIERARCHY at submission): "
        "kept where set, as every env entry is, and also passed into the site's container"))
    validation: Validation | None = field(default=None, metadata=_doc(
        "the validation DDP job (launchers, ranks per node, bandwidth references)"))
    tuning: Tuning | None = field(default=None, metadata=_doc(
        "runtime settings `invoke tune` measures before the stack module sets them (docs/tuning.md); "
        "null: nothing to tune"))
    build_jobs: int | None = field(default=None, metadata=_doc("parallel build jobs; default: the host's cores",
                                                               min=1, max=4096))
    references: tuple[str, ...] = field(default=(), metadata=_doc("where these facts come from"))
    install: Install = field(default_factory=Install, metadata=_doc(
        "group ownership and modes of installed trees (independent of the admin's umask)"))

    def check(self) -> str | None:
        if not self.prefix.startswith(("/", "{")):
            return f"prefix: {self.prefix!r} must be an absolute path (or start with a placeholder such as {{home}})"
        if envvars.normal_path(self.prefix) in envvars.SYSTEM_DIRS:   # its layout step would set the mode of /tmp
            return f"prefix: {self.prefix!r} is a system directory, not an install prefix of sitestack's own"
        # a relative marker would be looked up from the remote shell's working directory
        if self.marker is not None and not self.marker.startswith(("/", "{")):
            return f"marker: {self.marker!r} must be an absolute path (e.g. /opt/cray/pe)"
        # module files, job scripts and launch helpers are world-readable: no credential may go there
        secret = next((name for name, value in self.env.items() if has_secret(f"{name}={value}")), None)
        if secret:
            return (f"env.{secret}: holds a credential, and the module files and job scripts it would go into are "
                    "readable by every user: give it to pip by ~/.netrc or the user's own environment")
        unknown = [name for name in self.env_defaults if name not in self.env]
        if unknown:
            return f"env_defaults: {', '.join(unknown)} not in env (a default needs its value there)"
        tuned = [name for name in (self.tuning.variables if self.tuning else ()) if name in self.env]
        if tuned:
            return (f"tuning.variables.{tuned[0]}: also set in env; a tuned setting is set only by a measurement "
                    "(invoke tune): remove it from env")
        return self._gpu_check()

    def tuning_problem(self) -> str | None:
        """Why the sweep's job (every point to its time limit: Tuning.sweep_seconds) cannot fit in the
        scheduler's longest job, where the site states it; None when it fits. ``invoke tune`` refuses such a
        sweep; the rest of the playbook is not refused for it (a provision must not fail over a measurement)."""
        if not self.tuning or not self.scheduler.max_job_time:
            return None
        need, most = self.tuning.sweep_seconds(), slurm_seconds(self.scheduler.max_job_time)
        if need <= most:
            return None
        return (f"tuning: the sweep cannot fit in one job: {len(self.tuning.points())} points x "
                f"({self.tuning.point_seconds}s point_time + {GUARD_GRACE}s) with start-up and margin need {need}s, "
                f"more than scheduler.max_job_time {self.scheduler.max_job_time} ({most}s): "
                "fewer candidates or a shorter point_time")

    def _gpu_check(self) -> str | None:
        if self.gpu.vendor == "amd" and self.rocm is None:
            return "an AMD GPU site needs rocm: {version, home}"
        if self.gpu.vendor == "nvidia" and self.cuda is None:
            return "an NVIDIA GPU site needs cuda: {version, home}"
        return None


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
        nested = [a for a in (tp, *typing.get_args(tp)) if isinstance(a, type) and dataclasses.is_dataclass(a)]
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
        value = type_name(args[1])
        return f"mapping of {value}" + ("" if value.endswith("s") else "s")
    if dataclasses.is_dataclass(tp):
        return "mapping"
    if tp is Any:
        return "value"
    return {str: "string", int: "integer", bool: "boolean", float: "number"}.get(tp, str(tp))
