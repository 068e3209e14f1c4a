"""The container runtimes sitestack drives, one table row each (:data:`RUNTIME_TABLE`).

Everything sitestack does with a container (the stack venv built inside it, packed environments and
their wrappers, the LUMI container module, the Dawn image build, the validation job, the launch helper
and the job template) asks a :class:`Runtime` row for its command lines and variable names; no code
outside this table tests a runtime's name. A row says:

- how a command names the image (``image_arg``: a word before the command, or Shifter's
  ``--image=IMG``) and whether a batch job names it too (``sbatch_image``: Shifter's
  ``#SBATCH --image=docker:IMG``, which stages the image before the job starts);
- how a command runs inside (``command`` and ``run``: ``singularity exec IMG CMD``,
  ``shifter --image=IMG CMD``, ``podman-hpc run --rm IMG CMD``);
- how binds pass in: a variable the runtime reads (``SINGULARITY_BINDPATH``) and/or an option
  (``--bind a,b`` joined, or one ``--volume=src:dst`` per bind);
- how the environment passes in: ``<P>ENV_NAME`` variables (Singularity/Apptainer) or an option
  (Shifter ``--env=NAME=value``, podman-hpc ``-e NAME``);
- the runtime's own modules, which expose the GPUs and inject the site's NCCL network plugin and MPI
  into the container (Shifter ``--module=gpu,nccl-plugin``, ``--module=mpich``; podman-hpc ``--gpu``,
  ``--nccl``, ``--mpi``). A runtime without such a module cannot take ``container.net_plugin:
  runtime`` or ``container.mpi: runtime`` (:func:`refusal`).

Sources:

- Singularity / Apptainer: ``exec [--bind a,b] IMAGE CMD``, ``<P>_BINDPATH``, ``<P>ENV_NAME``
  (https://apptainer.org/docs/user/main/environment_and_metadata.html; Apptainer still reads the
  ``SINGULARITY`` names: https://apptainer.org/docs/user/main/singularity_compatibility.html).
- Shifter: ``shifter [--image=type:spec] [--volume=src:dst] CMD``, the image named by the batch job
  (``#SBATCH --image=docker:IMG``) or on the command line, which wins
  (https://shifter.readthedocs.io/en/latest/command/shifter.html); NERSC's modules ``gpu``,
  ``nccl-plugin`` and ``mpich`` and ``--env=NAME=value``
  (https://docs.nersc.gov/development/containers/shifter/how-to-use/).
- podman-hpc: a wrapper of ``podman run`` with site modules (``--gpu``, ``--mpi``, ``--nccl``; its
  ``modules_dir``: https://github.com/NERSC/podman-hpc, README;
  https://docs.nersc.gov/development/containers/podman-hpc/overview/); ``--volume``, ``-e NAME``
  (the host's value) and ``--env-host`` are podman's own
  (https://docs.podman.io/en/latest/markdown/podman-run.1.html).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from sitestack.core.errors import SitestackError

#: The runtimes sitestack drives: the keys of :data:`RUNTIME_TABLE`, as the fact's type.
RuntimeName = Literal["singularity", "apptainer", "shifter", "podman-hpc"]
RUNTIMES: tuple[str, ...] = get_args(RuntimeName)

#: What a runtime's modules can do for a job: expose the GPUs, inject the site's network plugin, its MPI.
Feature = Literal["gpu", "net_plugin", "mpi"]


@dataclass(frozen=True)
class Runtime:
    """One container runtime: a row of :data:`RUNTIME_TABLE` (see the module's docstring)."""

    name: str
    #: the words after the command that run a command in an image
    run: tuple[str, ...]
    #: how the run names the image, ``{image}`` replaced (a word before the command, or an option)
    image_arg: str
    #: the sbatch option that names the job's image, ``{image}`` replaced; None: the job does not
    sbatch_image: str | None
    #: the variable the runtime reads extra binds from (comma-separated ``src[:dst[:opts]]``); None: none
    bind_var: str | None
    #: the option that passes binds: ``--bind`` (the binds joined with ``,`` as its next word) or
    #: ``--volume`` (``--volume=src:dst``, one per bind)
    bind_option: str
    #: the prefix of the variables that set NAME inside (``SINGULARITYENV_``); None: an option does
    env_prefix: str | None
    #: the option words that pass NAME's value in, as shell text of a script (``{name}`` replaced:
    #: ``--env=NAME="${NAME}"``, ``-e NAME``); None: the prefix does
    env_option: tuple[str, ...] | None
    #: the module option, ``{}`` replaced by a module name (one option per module) or, with
    #: ``module_join``, by the names joined with ``,`` (one option)
    module_option: str | None
    module_join: bool
    #: the module that does each feature; a feature missing here is one the runtime cannot do
    modules: Mapping[Feature, str]
    #: whether the runtime builds images and reads their labels (``build``, ``inspect --labels``)
    builds: bool
    #: whether a bind can mount a squashfs image at a path (``IMG:DEST:image-src=/``, Apptainer's
    #: "image mounts"), which a packed environment's wrapper needs in a container
    mounts_images: bool

    @property
    def command(self) -> str:
        return self.name

    @property
    def prefix(self) -> str:
        """``SINGULARITY`` or ``APPTAINER``: what the runtime's variables start with."""
        return self.name.upper()

    def env_var(self, name: str) -> str:
        """The host variable that sets ``name`` inside the container (``SINGULARITYENV_NAME``); a
        runtime that passes values by option has none (:class:`SitestackError`)."""
        if self.env_prefix is None:
            raise SitestackError(f"container runtime {self.name} sets no variable inside from the host's "
                                 f"<PREFIX>ENV_NAME (it takes {' '.join(self.env_option or ())})")
        return f"{self.env_prefix}{name}"

    @property
    def prepend_path_var(self) -> str:
        """Prepended to the container's PATH (``<P>ENV_PREPEND_PATH``)."""
        return self.env_var("PREPEND_PATH")

    @staticmethod
    def image_bind(image: str, dest: str) -> str:
        """A bind spec mounting the squashfs ``image`` read-only at ``dest`` (``image-src=/``)."""
        return f"{image}:{dest}:image-src=/"

    def bind_words(self, binds: Iterable[str]) -> list[str]:
        """The options that bind ``binds`` (de-duplicated, order kept): ``--bind a,b`` or one
        ``--volume=src:dst`` each (a bare ``src`` as ``src:src``: podman reads a lone path as an
        anonymous volume)."""
        unique = list(dict.fromkeys(b for b in binds if b))
        if not unique:
            return []
        if self.bind_option == "--bind":
            return ["--bind", ",".join(unique)]
        return [f"{self.bind_option}={b if ':' in b else f'{b}:{b}'}" for b in unique]

    def env_words(self, names: Iterable[str]) -> list[str]:
        """The options (shell text of a script) that pass each of ``names`` in with its value when the
        script runs (none for a prefix runtime)."""
        if self.env_option is None:
            return []
        return [word.format(name=name) for name in names for word in self.env_option]

    def module_words(self, features: Iterable[Feature]) -> list[str]:
        """The runtime's options that do ``features`` (ValueError for one it cannot do)."""
        names = list(dict.fromkeys(self._module(f) for f in features))
        if not names or self.module_option is None:
            return []
        if self.module_join:
            return [self.module_option.format(",".join(names))]
        return [self.module_option.format(n) for n in names]

    def _module(self, feature: Feature) -> str:
        if feature not in self.modules:
            raise ValueError(f"container runtime {self.name} has no module for {feature}")
        return self.modules[feature]

    def exec_argv(self, image: str, argv: Sequence[str], binds: Iterable[str] = (),
                  options: Sequence[str] = ()) -> list[str]:
        """``<runtime> <run> [binds] [options] IMAGE ARGV...``, e.g. ``singularity exec --bind a,b IMG CMD``,
        ``podman-hpc run --rm ... IMG CMD``; an image given by option goes first, as the runtime's docs
        write it (``shifter --image=IMG --volume=a:a CMD``)."""
        image_word = self.image_arg.format(image=image)
        rest = [*self.bind_words(binds), *options]
        if image_word.startswith("-"):
            return [self.command, *self.run, image_word, *rest, *argv]
        return [self.command, *self.run, *rest, image_word, *argv]

    def build_argv(self, out: str, source: str, *, force: bool = True) -> list[str]:
        """``<runtime> build [--force] OUT SOURCE`` (SOURCE a definition file or a directory)."""
        return [self.command, "build", *(["--force"] if force else []), out, source]

    def inspect_labels_argv(self, image: str) -> list[str]:
        """``<runtime> inspect --labels IMAGE``: prints ``key: value`` lines."""
        return [self.command, "inspect", "--labels", image]


def _singularity_like(name: str) -> Runtime:
    # GPUs: the site binds its driver libraries (facts.container.bind), as LUMI's container docs do;
    # the network plugin and MPI come from the image or the host (container.net_plugin: container|host)
    return Runtime(name=name, run=("exec",), image_arg="{image}", sbatch_image=None,
                   bind_var=f"{name.upper()}_BINDPATH", bind_option="--bind", env_prefix=f"{name.upper()}ENV_",
                   env_option=None, module_option=None, module_join=False, modules={}, builds=True,
                   mounts_images=True)


#: One row per runtime (sources in the module's docstring).
RUNTIME_TABLE: Mapping[str, Runtime] = {
    "singularity": _singularity_like("singularity"),
    "apptainer": _singularity_like("apptainer"),
    "shifter": Runtime(
        name="shifter", run=(), image_arg="--image={image}", sbatch_image="--image=docker:{image}",
        bind_var=None, bind_option="--volume", env_prefix=None, env_option=('--env={name}="${{{name}}}"',),
        module_option="--module={}", module_join=True,
        modules={"gpu": "gpu", "net_plugin": "nccl-plugin", "mpi": "mpich"}, builds=False, mounts_images=False),
    # --env-host: the job's and Slurm's variables (SLURM_PROCID, MASTER_ADDR, NCCL_*) reach the ranks, as
    # with the other runtimes, which pass the host's environment in by default
    "podman-hpc": Runtime(
        name="podman-hpc", run=("run", "--rm", "--env-host"), image_arg="{image}", sbatch_image=None,
        bind_var=None, bind_option="--volume", env_prefix=None, env_option=("-e", "{name}"),
        module_option="--{}", module_join=False, modules={"gpu": "gpu", "net_plugin": "nccl", "mpi": "mpi"},
        builds=False, mounts_images=False),
}
assert tuple(RUNTIME_TABLE) == RUNTIMES


def runtime_named(name: str, where: str = "facts.container.runtime") -> Runtime:
    """The runtime called ``name``; an unknown one is a :class:`SitestackError` naming ``where``, what
    is accepted and the closest name."""
    if name not in RUNTIME_TABLE:
        close = difflib.get_close_matches(name, RUNTIMES, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise SitestackError(f"{where}: unknown container runtime {name!r} (known: {', '.join(RUNTIMES)}){hint}")
    return RUNTIME_TABLE[name]


def which_can(test: Callable[[Runtime], bool]) -> str:
    """The names of the runtimes that pass ``test``, for a message ("singularity, apptainer")."""
    return ", ".join(r.name for r in RUNTIME_TABLE.values() if test(r))


def refusal(runtime: Runtime, feature: Feature, key: str) -> str | None:
    """Why ``key: runtime`` (the runtime injects ``feature``) cannot be asked of ``runtime``, or None."""
    if feature in runtime.modules:
        return None
    return (f"{key}: runtime needs a runtime that injects it; {runtime.name} has no such option "
            f"(runtimes that do: {which_can(lambda r: feature in r.modules)}); use container"
            + (" or host" if feature == "net_plugin" else ""))


__all__ = ["RUNTIMES", "RUNTIME_TABLE", "Feature", "Runtime", "RuntimeName", "refusal", "runtime_named", "which_can"]
