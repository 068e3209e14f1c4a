"""The pieces of a site twin: stand-ins for what this machine lacks, each made in a directory that
mirrors the site's ``/`` (``stands/opt/cray/...`` is the site's ``/opt/cray/...``) and bound at the
site's own path in the twin's mount namespace (tests/twins/namespace.py). Module files and commands
therefore name the site's paths, never where the tree lies on this machine.

Each stand-in says in its first lines what it stands for and why (:data:`STAND_IN`).
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import stat
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path

from tests.twins.rocm import make_rccl_header, make_rocm

LMOD = "/usr/share/lmod/lmod"           # Debian's Lmod: bound at the site's Lmod path
MPICH_INCLUDE = "/usr/include/x86_64-linux-gnu/mpich"
MPICH_LIBS = "/usr/lib/x86_64-linux-gnu/libmpich.so*"
FABRIC_LIBS = "/usr/lib/x86_64-linux-gnu/libfabric.so*"

#: The first lines of every stand-in file (a module, a command): what it stands for, and why.
STAND_IN = "STAND-IN for {what}, written by sitestack's tests (tests/twins/stand_ins.py): {why}"


def site_path(stands: Path, path: Path) -> str:
    """The site's path of ``path``, a path inside the stand-ins tree ``stands``."""
    return "/" + str(path.relative_to(stands))


def module(tree: Path, name: str, body: str, *, what: str, why: str) -> Path:
    """A Lua module file ``tree/<name>.lua`` (Lmod) that says what it stands for."""
    path = tree / f"{name}.lua"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"-- {STAND_IN.format(what=what, why=why)}\n{body}")
    return path


def command(bindir: Path, name: str, script: str, *, what: str, why: str) -> Path:
    """An executable ``bindir/name`` (a POSIX shell script) that says what it stands for."""
    bindir.mkdir(parents=True, exist_ok=True)
    path = bindir / name
    path.write_text(f"#!/bin/sh\n# {STAND_IN.format(what=what, why=why)}\n{script}")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def plain_file(path: Path, what: str, why: str) -> Path:
    """A file that only says what it stands for (a library the site binds into its containers)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(STAND_IN.format(what=what, why=why) + "\n")
    return path


def link_tree(root: Path, include: Mapping[str, str], libs: str) -> Path:
    """A prefix whose ``include/`` holds only the given entries and whose ``lib/`` links the libraries
    matching ``libs``: Debian installs into /usr, and ``-I/usr/include`` breaks GCC's
    ``#include_next`` (docs/netplugin.md), so a site prefix cannot simply be /usr."""
    (root / "include").mkdir(parents=True, exist_ok=True)
    (root / "lib").mkdir(exist_ok=True)
    for name, target in include.items():
        (root / "include" / name).symlink_to(target)
    for lib in glob.glob(libs):
        (root / "lib" / os.path.basename(lib)).symlink_to(lib)
    return root


# -- MPI: Debian's MPICH under the site MPI's name and version string ---------------------------------------
SHIM_C = r"""/* %(stand_in)s */
#include <mpi.h>
#include <stdio.h>
int MPI_Get_library_version(char *version, int *resultlen) {
    char inner[MPI_MAX_LIBRARY_VERSION_STRING];
    int n = 0, rc = PMPI_Get_library_version(inner, &n);
    if (rc != MPI_SUCCESS) return rc;
    n = snprintf(version, MPI_MAX_LIBRARY_VERSION_STRING, "%%s (STAND-IN over %%s)", "%(label)s", inner);
    *resultlen = n < MPI_MAX_LIBRARY_VERSION_STRING ? n : MPI_MAX_LIBRARY_VERSION_STRING - 1;
    return MPI_SUCCESS;
}
"""


def mpi(prefix: Path, label: str, lib: str) -> Path:
    """An MPI prefix over Debian's MPICH whose ``lib/<lib>.so`` reports ``label`` from
    MPI_Get_library_version (the validation job checks the site's MPI by that string) and calls
    MPICH for everything else; programs linked with ``-l<lib>`` before MPICH get it first."""
    link_tree(prefix, {name: f"{MPICH_INCLUDE}/{name}" for name in ("mpi.h", "mpio.h", "mpicxx.h", "mpi_proto.h")},
              MPICH_LIBS)
    source = prefix / "lib" / "version-shim.c"
    source.write_text(SHIM_C % {"stand_in": STAND_IN.format(what=label, why="Debian's MPICH 4.0.2 is the MPI here"),
                                "label": label})
    subprocess.run(["mpicc", "-shared", "-fPIC", "-o", str(prefix / "lib" / f"{lib}.so"), str(source)], check=True)
    return prefix


def mpi_wrappers(bindir: Path, prefix: str, lib: str, *, what: str) -> None:
    """``mpicc``/``mpicxx``/``mpifort`` in ``bindir``: MPICH's, linking the site MPI's library first."""
    link = f'-L{prefix}/lib -Wl,-rpath,{prefix}/lib -Wl,--no-as-needed -l{lib[3:]} -Wl,--as-needed'
    for name in ("mpicc", "mpicxx", "mpifort"):
        command(bindir, name, f'exec /usr/bin/{name} {link} "$@"\n', what=f"{what} {name}",
                why="Debian's MPICH compiler wrapper, with the stand-in's version library linked first")


