"""The libraries each rank mapped (ddpcheck/mapped.py, ddpcheck/libraries.py): the maps parser on crafted
text, the ELF soname reader on libraries built here with gcc and on the system's, the judgement of
ranks' records, the manifest's expected places, and summary.md's section."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sitestack.installs.venv_manifest import (
    BUNDLED,
    BUNDLED_FILES,
    LIBRARY_PACKAGES,
    expected_libraries,
    explain,
    manifest_for,
)
from sitestack.onsite import ddp_report
from sitestack.onsite.ddpcheck import libraries, mapped

MAPS = """\
55d0c0a00000-55d0c0a01000 r--p 00000000 08:01 131 /usr/bin/python3.11
7f0000000000-7f0000021000 rw-p 00000000 00:00 0
7f0000100000-7f0000200000 r-xp 00001000 08:01 4242 /opt/my stack/lib/libnccl.so.2.18.3
7f0000200000-7f0000210000 r--p 00101000 08:01 4242 /opt/my stack/lib/libnccl.so.2.18.3
7f0000300000-7f0000310000 r-xp 00000000 08:01 77 /tmp/old/libfabric.so.1.18.2 (deleted)
7f0000400000-7f0000410000 r-xp 00000000 00:00 0                          [heap]
7f0000500000-7f0000510000 r-xp 00000000 00:00 0                          [anon:libc_malloc]
7f0000600000-7f0000610000 r-xp 00000000 08:01 90 /sp/numpy/_core/_multiarray_umath.cpython-311-x86_64-linux-gnu.so
7f0000700000-7f0000710000 r-xp 00000000 08:02 91 /tmp/copy/_multiarray_umath.cpython-311-x86_64-linux-gnu.so
7f0000800000-7f0000810000 r-xp 00000000 08:01 92 /sp/aws/librccl-net.so
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]
7ffd00100000-7ffd00101000 r-xp 00000000 00:00 0                          [vdso]
7ffd00200000-7ffd00201000 r-xp 00000000 08:01 93 /sp/torch/lib/libc1"""


def test_maps_parser_keeps_files_once_with_spaces_and_deleted_and_drops_the_rest():
    maps = mapped.parse_maps(MAPS)
    assert [(m.path, m.deleted, m.inode) for m in maps] == [
        ("/usr/bin/python3.11", False, 131),
        ("/opt/my stack/lib/libnccl.so.2.18.3", False, 4242),  # two mappings of one file: once
        ("/tmp/old/libfabric.so.1.18.2", True, 77),
        ("/sp/numpy/_core/_multiarray_umath.cpython-311-x86_64-linux-gnu.so", False, 90),
        ("/tmp/copy/_multiarray_umath.cpython-311-x86_64-linux-gnu.so", False, 91),
        ("/sp/aws/librccl-net.so", False, 92),
        ("/sp/torch/lib/libc1", False, 93),  # a line cut by the read limit is kept as it reads
    ]
    assert mapped.parse_maps("") == [] and mapped.parse_maps("garbage\n\n1 2 3 4 x /p\n") == []


def test_maps_read_is_bounded_and_this_process_maps_its_python(tmp_path):
    big = tmp_path / "maps"
    big.write_text(MAPS * 100)
    assert len(mapped.read_maps(str(big), limit=1000)) == 1000
    assert mapped.read_maps(str(tmp_path / "missing")) == ""
    own = mapped.parse_maps(mapped.read_maps())
    assert any(os.path.basename(m.path).startswith("libc.so") or "python" in m.path for m in own)


def test_classify_kinds_and_a_copy_of_an_extension_module_elsewhere():
    found = libraries.classify(mapped.parse_maps(MAPS), "process-group")
    assert [e["path"] for e in found["nccl"]] == ["/opt/my stack/lib/libnccl.so.2.18.3"]
    assert found["nccl"][0]["soname"] == "libnccl.so.2" and found["nccl"][0]["version"] == "2.18.3"
    assert found["libfabric"][0]["deleted"] is True and found["libfabric"][0]["version"] == "1.18.2"
    assert [e["path"] for e in found["net-plugin"]] == ["/sp/aws/librccl-net.so"]  # not NCCL itself
    assert [e["path"] for e in found["numpy"]] == ["/sp/numpy/_core/_multiarray_umath.cpython-311-x86_64-linux-gnu.so",
                                                   "/tmp/copy/_multiarray_umath.cpython-311-x86_64-linux-gnu.so"]
    assert "torch" not in found and "/usr/bin/python3.11" not in json.dumps(found)
    problems = libraries.rank_problems({"rank": 1, "host": "n1", "libraries": found}, {})
    assert problems == ["rank 1 on n1 mapped two copies of _multiarray_umath: "
                        "/sp/numpy/_core/_multiarray_umath.cpython-311-x86_64-linux-gnu.so and "
                        "/tmp/copy/_multiarray_umath.cpython-311-x86_64-linux-gnu.so"]


def entry(path: str, file: str = "08:01:1") -> dict:
    return {"path": path, "soname": None, "version": None, "file": file, "since": "process-group"}


def test_judgement_against_the_manifest_and_between_ranks():
    expected = {"torch": ["/venv/sp/torch"], "mpi": ["/opt/mpi/lib"]}
    good = {"torch": [entry("/venv/sp/torch/lib/libc10.so"), entry("/venv/sp/torch/lib/libtorch.so", "08:01:2")],
            "nccl": [entry("/venv/sp/torch/lib/librccl.so")]}
    bad = {"torch": [entry("/tmp/x/libc10.so", "08:01:9"), entry("/venv/sp/torch/lib/libtorch.so", "08:01:2")],
           "nccl": [entry("/opt/rocm/lib/librccl.so.1.0", "08:01:3")]}
    ranks = [{"rank": 0, "host": "a", "libraries": good}, {"rank": 1, "host": "b", "libraries": bad}]
    assert libraries.rank_problems(ranks[0], expected) == []
    assert libraries.rank_problems(ranks[1], expected) == [
        "rank 1 on b mapped torch library /tmp/x/libc10.so, not the stack's copy (/venv/sp/torch, as the stack's manifest says)"]
    assert libraries.disagreements(ranks) == [
        "ranks disagree on nccl library librccl: rank 0 mapped /venv/sp/torch/lib/librccl.so, rank 1 /opt/rocm/lib/librccl.so.1.0",
        "ranks disagree on torch library libc10: rank 0 mapped /venv/sp/torch/lib/libc10.so, rank 1 /tmp/x/libc10.so"]
    # one file under two paths (a bind mount, a hard link) is one copy; the same paths on every rank agree
    same = {"mpi": [entry("/opt/mpi/lib/libmpi.so.12"), entry("/mnt/mpi/lib/libmpi.so.12")]}
    assert libraries.rank_problems({"rank": 0, "libraries": same}, {}) == []
    assert libraries.disagreements([{"rank": 0, "libraries": good}, {"rank": 1, "libraries": good}]) == []


def test_expected_dirs_read_from_the_manifest_check_config_names(tmp_path):
    manifest = tmp_path / "stack.manifest.json"
    manifest.write_text(json.dumps({"libraries": {"torch": ["/venv/sp/torch/"], "numpy": ["relative", 3],
                                                  "no-such-kind": ["/x"], "mpi": "/not/a/list"}}))
    config = {"stack": {"manifest": str(manifest)}}
    assert libraries.expected_dirs(config) == {"torch": ["/venv/sp/torch"]}
    for broken in ("{", "[]", '{"libraries": 1}'):
        manifest.write_text(broken)
        assert libraries.expected_dirs(config) == {}
    assert libraries.expected_dirs({}) == {} and libraries.expected_dirs({"stack": {"manifest": "rel.json"}}) == {}


def test_a_staged_copy_of_the_stack_is_the_stacks_copy(tmp_path):
    """Frontier stages the stack env on node-local NVMe (stage-env.sh, SITESTACK_STAGED_ENV): its copies
    of the stack's libraries are the stack's, at the same place under the copy; others still are not."""
    manifest = tmp_path / "stack.manifest.json"
    manifest.write_text(json.dumps({"path": "/lustre/stack/2.13.0", "libraries": {
        "torch": ["/lustre/stack/2.13.0/lib/python3.11/site-packages/torch"], "net-plugin": ["/sw/plugin/lib"]}}))
    config = {"stack": {"manifest": str(manifest)}}
    expected = libraries.expected_dirs(config, "/mnt/bb/alice/sitestack-env-5023")
    assert expected == {"torch": ["/lustre/stack/2.13.0/lib/python3.11/site-packages/torch",
                                  "/mnt/bb/alice/sitestack-env-5023/lib/python3.11/site-packages/torch"],
                        "net-plugin": ["/sw/plugin/lib"]}
    staged = {"rank": 0, "host": "n1", "libraries": {"torch": [
        {"path": "/mnt/bb/alice/sitestack-env-5023/lib/python3.11/site-packages/torch/lib/libtorch_cpu.so"}]}}
    assert libraries.rank_problems(staged, expected) == []
    elsewhere = {"rank": 0, "host": "n1", "libraries": {"torch": [{"path": "/mnt/bb/bob/torch/lib/libtorch_cpu.so"}]}}
    assert libraries.rank_problems(elsewhere, expected)
    assert libraries.expected_dirs(config, "relative")["torch"] == expected["torch"][:1]


def test_the_manifest_names_each_python_library_package_where_the_stack_holds_it():
    assert set(LIBRARY_PACKAGES) <= set(libraries.KINDS)  # the job's table has a kind for each
    assert {b.kind for b in BUNDLED} <= set(libraries.KINDS)
    packages = [{"name": "numpy"}, {"name": "mpi4py"}, {"name": "six"}]
    base = [{"name": "torch", "location": "/opt/conda/lib/python3.11/site-packages"}, {"name": "horovod"}]
    scan = {"packages": packages, "base": base}
    assert expected_libraries("/p/venv/lib/python3.11/site-packages", scan) == {
        "mpi4py": ["/p/venv/lib/python3.11/site-packages/mpi4py"],
        "numpy": ["/p/venv/lib/python3.11/site-packages/numpy"],
        "torch": ["/opt/conda/lib/python3.11/site-packages/torch"]}  # horovod: no location, not judged


GCC = shutil.which("gcc")
SCAN_PROGRAM = Path(__file__).resolve().parents[1] / "sitestack" / "onsite" / "venv_scan.py"


def test_the_manifest_of_a_stack_that_builds_the_plugin_names_its_lib():
    """Frontier's stack includes the plugin's recipe-install step: its plan, and so its manifest, name the
    install's lib (and a changed install is a changed plan); LUMI's plugin is the container's, local has none."""
    from tests.fakehost import FakeHost
    from tests.test_venv import site_step
    ctx, step = site_step("frontier")
    plugin = next(s for s in ctx.site.steps if s.action == "recipe-install" and s.args["recipe"] == "aws-ofi-rccl")
    dest = ctx.actions["recipe-install"].from_spec(plugin, ctx).target.dest
    assert dest.startswith("/lustre/orion/proj123/world-shared/sitestack/aws-ofi-rccl/")
    plan, built = step.desired(FakeHost())
    assert plan["libraries"] == {"net-plugin": [f"{dest}/lib"]}
    scan = {"python": "3.10.13", "packages": [{"name": "torch", "dist_info": "torch-2.2.2+rocm5.7.dist-info"}],
            "base": [], "files": ["torch/lib/librccl.so"]}
    manifest = manifest_for(step.stack, plan, scan, {}, None, "gen", built)
    sp = step.stack.site_packages
    assert manifest["libraries"] == {"net-plugin": [f"{dest}/lib"], "nccl": [f"{sp}/torch/lib"], "torch": [f"{sp}/torch"]}
    moved = {**plan, "libraries": {"net-plugin": ["/elsewhere/lib"]}}
    assert explain(plan, moved) == f"net-plugin libraries {dest}/lib -> /elsewhere/lib"
    assert explain(moved, {k: v for k, v in plan.items() if k != "libraries"}) == \
        "net-plugin libraries /elsewhere/lib -> (none)"
    for name in ("lumi", "local", "cirrus"):
        _, other = site_step(name)
        assert "libraries" not in other.desired(FakeHost())[0], name  # an unchanged plan: no rebuild of their stacks


