"""`invoke build-rccl-plugin` builds the real upstream plugins, through the product, on this machine.

The sources are git archives of ROCm/aws-ofi-rccl (branch cxi at 17d41cb, the plugin for ROCm < 6)
and aws/aws-ofi-nccl v1.18.0 (ROCm >= 6), carried in ``tests/data/upstream/`` (GitHub cannot be
reached from the test machines); without them these tests fail, they are not skipped. ROCm is a twin made from
Debian's HIP (tests/twins/rocm.py); RCCL's header is a stand-in written by the test, as Debian
packages no RCCL. The builds take about 10 s and 20 to 40 s on 2 cores.

Each test checks the configure line that ran (from the install's stamp) against
tests/golden/netplugin/local-twin-rocm-<rocm>.txt, the exported plugin interface (``nm -D``), the
module file, that a second run changes nothing, and (the fork) that a changed source rebuilds.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import tarfile
from pathlib import Path

import pytest

from sitestack.installs.sources import sha256_file
from sitestack.onsite import nccl_log
from tests.twins import comm_oracle
from tests.twins.rocm import make_rccl_header, make_rocm, upstream_sources

GOLDEN = Path(__file__).parent / "golden" / "netplugin"
FORK = "aws-ofi-rccl-17d41cb.tar.gz"
UPSTREAM = "aws-ofi-nccl-1.18.0.tar.gz"
NCCL_APIS = ",".join(f"v{v}" for v in range(2, 12))


@pytest.fixture(scope="module")
def sources() -> Path:
    return upstream_sources()   # raises (an error, not a skip) where an archive is missing or changed


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {"SITESTACK_LOG_DIR": str(tmp_path / "logs"), "SITESTACK_SOURCE_CACHE": str(tmp_path / "sources"),
            "SITESTACK_BUILD_CACHE": str(tmp_path / "builds")}


def exported(library: Path) -> list[str]:
    """The plugin interface symbols the library defines (``nm -D --defined-only``), by version."""
    out = subprocess.run(["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True, check=True)
    names = [line.split()[-1] for line in out.stdout.splitlines() if line.split()[-1].startswith("ncclNetPlugin_v")]
    return sorted(names, key=lambda name: int(name.rsplit("_v", 1)[1]))


def ran_configure(dest: Path, paths: dict[str, Path]) -> str:
    """The configure command the install ran (its stamp), with the test's paths as $NAMES."""
    stamp = json.loads((dest / ".sitestack" / "install.json").read_text())
    (argv,) = [c["argv"] for c in stamp["inputs"]["build"]["plan"] if c["phase"] == "configure"]
    line = shlex.join(argv)
    for name, path in paths.items():
        line = line.replace(str(path), f"${name}")
    return line + "\n"


def check_golden(rocm: str, line: str) -> None:
    golden = GOLDEN / f"local-twin-rocm-{rocm}.txt"
    if os.environ.get("SITESTACK_UPDATE_GOLDEN"):
        golden.write_text(line)
    assert line == golden.read_text(), f"configure line for ROCm {rocm} changed; review and rerun with SITESTACK_UPDATE_GOLDEN=1"


def build_log(tmp_path: Path) -> str:
    return "\n".join(p.read_text() for p in sorted((tmp_path / "logs").rglob("aws-ofi-rccl-*.log")))


