"""The container runtime stand-in (tests/twins/runtime.py) does what the real runtimes do for the
subset sitestack uses: exec with binds and image mounts, the <P>ENV_* variables, build, inspect."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.twins import runtime

pytestmark = pytest.mark.skipif(runtime.available() is not None, reason=f"stand-in runtime: {runtime.available()}")


@pytest.fixture
def twin(tmp_path: Path) -> Path:
    img = tmp_path / "img"
    (img / "runscripts").mkdir(parents=True)
    (img / "opt" / "conda" / "bin").mkdir(parents=True)
    (img / ".singularity.d" / "env").mkdir(parents=True)
    script = img / "runscripts" / "hello"
    script.write_text('#!/bin/sh\necho hello "$@"\n')
    script.chmod(0o755)
    (img / "opt" / "conda" / "bin" / "python").symlink_to("/usr/bin/python3")
    (img / ".singularity.d" / "env" / "90-environment.sh").write_text('export WITH_CONDA="source activate"\n')
    runtime.make_image(img, tmp_path / "test.sif")
    data = tmp_path / "data"
    data.mkdir()
    (data / "x").write_text("payload\n")
    runtime.make_image(data, tmp_path / "data.sqfs")
    # Shifter and podman-hpc name images: the stand-in finds them by name; their site modules are files
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "example_torch_1.0.sif").write_bytes((tmp_path / "test.sif").read_bytes())
    for rt, module in (("shifter", "nccl-plugin"), ("podman-hpc", "nccl")):
        (tmp_path / "modules" / rt).mkdir(parents=True)
        (tmp_path / "modules" / rt / module).write_text("# the site's plugin\nNCCL_NET_PLUGIN=/site/plugin.so\n")
        (tmp_path / "modules" / rt / "gpu").write_text("# no GPU on this machine\n")
    runtime.install(tmp_path / "bin")
    return tmp_path


def named(twin: Path, **env: str) -> dict[str, str]:
    """The environment that tells the stand-in where named images and the runtimes' modules are."""
    return {"RUNTIME_TWIN_DOCKER_DIR": str(twin / "images"), "RUNTIME_TWIN_MODULES_DIR": str(twin / "modules"), **env}


def run(twin: Path, name: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(twin / "bin" / name), *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})}, cwd=twin)


def test_exec_binds_image_mounts_and_env(twin: Path) -> None:
    out = run(twin, "singularity", "exec", "--bind", f"{twin}/data.sqfs:/user-software/x:image-src=/",
              "--bind", f"{twin / 'data'}:/opt/newbind", str(twin / "test.sif"), "sh", "-c",
              'echo "$FOO|$PATH|$WITH_CONDA"; hello a b; cat /user-software/x/x /opt/newbind/x; '
              'test -d /opt/conda && test -d /usr/lib; /opt/conda/bin/python -c "print(1)"; exit 3',
              env={"SINGULARITYENV_FOO": "bar", "SINGULARITYENV_PREPEND_PATH": "/runscripts",
                   "APPTAINERENV_FOO": "ignored by singularity"})
    assert out.returncode == 3, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == f"bar|/runscripts:{runtime.DEFAULT_PATH}|source activate"
    assert lines[1:] == ["hello a b", "payload", "payload", "1"]