def so(path: Path, soname: str, body: str = "int nccl_stub(void) { return 1; }\n") -> Path:
    """A shared library built with gcc at ``path`` with DT_SONAME ``soname``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    source = path.parent / (path.name + ".c")
    source.write_text(body)
    subprocess.run([GCC, "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(path), str(source)], check=True)
    source.unlink()
    return path


def dist_info(sp: Path, name: str, version: str) -> None:
    d = sp / f"{name.replace('-', '_')}-{version}.dist-info"
    d.mkdir(parents=True)
    (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\n")


@pytest.mark.skipif(GCC is None, reason="no gcc")
def test_the_scan_finds_the_nccl_the_environment_installed(tmp_path):
    """The real scan program over a site-packages shaped like a CUDA stack's (NVIDIA's NCCL wheel) and a
    ROCm stack's (RCCL in torch/lib): the manifest names the directory of each copy the environment holds."""
    sp = tmp_path / "lib" / "python3.11" / "site-packages"
    nccl = so(sp / "nvidia" / "nccl" / "lib" / "libnccl.so.2", "libnccl.so.2")
    so(sp / "stray" / "lib" / "libnccl.so.2", "libnccl.so.2")   # no distribution ships it here: not named
    (sp / "torch" / "lib").mkdir(parents=True)
    dist_info(sp, "torch", "2.2.2")
    argv = [sys.executable, str(SCAN_PROGRAM), str(sp), *BUNDLED_FILES]

    def scan() -> dict:
        return json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)

    assert scan()["files"] == ["nvidia/nccl/lib/libnccl.so.2"]
    assert "nccl" not in expected_libraries(str(sp), scan())   # the file, but not NVIDIA's NCCL distribution
    dist_info(sp, "nvidia-nccl-cu12", "2.21.5")
    assert expected_libraries(str(sp), scan())["nccl"] == [str(nccl.parent)]
    so(sp / "torch" / "lib" / "librccl.so", "librccl.so.1")
    assert expected_libraries(str(sp), scan())["nccl"] == [str(nccl.parent), f"{sp}/torch/lib"]
    # a base Python's (a container's) NCCL is the site's: its torch is named, its NCCL is not
    base = {"packages": [], "base": [{"name": "torch", "location": str(sp)}], "files": scan()["files"]}
    assert expected_libraries("/venv/sp", base) == {"torch": [f"{sp}/torch"]}
    assert expected_libraries(str(sp), {**scan(), "files": ["../../x/libnccl.so.2", "/abs/libnccl.so.2"]}).get("nccl") is None


