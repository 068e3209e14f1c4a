"""STAND-IN for the Shifter and podman-hpc container runtimes, on top of the Singularity/Apptainer
stand-in's runner (tests/twins/runtime.py: bubblewrap + squashfuse).

Why a stand-in: Shifter needs its setuid udiRoot and an image gateway, podman-hpc needs podman and
its site configuration; neither is packaged for Debian 12 or on PyPI. This module maps the subset of
their command lines that sitestack writes (model/container_runtimes.py) onto the same runner, with
the runtimes' documented behaviour, so the product's job scripts run unchanged:

- ``shifter [--image=[TYPE:]NAME|-i NAME] [--volume=SRC:DST[:ro]|-V SPEC] [--module=a,b|-m a,b]
  [--env=NAME=VALUE|-e NAME=VALUE] COMMAND [ARGS...]``; without ``--image`` the image is the one the
  batch job named (``SHIFTER_IMAGE``, ``SLURM_SPANK_SHIFTER_IMAGE``; the command line wins:
  https://shifter.readthedocs.io/en/latest/command/shifter.html). The host's environment passes in.
- ``podman-hpc run [--rm] [--env-host] [--MODULE...] [--volume=SRC:DST|-v SPEC] [-e NAME[=VALUE]|
  --env=...] IMAGE COMMAND [ARGS...]``: only ``-e`` values (``-e NAME``: the host's value; ``-e P*``:
  every host variable starting with P) and, with ``--env-host``, the host's environment pass in
  (https://docs.podman.io/en/latest/markdown/podman-run.1.html).

What stands for what: an image NAME (``docker:`` or none) is the squashfs file
``$RUNTIME_TWIN_DOCKER_DIR/<NAME with / and : as _>.sif`` (what the image gateway or ``podman-hpc
pull`` would have fetched). A runtime module (Shifter's ``--module=gpu,nccl-plugin``, podman-hpc's
``--gpu``/``--nccl``/``--mpi``: site configuration that mounts the site's libraries and sets
variables) is the file ``$RUNTIME_TWIN_MODULES_DIR/<runtime>/<module>`` of ``NAME=VALUE`` lines set
inside; an unknown module is an error, as on the site. The container's PATH is the image's default.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from tests.twins.mounts import Fatal
from tests.twins.runtime import DEFAULT_PATH, run_in


def image_file(name: str) -> str:
    """The stand-in's squashfs for the image ``name`` (``docker:`` type or none)."""
    kind, sep, spec = name.partition(":")
    if sep and kind == "docker":
        name = spec
    directory = os.environ.get("RUNTIME_TWIN_DOCKER_DIR", "")
    path = os.path.join(directory, name.replace("/", "_").replace(":", "_") + ".sif")
    if not directory or not os.path.isfile(path):
        raise Fatal(f"image {name} not found (the stand-in takes it from $RUNTIME_TWIN_DOCKER_DIR/"
                    f"{os.path.basename(path)})")
    return path


def module_settings(runtime: str, names: list[str]) -> list[str]:
    """The ``export`` lines of the site modules ``names`` of ``runtime``."""
    lines = []
    root = Path(os.environ.get("RUNTIME_TWIN_MODULES_DIR", "/nonexistent")) / runtime
    for name in names:
        path = root / name
        if not path.is_file():
            raise Fatal(f"unknown module {name!r} (the site's modules: "
                        f"{', '.join(sorted(p.name for p in root.glob('*'))) or 'none'})")
        for line in path.read_text().splitlines():
            key, sep, value = line.partition("=")
            if sep and not line.startswith("#"):
                lines.append(f"export {key.strip()}={shlex.quote(value.strip())}")
    return lines


def _value(opt: str, args: list[str]) -> str:
    """The value of ``--opt=VALUE`` or of ``-o VALUE``."""
    if "=" in opt and opt.startswith("--"):
        return opt.split("=", 1)[1]
    if not args:
        raise Fatal(f"option {opt} needs a value")
    return args.pop(0)


def _volume(spec: str) -> str:
    if ":" not in spec:
        raise Fatal(f"--volume {spec!r}: give SRC:DST")
    return spec


def do_shifter(args: list[str]) -> int:
    image = os.environ.get("SHIFTER_IMAGE") or os.environ.get("SLURM_SPANK_SHIFTER_IMAGE") or ""
    binds: list[str] = []
    modules: list[str] = []
    sets: list[str] = []
    while args and args[0].startswith("-"):
        opt = args.pop(0)
        if opt == "--":
            break
        name = opt.split("=", 1)[0]
        if name in ("--image", "-i"):
            image = _value(opt, args)
        elif name in ("--volume", "-V"):
            binds += [_volume(v) for v in _value(opt, args).split(";") if v]
        elif name in ("--module", "-m"):
            modules += [m for m in _value(opt, args).split(",") if m and m != "none"]
        elif name in ("--env", "-e"):
            key, sep, value = _value(opt, args).partition("=")
            if not sep:
                raise Fatal(f"--env {key}: give NAME=VALUE")
            sets.append(f"export {key}={shlex.quote(value)}")
        else:
            raise Fatal(f"the stand-in does not implement option {opt}")
    if not image or not args:
        raise Fatal("usage: shifter --image=IMAGE [options] COMMAND [ARGS...]")
    env = {**os.environ, "PATH": DEFAULT_PATH}
    return run_in(image_file(image), binds, env, [*module_settings("shifter", modules), *sets], args)


def do_podman_run(args: list[str]) -> int:
    binds: list[str] = []
    modules: list[str] = []
    passed: dict[str, str] = {}
    host = False
    while args and args[0].startswith("-"):
        opt = args.pop(0)
        name = opt.split("=", 1)[0]
        if name == "--rm":
            continue
        if name == "--env-host":
            host = True
        elif name in ("--volume", "-v"):
            binds.append(_volume(_value(opt, args)))
        elif name in ("--env", "-e"):
            passed.update(_podman_env(_value(opt, args)))
        elif opt.startswith("--") and "=" not in opt:
            modules.append(opt[2:])   # a podman-hpc module (site configuration): --gpu, --nccl, --mpi
        else:
            raise Fatal(f"the stand-in does not implement option {opt}")
    if len(args) < 2:
        raise Fatal("usage: podman-hpc run [options] IMAGE COMMAND [ARGS...]")
    image, command = args[0], args[1:]
    env = {**(dict(os.environ) if host else {"HOME": os.environ.get("HOME", "/")}), "PATH": DEFAULT_PATH}
    sets = [f"export {k}={shlex.quote(v)}" for k, v in passed.items()]
    return run_in(image_file(image), binds, env, [*module_settings("podman-hpc", modules), *sets], command)


def _podman_env(spec: str) -> dict[str, str]:
    """``NAME=VALUE``, ``NAME`` (the host's value, when set) or ``PREFIX*`` (every host variable with it)."""
    key, sep, value = spec.partition("=")
    if sep:
        return {key: value}
    if key.endswith("*"):
        return {k: v for k, v in os.environ.items() if k.startswith(key[:-1])}
    return {key: os.environ[key]} if key in os.environ else {}


def main(runtime: str, args: list[str]) -> int:
    if runtime == "shifter":
        return do_shifter(args)
    if not args or args[0] != "run":
        raise Fatal(f"the stand-in implements only 'podman-hpc run', not {' '.join(args[:1]) or 'nothing'}")
    return do_podman_run(args[1:])
