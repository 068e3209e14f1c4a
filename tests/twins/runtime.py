"""STAND-IN for the Singularity / Apptainer container runtime, on top of bubblewrap and squashfuse
(and the runner under the Shifter and podman-hpc stand-ins: tests/twins/runtime_modules.py).

Why a stand-in: neither SingularityCE nor Apptainer is packaged for Debian 12 or on PyPI, so the
product's container features (packed environments, the LUMI container module and its run
scripts, the Dawn image build) could not run here at all. bubblewrap (mount namespaces),
squashfuse (FUSE-mounted squashfs, FUSE works as root here) and squashfs-tools are in Debian.
This module implements only the subset of the runtime's command line that sitestack uses, with
the runtime's documented behaviour, so the product's scripts and argv run unchanged:

- ``shell [--bind SPEC] IMAGE``: ``exec IMAGE /bin/bash --norc`` (the shell reads stdin).
- ``exec [--bind|-B SPEC[,SPEC]] IMAGE COMMAND [ARGS...]`` (global ``-s/--silent``, ``-q/--quiet``
  accepted before the subcommand). SPEC is ``src``, ``src:dst``, ``src:dst:ro`` or
  ``img.sqfs:dst:image-src=/`` (the squashfs image mounted at dst, read-only: Apptainer's
  "image mounts"). The ``<P>_BIND`` / ``<P>_BINDPATH`` variables add binds like ``--bind``.
  A bind source that does not exist is an error, as in the real runtimes.
- The environment: the host's is inherited except ``PATH`` (the container default) and
  ``LD_LIBRARY_PATH``; the image's ``/.singularity.d/env/*.sh`` are sourced, then each
  ``<P>ENV_NAME=value`` sets ``NAME`` inside, and ``<P>ENV_PREPEND_PATH`` /
  ``<P>ENV_APPEND_PATH`` extend ``PATH`` (Apptainer docs, "Environment and metadata").
  ``<P>`` is ``SINGULARITY`` for the ``singularity`` command; ``apptainer`` honours
  ``APPTAINER`` and, like Apptainer, the legacy ``SINGULARITY`` names (``APPTAINER`` wins).
- ``build [--force|-F] OUT SOURCE``: SOURCE a directory (packed as is), a squashfs image
  (copied), or a definition file with ``Bootstrap: localimage`` (``From:`` a local image) or
  ``Bootstrap: docker`` (``From: name:tag`` taken from ``$RUNTIME_TWIN_DOCKER_DIR/<name>_<tag>.sif``
  with ``/`` as ``_``: nothing outside this machine can be reached), running ``%post`` in the
  image, writing ``%environment`` and ``%labels`` into ``/.singularity.d``. ``%post`` sees the
  image laid over the host as ``exec`` does; what it writes lands in the image only under
  directories the host lacks (no overlay file system in bubblewrap 0.8).
- ``inspect --labels IMAGE``: ``key: value`` lines of the image's labels.
- ``version`` / ``--version``.

What a "SIF" is here: a squashfs image of a file tree. The container's root file system is the
host's ``/`` (read-only) with the image's tree laid over it directory by directory, so a small
image (a conda-like Python, the run scripts) behaves like a full one while the host's tools
stay visible; ``/tmp``, ``$HOME`` and the working directory are bound read-write, as the real
runtimes do by default. A bind onto a path that does not exist is given a mount point the way
Apptainer's "underlay" does: the nearest existing directory is replaced by a tmpfs holding
binds of its entries.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

if not __package__:  # run as a script by the installed singularity/apptainer: find the checkout's tests/
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.twins.mounts import Fatal, View  # noqa: E402

TOOLS = ("bwrap", "squashfuse", "mksquashfs", "unsquashfs", "fusermount3")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
VERSION = {"singularity": "singularity-ce version 4.1.0 (sitestack stand-in)",
           "apptainer": "apptainer version 1.3.4 (sitestack stand-in)"}


def available() -> str | None:
    """Why the stand-in cannot run here, or None when it can."""
    for tool in TOOLS:
        if not shutil.which(tool):
            return f"{tool} not installed (apt-get install bubblewrap squashfuse squashfs-tools fuse3)"
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse missing"
    if os.geteuid() != 0:
        return "squashfuse mounts and bwrap binds need root here"
    return None


#: The runtimes the stand-in answers as: Shifter and podman-hpc through tests/twins/runtime_modules.py.
COMMANDS = ("singularity", "apptainer", "shifter", "podman-hpc")


def install(bin_dir: Path, docker_dir: Path | None = None, modules_dir: Path | None = None) -> Path:
    """Write ``singularity``, ``apptainer``, ``shifter`` and ``podman-hpc`` executables into ``bin_dir``
    that run this stand-in (``docker_dir``: the images by name; ``modules_dir``: the runtimes' site
    modules, tests/twins/runtime_modules.py)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    docker = f"export RUNTIME_TWIN_DOCKER_DIR={shlex.quote(str(docker_dir))}\n" if docker_dir else ""
    if modules_dir:
        docker += f"export RUNTIME_TWIN_MODULES_DIR={shlex.quote(str(modules_dir))}\n"
    for name in COMMANDS:
        path = bin_dir / name
        path.write_text(f"#!/bin/sh\n# STAND-IN for {name}: tests/twins/runtime.py (bwrap + squashfuse)\n{docker}"
                        f"exec {shlex.quote(sys.executable)} {shlex.quote(__file__)} {name} \"$@\"\n")
        path.chmod(0o755)
    return bin_dir