@pytest.mark.skipif(GCC is None, reason="no gcc")
def test_elf_soname_of_libraries_built_here_and_of_the_system(tmp_path):
    source = tmp_path / "x.c"
    source.write_text("int x(void) { return 1; }\n")
    named, plain = tmp_path / "libnamed.so.3.1", tmp_path / "libplain.so"
    subprocess.run([GCC, "-shared", "-fPIC", "-Wl,-soname,libnamed.so.3", "-o", str(named), str(source)], check=True)
    subprocess.run([GCC, "-shared", "-fPIC", "-o", str(plain), str(source)], check=True)
    assert mapped.elf_soname(str(named)) == "libnamed.so.3"
    assert mapped.elf_soname(str(plain)) is None  # no DT_SONAME: the file name stands in
    (tmp_path / "text.so").write_text("not ELF")
    (tmp_path / "cut.so").write_bytes(named.read_bytes()[:100])
    for path in ("text.so", "cut.so", "missing.so", "."):
        assert mapped.elf_soname(str(tmp_path / path)) is None
    readelf = shutil.which("readelf")
    for lib in sorted(glob.glob("/usr/lib/*/libc.so.6") + glob.glob("/usr/lib/*/libmpich.so.12*"))[:3]:
        if readelf:
            dynamic = subprocess.run([readelf, "-d", lib], capture_output=True, text=True).stdout
            want = dynamic.split("Library soname: [", 1)[1].split("]", 1)[0]
            assert mapped.elf_soname(lib) == want, lib


