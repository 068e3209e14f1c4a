"""How a packed environment's image is built and mounted (sitestack/installs/squashfs_env.py): real
mksquashfs images with the product's options, real FUSE mounts by the wrappers: squashfuse_ll where it is,
the high-level squashfuse with its cache options where it is not, one mount per image under the lock
however many first calls race, and the options recorded in the stamp of a real ``invoke pack-env``.
Speed itself is benchmarks/packed_env.py's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from sitestack.installs.squashfs_env import FORMAT, MOUNTERS, PackedEnv, wrapper
from sitestack.model.container_facts import runtime_named
from tests.conftest import run_invoke
from tests.twins import runtime as twin

needs_fuse = pytest.mark.skipif(twin.available() is not None, reason=f"FUSE mounts: {twin.available()}")


def packed(runtime: str | None, dest: str = "/proj/envs/tools") -> PackedEnv:
    return PackedEnv(name="tools", dest=dest, requirements=("six==1.16.0",), python="/usr/bin/python3",
                     system_site_packages=False, runtime=runtime_named(runtime) if runtime else None,
                     image="/proj/pytorch.sif" if runtime else None, binds=())


def superblock(image: Path) -> str:
    return subprocess.run(["unsquashfs", "-s", str(image)], capture_output=True, text=True, check=True).stdout


def mounts_at(point: Path) -> list[str]:
    """The file system types mounted at ``point`` (``fuse.squashfuse_ll``, ...)."""
    return [line.split(" - ")[1].split()[0] for line in Path("/proc/self/mountinfo").read_text().splitlines()
            if line.split()[4] == str(point)]


def unmount_under(top: Path) -> None:
    for line in reversed(Path("/proc/self/mountinfo").read_text().splitlines()):
        if line.split()[4].startswith(str(top)):
            subprocess.run(["fusermount3", "-u", "-z", line.split()[4]], capture_output=True)


def generation(tmp: Path, name: str) -> tuple[Path, Path]:
    """A packed generation made by hand the way pack-env lays it out: an image of a tree with one
    command, ``hello``, built with the product's options, the empty mount point and its wrapper.
    (the generation's directory, the wrapper)."""
    gen, tree = tmp / name, tmp / f"{name}-tree"
    (tree / "bin").mkdir(parents=True)
    (tree / "bin" / "hello").write_text('#!/bin/sh\necho "hello from $0"\n')
    (tree / "bin" / "hello").chmod(0o755)
    (gen / "root").mkdir(parents=True)
    (gen / "bin").mkdir()
    env = packed(None, str(tmp / "tools"))
    subprocess.run(["mksquashfs", str(tree), str(gen / "env.sqfs"), *env.mksquashfs_options()], check=True,
                   stdout=subprocess.DEVNULL)
    command = gen / "bin" / "hello"
    command.write_text(wrapper(env, str(gen), "hello"))
    command.chmod(0o755)
    return gen, command


def tools_without(links: Path, *left_out: str) -> str:
    """A PATH (the directory ``links``, made) with this machine's /usr/bin and /usr/sbin but ``left_out``."""
    links.mkdir()
    for top in ("/usr/bin", "/usr/sbin"):
        for entry in os.scandir(top):
            if entry.name not in left_out and not (links / entry.name).exists():
                (links / entry.name).symlink_to(entry.path)
    return str(links)


def test_image_options_follow_who_mounts_it(tmp_path: Path) -> None:
    """lz4 where the wrappers mount it with squashfuse, gzip where the site's runtime (maybe its kernel)
    mounts it; 128K blocks both; the options and, without a container, the mounters are inputs of the
    digest (a change re-packs)."""
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "data").write_bytes(os.urandom(4096) * 64)
    for runtime, compression in ((None, "lz4"), ("apptainer", "gzip")):
        env = packed(runtime)
        image = tmp_path / f"{compression}.sqfs"
        subprocess.run(["mksquashfs", str(tree), str(image), *env.mksquashfs_options()], check=True,
                       stdout=subprocess.DEVNULL)
        info = superblock(image)
        assert f"Compression {compression}\n" in info and "Block size 131072\n" in info, info
        assert env.inputs()["mksquashfs"] == list(env.mksquashfs_options())
    assert packed(None).inputs()["mount"] == [list(m) for m in MOUNTERS]
    assert "mount" not in packed("apptainer").inputs()