def make_image(tree: Path, image: Path) -> Path:
    """Pack the file tree ``tree`` into the image file ``image`` (a squashfs, the stand-in's SIF)."""
    subprocess.run(["mksquashfs", str(tree), str(image), "-noappend", "-quiet", "-no-progress", "-all-root"],
                   check=True, stdout=subprocess.DEVNULL)
    return image


# -- exec -----------------------------------------------------------------------------------------------
class Mounts:
    """squashfuse mounts made for one run, unmounted at the end."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="runtime-twin-"))
        self.points: list[Path] = []

    def mount(self, image: str) -> str:
        point = self.dir / f"m{len(self.points)}"
        point.mkdir()
        out = subprocess.run(["squashfuse", image, str(point)], capture_output=True, text=True)
        if out.returncode != 0:
            raise Fatal(f"could not mount image {image}: {out.stderr.strip() or 'not a squashfs image'}")
        self.points.append(point)
        return str(point)

    def close(self) -> None:
        for point in reversed(self.points):
            subprocess.run(["fusermount3", "-u", "-z", str(point)], capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)


def prefixes(runtime: str) -> list[str]:
    """Variable prefixes this runtime reads, lowest precedence first."""
    return ["SINGULARITY"] if runtime == "singularity" else ["SINGULARITY", "APPTAINER"]


def parse_bind(spec: str) -> tuple[str, str, str]:
    fields = spec.split(":")
    if len(fields) > 3 or not fields[0]:
        raise Fatal(f"bind spec {spec!r} is not src[:dst[:options]]")
    src = fields[0]
    dst = fields[1] if len(fields) > 1 and fields[1] else src
    return src, dst, fields[2] if len(fields) > 2 else ""


def inner_env(runtime: str, env: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """The environment passed in, and the shell lines applied after the image's env scripts."""
    keep = {k: v for k, v in env.items() if k not in ("PATH", "LD_LIBRARY_PATH")
            and not any(k.startswith(f"{p}ENV_") or k.startswith(f"{p}_") for p in ("SINGULARITY", "APPTAINER"))}
    keep["PATH"] = DEFAULT_PATH
    keep["LD_LIBRARY_PATH"] = "/.singularity.d/libs"
    sets: dict[str, str] = {}
    for prefix in prefixes(runtime):
        for key, value in env.items():
            if key.startswith(f"{prefix}ENV_"):
                sets[key[len(prefix) + 4:]] = value
    lines = []
    prepend, append = sets.pop("PREPEND_PATH", None), sets.pop("APPEND_PATH", None)
    for key, value in sorted(sets.items()):
        lines.append(f"export {key}={shlex.quote(value)}")
    if prepend:
        lines.append(f'export PATH={shlex.quote(prepend)}:"$PATH"')
    if append:
        lines.append(f'export PATH="$PATH":{shlex.quote(append)}')
    return keep, lines


def do_shell(runtime: str, args: list[str]) -> int:
    """``shell [--bind SPEC] IMAGE``: an interactive shell in the container, reading its stdin: bash
    without rc files when the container has it, as the runtimes' shell action starts it
    (Apptainer docs, "shell": "/bin/bash --norc" when present, else /bin/sh)."""
    options = args[:-1]
    if not args or args[-1].startswith("-"):
        raise Fatal("usage: shell [--bind SPEC] IMAGE")
    return do_exec(runtime, [*options, args[-1], "/bin/bash", "--norc"])


