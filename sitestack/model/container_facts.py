"""A site's container facts (``facts.container``): the runtime and image the stack runs in, where the
image comes from (a copy of the site's, or a build from a definition file), and the choices the
container module makes. Part of :mod:`sitestack.model.facts`, which re-exports these names.

It also holds the container runtime a site runs its stack in, Singularity or Apptainer, in one place.
Everything sitestack does with a container (the stack venv built inside it, packed environments
and their wrappers, the LUMI container module, the Dawn image build, the validation job) asks a
:class:`Runtime` for the command lines and variable names, so the two runtimes differ here only:

- the command (``singularity`` / ``apptainer``);
- the variable prefix: ``SINGULARITY_BINDPATH`` and ``SINGULARITYENV_NAME`` vs
  ``APPTAINER_BINDPATH`` and ``APPTAINERENV_NAME`` (Apptainer still reads the ``SINGULARITY``
  names, with a warning: https://apptainer.org/docs/user/main/singularity_compatibility.html);
- argv: ``exec [--bind a,b] IMAGE CMD...``, ``build [--force] OUT DEF``, ``inspect --labels``.

The runtime is a fact (``facts.container.runtime``, one of :data:`RUNTIMES`): an unknown name is
an error when the playbook is loaded (the fact's type is the Literal :data:`RuntimeName`), and
:func:`runtime_named` gives the same clear error for a name from anywhere else.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from sitestack.core.errors import SitestackError
from sitestack.core.quoting import SHELL_NAME

#: The runtimes sitestack drives. SingularityCE and Apptainer share the command line it uses.
RuntimeName = Literal["singularity", "apptainer"]
RUNTIMES: tuple[str, ...] = get_args(RuntimeName)


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
    net_plugin: Literal["container", "host"] = field(default="container", metadata=_doc(
        "which RCCL/NCCL network plugin the stack uses: the one inside the image (the stack module loads no "
        "host modules) or the one sitestack builds on the host (its module and the site modules it needs)"))
    with_conda: str | None = field(default=None, metadata=_doc(
        "the command that activates the image's conda environment; the module exports it as WITH_CONDA"))
    build: ImageBuild | None = field(default=None, metadata=_doc(
        "build the image from a definition file (the apptainer-image step); null: the image is given"))

    def check(self) -> str | None:
        if self.sha256 is not None and not re.fullmatch(r"[0-9a-f]{64}", self.sha256):
            return f"sha256: {self.sha256!r} is not 64 lowercase hex digits"
        if self.source is not None and self.image is None:
            return "source is set but image (where the container-image step installs it) is not"
        return None


@dataclass(frozen=True)
class Runtime:
    """One container runtime: its command and the names of its variables."""

    name: str

    @property
    def command(self) -> str:
        return self.name

    @property
    def prefix(self) -> str:
        """``SINGULARITY`` or ``APPTAINER``."""
        return self.name.upper()

    @property
    def bind_var(self) -> str:
        """The variable the runtime reads extra binds from (comma-separated ``src[:dst[:opts]]``)."""
        return f"{self.prefix}_BINDPATH"

    def env_var(self, name: str) -> str:
        """The host variable that sets ``name`` inside the container (``SINGULARITYENV_NAME``)."""
        return f"{self.prefix}ENV_{name}"

    @property
    def prepend_path_var(self) -> str:
        """Prepended to the container's PATH (``<P>ENV_PREPEND_PATH``)."""
        return self.env_var("PREPEND_PATH")

    @staticmethod
    def image_bind(image: str, dest: str) -> str:
        """A bind spec mounting the squashfs ``image`` read-only at ``dest`` (``image-src=/``)."""
        return f"{image}:{dest}:image-src=/"

    def exec_argv(self, image: str, argv: Sequence[str], binds: Iterable[str] = ()) -> list[str]:
        """``<runtime> exec [--bind b1,b2] IMAGE ARGV...`` (binds de-duplicated, order kept)."""
        out = [self.command, "exec"]
        joined = ",".join(dict.fromkeys(b for b in binds if b))
        if joined:
            out += ["--bind", joined]
        return [*out, image, *argv]

    def build_argv(self, out: str, source: str, *, force: bool = True) -> list[str]:
        """``<runtime> build [--force] OUT SOURCE`` (SOURCE a definition file or a directory)."""
        return [self.command, "build", *(["--force"] if force else []), out, source]

    def inspect_labels_argv(self, image: str) -> list[str]:
        """``<runtime> inspect --labels IMAGE``: prints ``key: value`` lines."""
        return [self.command, "inspect", "--labels", image]


def runtime_named(name: str, where: str = "facts.container.runtime") -> Runtime:
    """The runtime called ``name``; an unknown one is a :class:`SitestackError` naming ``where``."""
    if name not in RUNTIMES:
        raise SitestackError(f"{where}: unknown container runtime {name!r} (known: {', '.join(RUNTIMES)})")
    return Runtime(name)


def runtime_of(container: Container) -> Runtime:
    """The runtime of a site's container facts."""
    return runtime_named(container.runtime)


def passed_in(container: Container | None, names: Iterable[str]) -> list[tuple[str, str]]:
    """(the runtime's variable, NAME) for each of ``names``: exported as ``APPTAINERENV_NAME="$NAME"``, it
    passes the value NAME has into the container, where it wins over the image's ``%environment``
    (Apptainer docs, "Environment and metadata"). None without a container."""
    return [(runtime_of(container).env_var(name), name) for name in names] if container else []


__all__ = ["IMAGE_BASES", "RUNTIMES", "Container", "ImageBuild", "Runtime", "RuntimeName", "passed_in",
           "runtime_named", "runtime_of"]