@needs_fuse
def test_wrapper_mounts_with_squashfuse_ll_else_squashfuse(tmp_path: Path) -> None:
    gen_ll, hello_ll = generation(tmp_path, "ll")
    gen_hl, hello_hl = generation(tmp_path, "hl")
    gen_none, hello_none = generation(tmp_path, "none")
    try:
        out = subprocess.run([str(hello_ll)], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and out.stdout == f"hello from {gen_ll}/root/bin/hello\n", out.stderr
        assert mounts_at(gen_ll / "root") == ["fuse.squashfuse_ll"]
        # no squashfuse_ll on PATH: the high-level squashfuse, with its cache options
        path = tools_without(tmp_path / "no-ll", "squashfuse_ll")
        out = subprocess.run([str(hello_hl)], capture_output=True, text=True, timeout=60, env={**os.environ, "PATH": path})
        assert out.returncode == 0 and out.stdout == f"hello from {gen_hl}/root/bin/hello\n", out.stderr
        assert mounts_at(gen_hl / "root") == ["fuse.squashfuse"]
        daemons = [p.read_bytes().split(b"\0") for p in Path("/proc").glob("[0-9]*/cmdline")
                   if os.fsencode(str(gen_hl / "env.sqfs")) in p.read_bytes().split(b"\0")]
        assert [d[:3] for d in daemons] == [[os.fsencode(w) for w in MOUNTERS[1]]], daemons
        # neither: one message naming the image and the mounter it tried, nothing mounted
        path = tools_without(tmp_path / "bare", "squashfuse_ll", "squashfuse")
        out = subprocess.run([str(hello_none)], capture_output=True, text=True, timeout=60, env={**os.environ, "PATH": path})
        assert out.returncode == 1 and out.stdout == "", out.stdout
        assert f"hello: cannot mount {gen_none}/env.sqfs at {gen_none}/root (squashfuse)" in out.stderr, out.stderr
        assert mounts_at(gen_none / "root") == []
    finally:
        unmount_under(tmp_path)


@needs_fuse
def test_racing_first_calls_mount_once(tmp_path: Path) -> None:
    """Eight first calls at once: all run the command, and the image is mounted once (the lock)."""
    gen, hello = generation(tmp_path, "race")
    try:
        runs = [subprocess.Popen([str(hello)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for _ in range(8)]
        results = [(p.wait(timeout=60), *p.communicate()) for p in runs]
        assert all(code == 0 and out == f"hello from {gen}/root/bin/hello\n" for code, out, _ in results), results
        assert mounts_at(gen / "root") == ["fuse.squashfuse_ll"]
    finally:
        unmount_under(tmp_path)


@needs_fuse
def test_a_mount_whose_daemon_was_killed_is_mounted_again(tmp_path: Path) -> None:
    """The daemon killed (as the out-of-memory killer does): root answers ECONNABORTED or ENOTCONN; the next call
    detaches the dead mount and mounts the image again, once."""
    gen, hello = generation(tmp_path, "killed")
    try:
        assert subprocess.run([str(hello)], capture_output=True, timeout=60).returncode == 0
        image = os.fsencode(str(gen / "env.sqfs"))
        daemons = [int(p.parent.name) for p in Path("/proc").glob("[0-9]*/cmdline")
                   if image in p.read_bytes().split(b"\0")]
        assert len(daemons) == 1, daemons
        os.kill(daemons[0], 9)
        with pytest.raises(OSError) as dead:   # what every call met before the fix
            for _ in range(100):
                (gen / "root").stat()
                subprocess.run(["sleep", "0.05"])
        assert dead.value.errno in (103, 107), dead.value   # ECONNABORTED, later ENOTCONN
        out = subprocess.run([str(hello)], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and out.stdout == f"hello from {gen}/root/bin/hello\n", out.stderr
        assert mounts_at(gen / "root") == ["fuse.squashfuse_ll"]
    finally:
        unmount_under(tmp_path)


@needs_fuse
def test_pack_env_records_the_options_and_needs_a_mounter(tmp_path: Path) -> None:
    """A real ``invoke pack-env`` on the local site: the stamp holds the image's options and the mounters,
    the image is what they say, and its python runs from a squashfuse_ll mount. Without squashfuse_ll and
    squashfuse the pack stops before building, naming both."""
    req = tmp_path / "requirements.txt"
    req.write_text("six==1.16.0\n")
    prefix = tmp_path / "prefix"
    logs = {"SITESTACK_LOG_DIR": str(tmp_path / "logs")}
    args = ("pack-env", "--site", "local", "--name", "tools", "--requirements", str(req), "--prefix", str(prefix))
    try:
        out = run_invoke(*args, env=logs, timeout=900)
        assert out.returncode == 0, out.stdout + out.stderr
        dest = prefix / "envs" / "tools"
        stamp = json.loads((dest / "packed.json").read_text())
        expected = packed(None).mksquashfs_options()
        assert stamp["inputs"]["mksquashfs"] == list(expected) and "lz4" in expected
        assert stamp["inputs"]["mount"] == [list(m) for m in MOUNTERS] and stamp["inputs"]["format"] == FORMAT
        assert "Compression lz4\n" in superblock(dest / "env.sqfs")
        run = subprocess.run([str(dest / "bin" / "python"), "-c", "import six; print(six.__version__)"],
                             capture_output=True, text=True, timeout=120)
        assert run.stdout == "1.16.0\n", run.stderr
        assert mounts_at((dest / "root").resolve()) == ["fuse.squashfuse_ll"]
    finally:
        unmount_under(tmp_path)
    path = tools_without(tmp_path / "bare", "squashfuse_ll", "squashfuse")
    bare = run_invoke(*args[:-1], str(tmp_path / "other"), env={**logs, "PATH": f"{path}:/usr/local/bin"}, timeout=300)
    assert bare.returncode == 1, bare.stdout + bare.stderr
    assert "packing needs squashfuse_ll or squashfuse (squashfuse)" in bare.stdout + bare.stderr
    assert not shutil.which("squashfuse", path=path) and not (tmp_path / "other" / "envs" / "tools").exists()
