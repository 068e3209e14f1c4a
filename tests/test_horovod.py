"""Horovod: the version rules and site configuration (unit), and a real CPU build on the `local` site.

The real build (the session fixture ``horovod_build``) runs ONCE per test session: Horovod 0.28.1
from its PyPI sdist with patches/horovod/, against torch 2.13.0+cpu (a build environment sitestack
makes) and Debian's MPICH. The tests then parse ``horovodrun --check-build``, run a 2-rank
allreduce under mpiexec and under horovodrun, rerun as a no-op and install into a second prefix
from the build cache.

The NCCL variant (torch 2.14.1+cu130, CUDA 13.0 at /usr/local/cuda, NCCL from the pip wheel, about
13 minutes and 5 GB) runs only with SITESTACK_TEST_NCCL=1.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from sitestack.core.errors import SitestackError
from sitestack.engine import playbook as pb
from sitestack.model.recipe import load_recipe
from sitestack.model.site import Toolkit
from sitestack.packages.horovod import (
    Plan,
    Probed,
    TorchInfo,
    build_env,
    check_cuda_arch,
    cxx_standard,
    gpu_operations,
    horovod_data,
    parse_check_build,
    plan_for,
    render_check_build,
)
from tests.conftest import Build, run_invoke

ALLREDUCE = textwrap.dedent("""\
    import torch
    import horovod.torch as hvd
    hvd.init()
    t = hvd.allreduce(torch.full((4,), float(hvd.rank() + 1)), op=hvd.Sum)
    print("rank %d of %d: %s" % (hvd.rank(), hvd.size(), t.tolist()))
    """)

CHECK_BUILD_CPU = """\
Horovod v0.28.1:

Available Frameworks:
    [ ] TensorFlow
    [X] PyTorch
    [ ] MXNet

Available Controllers:
    [X] MPI
    [X] Gloo

Available Tensor Operations:
    [ ] NCCL
    [ ] DDL
    [ ] CCL
    [X] MPI
    [X] Gloo\x20\x20\x20\x20
