"""The stack environment installed by uv where the host has it, by pip otherwise
(facts.python.installer): the same packages either way, pip's index settings given to uv, the
manifest's origins from the installed metadata, and a clear refusal when uv is required but missing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sitestack.installs import venv_manifest, venv_stack
from sitestack.installs.venv_env import PIP_SETTINGS
from sitestack.installs.venv_uv import PipSettings, uv_index_args, uv_install_argv
from tests.conftest import playbook_copy, run_invoke, uv_dir

integration = pytest.mark.integration


def path_without_uv() -> str:
    return os.pathsep.join(d for d in os.environ["PATH"].split(os.pathsep) if not os.path.exists(os.path.join(d, "uv")))


# -- pip's settings, read the way pip reads them ------------------------------------------------------
def pip_settings(tmp_path: Path, env: dict[str, str]) -> dict[str, object]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    out = subprocess.run([sys.executable, "-c", PIP_SETTINGS], env={**clean, "HOME": str(tmp_path / "home"), **env},
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_pip_settings_follow_pips_order(tmp_path: Path):
    xdg = tmp_path / "xdg" / "pip"
    xdg.mkdir(parents=True)
    (xdg / "pip.conf").write_text("[global]\nindex-url = https://global.example/simple\nfind-links = /g\n")
    user = tmp_path / "home" / ".config" / "pip"
    user.mkdir(parents=True)
    user_conf = ("[global]\nextra-index-url = https://a.example/simple\n  https://b.example/simple\n"
                 "[install]\nfind-links = /u1 /u2\n")
    (user / "pip.conf").write_text(user_conf)
    base = {"XDG_CONFIG_DIRS": str(tmp_path / "xdg"), "XDG_CONFIG_HOME": str(tmp_path / "home" / ".config")}
    got = pip_settings(tmp_path, base)
    assert got == {"index_url": "https://global.example/simple",
                   "extra_index_urls": ["https://a.example/simple", "https://b.example/simple"],
                   "find_links": ["/u1", "/u2"], "no_index": False, "trusted_hosts": []}  # [install] over [global]
    # PIP_* variables win over every file; PIP_CONFIG_FILE replaces the user's files
    env_file = tmp_path / "env.conf"
    env_file.write_text("[global]\ntrusted-host = mirror.example\n")
    got = pip_settings(tmp_path, {**base, "PIP_CONFIG_FILE": str(env_file), "PIP_INDEX_URL": "https://env.example/simple",
                                  "PIP_NO_INDEX": "yes"})
    assert got == {"index_url": "https://env.example/simple", "extra_index_urls": [], "find_links": ["/g"],
                   "no_index": True, "trusted_hosts": ["mirror.example"]}
    assert pip_settings(tmp_path, {**base, "PIP_CONFIG_FILE": os.devnull})["index_url"] is None  # pip: no files


def test_uv_gets_pips_indexes_and_pips_resolution():
    settings = PipSettings(index_url="https://mirror.example/simple", extra_index_urls=("file:///opt/pypi",),
                           find_links=("/opt/wheels",), trusted_hosts=("mirror.example",))
    # the stack's torch index comes after the configured ones, as pip adds a command line's extra index
    assert uv_index_args(settings, ["--extra-index-url", "https://torch.example/cpu"]) == [
        "--index-url", "https://mirror.example/simple", "--extra-index-url", "file:///opt/pypi",
        "--extra-index-url", "https://torch.example/cpu", "--find-links", "/opt/wheels",
        "--allow-insecure-host", "mirror.example"]
    # facts.torch.index: only -> the stack's index replaces the configured one for the torch line
    assert uv_index_args(PipSettings(index_url="https://mirror.example/simple"),
                         ["--index-url", "https://torch.example/cpu"]) == ["--index-url", "https://torch.example/cpu"]
    argv = uv_install_argv("/usr/bin/uv", "/p/env", PipSettings(no_index=True), [], ["--force-reinstall", "--no-deps"],
                           compile=True)
    assert argv[:4] == ["/usr/bin/uv", "pip", "install", "--python"] and argv[4] == "/p/env/bin/python"
    assert argv[argv.index("--index-strategy"):][:2] == ["--index-strategy", "unsafe-best-match"]
    assert argv[argv.index("--link-mode"):][:2] == ["--link-mode", "hardlink"]  # as uv links every venv
    shared = uv_install_argv("uv", "/p", PipSettings(), [], [], compile=False, shared=True)
    assert shared[shared.index("--link-mode"):][:2] == ["--link-mode", "copy"]  # modes and group of its own
    assert {"--no-index", "--reinstall", "--no-deps", "--compile-bytecode"} <= set(argv)
    with pytest.raises(ValueError):
        uv_install_argv("uv", "/p", PipSettings(), [], ["--upgrade"], compile=False)
    with pytest.raises(Exception, match="cannot read pip's index settings"):
        PipSettings.parse("Traceback (most recent call last)", "h1")


def test_origins_come_from_installed_metadata():
    stack = venv_stack.Stack(site="local", name="pytorch/2.13.0-cpu", path="/p/pytorch/2.13.0-cpu", source="system",
                             python_version="3.11", requirements=("torch==2.13.0+cpu",), extras=(), checks=("numpy",),
                             index_url="https://torch.example/cpu", system_site_packages=False, compile=True)
    built = [venv_stack.Built(recipe="mpi4py", version="4.1.2", dest="/p/mpi4py/4.1.2", description="", homepage="",
                              settings=None, values={}, installed=True,
                              wheel="/p/mpi4py/4.1.2/wheels/mpi4py-4.1.2-cp311-cp311-linux_x86_64.whl", wheel_sha256="ab")]
    scan = {"python": "3.11.7", "base": [], "packages": [
        {"name": "torch", "version": "2.13.0+cpu", "dist_info": "torch-2.13.0+cpu.dist-info", "record_sha256": "1",
         "installer": "uv", "direct_url": None},
        {"name": "filelock", "version": "3", "dist_info": "filelock-3.dist-info", "record_sha256": "2",
         "installer": "uv", "direct_url": None},   # a dependency (uv would mark it REQUESTED too)
        {"name": "mpi4py", "version": "4.1.2", "dist_info": "mpi4py-4.1.2.dist-info", "record_sha256": "3",
         "installer": "uv",
         "direct_url": {"url": "file:///p/mpi4py/4.1.2/wheels/mpi4py-4.1.2-cp311-cp311-linux_x86_64.whl", "sha256": None}},
        {"name": "six", "version": "1", "dist_info": "six-1.dist-info", "record_sha256": "4", "installer": "pip",
         "direct_url": {"url": "https://x.example/six-1-py3-none-any.whl", "sha256": "cd"}},
        {"name": "pip", "version": "24", "dist_info": "pip-24.dist-info", "record_sha256": "5", "installer": "conda",
         "direct_url": None},
    ]}
    plan = venv_manifest.plan_for(stack, _facts(), built)
    m = venv_manifest.manifest_for(stack, plan, scan, {}, None, "gen", built)
    src = {p["name"]: p["source"] for p in m["packages"]}
    assert src["torch"] == {"kind": "index", "index_url": "https://torch.example/cpu", "requested": True, "installer": "uv"}
    assert src["filelock"]["requested"] is False
    assert src["mpi4py"]["kind"] == "built" and src["mpi4py"]["sha256"] == "ab" and src["mpi4py"]["install"] == "/p/mpi4py/4.1.2"
    assert src["six"] == {"kind": "url", "url": "https://x.example/six-1-py3-none-any.whl", "sha256": "cd",
                          "requested": False, "installer": "pip"}
    assert src["pip"]["kind"] == "environment" and src["pip"]["installer"] == "conda"
    assert all(set(p) == {"name", "version", "dist_info", "record_sha256", "source"} for p in m["packages"])
    # pip's report (the index URL and the file's sha256) wins; an unchanged distribution keeps its old origin
    report = {"filelock": {"kind": "index", "url": "https://i.example/filelock-3.whl", "sha256": "ef", "requested": False}}
    again = venv_manifest.manifest_for(stack, plan, scan, report, {"packages": [
        {**scan["packages"][0], "source": {"kind": "index", "url": "https://torch.example/cpu/torch.whl"}}]}, "gen", built)
    src = {p["name"]: p["source"] for p in again["packages"]}
    assert src["filelock"]["url"] == "https://i.example/filelock-3.whl" and src["filelock"]["installer"] == "uv"
    assert src["torch"]["url"] == "https://torch.example/cpu/torch.whl"


def _facts():
    from sitestack.engine import playbook as pb
    return pb.load("local").facts


# -- for real: the same stack from pip and from uv --------------------------------------------------------
def install(tmp_path: Path, name: str, facts: dict, path: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    prefix = tmp_path / name
    playbook = playbook_copy(tmp_path / f"pb-{name}", facts=facts)
    # built from scratch: no venv template, whichever installer (the template is keyed by the plan alone)
    env = {"SITESTACK_LOG_DIR": str(tmp_path / "logs"), "SITESTACK_VENV_TEMPLATE": "off", "PATH": path}
    build = run_invoke("build-mpi4py", "--playbook", str(playbook), "--prefix", str(prefix), env=env)
    assert build.returncode == 0, build.stdout + build.stderr
    return run_invoke("install-venv", "--playbook", str(playbook), "--prefix", str(prefix), env=env), prefix


@integration
def test_uv_and_pip_make_the_same_stack(local_stack, tmp_path: Path):
    """local_stack first: mpi4py is then in the build cache, and the installs below take it from there."""
    with_uv = f"{uv_dir(tmp_path)}{os.pathsep}{os.environ['PATH']}"
    by_uv, uv_prefix = install(tmp_path, "uv", {"python": {"installer": "uv"}}, with_uv)
    assert by_uv.returncode == 0, by_uv.stdout + by_uv.stderr
    assert "uv pip install" in by_uv.stdout
    by_pip, pip_prefix = install(tmp_path, "pip", {}, path_without_uv())  # auto, no uv on the PATH: pip
    assert by_pip.returncode == 0, by_pip.stdout + by_pip.stderr
    assert "pip install" in by_pip.stdout and "uv pip install" not in by_pip.stdout

    def manifest(prefix: Path) -> dict:
        return json.loads((prefix / "pytorch" / "2.13.0-cpu.manifest.json").read_text())

    mu, mp = manifest(uv_prefix), manifest(pip_prefix)
    assert {(p["name"].lower(), p["version"]) for p in mu["packages"]} == \
        {(p["name"].lower(), p["version"]) for p in mp["packages"]}
    assert {p["source"]["installer"] for p in mu["packages"]} == {"uv"}
    assert {p["source"]["installer"] for p in mp["packages"]} == {"pip"}
    for m in (mu, mp):
        src = {venv_stack.normalize(p["name"]): p["source"] for p in m["packages"]}
        assert src["torch"]["kind"] == "index" and src["torch"]["requested"]
        assert src["numpy"]["requested"] and not src["filelock"]["requested"]
        assert src["mpi4py"]["kind"] == "built"
    assert Path(mp_torch_url := {venv_stack.normalize(p["name"]): p["source"] for p in mp["packages"]}["torch"]["url"]
                .replace("file://", "").replace("%2B", "+")).is_file(), mp_torch_url  # pip's report adds the file
    out = subprocess.run([str(uv_prefix / "pytorch" / "2.13.0-cpu" / "bin" / "python"), "-c",
                          "import torch, numpy, mpi4py.MPI; print(torch.__version__)"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "2.13.0+cpu", out.stderr
    # a no-op re-run with uv: nothing changes
    again = run_invoke("install-venv", "--playbook", str(tmp_path / "pb-uv" / "local.yml"), "--prefix", str(uv_prefix),
                       env={"SITESTACK_LOG_DIR": str(tmp_path / "logs"), "PATH": with_uv})
    assert again.returncode == 0 and "ok       stack-venv" in again.stdout, again.stdout


@integration
@pytest.mark.parametrize(("system_site_packages", "found", "why"), [
    ("false", False, "uv is not on the PATH"),
    # uv ignores the base's packages (astral-sh/uv#4466): it would install a second torch
    ("true", True, "which uv ignores and would install again"),
])
def test_installer_uv_is_refused_before_anything_is_made(tmp_path: Path, system_site_packages: str, found: bool,
                                                         why: str):
    playbook = playbook_copy(tmp_path, facts={"python": {"installer": "uv"}},
                             step_args={"stack-venv": {"system_site_packages": system_site_packages}})
    prefix = tmp_path / "prefix"
    path = f"{uv_dir(tmp_path)}{os.pathsep}{os.environ['PATH']}" if found else path_without_uv()
    out = run_invoke("install-venv", "--playbook", str(playbook), "--prefix", str(prefix),
                     env={"SITESTACK_LOG_DIR": str(tmp_path / "logs"), "PATH": path})
    assert out.returncode == 1, out.stdout + out.stderr
    assert "facts.python.installer is uv, but" in out.stdout + out.stderr and why in out.stdout + out.stderr
    assert "Traceback" not in out.stdout + out.stderr
    assert not (prefix / "pytorch").exists()


def test_an_unknown_installer_is_refused_at_load(tmp_path: Path):
    playbook = playbook_copy(tmp_path, facts={"python": {"installer": "conda"}})
    out = run_invoke("provision", "--playbook", str(playbook), "--prefix", str(tmp_path / "p"), "--check")
    assert out.returncode == 1 and "installer" in out.stdout + out.stderr and "Traceback" not in out.stderr