def cray_pe(stands: Path, tree: Path, *, mpich: str, prgenv: str = "8.5.0", loads_mpich: bool = False) -> None:
    """Cray PE stand-ins at /opt/cray/pe: ``PrgEnv-gnu`` (the ``cc``/``CC`` drivers over GCC) and
    ``cray-mpich/<mpich>`` (MPICH_DIR; the drivers then compile and link MPI, as craype does with
    cray-mpich loaded); ``loads_mpich``: PrgEnv-gnu loads cray-mpich, as on LUMI."""
    bindir = stands / "opt/cray/pe/craype/bin"
    mpich_dir = stands / f"opt/cray/pe/mpich/{mpich}/ofi/gnu/12.3"
    site_dir = site_path(stands, mpich_dir)
    mpi(mpich_dir, f"MPI VERSION    : CRAY MPICH version {mpich}", "libmpi")
    why = "this machine has no Cray PE; the drivers add MPI only with cray-mpich loaded, as craype does"
    link = '-L"$MPICH_DIR/lib" -Wl,-rpath,"$MPICH_DIR/lib" -Wl,--no-as-needed -lmpi -Wl,--as-needed'
    for name, plain, mpicc in (("cc", "gcc", "mpicc"), ("CC", "g++", "mpicxx"), ("ftn", "gfortran", "mpifort")):
        command(bindir, name, f'[ -n "${{MPICH_DIR:-}}" ] && exec /usr/bin/{mpicc} {link} "$@"\nexec {plain} "$@"\n',
                what=f"Cray's {name} compiler driver (craype)", why=why)
    load = f'load("cray-mpich/{mpich}")\n' if loads_mpich else ""
    module(tree, f"PrgEnv-gnu/{prgenv}", f'prepend_path("PATH", "{site_path(stands, bindir)}")\n'
           f'setenv("PE_ENV", "GNU")\n{load}', what="Cray's PrgEnv-gnu", why=why)
    module(tree, f"cray-mpich/{mpich}", f'setenv("MPICH_DIR", "{site_dir}")\n',
           what=f"cray-mpich {mpich} (Debian's MPICH 4.0.2 through the cc/CC drivers)", why=why)


def rocm(stands: Path, tree: Path, version: str, accel: str) -> None:
    """``rocm/<version>`` over /opt/rocm-<version>, a tree made from Debian's HIP (tests/twins/rocm.py)
    with the stand-in RCCL header, and ``craype-accel-<accel>``."""
    home = make_rccl_header(make_rocm(stands / f"opt/rocm-{version}"))
    module(tree, f"rocm/{version}", f'setenv("ROCM_PATH", "{site_path(stands, home)}")\n',
           what=f"ROCm {version}", why="Debian packages HIP 5.2 (hipcc, libamdhip64) and no RCCL")
    module(tree, f"craype-accel-{accel}", f'setenv("CRAY_ACCEL_TARGET", "{accel}")\n',
           what=f"craype-accel-{accel}", why="it only sets the GPU target of the Cray drivers; there is no GPU here")


def libfabric(stands: Path, path: str) -> Path:
    """A libfabric prefix at ``path`` (e.g. /opt/cray/libfabric/1.15.2.0) over Debian's libfabric 1.17."""
    return link_tree(stands / path.lstrip("/"), {"rdma": "/usr/include/rdma"}, FABRIC_LIBS)


def conda(stands: Path, tree: Path, name: str, home: str) -> None:
    """A ``miniforge3`` module over ``home`` whose ``conda`` makes environments with Python's venv (conda
    is neither in Debian nor usable from PyPI here). Only what sitestack and OLCF's users run is
    accepted: ``conda create --yes --prefix P python=X.Y pip`` and ``source activate P``."""
    bindir = stands / home.lstrip("/") / "bin"
    command(bindir, "conda", r'''set -eu
[ "${1:-}" = create ] || { echo "conda stand-in: only 'create' is provided" >&2; exit 2; }
shift; prefix=""; want=""
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix|-p) prefix=$2; shift 2 ;;
    python=*) want=${1#python=}; shift ;;
    *) shift ;;
  esac
done
have=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[ -n "$prefix" ] || { echo "conda stand-in: --prefix is required" >&2; exit 2; }
[ -z "$want" ] || [ "$want" = "$have" ] || { echo "conda stand-in: python=$want asked, this machine has $have" >&2; exit 1; }
exec python3 -m venv "$prefix"
''', what="conda of Miniforge3 (conda create --prefix)", why="conda cannot be installed on this machine")
    (bindir / "activate").write_text(
        f"# {STAND_IN.format(what='conda activate of Miniforge3 (source activate PREFIX)', why='the env is a venv')}\n"
        '. "$1/bin/activate" && export CONDA_PREFIX="$1" CONDA_DEFAULT_ENV="$1"\n')
    module(tree, name, f'prepend_path("PATH", "{home}/bin")\n', what=f"the {name} module",
           why="its conda is a stand-in (see bin/conda)")