"""


@pytest.fixture(scope="module")
def recipe():
    return load_recipe("horovod")


@pytest.fixture(scope="module")
def data(recipe):
    return horovod_data(recipe)


def facts(site: str, **changes):
    loaded = pb.load(site).facts
    return dataclasses.replace(loaded, **changes)


# -- version rules -------------------------------------------------------------------------------------
def test_what_each_site_builds(recipe):
    assert plan_for(recipe, facts("local"), None, "local") == Plan("none", None)
    assert plan_for(recipe, facts("cirrus"), None, "cirrus") == Plan("NCCL", "CUDA", 70)
    assert plan_for(recipe, facts("lumi"), None, "lumi") == Plan("NCCL", "ROCM")
    assert plan_for(recipe, facts("frontier"), None, "frontier") == Plan("NCCL", "ROCM")
    assert plan_for(recipe, facts("dawn"), None, "dawn") == Plan("none", None)     # oneCCL: CPU operations only
    assert plan_for(recipe, facts("cirrus"), "MPI", "cirrus") == Plan("MPI", "CUDA", 70)


def test_cuda_13_cannot_target_the_v100(recipe, data):
    cirrus = facts("cirrus")
    with pytest.raises(SitestackError, match=r"CUDA 13\.0 cannot target sm_70 \(V100-SXM2-16GB\).*CUDA >=12\.9,<13"):
        plan_for(recipe, dataclasses.replace(cirrus, cuda=Toolkit("13.0", "/usr/local/cuda")), None, "cirrus")
    check_cuda_arch(data, "13.0", 90)
    check_cuda_arch(data, "12.4", 70)
    with pytest.raises(SitestackError, match="no row for CUDA 10.2"):
        check_cuda_arch(data, "10.2", 70)


def test_torch_outside_what_the_patches_cover_is_refused(recipe, data):
    with pytest.raises(SitestackError, match=r"horovod 0\.28\.1 is not supported on site local: needs torch >=1\.5,<2\.15"):
        recipe.select_version(None, facts("local", torch=dataclasses.replace(facts("local").torch, version="2.15.0")),
                              "site local")
    with pytest.raises(SitestackError, match="torch 1.4.0 is outside"):
        cxx_standard(data, "1.4.0")
    assert cxx_standard(data, "2.13.0") == 17
    assert cxx_standard(data, "2.13.0", declared=20) == 20      # what torch 2.13's TorchConfig.cmake declares
    assert cxx_standard(data, "2.14.1") == 20                   # std::strong_ordering in its headers
    assert cxx_standard(data, "2.0.1") == 14


def test_gpu_operations_the_site_cannot_provide_are_refused(recipe, data):
    with pytest.raises(SitestackError, match=r"HOROVOD_GPU_OPERATIONS=NCCL cannot be provided by site local: it has gpu none"):
        gpu_operations(data, facts("local"), "NCCL", "local")
    with pytest.raises(SitestackError, match=r"HOROVOD_GPU_OPERATIONS=CCL is not something"):
        gpu_operations(data, facts("cirrus"), "CCL", "cirrus")
    with pytest.raises(SitestackError, match="cannot be provided by site dawn"):
        gpu_operations(data, facts("dawn"), "NCCL", "dawn")
    assert gpu_operations(data, facts("cirrus"), "none", "cirrus") == "none"


def probed(torch: str = "2.3.1", **changes) -> Probed:
    info = TorchInfo(python="/venv/bin/python", torch=torch, cuda="12.1", hip=None, declared_cxx=17)
    return dataclasses.replace(Probed(torch=info, env={"PATH": "/usr/bin:/bin"}, jobs=8), **changes)


def test_cirrus_build_environment(recipe, data):
    cirrus = facts("cirrus")
    plan = plan_for(recipe, cirrus, None, "cirrus")
    env = build_env(plan, cirrus, data, probed(cuda_home="/nvhpc/cuda/12.4", nccl_home="/nvhpc/comm_libs/nccl",
                                               nccl_include="/nvhpc/comm_libs/nccl/include",
                                               nccl_lib="/nvhpc/comm_libs/nccl/lib", cuda_stubs="/p/.sitestack/links/cuda"))
    assert env["HOROVOD_GPU"] == "CUDA" and env["HOROVOD_GPU_OPERATIONS"] == "NCCL"
    assert env["HOROVOD_CUDA_HOME"] == env["CUDAToolkit_ROOT"] == "/nvhpc/cuda/12.4"
    assert env["HOROVOD_BUILD_CUDA_CC_LIST"] == "70"
    assert env["HOROVOD_NCCL_HOME"] == "/nvhpc/comm_libs/nccl" and env["HOROVOD_NCCL_LINK"] == "SHARED"
    assert env["HOROVOD_TORCH_CXX_STANDARD"] == "17" and env["CXX"] == "mpicxx" and env["MAKEFLAGS"] == "-j8"
    assert env["LIBRARY_PATH"].startswith("/p/.sitestack/links/cuda")     # the libcuda stub, no driver
    assert env["PATH"] == "/nvhpc/cuda/12.4/bin:/usr/bin:/bin"


def test_rocm_sites_build_environment(recipe, data):
    for site in ("lumi", "frontier"):
        f = facts(site)
        env = build_env(plan_for(recipe, f, None, site), f, data,
                        probed(torch=f.torch.version, rocm_home=f"/opt/rocm-{f.rocm.version}"))
        assert env["HOROVOD_GPU"] == "ROCM" and env["HOROVOD_GPU_OPERATIONS"] == "NCCL"
        assert env["HOROVOD_ROCM_HOME"] == env["HOROVOD_RCCL_HOME"] == f"/opt/rocm-{f.rocm.version}"
        assert env["CXX"] == "CC" and env["CC"] == "cc"           # the Cray drivers (MPI without extra flags)
        assert env["HOROVOD_MPICXX_SHOW"] == "CC --cray-print-opts=all" and env["HCC_AMDGPU_TARGET"] == "gfx90a"
    local = facts("local")
    env = build_env(Plan("none", None), local, data, probed(torch="2.13.0"))
    assert not any(k.startswith(("HOROVOD_GPU", "HOROVOD_CUDA", "HOROVOD_NCCL", "HOROVOD_ROCM")) for k in env)


def test_check_build_output_is_parsed_and_rendered():
    parsed = parse_check_build(CHECK_BUILD_CPU)
    assert parsed == Plan("none", None).expected_check_build()
    assert render_check_build(parsed) in CHECK_BUILD_CPU
    nccl = Plan("NCCL", "CUDA", 90).expected_check_build()
    assert nccl["Available Tensor Operations"]["NCCL"] is True


def cuda_13_row_matches_nvcc(data) -> None:
    """The architecture table's CUDA 13 row is what CUDA 13's own ``nvcc --list-gpu-arch`` lists (run
    by the opt-in NCCL build below, the one test that has a CUDA 13 toolkit)."""
    version = subprocess.run(["/usr/local/cuda/bin/nvcc", "--version"], capture_output=True, text=True).stdout
    assert "release 13." in version, version
    listed = subprocess.run(["/usr/local/cuda/bin/nvcc", "--list-gpu-arch"], capture_output=True, text=True).stdout
    archs = sorted({int(a.split("_")[1].rstrip("af")) for a in listed.split()})
    (row,) = [r for r in data.cuda_architectures if r.cuda == ">=13"]
    assert sorted(row.sm) == archs


def test_patches_carry_their_headers(recipe):
    for patch in recipe.patches_for("0.28.1"):
        assert patch.header["Upstream"] and patch.header["Why"] and patch.header["Applies-to"]
    assert [p.file for p in recipe.patches_for("0.28.1")][:3] == [
        "0001-torch-cxx17.patch", "0002-torch-cxx-standard-from-env.patch", "0003-gloo-cmake4.patch"]


# -- the real CPU build, once per session: the horovod_build fixture (tests/conftest.py) ----------------
def cli(*args: str, env: dict, timeout: float = 3000) -> subprocess.CompletedProcess:
    return run_invoke(*args, env=env, timeout=timeout)


integration = [pytest.mark.integration, pytest.mark.slow]


def run(argv, build: Build, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(build.dest), "PATH": f"{build.dest}/bin:{os.environ['PATH']}"}
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.integration
@pytest.mark.slow
def test_cpu_build_from_the_sdist(horovod_build):
    out = horovod_build.first
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr
    assert "[localhost] changed  horovod@0.28.1:" in out.stdout
    stamp = json.loads((horovod_build.dest / ".sitestack" / "install.json").read_text())
    assert stamp["inputs"]["build"]["source"]["sha256"] == \
        "92a43f5a94c43907a56805bad15f19700c62ffc83b7ca483f9e104e229f67ef0"
    assert [p["file"] for p in stamp["inputs"]["build"]["patches"]] == sorted(
        p.name for p in (Path(__file__).parent.parent / "patches" / "horovod").glob("*.patch"))
    env = stamp["inputs"]["build"]["plan"][0]["env"]
    assert env["HOROVOD_WITH_PYTORCH"] == "1" and env["HOROVOD_WITH_MPI"] == "1"
    assert env["HOROVOD_TORCH_CXX_STANDARD"] == "20"       # torch 2.13's TorchConfig.cmake: CXX_STANDARD 20
    assert "HOROVOD_GPU_OPERATIONS" not in env
    assert [c["name"] for c in stamp["checks"]] == ["horovodrun --check-build", "2-rank allreduce (MPI launcher)",
                                                    "2-rank allreduce (horovodrun, Gloo)"]
    assert all(c["ok"] for c in stamp["checks"])
    log = "".join(p.read_text() for p in (horovod_build.root / "logs").rglob("horovod-0.28.1.log"))
    if not stamp["artefact"]["from_cache"]:
        assert "-std=c++20" in log and "Horovod PyTorch extension: C++20" in log
    print(f"\nHorovod CPU build (build environment + build + checks): {horovod_build.seconds:.0f} s")


@pytest.mark.integration
@pytest.mark.slow
def test_check_build_shows_exactly_what_was_asked(horovod_build):
    out = run([f"{horovod_build.dest}/bin/horovodrun", "--check-build"], horovod_build)
    assert out.returncode == 0, out.stderr
    assert parse_check_build(out.stdout) == Plan("none", None).expected_check_build()


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["mpiexec", "horovodrun"])
def test_two_rank_allreduce(horovod_build, launcher):
    script = horovod_build.root / "allreduce.py"
    script.write_text(ALLREDUCE)
    argv = (["mpiexec", "-n", "2"] if launcher == "mpiexec"
            else [f"{horovod_build.dest}/bin/horovodrun", "-np", "2", "-H", "localhost:2", "--gloo"])
    out = run([*argv, horovod_build.python, str(script)], horovod_build)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "rank 0 of 2: [3.0, 3.0, 3.0, 3.0]" in out.stdout and "rank 1 of 2: [3.0, 3.0, 3.0, 3.0]" in out.stdout


@pytest.mark.integration
@pytest.mark.slow
def test_rerun_is_a_no_op(horovod_build):
    args = ["build-horovod", "--site", "local", "--prefix", str(horovod_build.prefix)]
    planned = cli(*args, "--check", "--fail-on-change", env=horovod_build.env)
    assert planned.returncode == 0, planned.stdout + planned.stderr
    start = time.monotonic()
    again = cli(*args, env=horovod_build.env)
    took = time.monotonic() - start
    assert again.returncode == 0 and "[localhost] ok       horovod@0.28.1" in again.stdout, again.stdout
    print(f"\nno-op re-run: {took:.1f} s")


@pytest.mark.integration
@pytest.mark.slow
def test_another_prefix_installs_the_cached_wheel(horovod_build, tmp_path):
    start = time.monotonic()
    out = cli("build-horovod", "--site", "local", "--prefix", str(tmp_path / "other"), env=horovod_build.env)
    took = time.monotonic() - start
    assert out.returncode == 0, out.stdout + out.stderr
    assert "from the build cache" in out.stdout
    record = json.loads((tmp_path / "other" / "horovod" / "0.28.1" / ".sitestack" / "install.json").read_text())
    assert record["artefact"]["from_cache"] is True and all(c["ok"] for c in record["checks"])
    first = json.loads((horovod_build.dest / ".sitestack" / "install.json").read_text())
    if not first["artefact"]["from_cache"]:     # the session built it: installing the wheel is much faster
        assert took < horovod_build.seconds / 4, (took, horovod_build.seconds)
    print(f"\ncached install into a second prefix: {took:.1f} s")


def test_refusals_before_anything_is_built(tmp_path):
    env = {"SITESTACK_LOG_DIR": str(tmp_path / "logs"), "SITESTACK_BUILD_CACHE": str(tmp_path / "builds")}
    out = cli("build-horovod", "--site", "local", "--gpu-operations", "NCCL", "--prefix", str(tmp_path / "p"), env=env)
    assert out.returncode == 1 and "HOROVOD_GPU_OPERATIONS=NCCL cannot be provided by site local" in out.stdout + out.stderr
    out = cli("build-horovod", "--site", "local", "--python", "/nonexistent/python", "--prefix", str(tmp_path / "p"),
              env=env)
    assert out.returncode == 1 and "cannot run /nonexistent/python" in out.stdout, out.stdout + out.stderr
    assert not (tmp_path / "p" / "horovod").exists() and not (tmp_path / "builds").exists()


# -- opt-in: the NCCL variant (about 13 minutes, 5 GB) ------------------------------------------------------
NCCL_PLAYBOOK = """\
site: ncclsite
description: this machine as an NVIDIA site (CUDA 13.0, torch 2.14.1+cu130, NCCL from the pip wheel)
hosts:
  - name: localhost
    connection: local