def test_apptainer_prefers_its_own_variables_and_reads_bindpath(twin: Path) -> None:
    out = run(twin, "apptainer", "exec", str(twin / "test.sif"), "sh", "-c", 'echo "$FOO"; cat /mnt2/x',
              env={"SINGULARITYENV_FOO": "old", "APPTAINERENV_FOO": "new", "APPTAINER_BINDPATH": f"{twin / 'data'}:/mnt2"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["new", "payload"]


def test_missing_bind_source_is_fatal(twin: Path) -> None:
    out = run(twin, "singularity", "exec", "--bind", "/no/such/dir", str(twin / "test.sif"), "true")
    assert out.returncode == 255 and "mount source doesn't exist" in out.stderr


def test_build_from_def_and_inspect(twin: Path) -> None:
    (twin / "t.def").write_text("Bootstrap: localimage\nFrom: test.sif\n\n%post\n    mkdir -p /opt/conda/extra\n"
                                "    echo built > /opt/conda/extra/marker\n\n%environment\n    export FROMDEF=yes\n\n"
                                "%labels\n    org.example.digest abc123\n")
    assert run(twin, "apptainer", "build", "out.sif", "t.def").returncode == 0
    again = run(twin, "apptainer", "build", "out.sif", "t.def")
    assert again.returncode == 255 and "already exists" in again.stderr
    assert run(twin, "apptainer", "inspect", "--labels", "out.sif").stdout == "org.example.digest: abc123\n"
    out = run(twin, "apptainer", "exec", "out.sif", "sh", "-c", 'cat /opt/conda/extra/marker; echo "$FROMDEF"')
    assert out.stdout.split() == ["built", "yes"]


def test_build_from_directory_and_docker_dir(twin: Path, tmp_path: Path) -> None:
    assert run(twin, "singularity", "build", "dir.sif", str(twin / "data")).returncode == 0
    out = run(twin, "singularity", "exec", "dir.sif", "cat", "/x")
    assert out.stdout == "payload\n"
    (twin / "d.def").write_text("Bootstrap: docker\nFrom: example/base:1.0\n")
    refused = run(twin, "apptainer", "build", "d.sif", "d.def")
    assert refused.returncode == 255 and "cannot pull" in refused.stderr
    docker = tmp_path / "docker"
    docker.mkdir()
    (docker / "example_base_1.0.sif").write_bytes((twin / "test.sif").read_bytes())
    ok = run(twin, "apptainer", "build", "d.sif", "d.def", env={"RUNTIME_TWIN_DOCKER_DIR": str(docker)})
    assert ok.returncode == 0, ok.stderr


def test_open_descriptors_pass_into_the_container(twin: Path) -> None:
    """As with the real runtimes: MPICH's PMI client in the container talks to srun/Hydra over the
    inherited PMI_FD (found on the LUMI twin: Horovod's MPI_Init failed, "PMI_Get_appnum returned -1")."""
    read, write = os.pipe()
    try:
        out = subprocess.run([str(twin / "bin" / "singularity"), "exec", str(twin / "test.sif"), "sh", "-c",
                              f"echo through > /dev/fd/{write}"], capture_output=True, text=True, timeout=120, pass_fds=(write,))
    finally:
        os.close(write)
    with os.fdopen(read) as pipe:
        assert out.returncode == 0 and pipe.read() == "through\n", out.stderr


def test_shifter_maps_image_volume_module_and_env(twin: Path) -> None:
    """Shifter's command line as the job writes it: the image by name, one --volume per bind, the site's
    modules (their variables set inside) and --env; the host's environment passes in."""
    out = run(twin, "shifter", "--image=docker:example/torch:1.0", f"--volume={twin / 'data'}:/data",
              "--module=gpu,nccl-plugin", '--env=CHOICE=mine', "sh", "-c",
              'echo "$CHOICE|$NCCL_NET_PLUGIN|$FROM_HOST|$WITH_CONDA"; cat /data/x; /runscripts/hello', env=named(twin, FROM_HOST="yes"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["mine|/site/plugin.so|yes|source activate", "payload", "hello"]
    # the image the batch job named (#SBATCH --image) when the command names none
    batch = run(twin, "shifter", "true", env=named(twin, SLURM_SPANK_SHIFTER_IMAGE="example/torch:1.0"))
    assert batch.returncode == 0, batch.stderr
    unknown = run(twin, "shifter", "--image=example/torch:1.0", "--module=mpich", "true", env=named(twin))
    assert unknown.returncode == 255 and "unknown module 'mpich'" in unknown.stderr


def test_podman_hpc_passes_only_what_it_is_told(twin: Path) -> None:
    argv = ["run", "--rm", "--gpu", "--nccl", f"--volume={twin / 'data'}:/data", "-e", "CHOICE"]
    script = 'echo "${CHOICE:-}|${FROM_HOST:-unset}|$NCCL_NET_PLUGIN"; cat /data/x'
    env = named(twin, CHOICE="mine", FROM_HOST="yes")
    out = run(twin, "podman-hpc", *argv, "example/torch:1.0", "sh", "-c", script, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["mine|unset|/site/plugin.so", "payload"]
    host = run(twin, "podman-hpc", "run", "--rm", "--env-host", "example/torch:1.0", "sh", "-c",
               'echo "$FROM_HOST"', env=env)
    assert host.stdout == "yes\n", host.stderr
    missing = run(twin, "podman-hpc", "run", "--rm", "other/image:2", "true", env=named(twin))
    assert missing.returncode == 255 and "image other/image:2 not found" in missing.stderr
