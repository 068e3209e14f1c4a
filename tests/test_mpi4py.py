"""mpi4py 4.1.2 built for real from its PyPI sdist against Debian's MPICH on the `local` site (once per
session: the `mpi4py_build` fixture), checked, and put through check -> build -> check -> build."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

from tests.conftest import run_invoke

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def status(out) -> str:
    lines = [line for line in out.stdout.splitlines() if line.startswith("[localhost]") and "mpi4py" in line]
    assert lines, out.stdout + out.stderr
    return lines[-1]


def step_seconds(out) -> float:
    return float(out.stdout.strip().splitlines()[-1].split()[-1].rstrip("s"))


def stamp(dest) -> dict:
    return json.loads((dest / ".sitestack" / "install.json").read_text())


def test_cold_build_against_the_site_mpi(mpi4py_build):
    check = mpi4py_build.check
    assert check.returncode == 2 and "would change: not installed" in status(check)
    build = mpi4py_build.build
    assert build.returncode == 0, build.stdout[-5000:] + build.stderr
    assert "changed  mpi4py@4.1.2: not installed" in status(build)
    assert "mpi4py 4.1.2: still in build" in build.stdout or mpi4py_build.seconds < 30  # progress on long builds
    dest = mpi4py_build.dest
    record = stamp(dest)
    linked, two_ranks = record["checks"]
    assert linked["name"] == "linked MPI" and linked["ok"] and linked["output"].startswith("MPICH Version:")
    assert two_ranks == {"name": "2-rank message", "ok": True, "output": "rank 0 got ping-pong from rank 1 of 2"}
    assert record["inputs"]["build"]["source"]["sha256"] == \
        "56860286dc45f20e8821e93cb06669e30462348bf866f685553fa4b712d58d02"
    plan = record["inputs"]["build"]["plan"]
    assert plan[0]["env"]["MPICC"] == "mpicc" and "--no-cache-dir" in plan[0]["argv"]
    log = "".join(p.read_text() for p in mpi4py_build.root.joinpath("logs").rglob("mpi4py-4.1.2.log"))
    assert "MPICC=mpicc" in log and "/usr/bin/mpicc" in log  # the wrapper compiled MPI.c


def test_the_install_links_the_site_mpi_and_runs_two_ranks(mpi4py_build):
    dest = mpi4py_build.dest
    (ext,) = (dest / "mpi4py").glob("MPI.*.so")
    ldd = subprocess.run(["ldd", str(ext)], capture_output=True, text=True).stdout
    assert "libmpich.so.12" in ldd, ldd
    env = {**os.environ, "PYTHONPATH": str(dest)}
    code = ("from mpi4py import MPI; c = MPI.COMM_WORLD; g = c.gather((c.Get_rank(), c.allreduce(c.Get_rank() + 1)));"
            " print('sums', g) if c.Get_rank() == 0 else None")
    python = shutil.which("python3")
    out = subprocess.run(["mpiexec", "-n", "2", python, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "sums [(0, 3), (1, 3)]"


def test_second_run_is_ok_and_near_instant(mpi4py_build):
    env, prefix = mpi4py_build.env, mpi4py_build.prefix
    check = run_invoke("build-mpi4py", "--site", "local", "--prefix", str(prefix), "--check", "--fail-on-change", env=env)
    assert check.returncode == 0 and "ok       mpi4py@4.1.2" in status(check)
    start = time.monotonic()
    again = run_invoke("build-mpi4py", "--site", "local", "--prefix", str(prefix), env=env)
    took = time.monotonic() - start
    assert again.returncode == 0 and "ok       mpi4py@4.1.2" in status(again)
    assert step_seconds(again) < 2 and took < 0.05 * mpi4py_build.seconds, (took, mpi4py_build.seconds)


def test_changed_flag_or_patch_is_reported_by_check_mode(mpi4py_build, repo, tmp_path):
    sources = tmp_path / "sources"
    sources.mkdir()
    text = (repo / "sources" / "mpi4py.yml").read_text()
    flagged = text.replace('  MPICC: "{mpicc}"\n', '  MPICC: "{mpicc}"\n  MPI4PY_BUILD_CONFIGURE: "1"\n')
    assert flagged != text
    (sources / "mpi4py.yml").write_text(flagged)
    argv = ["build-mpi4py", "--site", "local", "--prefix", str(mpi4py_build.prefix), "--sources-dir", str(sources),
            "--check", "--fail-on-change"]
    out = run_invoke(*argv, env=mpi4py_build.env)
    assert out.returncode == 2
    assert "would change: inputs changed: build environment changed: MPI4PY_BUILD_CONFIGURE" in status(out)

    (tmp_path / "patches" / "mpi4py").mkdir(parents=True)
    (tmp_path / "patches" / "mpi4py" / "0001-doc.patch").write_text(textwrap.dedent("""\
        Upstream: not needed upstream (shows a patch forcing a rebuild)
        Applies-to: ==4.1.*
        Why: a comment in the README
        ---
        --- a/README.rst
        +++ b/README.rst
        @@ -1,1 +1,1 @@
        -old
        +new
        """))
    (sources / "mpi4py.yml").write_text(text + "patches:\n  - file: 0001-doc.patch\n")
    out = run_invoke(*argv, env=mpi4py_build.env)
    assert out.returncode == 2
    assert "would change: inputs changed: patch 0001-doc.patch added" in status(out)
    assert stamp(mpi4py_build.dest)["inputs"]["build"]["patches"] == []  # nothing was changed


def test_another_prefix_installs_the_cached_wheel(mpi4py_build, tmp_path):
    start = time.monotonic()
    out = run_invoke("build-mpi4py", "--site", "local", "--prefix", str(tmp_path / "p2"),
                     env={**mpi4py_build.env, "SITESTACK_LOG_DIR": str(tmp_path / "logs")})
    took = time.monotonic() - start
    assert out.returncode == 0, out.stdout + out.stderr
    log = "".join(p.read_text() for p in (tmp_path / "logs").rglob("mpi4py-4.1.2.log"))
    assert "(no build needed)" in log and "phase build" not in log
    record = stamp(tmp_path / "p2" / "mpi4py" / "4.1.2")
    assert record["artefact"]["from_cache"] is True
    assert record["build_digest"] == stamp(mpi4py_build.dest)["build_digest"]
    assert record["checks"][1]["ok"] is True
    assert took < 0.05 * mpi4py_build.seconds, (took, mpi4py_build.seconds)


def test_provision_local_installs_mpi4py(mpi4py_build, tmp_path):
    env = {**mpi4py_build.env, "SITESTACK_LOG_DIR": str(tmp_path / "logs")}
    argv = ["provision", "--site", "local", "--prefix", str(tmp_path / "stack"), "--tags", "mpi4py"]
    out = run_invoke(*argv, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "[localhost] changed  mpi4py: not installed" in out.stdout
    again = run_invoke(*argv, env=env)
    assert "[localhost] ok       mpi4py" in again.stdout

    from sitestack.core.host import local_host
    from sitestack.installs.stamp import installed_wheel
    wheel = installed_wheel(local_host(), str(tmp_path / "stack" / "mpi4py" / "4.1.2"))
    assert wheel and wheel.endswith(f"-cp{sys.version_info.major}{sys.version_info.minor}-linux_x86_64.whl")
    assert os.path.isfile(wheel)