def module_env(root: Path, module: str, *names: str) -> dict[str, str]:
    """The variables as `module load` sets them (Lmod)."""
    script = ". /usr/share/lmod/lmod/init/bash; module use \"$1\"; module load \"$2\" || exit 3; shift 2; " \
             "for v in \"$@\"; do printf '%s=%s\\n' \"$v\" \"$(printenv \"$v\")\"; done"
    out = subprocess.run(["bash", "-c", script, "lmod", str(root), module, *names], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return dict(line.split("=", 1) for line in out.stdout.splitlines())


def assert_no_system_include(log: str) -> None:
    """Nothing put the system's include or library directory on a compiler line: it breaks GCC's #include_next."""
    for bad in (" -I/usr/include ", " -isystem /usr/include ", " -L/usr/lib ", "--with-libfabric=/usr ",
                "--with-hwloc=/usr "):
        assert bad not in log.replace("\n", " \n"), bad


@pytest.mark.integration
def test_the_rocm_fork_for_rocm_5(cli, tmp_path: Path, env, sources: Path):
    rocm = make_rccl_header(make_rocm(tmp_path / "rocm-5.7.1"))   # RCCL's header where ROCm 5.2+ has it
    prefix = tmp_path / "prefix"
    args = ["build-rccl-plugin", "--site", "local", "--rocm", "5.7.1", "--rocm-home", str(rocm), "--prefix", str(prefix)]
    tarball = sources / FORK

    planned = cli(*args, "--source", str(tarball), "--check", env=env)
    assert planned.returncode == 0, planned.stdout + planned.stderr
    assert "would change: not installed" in planned.stdout and not prefix.exists()

    built = cli(*args, "--source", str(tarball), env=env)
    assert built.returncode == 0, built.stdout + built.stderr
    dest = prefix / "aws-ofi-rccl" / "1.4.0+17d41cb-rocm-5.7.1"
    assert exported(dest / "lib" / "librccl-net.so") == ["ncclNetPlugin_v5"]
    check_golden("5.7.1", ran_configure(dest, {"PREFIX": prefix, "ROCM": rocm}))
    stamp = json.loads((dest / ".sitestack" / "install.json").read_text())
    assert [(c["name"], c["ok"]) for c in stamp["checks"]] == [("exports exactly ncclNetPlugin_v5", True)]
    assert_no_system_include(build_log(tmp_path))

    shown = module_env(prefix / "modules", "aws-ofi-rccl/1.4.0+17d41cb-rocm-5.7.1", "NCCL_NET_PLUGIN", "NCCL_NET",
                       "SITESTACK_NCCL_NET", "SITESTACK_NCCL_NET_PLUGIN_APIS", "LD_LIBRARY_PATH")
    # RCCL of ROCm 5.7.1 opens its default name librccl-net.so from LD_LIBRARY_PATH (tests/test_comm_oracle.py)
    assert shown["NCCL_NET_PLUGIN"] == "" and shown["SITESTACK_NCCL_NET"] == "AWS Libfabric"
    assert shown["NCCL_NET"] == ""   # not forced: the name a plugin registers varies by release
    assert shown["SITESTACK_NCCL_NET_PLUGIN_APIS"] == "v5" and shown["LD_LIBRARY_PATH"].startswith(f"{dest}/lib")
    assert "net plugin API v5" in (prefix / "modules" / "aws-ofi-rccl" / "1.4.0+17d41cb-rocm-5.7.1.lua").read_text()

    # A second run changes nothing, with the same --source or without (the stamp's sum stands for it).
    for extra in (["--source", str(tarball)], []):
        again = cli(*args, *extra, "--check", "--fail-on-change", env=env)
        assert again.returncode == 0, again.stdout + again.stderr
    rerun = cli(*args, "--source", str(tarball), env=env)
    assert rerun.returncode == 0 and "] ok       aws-ofi-rccl@1.4.0+17d41cb-rocm-5.7.1" in rerun.stdout, rerun.stdout

    # A changed source (another sha256, here a checkout directory with one file edited) rebuilds.
    with tarfile.open(tarball) as tar:
        tar.extractall(tmp_path / "checkout", filter="data")
    tree = tmp_path / "checkout" / "aws-ofi-rccl-17d41cb"
    with open(tree / "README.md", "a") as readme:
        readme.write("\nA local change.\n")
    before = stamp["inputs"]["build"]["source"]["sha256"]
    assert before == sha256_file(tarball)
    changed = cli(*args, "--source", str(tree), env=env)
    assert changed.returncode == 0, changed.stdout + changed.stderr
    assert "] changed  aws-ofi-rccl@1.4.0+17d41cb-rocm-5.7.1" in changed.stdout, changed.stdout
    assert ": build (+" in changed.stdout     # built again, not taken from the build cache
    after = json.loads((dest / ".sitestack" / "install.json").read_text())["inputs"]["build"]["source"]["sha256"]
    assert after != before
    assert exported(dest / "lib" / "librccl-net.so") == ["ncclNetPlugin_v5"]


@pytest.mark.integration
def test_aws_ofi_nccl_for_rocm_6(cli, tmp_path: Path, env, sources: Path):
    rocm = make_rocm(tmp_path / "rocm-6.2.4")         # no RCCL: aws-ofi-nccl has its own NCCL headers
    prefix = tmp_path / "prefix"
    args = ["build-rccl-plugin", "--site", "local", "--rocm", "6.2.4", "--rocm-home", str(rocm), "--prefix", str(prefix),
            "--source", str(sources / UPSTREAM)]
    built = cli(*args, env=env)
    assert built.returncode == 0, built.stdout + built.stderr
    dest = prefix / "aws-ofi-rccl" / "1.18.0-rocm-6.2.4"
    expected = [f"ncclNetPlugin_v{v}" for v in range(2, 12)]
    for library in ("librccl-net-ofi.so", "librccl-net.so"):
        assert exported(dest / "lib" / library) == expected, library
    # libfabric and hwloc are Debian's (pkg-config: /usr), so neither option is given.
    check_golden("6.2.4", ran_configure(dest, {"PREFIX": prefix, "ROCM": rocm}))
    assert_no_system_include(build_log(tmp_path))

    module = prefix / "modules" / "aws-ofi-rccl" / "1.18.0-rocm-6.2.4.lua"
    shown = module_env(prefix / "modules", "aws-ofi-rccl/1.18.0-rocm-6.2.4", "NCCL_NET_PLUGIN",
                       "SITESTACK_NCCL_NET_PLUGIN_APIS")
    # the suffix, which every RCCL opens as librccl-net-ofi.so; never a path, which RCCL < 6.3 cannot take
    assert shown == {"NCCL_NET_PLUGIN": "ofi", "SITESTACK_NCCL_NET_PLUGIN_APIS": NCCL_APIS}
    assert f"net plugin API {NCCL_APIS}" in module.read_text()

    again = cli(*args, "--check", "--fail-on-change", env=env)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "] ok       aws-ofi-rccl@1.18.0-rocm-6.2.4" in again.stdout, again.stdout


@pytest.mark.integration
def test_a_checked_archive_in_a_mirror_builds_offline_and_another_is_refused(cli, tmp_path: Path, env, sources: Path):
    """No --source: the fork's git archive (its sum is one of the recipe's checked ``archives``) is
    taken from --mirror; a tampered copy is refused before anything is built."""
    rocm = make_rccl_header(make_rocm(tmp_path / "rocm-5.7.1"))
    prefix = tmp_path / "prefix"
    mirror = tmp_path / "mirror"
    (mirror / "aws-ofi-rccl").mkdir(parents=True)
    args = ["build-rccl-plugin", "--site", "local", "--rocm", "5.7.1", "--rocm-home", str(rocm), "--prefix", str(prefix),
            "--mirror", str(mirror)]
    bad = mirror / "aws-ofi-rccl" / FORK
    bad.write_bytes((sources / FORK).read_bytes() + b"\0")
    refused = cli(*args, env=env)
    assert refused.returncode == 1 and "none of the checked sums of aws-ofi-rccl 1.4.0+17d41cb" in refused.stdout
    assert not (prefix / "aws-ofi-rccl").exists()
    bad.unlink()
    (mirror / FORK).write_bytes((sources / FORK).read_bytes())
    built = cli(*args, env=env)
    assert built.returncode == 0, built.stdout + built.stderr
    assert exported(prefix / "aws-ofi-rccl" / "1.4.0+17d41cb-rocm-5.7.1" / "lib" / "librccl-net.so") == ["ncclNetPlugin_v5"]


def test_without_site_the_local_site_is_used_only_when_it_has_rocm(cli, tmp_path: Path, env):
    out = cli("build-rccl-plugin", "--rocm", "5.7.1", "--prefix", str(tmp_path / "p"), "--check", env=env)
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.startswith("error: --site: not given, and the local site (this machine, ")
    assert "has no ROCm (facts.rocm)" in out.stderr and not (tmp_path / "p").exists()
    rocm = make_rocm(tmp_path / "rocm-6.2.4")
    out = cli("build-rccl-plugin", "--rocm", "6.2.4", "--rocm-home", str(rocm), "--prefix", str(tmp_path / "p"),
              "--check", env=env)
    assert out.stdout.startswith("build-rccl-plugin: site local (this machine, "), out.stdout + out.stderr


def cuda_toolkit() -> tuple[str, Path]:
    """The CUDA toolkit of this machine: its release (``nvcc --version``) and home (the tree whose bin/ holds
    the real nvcc: $CUDA_HOME, /usr/local/cuda-<release> or /usr/local/cuda). Missing is an error, not a skip:
    the test machines have CUDA 13 (nvcc on PATH)."""
    out = subprocess.run(["nvcc", "--version"], capture_output=True, text=True, check=True)
    release = out.stdout.split("release ", 1)[1].split(",", 1)[0]
    for home in (os.environ.get("CUDA_HOME"), f"/usr/local/cuda-{release}", "/usr/local/cuda"):
        if home and (Path(home) / "bin" / "nvcc").is_file() and (Path(home) / "include" / "cuda.h").is_file():
            return release, Path(home)
    raise FileNotFoundError(f"nvcc {release} is on PATH, but no CUDA home with bin/nvcc and include/cuda.h was found")


@pytest.mark.integration
def test_aws_ofi_nccl_for_cuda(cli, tmp_path: Path, env, sources: Path):
    """aws-ofi-nccl 1.18.0 built --with-cuda against this machine's CUDA toolkit, through build-nccl-plugin."""
    release, cuda = cuda_toolkit()
    prefix = tmp_path / "prefix"
    args = ["build-nccl-plugin", "--site", "local", "--cuda", release, "--cuda-home", str(cuda), "--prefix", str(prefix),
            "--source", str(sources / UPSTREAM)]
    built = cli(*args, env=env)
    assert built.returncode == 0, built.stdout + built.stderr
    dest = prefix / "aws-ofi-rccl" / f"1.18.0-cuda-{release}"
    expected = [f"ncclNetPlugin_v{v}" for v in range(2, 12)]   # the recipe's exports for 1.18 (CUDA row)
    # Both libraries are real files (libtool modules), not a symlink: NCCL opens libnccl-net.so by default.
    for library in ("libnccl-net-ofi.so", "libnccl-net.so"):
        assert not (dest / "lib" / library).is_symlink() and exported(dest / "lib" / library) == expected, library
    assert not list((dest / "lib").glob("librccl-net*"))
    line = ran_configure(dest, {"PREFIX": prefix, "CUDA": cuda})
    golden = GOLDEN / "local-cuda.txt"
    if os.environ.get("SITESTACK_UPDATE_GOLDEN"):
        golden.write_text(line.replace(f"-cuda-{release}", "-cuda-$RELEASE"))
    assert line == golden.read_text().replace("$RELEASE", release), "configure line for CUDA changed; review it"
    assert "--with-cuda=" in line and "--with-rocm" not in line and "--with-hip" not in line
    stamp = json.loads((dest / ".sitestack" / "install.json").read_text())
    assert [(c["name"], c["ok"]) for c in stamp["checks"]] == [(f"exports exactly {' '.join(expected)}", True)]
    assert_no_system_include(build_log(tmp_path))

    module = f"aws-ofi-rccl/1.18.0-cuda-{release}"
    shown = module_env(prefix / "modules", module, "NCCL_NET_PLUGIN", "SITESTACK_NCCL_NET", "SITESTACK_NCCL_NET_PLUGIN_APIS",
                       "LD_LIBRARY_PATH")
    assert shown["NCCL_NET_PLUGIN"] == "ofi" and shown["SITESTACK_NCCL_NET"] == "AWS Libfabric"
    assert shown["SITESTACK_NCCL_NET_PLUGIN_APIS"] == NCCL_APIS and shown["LD_LIBRARY_PATH"].startswith(f"{dest}/lib")
    assert f"libfabric network plugin for NCCL (aws-ofi-nccl); net plugin API {NCCL_APIS}" in (
        prefix / "modules" / f"{module}.lua").read_text()
    # the built plugin, under its module's environment, opened by the real NCCL of PyPI (tests/twins/comm_oracle.py)
    for nccl in ("2.17.1", "2.21.5"):
        wired = {k: shown[k] for k in ("NCCL_NET_PLUGIN", "LD_LIBRARY_PATH")}
        log = comm_oracle.real_init(comm_oracle.nccl_library(nccl), wired)
        lines, _ = nccl_log.parse(log)
        assert [r.plugin_state for r in nccl_log.classify(lines)] == ["loaded"], log

    again = cli(*args, "--check", "--fail-on-change", env=env)
    assert again.returncode == 0, again.stdout + again.stderr
    rerun = cli(*args, env=env)
    assert rerun.returncode == 0 and f"] ok       aws-ofi-rccl@1.18.0-cuda-{release}" in rerun.stdout, rerun.stdout


@pytest.mark.integration
@pytest.mark.parametrize("extra, message", [
    (["--version", "1.4.0+17d41cb"], "1.4.0+17d41cb (ROCm/aws-ofi-rccl (cxi branch)) is built for ROCm only"),
    (["--cuda-home", "/usr"], "the CUDA home for CUDA {release} /usr is a system prefix: --with-cuda=/usr"),
    (["--cuda-home", "/nonexistent"], "missing the CUDA runtime for CUDA {release} in /nonexistent: no include/cuda.h"),
    (["--nccl", "2.11.4", "--version", "1.21.1"], "it exports plugin API v6, v7, v8, v9, v10, v11, v12 and NCCL 2.11.4 "
                                                  "loads v4 (NVIDIA/nccl v2.10.3-1, v2.11.4-1 src/init.cc"),
    (["--nccl", "2.x"], "--nccl '2.x' is not a version"),
])
def test_cuda_refusals(cli, tmp_path: Path, env, extra, message):
    release, cuda = cuda_toolkit()
    home = [] if "--cuda-home" in extra else ["--cuda-home", str(cuda)]
    args = ["build-nccl-plugin", "--site", "local", "--cuda", release, *home, *extra, "--prefix", str(tmp_path / "prefix"),
            "--check"]
    result = cli(*args, env=env)
    assert result.returncode == 1 and "Traceback" not in result.stdout + result.stderr, result.stdout + result.stderr
    assert message.format(release=release) in result.stdout + result.stderr, result.stdout + result.stderr


def test_a_plugin_step_without_a_toolkit_says_what_to_add(cli, tmp_path: Path, env):
    out = cli("build-nccl-plugin", "--site", "local", "--prefix", str(tmp_path / "p"), "--check", env=env)
    assert out.returncode == 1 and "has no facts.cuda: add `cuda: {version: ..., home: ...}` under facts:" in out.stderr
    assert "local.yml" in out.stderr and "Traceback" not in out.stderr