def do_exec(runtime: str, args: list[str]) -> int:
    binds: list[str] = []
    for prefix in prefixes(runtime):
        for var in (f"{prefix}_BINDPATH", f"{prefix}_BIND"):
            binds += [b for b in os.environ.get(var, "").split(",") if b]
    while args and args[0].startswith("-"):
        opt = args.pop(0)
        if opt in ("--bind", "-B") and args:
            binds += [b for b in args.pop(0).split(",") if b]
        elif opt.startswith("--bind="):
            binds += [b for b in opt.split("=", 1)[1].split(",") if b]
        else:
            raise Fatal(f"the stand-in does not implement option {opt}")
    if len(args) < 2:
        raise Fatal("usage: exec [--bind SPEC] IMAGE COMMAND [ARGS...]")
    image, command = args[0], args[1:]
    if not os.path.isfile(image):
        raise Fatal(f"could not open image {image}: no such file")
    env, lines = inner_env(runtime, dict(os.environ))
    return run_in(image, binds, env, lines, command)


def run_in(image: str, binds: list[str], env: dict[str, str], lines: list[str], command: list[str]) -> int:
    """Run ``command`` in ``image`` (a squashfs laid over the host's ``/``) with ``binds``, the environment
    ``env``, and the shell ``lines`` applied after the image's env scripts; its exit status."""
    mounts = Mounts()
    try:
        view = View()
        for path in dict.fromkeys(p for p in ("/tmp", os.environ.get("HOME"), os.getcwd())
                                  if p and p != "/" and os.path.isdir(p)):
            view.bind(path, path, ro=False)
        view.overlay(mounts.mount(image))
        for spec in binds:
            src, dst, opts = parse_bind(spec)
            if not os.path.exists(src):
                raise Fatal(f"container creation failed: mount {src}->{dst} error: while mounting {src}: "
                            "mount source doesn't exist")
            if opts.startswith("image-src="):
                inside = opts.split("=", 1)[1] or "/"
                view.bind(os.path.join(mounts.mount(src), inside.lstrip("/")), dst, ro=True)
            else:
                view.bind(os.path.realpath(src), dst, ro=opts == "ro")
        script = ("for f in /.singularity.d/env/*.sh; do [ -f \"$f\" ] && . \"$f\"; done\n"
                  + "\n".join(lines) + '\nexec "$@"\n')
        argv = ["bwrap", "--die-with-parent", *view.argv(), "--dev-bind", "/dev", "/dev", "--proc", "/proc",
                "--ro-bind", "/sys", "/sys", "--chdir", os.getcwd(), "--", "/bin/sh", "-c", script, "sh", *command]
        # open descriptors pass into the container, as with the real runtimes: MPICH's PMI client talks to
        # srun/Hydra over the inherited PMI_FD (closed, MPI_Init fails: "PMI_Get_appnum returned -1")
        child = subprocess.Popen(argv, env=env, close_fds=False)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, lambda s, _f: child.send_signal(s))
        code = child.wait()
        return 128 - code if code < 0 else code
    finally:
        mounts.close()


# -- build and inspect ---------------------------------------------------------------------------------
def parse_def(text: str) -> tuple[dict[str, str], dict[str, str]]:
    """(header, sections) of a definition file."""
    header: dict[str, str] = {}
    sections: dict[str, str] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("%"):
            current = line[1:].split()[0]
            sections[current] = ""
        elif current is not None:
            sections[current] += line + "\n"
        elif line.strip() and not line.lstrip().startswith("#"):
            key, sep, value = line.partition(":")
            if not sep:
                raise Fatal(f"definition file: bad header line {line!r}")
            header[key.strip().lower()] = value.strip()
    return header, sections


def base_image(header: dict[str, str], where: Path) -> str:
    bootstrap = header.get("bootstrap", "")
    source = header.get("from", "")
    if bootstrap == "localimage":
        path = (where / source) if not os.path.isabs(source) else Path(source)
        if not path.is_file():
            raise Fatal(f"localimage {source}: no such file")
        return str(path)
    if bootstrap == "docker":
        directory = os.environ.get("RUNTIME_TWIN_DOCKER_DIR")
        name = source.replace("/", "_").replace(":", "_") + ".sif"
        if not directory or not os.path.isfile(os.path.join(directory, name)):
            raise Fatal(f"while building from docker://{source}: the stand-in cannot pull (no network here); "
                        f"put the image at $RUNTIME_TWIN_DOCKER_DIR/{name}")
        return os.path.join(directory, name)
    raise Fatal(f"the stand-in does not implement Bootstrap: {bootstrap or '(missing)'}")