def test_names_and_versions_from_file_names_and_dist_info(tmp_path):
    assert mapped.name_soname("/a/libmpich.so.12.2.2") == "libmpich.so.12" and mapped.name_soname("/a/libc10.so") == "libc10.so"
    assert mapped.name_version("/a/libnccl.so.2.18.3") == "2.18.3" and mapped.name_version("/a/libtorch.so") is None
    sp = tmp_path / "site-packages"
    (sp / "torch" / "lib").mkdir(parents=True)
    (sp / "torch-2.13.0+cpu.dist-info").mkdir()
    (sp / "torch_tb-1.0.dist-info").mkdir()
    assert mapped.package_version(str(sp / "torch" / "lib" / "libc10.so"), "torch") == "2.13.0+cpu"
    assert mapped.package_version("/elsewhere/libc10.so", "torch") is None


def test_summary_lists_each_file_with_the_ranks_that_mapped_it():
    ranks = [{"rank": 0, "libraries": {"torch": [{**entry("/sp/torch/lib/libc10.so"), "soname": "libc10.so", "version": "2.13.0"}]}},
             {"rank": 1, "libraries": {"torch": [{**entry("/tmp/x/libc10.so"), "soname": "libc10.so", "version": None}]}},
             {"rank": 2, "libraries": {"torch": [{**entry("/sp/torch/lib/libc10.so"), "soname": "libc10.so", "version": "2.13.0"}]}}]
    lines = ddp_report.library_lines(ranks)
    assert lines[:4] == ["## Libraries", "", "| kind | path | soname | version | ranks |", "|---|---|---|---|---|"]
    assert "| torch | `/sp/torch/lib/libc10.so` | libc10.so | 2.13.0 | 0,2 |" in lines
    assert "| torch | `/tmp/x/libc10.so` | libc10.so | — | 1 |" in lines
    assert ddp_report.library_lines([{"rank": 0}]) == []


