"""The ``install-validation-job`` action: the site's validation job, installed in its prefix.

One step makes true: ``<dir>/`` holds the check program (``ddp_check.py``, ``ddp_report.py``),
``check-config.json``, one batch script per launcher in ``jobs/``, a ``README.md`` for the
site's users, where the site has ``facts.tuning`` the tuning sweep's plan (``tune-plan.json``) and
scripts (``jobs/tune-<launcher>.sbatch``, :mod:`sitestack.validation.tune_jobs`), and the MPI probe built against the site MPI in ``mpi-probe/`` (CMake through
scikit-build-core, a wheel built by ``pip wheel`` inside the site's modules and kept in the host's
build cache by source and toolchain digest, :mod:`sitestack.installs.wheel_cache`, then installed
by ``pip install --prefix``: another prefix needs no build). Files are compared
before they are written; the probe is rebuilt only when the digest of its sources, compiler
and Python changes (``mpi-probe/.sitestack-stamp``), into a staging directory renamed into
place, so a failed build leaves the previous probe (or none), never half of one.

A step with ``stack: NAME`` installs that stack's job, rendered with its facts (its module, its
Python, its site modules), by default in ``{prefix}/validation-NAME`` (:func:`job_dir`), beside the
playbook's own job in ``{prefix}/validation``; ``invoke validate --stack NAME`` runs it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sitestack.actions.action import Action, files_diff, files_pending, log_name, under, write_files
from sitestack.core.errors import SitestackError
from sitestack.core.host import Host
from sitestack.core.paths import SOURCES_DIR
from sitestack.core.quoting import in_prefix_problem
from sitestack.installs import wheel_cache
from sitestack.installs.installer import build_cache
from sitestack.installs.site_stack import job_inputs
from sitestack.model.context import RunContext
from sitestack.model.site import StepSpec
from sitestack.model.siteenv import in_site_env
from sitestack.validation.jobs import job_files
from sitestack.validation.tune_jobs import tune_files

PROBE_SOURCES = SOURCES_DIR / "mpi_probe"
PROBE_FILES = ("pyproject.toml", "CMakeLists.txt", "probe.c", "src/sitestack_mpi_probe/__init__.py",
               "src/sitestack_mpi_probe/__main__.py")
PROBE_EXE = "mpi-probe/bin/sitestack-mpi-probe"
STAMP = "mpi-probe/.sitestack-stamp"
#: Where the job is installed unless the step's ``dir`` says: the playbook's own stack's, and a further stack's
#: (``{stack}``: its key in the playbook's ``stacks:``), beside it rather than below it, so that neither job's
#: files nor its MPI probe's staging directory lie inside the other's directory.
DEFAULT_DIR = "{prefix}/validation"
STACK_DIR = "{prefix}/validation-{stack}"


def job_dir(args: Mapping[str, object], stack: str | None) -> str:
    """The ``dir`` of an install-validation-job step (its raw ``args``, placeholders unfilled) that has
    ``stack`` (None: the playbook's own stack)."""
    given = args.get("dir")
    if given is not None:
        return str(given)
    return DEFAULT_DIR if stack is None else STACK_DIR.replace("{stack}", stack)


def probe_digest(cc: str, build_python: str, flavour: str) -> str:
    digest = hashlib.sha256()
    for name in PROBE_FILES:
        digest.update(name.encode() + b"\0" + (PROBE_SOURCES / name).read_bytes() + b"\0")
    digest.update(f"cc={cc}\0python={build_python}\0mpi={flavour}".encode())
    return digest.hexdigest()


class InstallValidationJob(Action):
    """The validation DDP job (check program, batch scripts, README, MPI probe) is installed for the site."""

    action = "install-validation-job"
    #: Its files are rendered from the facts, and its MPI probe builds with the host's Python against the
    #: site's MPI into the job's own directory and build-cache entry: it reads nothing another step makes,
    #: so on a cold provision the probe builds beside the source builds (docs/cli.md).
    concurrent_by_default = True

    @dataclass(frozen=True)
    class Args:
        dir: str = field(default=DEFAULT_DIR, metadata={"doc": (
            "where the job is installed (on a step with `stack: NAME`: `{prefix}/validation-NAME`)")})
        python: str | None = field(default=None, metadata={"doc": (
            "the Python the job runs the checks with (default: the stack's, where a stack-venv step makes one, "
            "else facts.python.executable; `invoke install-validation-job --python` overrides)")})
        build_probe: bool = field(default=True, metadata={"doc": "build the MPI probe against the site MPI"})
        build_python: str = field(default="python3", metadata={"doc": (
            "the host's Python (with pip) that builds the MPI probe, once the site modules are loaded")})

        def check(self) -> str | None:
            return in_prefix_problem(self.dir, "dir")

    @classmethod
    def from_spec(cls, spec: StepSpec, ctx: RunContext) -> Action:
        """The step, its ``dir`` defaulting to the stack's own directory (:func:`job_dir`) on a step of a
        further stack."""
        if spec.stack is not None and "dir" not in (spec.args or {}):
            spec = dataclasses.replace(spec, args={**(spec.args or {}), "dir": job_dir(spec.args or {}, spec.stack)})
        return super().from_spec(spec, ctx)

    @classmethod
    def independent(cls, args: Any) -> bool:
        """Independent unless the probe builds with an interpreter named by path (it may be one another
        step makes, e.g. the stack's); a bare name is the host's own."""
        return not args.build_probe or "/" not in args.build_python

    def describe(self) -> str:
        return f"install the validation job in {self.args.dir}"

    # -- what it writes ----------------------------------------------------------------------
    def python(self) -> str | None:
        return self.ctx.options.python or self.args.python or None

    def files(self) -> dict[str, tuple[str, int]]:
        """The job's files, and where the site has ``facts.tuning`` the tuning sweep's plan and scripts."""
        inputs = job_inputs(self.ctx, self.args.dir, self.python())
        return {**job_files(inputs), **tune_files(inputs)}

    def rendered(self, earlier: Mapping[str, str]) -> dict[str, tuple[str, int]]:
        """The job's files (:meth:`files`); the MPI probe is built on the site, so not among them."""
        return under(self.args.dir, self.files())

    def cc(self) -> str:
        return shlex.split(self.ctx.facts.mpi.cc)[0]  # "cc -shared" is for libraries; the probe is a program

    def digest(self) -> str:
        return probe_digest(self.cc(), self.args.build_python, self.ctx.facts.mpi.flavour)

    # -- Step ----------------------------------------------------------------------------------
    def pending(self, host: Host) -> str | None:
        reasons = files_pending(host, self.args.dir, self.files())
        if self.args.build_probe:
            stamp = host.read_text(f"{self.args.dir}/{STAMP}")
            if stamp is None or not host.exists(f"{self.args.dir}/{PROBE_EXE}"):
                reasons.append("MPI probe not built")
            elif stamp.strip() != self.digest():
                reasons.append("MPI probe out of date")
        if not reasons:
            return None
        shown = reasons[:4] + ([f"and {len(reasons) - 4} more"] if len(reasons) > 4 else [])
        return "; ".join(shown)

    def diff(self, host: Host) -> str | None:
        return files_diff(host, self.args.dir, self.files())

    def apply(self, host: Host) -> None:
        write_files(host, self.args.dir, self.files())
        if self.args.build_probe:
            stamp = host.read_text(f"{self.args.dir}/{STAMP}")
            if stamp is None or stamp.strip() != self.digest() or not host.exists(f"{self.args.dir}/{PROBE_EXE}"):
                self.build_probe(host)

    def build_probe(self, host: Host) -> None:
        """Install the probe from its wheel in the host's build cache, built first (inside the site's
        modules) when no wheel for these sources and this toolchain is there yet (or under --no-cache)."""
        base = self.args.dir
        for name in PROBE_FILES:   # the sources are part of the job (its README points to them)
            host.put_file(PROBE_SOURCES / name, f"{base}/src/mpi_probe/{name}", 0o644)
        staging = f"{base}/mpi-probe.new"
        log = self.ctx.log_dir / log_name(self.name) if self.ctx.log_dir else None
        host.run(["rm", "-rf", "--", staging])
        py = self.args.build_python
        identity = wheel_cache.toolchain_identity(host, self.ctx.facts, [self.cc(), py], py)
        entry = (f"{build_cache(host, self.ctx.options)}/mpi-probe/"
                 f"{wheel_cache.entry_key(probe_digest(self.cc(), py, self.ctx.facts.mpi.flavour), identity)}")
        wheel = None if self.ctx.options.no_cache else wheel_cache.cached_file(host, entry)
        if wheel is None:
            wheel = wheel_cache.store_wheel(host, entry, self.build_wheel(host, log), identity,
                                            replace=self.ctx.options.no_cache)
        else:
            self.ctx.note(f"    [{host.name}] MPI probe: from the build cache ({wheel}, no build needed)")
        pip = [py, "-m", "pip", "install", "--no-deps", "--no-index", "--no-cache-dir", "--disable-pip-version-check",
               "--prefix", staging, wheel]
        host.run(in_site_env(self.ctx.facts, pip), log=log)
        host.run(["rm", "-rf", "--", f"{base}/mpi-probe.wheel"])
        if not host.exists(f"{staging}/bin/sitestack-mpi-probe"):
            raise SitestackError(f"the MPI probe build left no {staging}/bin/sitestack-mpi-probe")
        old = f"{base}/mpi-probe.old"
        host.run(["rm", "-rf", "--", old])
        if host.exists(f"{base}/mpi-probe"):
            host.run(["mv", "--", f"{base}/mpi-probe", old])
        host.run(["mv", "--", staging, f"{base}/mpi-probe"])
        host.run(["rm", "-rf", "--", old])
        host.write_text(f"{base}/{STAMP}", self.digest() + "\n", 0o644)

    def build_wheel(self, host: Host, log: Path | None) -> str:
        """Build the probe's wheel from its sources on the host (``src/mpi_probe``), inside the site's modules."""
        base = self.args.dir
        src, out = f"{base}/src/mpi_probe", f"{base}/mpi-probe.wheel"
        host.run(["rm", "-rf", "--", out])
        py = self.args.build_python
        has_backend = host.probe(in_site_env(self.ctx.facts, [py, "-c", "import scikit_build_core"])).ok
        pip = [py, "-m", "pip", "wheel", "--no-deps", "--no-cache-dir", "--disable-pip-version-check",
               "--wheel-dir", out]
        if has_backend:
            pip.append("--no-build-isolation")  # scikit-build-core is already there: no download
        pip.append(src)
        # The compiler by its absolute path (as the site modules put it on PATH): a bare name is looked
        # up by FindMPI in the prefix of the first mpiexec it finds first, where /usr/bin/cc is the
        # system's GCC, not the Cray driver (found on the Frontier twin).
        found = host.probe(in_site_env(self.ctx.facts, ["sh", "-c", 'command -v "$1"', "sh", self.cc()]))
        cc = found.stdout.strip().splitlines()[-1] if found.ok and found.stdout.strip() else self.cc()
        env = {"CC": cc, "CMAKE_ARGS": f"-DMPI_C_COMPILER={cc}"}
        try:
            host.run(in_site_env(self.ctx.facts, pip), env=env, log=log)
        except SitestackError as exc:
            raise SitestackError(f"building the MPI probe against {self.ctx.facts.mpi.flavour} ({self.cc()}) "
                                 f"failed: {exc}") from None
        listing = host.probe(["bash", "-c", 'ls -1 "$1"/*.whl', "sitestack", out])
        wheels = listing.stdout.split() if listing.ok else []
        if len(wheels) != 1:
            raise SitestackError(f"the MPI probe build made {len(wheels)} wheels in {out}, expected one")
        return wheels[0]