facts:
  description: this machine with CUDA 13.0 at /usr/local/cuda (no GPU; builds only)
  marker: /usr/local/cuda/bin/nvcc
  prefix: "{home}/sitestack/ncclsite"
  node: {cores: 2}
  gpu: {vendor: nvidia, model: H100, arch: sm_90, per_node: 1}
  modules: {system: none}
  mpi: {flavour: mpich, cc: mpicc, cxx: mpicxx, launcher: mpiexec, library_match: MPICH}
  network: {fabric: loopback, interfaces: [lo]}
  scheduler: {kind: none}
  python: {source: system, version: "3.11", executable: python3}
  torch: {version: 2.14.1, variant: cu130}
  collectives: nccl
  cuda: {version: "13.0", home: /usr/local/cuda}
steps: []
"""


@pytest.mark.skipif(os.environ.get("SITESTACK_TEST_NCCL") != "1", reason="opt-in: SITESTACK_TEST_NCCL=1 (13 min, 5 GB)")
@pytest.mark.integration
@pytest.mark.slow
def test_nccl_variant_builds_with_cuda_13(tmp_path, data):
    cuda_13_row_matches_nvcc(data)
    playbook = tmp_path / "ncclsite.yml"
    playbook.write_text(NCCL_PLAYBOOK)
    root = Path(os.environ.get("SITESTACK_TEST_NCCL_DIR") or tmp_path)
    env = {"SITESTACK_LOG_DIR": str(root / "logs"), "SITESTACK_BUILD_CACHE": str(root / "builds"),
           "SITESTACK_SOURCE_CACHE": str(root / "sources")}
    prefix = root / "prefix"
    start = time.monotonic()
    out = cli("build-horovod", "--playbook", str(playbook), "--prefix", str(prefix), env=env, timeout=5400)
    took = time.monotonic() - start
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr
    dest = prefix / "horovod" / "0.28.1"
    stamp = json.loads((dest / ".sitestack" / "install.json").read_text())
    env_used = stamp["inputs"]["build"]["plan"][0]["env"]
    assert env_used["HOROVOD_GPU_OPERATIONS"] == "NCCL" and env_used["HOROVOD_BUILD_CUDA_CC_LIST"] == "90"
    assert env_used["HOROVOD_TORCH_CXX_STANDARD"] == "20"
    check = next(c for c in stamp["checks"] if c["name"] == "horovodrun --check-build")
    assert parse_check_build(check["output"])["Available Tensor Operations"]["NCCL"] is True
    print(f"\nHorovod NCCL build (CUDA 13.0, torch 2.14.1+cu130): {took:.0f} s")
    if not os.environ.get("SITESTACK_TEST_NCCL_DIR"):
        shutil.rmtree(root / "builds", ignore_errors=True)