def plain(tree: Path, names: Mapping[str, str]) -> None:
    """Site modules that change nothing the twin needs (name -> what it stands for)."""
    for name, what in names.items():
        module(tree, name, "", what=what, why="what it provides on the site is not used by the stack's build here")


def apptainer(root: Path) -> Path:
    """The container runtime stand-in (tests/twins/runtime.py: bubblewrap + squashfuse): ``apptainer``
    and ``singularity`` in ``root/opt/apptainer/bin``. Its ``build`` takes docker bases from
    ``$RUNTIME_TWIN_DOCKER_DIR`` (see :func:`torch_image`)."""
    from tests.twins import runtime
    return runtime.install(root / "opt/apptainer/bin")


def torch_image(tree: Path, python: str, image: Path, *, interpreter: str = "/usr/local/bin/python",
                keep: bool = False) -> Path:
    """A stand-in image of a PyTorch container: the host's ``/`` (the stand-in runtime lays an image over
    it) plus ``python`` on the container's PATH with torch 2.13.0 CPU: the site-packages of the test venv
    whose interpreter is ``python`` (tests/conftest.py validation_python), linked entry by entry into the
    host Python's ``/usr/local/lib/python3.X/dist-packages``, and a marker saying what it stands for."""
    from tests.twins import runtime
    site = Path(python).parent.parent / "lib"
    (packages,) = site.glob("python3.*/site-packages")
    if not keep:   # keep: what the caller already put into the tree (the LUMI image's conda)
        shutil.rmtree(tree, ignore_errors=True)
    target = tree / "usr/local/lib" / packages.parent.name / "dist-packages"
    target.mkdir(parents=True)
    for entry in packages.iterdir():
        if not entry.name.startswith("mpi4py"):   # the test venv's mpi4py (built here) is no image's
            (target / entry.name).symlink_to(entry)
    # the image's interpreter: the host's Python, whose prefix (found through the link) is /usr
    (tree / interpreter.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
    (tree / interpreter.lstrip("/")).symlink_to(f"/usr/bin/{packages.parent.name}")
    (tree / ".singularity.d/env").mkdir(parents=True, exist_ok=True)
    (tree / "STAND-IN").write_text(STAND_IN.format(what=f"a PyTorch container image ({image.name})", why=(
        "no image can be pulled here; the host's Python with the test venv's torch 2.13.0 CPU")) + "\n")
    image.parent.mkdir(parents=True, exist_ok=True)
    return runtime.make_image(tree, image)


def lumi_conda(tree: Path) -> None:
    """The LUMI image's conda activation in the image tree ``tree``: the image defines ``WITH_CONDA``
    (``source /opt/miniconda3/bin/activate pytorch``, https://lumi-supercomputer.github.io/LUMI-EasyBuild-docs/p/PyTorch/),
    and the activation sets CONDA_DEFAULT_ENV and CONDA_PREFIX and puts the env's ``bin`` on PATH. The
    env's python (``/opt/miniconda3/envs/pytorch/bin``) is not on the container's PATH before it."""
    (tree / "opt/miniconda3/bin").mkdir(parents=True, exist_ok=True)
    (tree / "opt/miniconda3/bin/activate").write_text(
        f"# {STAND_IN.format(what='conda activate of the LUMI image', why='the stand-in image has no conda')}\n"
        'export CONDA_DEFAULT_ENV="${1:-base}"\n'
        'export CONDA_PREFIX=/opt/miniconda3/envs/"$CONDA_DEFAULT_ENV"\n'
        'export PATH="$CONDA_PREFIX/bin:$PATH"\n')
    (tree / ".singularity.d/env").mkdir(parents=True, exist_ok=True)
    (tree / ".singularity.d/env/90-environment.sh").write_text(
        'export WITH_CONDA="source /opt/miniconda3/bin/activate pytorch"\n')


def cached(site: str, make: Callable[[Path], None]) -> Path:
    """The directory of a site's stand-ins, made by ``make`` at a fixed path (``<site>`` under
    $SITESTACK_TEST_TWINS, else ~/.cache/sitestack/twins). Made under a lock; made again when this
    code changed (its sum is kept). The site sees it only at its own paths, so where it lies never
    reaches a build's inputs."""
    import fcntl
    here = Path(__file__).resolve().parent
    key = hashlib.sha256(str(here).encode() + b"".join((here / n).read_bytes() for n in ("stand_ins.py", "sites.py", "rocm.py", "runtime.py"))).hexdigest()[:12]
    base = Path(os.environ.get("SITESTACK_TEST_TWINS") or Path.home() / ".cache" / "sitestack" / "twins")
    final = base / site
    base.mkdir(parents=True, exist_ok=True)
    with open(base / f".{site}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / ".complete").exists() and (final / ".complete").read_text() != key:
            shutil.rmtree(final)
        if not (final / ".complete").exists():
            shutil.rmtree(final, ignore_errors=True)
            make(final)
            (final / ".complete").write_text(key)
    return final
