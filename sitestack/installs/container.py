"""The container runtime a site runs its stack in: Singularity or Apptainer, in one place.

Everything sitestack does with a container (the stack venv built inside it, packed environments
and their wrappers, the LUMI container module, the Dawn image build, the validation job) asks a
:class:`Runtime` for the command lines and variable names, so the two runtimes differ here only:

- the command (``singularity`` / ``apptainer``);
- the variable prefix: ``SINGULARITY_BINDPATH`` and ``SINGULARITYENV_NAME`` vs
  ``APPTAINER_BINDPATH`` and ``APPTAINERENV_NAME`` (Apptainer still reads the ``SINGULARITY``
  names, with a warning: apptainer.org/docs/user/main/singularity_compatibility.html);
- argv: ``exec [--bind a,b] IMAGE CMD...``, ``build [--force] OUT DEF``, ``inspect --labels``.

The runtime is a fact (``facts.container.runtime``, one of :data:`RUNTIMES`): an unknown name is
an error when the playbook is loaded (the fact's type is a Literal of these names), and
:func:`runtime_named` gives the same clear error for a name from anywhere else.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sitestack.core.errors import SitestackError
from sitestack.model.container_facts import Container
from sitestack.model.facts import Facts

#: The runtimes sitestack drives. SingularityCE and Apptainer share the command line it uses.
RUNTIMES: tuple[str, ...] = ("singularity", "apptainer")


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


def container_of(facts: Facts, what: str) -> Container:
    """The site's container facts; a clear error saying ``what`` needs them when the site has none."""
    if facts.container is None:
        raise SitestackError(f"{what} needs facts.container (runtime, image), which this site does not set")
    return facts.container


def parse_labels(text: str) -> dict[str, str]:
    """``inspect --labels`` output (``key: value`` lines) -> mapping."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip():
            out[key.strip()] = value.strip()
    return out