# -- the check program for real: two ranks of the installed job --------------------------------------------

def job_with_manifest(job: dict, tmp_path: Path, more: dict[str, list[str]] | None = None) -> tuple[Path, str]:
    """check-config.json of the installed job naming a manifest whose ``libraries`` come from a real scan
    of the job's Python (onsite/venv_scan.py, as install-venv scans a stack), and ``more``; its site-packages."""
    sp = subprocess.run([job["python"], "-c", "import numpy, os; print(os.path.dirname(os.path.dirname(numpy.__file__)))"],
                        capture_output=True, text=True, check=True).stdout.strip()
    scan = json.loads(subprocess.run([job["python"], str(SCAN_PROGRAM), sp], capture_output=True, text=True,
                                     check=True).stdout)
    manifest = tmp_path / "stack.manifest.json"
    manifest.write_text(json.dumps({"format": 1, "libraries": {**expected_libraries(sp, scan), **(more or {})}}))
    config = json.loads((job["dir"] / "check-config.json").read_text())
    config["stack"]["manifest"] = str(manifest)
    path = tmp_path / "check-config.json"
    path.write_text(json.dumps(config))
    return path, sp


def two_ranks(job: dict, config: Path, out: Path, rank_env: dict[int, dict[str, str]]) -> list[tuple[int, str]]:
    """Two ranks of the installed job started by hand (env://), each with its own additions to the job's environment."""
    from tests.ports import free_port
    port = free_port()
    procs = []
    for rank in range(2):
        env = {**os.environ, **job["env"], "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1", **rank_env.get(rank, {})}
        argv = [job["python"], "-u", str(job["dir"] / "ddp_check.py"), "--config", str(config), "--out", str(out),
                "--steps", "8", "--init-timeout", "30", "--no-mpi"]
        procs.append(subprocess.Popen(argv, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    return [(p.wait(timeout=300), p.stdout.read() if p.stdout else "") for p in procs]


@pytest.mark.integration
def test_a_healthy_run_lists_each_ranks_libraries(installed_local_job, tmp_path):
    config, sp = job_with_manifest(installed_local_job, tmp_path)
    out = tmp_path / "out"
    results = two_ranks(installed_local_job, config, out, {})
    data = json.loads((out / "result.json").read_text())
    assert [rc for rc, _ in results] == [0, 0], (data["cause"], results)
    env_check = next(c for c in data["checks"] if c["name"] == "environment")
    assert env_check["status"] == "passed" and env_check["details"]["libraries_expected"]["torch"] == [f"{sp}/torch"]
    for rank in data["ranks"]:
        libs = rank["libraries"]
        c10 = next(e for e in libs["torch"] if e["path"].endswith("/libc10.so"))
        assert c10["path"] == os.path.realpath(f"{sp}/torch/lib/libc10.so") and c10["soname"] == "libc10.so"
        assert c10["version"] == data["torch"]
        assert any("_multiarray_umath" in e["path"] and e["path"].startswith(os.path.realpath(sp)) for e in libs["numpy"])
    summary = (out / "summary.md").read_text()
    assert "## Libraries" in summary and f"| torch | `{os.path.realpath(sp)}/torch/lib/libc10.so` | libc10.so |" in summary


@pytest.mark.integration
def test_a_rank_with_other_copies_preloaded_fails_naming_both_paths(installed_local_job, tmp_path):
    """Rank 1 alone runs with LD_PRELOAD of a copy of torch's libc10.so (which torch then uses instead of
    its own) and of numpy's _multiarray_umath (mapped beside numpy's own when numpy imports it)."""
    config, sp = job_with_manifest(installed_local_job, tmp_path)
    real = Path(os.path.realpath(sp))
    copies = tmp_path / "copies"
    copies.mkdir()
    c10 = shutil.copy(real / "torch" / "lib" / "libc10.so", copies)
    umath = shutil.copy(next((real / "numpy").glob("*/_multiarray_umath.*.so")), copies)
    libs = installed_local_job["env"].get("LD_LIBRARY_PATH", "")
    out = tmp_path / "out"
    results = two_ranks(installed_local_job, config, out, {1: {
        "LD_PRELOAD": f"{c10} {umath}", "LD_LIBRARY_PATH": f"{next(real.glob('numpy.libs'), real)}:{libs}".rstrip(":")}})
    assert [rc for rc, _ in results] == [1, 1], results
    data = json.loads((out / "result.json").read_text())
    env_check = next(c for c in data["checks"] if c["name"] == "environment")
    problems = env_check["details"]["problems"]
    host = data["ranks"][1]["host"]
    assert env_check["status"] == "failed" and env_check["summary"].startswith("rank 1 on ")
    assert (f"rank 1 on {host} mapped torch library {c10}, not the stack's copy ({sp}/torch, as the stack's manifest "
            "says)") in problems, problems
    theirs = next(str(p) for p in (real / "numpy").glob("*/_multiarray_umath.*.so"))
    assert f"rank 1 on {host} mapped two copies of _multiarray_umath: {umath} and {theirs}" in problems \
        or f"rank 1 on {host} mapped two copies of _multiarray_umath: {theirs} and {umath}" in problems, problems
    assert (f"ranks disagree on torch library libc10: rank 0 mapped {real}/torch/lib/libc10.so, rank 1 {c10}"
            in problems), problems
    assert not any(p.startswith("rank 0 ") for p in problems), problems
    assert data["verdict"] == "failed" and data["cause"].startswith("environment: rank 1 on ")


@pytest.mark.integration
@pytest.mark.skipif(GCC is None, reason="no gcc")
def test_a_rank_with_another_nccl_and_plugin_fails_naming_both_paths(installed_local_job, tmp_path):
    """The manifest names the stack's NCCL (NVIDIA's wheel, found by the real scan) and its network plugin's
    lib (as for a stack whose playbook builds the plugin); each rank LD_PRELOADs a libnccl.so.2 and a
    librccl-net.so built here with gcc (the plugin a loadable stub exporting ncclNetPlugin_v5): rank 0 the
    stack's copies, rank 1 copies from elsewhere, as LD_LIBRARY_PATH or LD_PRELOAD put them first in the field."""
    from tests.twins.comm_oracle import stub_plugin
    stack_sp = tmp_path / "stack" / "lib" / "python3.11" / "site-packages"
    dist_info(stack_sp, "nvidia-nccl-cu12", "2.21.5")
    ours = so(stack_sp / "nvidia" / "nccl" / "lib" / "libnccl.so.2", "libnccl.so.2")
    scan = json.loads(subprocess.run([sys.executable, str(SCAN_PROGRAM), str(stack_sp), *BUNDLED_FILES],
                                     capture_output=True, text=True, check=True).stdout)
    plugin_lib = tmp_path / "prefix" / "aws-ofi-rccl" / "1.18.0" / "lib"
    our_plugin = stub_plugin(plugin_lib / "librccl-net.so", "Libfabric")
    theirs = so(tmp_path / "elsewhere" / "libnccl.so.2", "libnccl.so.2")
    their_plugin = stub_plugin(tmp_path / "elsewhere" / "librccl-net.so", "Libfabric")
    config, _sp = job_with_manifest(installed_local_job, tmp_path, {
        "nccl": expected_libraries(str(stack_sp), scan)["nccl"], "net-plugin": [str(plugin_lib)]})
    out = tmp_path / "out"
    results = two_ranks(installed_local_job, config, out, {0: {"LD_PRELOAD": f"{ours} {our_plugin}"},
                                                           1: {"LD_PRELOAD": f"{theirs} {their_plugin}"}})
    assert [rc for rc, _ in results] == [1, 1], results
    data = json.loads((out / "result.json").read_text())
    env_check = next(c for c in data["checks"] if c["name"] == "environment")
    problems, host = env_check["details"]["problems"], data["ranks"][1]["host"]
    assert env_check["details"]["libraries_expected"]["net-plugin"] == [str(plugin_lib)]
    assert [e["path"] for e in data["ranks"][0]["libraries"]["nccl"]] == [str(ours)]
    assert data["ranks"][0]["libraries"]["net-plugin"][0]["path"] == str(our_plugin)
    assert (f"rank 1 on {host} mapped nccl library {theirs}, not the stack's copy ({ours.parent}, as the stack's "
            "manifest says)") in problems, problems
    assert (f"rank 1 on {host} mapped net-plugin library {their_plugin}, not the stack's copy ({plugin_lib}, as the "
            "stack's manifest says)") in problems, problems
    assert (f"ranks disagree on net-plugin library librccl-net: rank 0 mapped {our_plugin}, rank 1 {their_plugin}"
            in problems), problems
    assert not any(p.startswith("rank 0 ") for p in problems), problems
