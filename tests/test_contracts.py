"""Contracts of core/ and installs/ that a one-line change could silently break: each test here
fails when its rule is switched off (placeholders without a value, the atomic generation swap,
check mode's read-only host, ...)."""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

import pytest

from sitestack.core import placeholders
from sitestack.core.errors import SitestackError
from tests.conftest import REPO, tree


# -- placeholders: a recipe string must be complete ---------------------------------------------------
def test_a_placeholder_without_a_value_raises_naming_it_when_asked_to():
    with pytest.raises(SitestackError, match=r"placeholder \{rocm_home\} has no value"):
        placeholders.expand("--with-rocm={rocm_home}", {"version": "1"}, missing="raise")
    with pytest.raises(SitestackError, match=r"\{cuda_home\}"):
        placeholders.expand_all({"env": ["a={version}", "b={cuda_home}"]}, {"version": "1"}, missing="raise")
    assert placeholders.expand("{a}-{b}", {"a": "x"}, missing="keep") == "x-{b}"
    assert placeholders.expand("{a}-{{b}}", {"a": "x"}, missing="raise") == "x-{b}"


def _recipe_dir(root: Path, args: str) -> tuple[Path, Path]:
    """A source directory with recipe ``demo`` (autotools, build ``args``) and its verified tarball."""
    tarball = root / "demo-1.0.tar.gz"
    with tarfile.open(tarball, "w:gz") as tar:
        info = tarfile.TarInfo("demo-1.0/configure")
        data = b"#!/bin/sh\n"
        info.size, info.mode = len(data), 0o755
        tar.addfile(info, io.BytesIO(data))
    sha = hashlib.sha256(tarball.read_bytes()).hexdigest()
    sources = root / "sources"
    sources.mkdir()
    (sources / "demo.yml").write_text(
        "name: demo\ndescription: a recipe of the tests\nhomepage: https://example.invalid/demo\nbuild: autotools\n"
        f'default_version: "1.0"\nargs: [{args}]\nversions:\n  "1.0":\n'
        f"    url: https://example.invalid/demo-{{version}}.tar.gz\n    sha256: {sha}\nsanity: [bin/demo]\n")
    return sources, tarball


def test_a_recipe_placeholder_the_site_has_no_value_for_fails_the_build_naming_it(tmp_path: Path):
    """The local site has no ROCm: a recipe argument using {rocm_home} is an error, in check mode
    too, not a build run with a literal ``{rocm_home}`` in its configure line."""
    sources, tarball = _recipe_dir(tmp_path, '"--with-rocm={rocm_home}"')
    prefix = tmp_path / "prefix"
    run = subprocess.run([sys.executable, "-m", "invoke", "--search-root", str(REPO), "build-recipe", "demo", "--site",
                          "local", "--sources-dir", str(sources), "--source", str(tarball), "--prefix", str(prefix),
                          "--check"], cwd=tmp_path, text=True, capture_output=True, timeout=120,
                         env={**os.environ, "SITESTACK_LOG_DIR": str(tmp_path / "logs")})
    assert run.returncode == 1, run.stdout + run.stderr
    assert "demo@1.0: placeholder {rocm_home} has no value on this site" in run.stdout, run.stdout
    assert "Traceback" not in run.stdout + run.stderr
    assert not prefix.exists()


# -- the generation swap: a reader never sees the path missing -------------------------------------
def test_the_generation_swap_never_leaves_the_path_missing(tmp_path: Path):
    """A reader resolving the link in a tight loop during many swaps always finds a tree."""
    from sitestack.core.swap import swap_argv

    leaf = tmp_path / "v"
    missing: list[str] = []
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            try:
                os.readlink(leaf)
                os.stat(leaf)
            except FileNotFoundError as exc:
                missing.append(str(exc))

    (tmp_path / ".v.tree-0").mkdir()
    subprocess.run(swap_argv(str(tmp_path), "v", ".v.tree-0", "t0"), check=True)
    watcher = threading.Thread(target=reader)
    watcher.start()
    try:
        for i in range(1, 120):
            (tmp_path / f".v.tree-{i}").mkdir()
            subprocess.run(swap_argv(str(tmp_path), "v", f".v.tree-{i}", f"t{i}"), check=True)
            if missing:
                break
    finally:
        stop.set()
        watcher.join()
    assert not missing, f"the swapped path was missing {len(missing)} times: {missing[0]}"
    assert os.readlink(leaf) == f".v.tree-{i}"
    assert sorted(p.name for p in tmp_path.iterdir()) == [f".v.tree-{i}", "v"]



# -- check mode: the host is read-only ----------------------------------------------------------------
def test_a_check_mode_provision_writes_nothing_on_the_host(tmp_path: Path):
    """`provision --check` plans every step against a read-only host: the prefix it would make stays
    absent (a writable host would leave, at least, the lock directory of each recipe install's probe)."""
    prefix, home = tmp_path / "prefix", tmp_path / "home"
    home.mkdir()
    run = subprocess.run([sys.executable, "-m", "invoke", "provision", "--site", "local", "--check", "--prefix",
                          str(prefix)], cwd=REPO, text=True, capture_output=True, timeout=300,
                         env={**os.environ, "SITESTACK_LOG_DIR": str(tmp_path / "logs")})
    assert run.returncode == 0, run.stdout + run.stderr
    assert "check mode: nothing will be changed" in run.stdout and "would change" in run.stdout, run.stdout
    assert tree(prefix) == [] and not prefix.exists()
    assert not (tmp_path / "logs").exists()


def test_the_check_mode_host_refuses_every_mutation(tmp_path: Path):
    from sitestack.core.errors import MutationRefused
    from sitestack.core.host import local_host

    host = local_host("checked", read_only=True)
    target = tmp_path / "f"
    for attempt in (lambda: host.write_text(str(target), "x"), lambda: host.run(["touch", str(target)]),
                    lambda: host.put_file(Path(__file__), str(target))):
        with pytest.raises(MutationRefused, match=r"\[checked\] check mode: refusing to"):
            attempt()
    assert host.probe(["true"]).rc == 0   # probes still run for real
    assert list(tmp_path.iterdir()) == []
