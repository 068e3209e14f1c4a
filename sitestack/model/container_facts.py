"""A site's container facts (``facts.container``): the runtime and image the stack runs in, where the
image comes from (a copy of the site's, or a build from a definition file), and the choices the
container module makes. Part of :mod:`sitestack.model.facts`, which re-exports these names.

The runtime (``facts.container.runtime``, one of :data:`RUNTIMES`: Singularity, Apptainer, Shifter,
podman-hpc) is a row of :data:`sitestack.model.container_runtimes.RUNTIME_TABLE`, which everything that
runs a container asks for its command lines (:func:`runtime_of`). An unknown name is an error when the
playbook is loaded (the fact's type is the Literal :data:`RuntimeName`), and :func:`runtime_named`
gives the same clear error for a name from anywhere else.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from sitestack.core.quoting import SHELL_NAME
from sitestack.model.container_runtimes import (
    RUNTIMES,
    Feature,
    Runtime,
    RuntimeName,
    refusal,
    runtime_named,
    which_can,
)


def _doc(text: str, **extra: Any) -> dict[str, Any]:
    return {"doc": text, **extra}


#: The base images the apptainer-image step knows: name -> (Bootstrap agent, From template).
#: intel/intel-extension-for-pytorch's XPU images are tagged <version>-xpu (Dawn's image build,
#: https://github.com/kh296/dawn-containers).
IMAGE_BASES: Mapping[str, tuple[str, str]] = {
    "intel-extension-for-pytorch": ("docker", "intel/intel-extension-for-pytorch:{version}-xpu"),
}


@dataclass(frozen=True)
class ImageBuild:
    """How the apptainer-image step builds the site's image from a definition file (as Dawn's
    Apptainer instructions do, ``IMAGE_BASES``)."""

    base: str = field(metadata=_doc("the base image: one of " + ", ".join(IMAGE_BASES)))
    version: str = field(metadata=_doc("its version, e.g. 2.8.10 for intel/intel-extension-for-pytorch:2.8.10-xpu"))
    packages: tuple[str, ...] = field(default=(), metadata=_doc("pip requirements %post installs into the image"))
    environment: Mapping[str, str] = field(default_factory=dict, metadata=_doc(
        "defaults the image's %environment exports: a value the caller passes in (its environment, "
        "or <RUNTIME>ENV_NAME) wins", key_pattern=SHELL_NAME.pattern,
        key_doc="an environment variable name (letters, digits, _)"))
    where: Literal["login", "slurm"] = field(default="login", metadata=_doc(
        "login: build on the host the step runs on; slurm: as a batch job (sbatch --wait) with "
        "APPTAINER_TMPDIR on the node's local scratch"))
    slurm_options: tuple[str, ...] = field(default=(), metadata=_doc(
        "sbatch options of the build job, one per item (partition and account come from scheduler)"))
    time: str = field(default="00:30:00", metadata=_doc("wall time of the build job"))

    def check(self) -> str | None:
        if self.base not in IMAGE_BASES:
            return f"base: unknown base image {self.base!r} (known: {', '.join(IMAGE_BASES)})"
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]*", self.version):
            return f"version: {self.version!r} is not a version (letters, digits, . _ + -)"
        # packaging's parser is imported only for an image that names packages (a no-op's imports)
        from packaging.requirements import InvalidRequirement, Requirement

        for req in self.packages:
            try:
                Requirement(req)
            except InvalidRequirement as exc:
                return f"packages: {req!r} is not a pip requirement ({exc})"
        return None


@dataclass(frozen=True)
class Container:
    """A container runtime the stack is run through."""

    runtime: RuntimeName = field(metadata=_doc("container runtime"))
    image: str | None = field(default=None, metadata=_doc("image (SIF) the stack runs in"))
    bind: tuple[str, ...] = field(default=(), metadata=_doc("host paths bound into the container"))
    source: str | None = field(default=None, metadata=_doc(
        "the site's copy of the image that the container-image step installs at image (LUMI: its central "
        "/appl/local/containers copy); null: image is used where it is"))
    install: Literal["copy", "link"] = field(default="copy", metadata=_doc(
        "copy: the container-image step copies source to image (the user controls when it goes away); "
        "link: image is a symbolic link to source"))
    sha256: str | None = field(default=None, metadata=_doc(
        "sha256 of the image (source); the container-image step refuses an image that differs"))
    net_plugin: Literal["container", "host", "runtime"] = field(default="container", metadata=_doc(
        "which RCCL/NCCL network plugin the stack uses: the one inside the image (the stack module loads no "
        "host modules), the one sitestack builds on the host (its module and the site modules it needs), or "
        "the site's, which the runtime injects with its own option (Shifter --module=gpu,nccl-plugin, "
        "podman-hpc --nccl); runtime is refused for a runtime that has no such option"))
    mpi: Literal["container", "runtime"] = field(default="container", metadata=_doc(
        "the MPI the stack's programs use in the container: the image's, or the site's, which the runtime "
        "injects with its own option (Shifter --module=mpich, podman-hpc --mpi); runtime is refused for a "
        "runtime that has no such option"))
    with_conda: str | None = field(default=None, metadata=_doc(
        "the command that activates the image's conda environment; the module exports it as WITH_CONDA"))
    build: ImageBuild | None = field(default=None, metadata=_doc(
        "build the image from a definition file (the apptainer-image step); null: the image is given"))

    def check(self) -> str | None:
        if self.sha256 is not None and not re.fullmatch(r"[0-9a-f]{64}", self.sha256):
            return f"sha256: {self.sha256!r} is not 64 lowercase hex digits"
        if self.source is not None and self.image is None:
            return "source is set but image (where the container-image step installs it) is not"
        runtime = runtime_named(self.runtime)
        if self.net_plugin == "runtime" and (why := refusal(runtime, "net_plugin", "net_plugin")):
            return why
        if self.mpi == "runtime" and (why := refusal(runtime, "mpi", "mpi")):
            return why
        if self.build is not None and not runtime.builds:
            return f"build: {runtime.name} builds no images here (runtimes that do: {which_can(lambda r: r.builds)})"
        return None


def runtime_of(container: Container) -> Runtime:
    """The runtime of a site's container facts."""
    return runtime_named(container.runtime)


def container_features(container: Container, gpus: bool) -> list[Feature]:
    """What the runtime's modules do for a job in ``container``: expose the GPUs (a site with ``gpus``;
    always with the plugin, which needs them), inject the site's network plugin and MPI where the facts
    say the runtime does (``net_plugin: runtime``, ``mpi: runtime``). Only features the runtime has."""
    runtime = runtime_of(container)
    wanted: list[Feature] = ["gpu"] if gpus or container.net_plugin == "runtime" else []
    wanted += ["net_plugin"] if container.net_plugin == "runtime" else []
    wanted += ["mpi"] if container.mpi == "runtime" else []
    return [f for f in wanted if f in runtime.modules]


def passed_in(container: Container | None, names: Iterable[str]) -> list[tuple[str, str]]:
    """(the runtime's variable, NAME) for each of ``names``: exported as ``APPTAINERENV_NAME="$NAME"``, it
    passes the value NAME has into the container, where it wins over the image's ``%environment``
    (Apptainer docs, "Environment and metadata"). None without a container, or for a runtime that
    passes values by option (``Runtime.env_words``)."""
    if not container or runtime_of(container).env_prefix is None:
        return []
    return [(runtime_of(container).env_var(name), name) for name in names]


__all__ = ["IMAGE_BASES", "RUNTIMES", "Container", "ImageBuild", "Runtime", "RuntimeName", "container_features",
           "passed_in", "runtime_named", "runtime_of"]