def do_build(runtime: str, args: list[str]) -> int:
    force = False
    while args and args[0].startswith("-"):
        opt = args.pop(0)
        if opt in ("--force", "-F"):
            force = True
        else:
            raise Fatal(f"the stand-in does not implement build option {opt}")
    if len(args) != 2:
        raise Fatal("usage: build [--force] OUT SOURCE")
    out, source = args
    if os.path.exists(out) and not force:
        raise Fatal(f"Build target '{out}' already exists. Use --force if you want to overwrite it")
    if os.path.isdir(source):
        make_image(Path(source), Path(out))
        return 0
    with open(source, "rb") as fh:
        magic = fh.read(4)
    if magic == b"hsqs":
        shutil.copyfile(source, out)
        return 0
    header, sections = parse_def(Path(source).read_text())
    base = base_image(header, Path(source).parent)
    with tempfile.TemporaryDirectory(prefix="runtime-twin-build-") as tmp:
        root = Path(tmp) / "rootfs"
        subprocess.run(["unsquashfs", "-q", "-n", "-d", str(root), base], check=True, stdout=subprocess.DEVNULL)
        meta = root / ".singularity.d"
        (meta / "env").mkdir(parents=True, exist_ok=True)
        if sections.get("environment", "").strip():
            (meta / "env" / "90-environment.sh").write_text(sections["environment"])
        labels = json.loads((meta / "labels.json").read_text()) if (meta / "labels.json").exists() else {}
        for line in sections.get("labels", "").splitlines():
            if line.strip():
                key, _, value = line.strip().partition(" ")
                labels[key] = value.strip()
        (meta / "labels.json").write_text(json.dumps(labels, indent=2, sort_keys=True) + "\n")
        (meta / "Singularity").write_text(Path(source).read_text())
        if sections.get("post", "").strip():
            # %post runs in the image being built: its tree (writable) laid over the host's / as for exec
            view = View()
            for path in ("/tmp",):
                view.bind(path, path, ro=False)
            view.overlay(str(root), ro=False)
            argv = ["bwrap", "--die-with-parent", *view.argv(), "--dev-bind", "/dev", "/dev", "--proc", "/proc",
                    "--chdir", "/", "--", "/bin/sh", "-e", "-c", sections["post"]]
            env, _ = inner_env(runtime, dict(os.environ))
            code = subprocess.run(argv, env=env).returncode
            if code != 0:
                raise Fatal(f"While performing build: while running engine: exit status {code}")
        make_image(root, Path(out))
    return 0


def do_inspect(args: list[str]) -> int:
    if len(args) != 2 or args[0] != "--labels":
        raise Fatal("usage: inspect --labels IMAGE")
    out = subprocess.run(["unsquashfs", "-cat", args[1], ".singularity.d/labels.json"], capture_output=True, text=True)
    labels = json.loads(out.stdout) if out.returncode == 0 and out.stdout.strip() else {}
    for key, value in sorted(labels.items()):
        print(f"{key}: {value}")
    return 0


def main(argv: list[str]) -> int:
    runtime, args = argv[0], list(argv[1:])
    while runtime not in ("shifter", "podman-hpc") and args and args[0] in ("-s", "--silent", "-q", "--quiet"):
        args.pop(0)
    try:
        if runtime in ("shifter", "podman-hpc"):
            from tests.twins import runtime_modules
            return runtime_modules.main(runtime, args)
        if not args or args[0] in ("--version", "version"):
            print(VERSION[runtime])
            return 0
        command, rest = args[0], args[1:]
        if command == "exec":
            return do_exec(runtime, rest)
        if command == "shell":
            return do_shell(runtime, rest)
        if command == "build":
            return do_build(runtime, rest)
        if command == "inspect":
            return do_inspect(rest)
        raise Fatal(f"the stand-in does not implement '{command}'")
    except Fatal as exc:
        print(f"FATAL:   {exc}", file=sys.stderr)
        return 255


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
