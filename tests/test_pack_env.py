"""Packed environments (`invoke pack-env`, the pack-env action): a real venv packed with mksquashfs,
run through its wrappers: with squashfuse on the local site (torch CPU), and in a container through the
runtime stand-in (tests/twins/runtime.py). Idempotence, re-pack on change, atomic swap, bad input."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from sitestack.installs.squashfs_env import PackedEnv, commands_of, parse_requirements, wrapper
from sitestack.model.container_facts import runtime_named
from tests.conftest import REPO, playbook_copy, run_invoke
from tests.twins import runtime as twin

GOLDEN = REPO / "tests" / "golden" / "containers"
needs_twin = pytest.mark.skipif(twin.available() is not None, reason=f"stand-in runtime: {twin.available()}")


def golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("SITESTACK_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert text == path.read_text(), f"{name} differs from its golden file"


def packed(runtime: str | None) -> PackedEnv:
    return PackedEnv(name="tools", dest="/proj/sitestack/envs/tools", requirements=("torch==2.13.0",),
                  python="/opt/miniconda3/envs/pytorch/bin/python", system_site_packages=runtime is not None,
                  runtime=runtime_named(runtime) if runtime else None, image="/proj/sitestack/pytorch.sif" if runtime else None,
                  binds=("/proj/sitestack", "/var/spool/slurmd", "/opt/cray") if runtime else ())


def test_wrappers_golden() -> None:
    gen = "/proj/sitestack/envs/.tools.gen-0123abcd"
    golden("wrapper-singularity.sh", wrapper(packed("singularity"), gen, "torchrun"))
    golden("wrapper-apptainer.sh", wrapper(packed("apptainer"), gen, "python"))
    golden("wrapper-squashfuse.sh", wrapper(packed(None), gen, "python"))
    assert packed("singularity").in_env(["python", "-m", "venv", "/x"]) == [
        "singularity", "exec", "--bind", "/proj/sitestack,/var/spool/slurmd,/opt/cray", "/proj/sitestack/pytorch.sif",
        "python", "-m", "venv", "/x"]


def test_digest_follows_the_inputs() -> None:
    a, b = packed("apptainer"), packed("singularity")
    assert a.digest() == packed("apptainer").digest() and a.digest() != b.digest()


def test_requirements_parsing_and_commands() -> None:
    assert parse_requirements("# c\ntorch==2.13.0  # cpu\n\n--extra-index-url https://x/y\nsix\n", "r.txt") == [
        "torch==2.13.0", "--extra-index-url https://x/y", "six"]
    with pytest.raises(Exception, match=r"r.txt:2: not a requirement"):
        parse_requirements("six\nnot a req !!\n", "r.txt")
    with pytest.raises(Exception, match=r"r.txt:1: option '-e'"):
        parse_requirements("-e git+https://x\n", "r.txt")
    assert commands_of("python\npip\nactivate\nActivate.ps1\ntorchrun\n") == ["pip", "python", "torchrun"]


def files_under(path: Path) -> int:
    """Files and directories under ``path``, not counting what is mounted below it (the image)."""
    total = 0
    for top, dirs, files in os.walk(path):
        dirs[:] = [d for d in dirs if not os.path.ismount(os.path.join(top, d))]
        total += len(dirs) + len(files)
    return total


def unmount_all(root: Path) -> None:
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4]
        if point.startswith(str(root)):
            subprocess.run(["fusermount3", "-u", "-z", point], capture_output=True)


def pack(site: str, prefix: Path, req: Path, *extra: str, playbook: Path | None = None,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    args = ["pack-env", "--site", site, "--name", "tools", "--requirements", str(req), "--prefix", str(prefix), *extra]
    if playbook:
        args += ["--playbook", str(playbook)]
    return run_invoke(*args, env={"SITESTACK_LOG_DIR": str(prefix.parent / "logs"), **(env or {})}, timeout=1500)


@needs_twin
def test_pack_torch_with_squashfuse(tmp_path: Path) -> None:
    """The local site has no container: the wrapper mounts the image with squashfuse."""
    req = tmp_path / "requirements.txt"
    req.write_text("torch==2.13.0\n")
    prefix = tmp_path / "prefix"
    try:
        first = pack("local", prefix, req)
        assert first.returncode == 0, first.stdout + first.stderr
        dest = prefix / "envs" / "tools"
        out = subprocess.run([str(dest / "bin" / "python"), "-c", "import torch, sys; print(torch.__version__, sys.prefix)"],
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith("2.13.0")
        listing = subprocess.run(["unsquashfs", "-l", str(dest / "env.sqfs")], capture_output=True, text=True).stdout
        inside = len(listing.splitlines())
        on_disk = files_under(prefix)
        assert inside > 5000 and on_disk < 60, (inside, on_disk)
        assert {"python", "pip", "torchrun"} <= {p.name for p in (dest / "bin").iterdir()}
        torchrun = subprocess.run([str(dest / "bin" / "torchrun"), "--help"], capture_output=True, text=True, timeout=300)
        assert torchrun.returncode == 0 and "usage: torchrun" in torchrun.stdout
        again = pack("local", prefix, req)
        assert again.returncode == 0 and "ok       pack-env tools" in again.stdout, again.stdout
        req.write_text("torch==2.13.0\nsix\n")
        check = pack("local", prefix, req, "--check", "--fail-on-change")
        assert check.returncode == 2 and "inputs changed (requirements)" in check.stdout, check.stdout
    finally:
        unmount_all(tmp_path)


@pytest.fixture
def container_site(tmp_path: Path) -> dict[str, object]:
    """A copy of the local playbook whose stack runs in an Apptainer image (the stand-in runtime)."""
    tree = tmp_path / "image"
    (tree / "opt" / "conda" / "bin").mkdir(parents=True)
    (tree / "opt" / "conda" / "bin" / "python").symlink_to(os.path.realpath(subprocess.run(
        ["python3", "-c", "import sys; print(sys.executable)"], capture_output=True, text=True).stdout.strip()))
    image = twin.make_image(tree, tmp_path / "base.sif")
    bin_dir = twin.install(tmp_path / "bin")
    playbook = playbook_copy(tmp_path / "pb", facts={
        "python": {"source": "container", "executable": "/opt/conda/bin/python"},
        "container": {"runtime": "apptainer", "image": str(image), "bind": []}},
        without=("horovod",))  # Horovod is not built on the host for a stack inside its image
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    return {"playbook": playbook, "env": env, "prefix": tmp_path / "prefix", "image": image}


@needs_twin
def test_pack_in_container_repack_and_failure(tmp_path: Path, container_site: dict) -> None:
    env, prefix, playbook = container_site["env"], container_site["prefix"], container_site["playbook"]
    req = tmp_path / "requirements.txt"
    req.write_text("six==1.16.0\n")
    first = pack("local", prefix, req, playbook=playbook, env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    dest = prefix / "envs" / "tools"
    wrapper_text = (dest / "bin" / "python").read_text()
    assert '"$image:$root:image-src=/" ' in wrapper_text and 'apptainer exec --bind ' in wrapper_text
    script = "import six, sys; print(six.__version__, sys.prefix)"
    run_env = {**os.environ, **env}
    old_python = dest.resolve() / "bin" / "python"
    out = subprocess.run([str(dest / "bin" / "python"), "-c", script], capture_output=True, text=True, env=run_env)
    assert out.returncode == 0 and out.stdout.startswith("1.16.0"), out.stderr
    # a changed requirement re-packs into a new generation; the old one keeps working
    req.write_text("six==1.17.0\n")
    second = pack("local", prefix, req, playbook=playbook, env=env)
    assert second.returncode == 0 and "inputs changed (requirements)" in second.stdout, second.stdout
    assert dest.resolve() != old_python.parent.parent
    new = subprocess.run([str(dest / "bin" / "python"), "-c", script], capture_output=True, text=True, env=run_env)
    assert new.stdout.startswith("1.17.0"), new.stderr
    old = subprocess.run([str(old_python), "-c", script], capture_output=True, text=True, env=run_env)
    assert old.stdout.startswith("1.16.0"), old.stderr
    # a package that fails to install: one clear message, exit 1, the current environment unchanged
    before = sorted(p.name for p in dest.parent.iterdir())
    req.write_text("six==1.17.0\nno-such-package-sitestack==1.0\n")
    failed = pack("local", prefix, req, playbook=playbook, env=env)
    assert failed.returncode == 1 and "pip could not install the requirements" in failed.stdout, failed.stdout
    assert "the previous environment stays in use" in failed.stdout
    assert sorted(p.name for p in dest.parent.iterdir()) == before
    still = subprocess.run([str(dest / "bin" / "python"), "-c", script], capture_output=True, text=True, env=run_env)
    assert still.stdout.startswith("1.17.0")


@pytest.mark.parametrize("name, text, message", [
    ("requirements.txt", "six\nnot a req !!\n", "requirements.txt:2: not a requirement"),
    ("env.yml", "name: x\ndependencies: [a\n", "env.yml:3: YAML syntax error"),
])
def test_bad_env_files(tmp_path: Path, name: str, text: str, message: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    out = pack("local", tmp_path / "prefix", path)
    assert out.returncode == 1, out.stdout + out.stderr
    assert message in out.stdout + out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "prefix").exists()


@needs_twin
def test_playbook_step_with_a_relative_requirements_file(tmp_path: Path) -> None:
    import yaml
    data = yaml.safe_load((REPO / "playbooks" / "local.yml").read_text())
    data["steps"].append({"name": "packed-tools", "action": "pack-env", "tags": ["packed"],
                          "args": {"name": "tools", "requirements": "envs/tools.txt"}})
    (tmp_path / "pb" / "envs").mkdir(parents=True)
    (tmp_path / "pb" / "envs" / "tools.txt").write_text("six==1.16.0\n")
    playbook = tmp_path / "pb" / "local.yml"
    playbook.write_text(yaml.safe_dump(data, sort_keys=False))
    prefix = tmp_path / "prefix"
    try:
        out = run_invoke("pack-env", "--site", "local", "--playbook", str(playbook), "--prefix", str(prefix),
                         env={"SITESTACK_LOG_DIR": str(tmp_path / "logs")}, timeout=900)
        assert out.returncode == 0 and "changed  packed-tools" in out.stdout, out.stdout + out.stderr
        run = subprocess.run([str(prefix / "envs" / "tools" / "bin" / "python"), "-c", "import six; print(six.__version__)"],
                             capture_output=True, text=True)
        assert run.stdout == "1.16.0\n", run.stderr
        missing = run_invoke("pack-env", "--site", "local", "--playbook", str(playbook), "--name", "other")
        assert missing.returncode == 1 and "no pack-env step named 'other'" in missing.stdout + missing.stderr
    finally:
        unmount_all(tmp_path)
