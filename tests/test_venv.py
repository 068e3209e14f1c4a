"""The stack environment: `invoke install-venv` for real on the local site (one stack per session),
its manifest, no-op re-runs, in-place updates, bad input; and the commands made for the other sites."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from sitestack.actions import stack_venv as venv
from sitestack.core.host import site_environ
from sitestack.engine import playbook as pb
from sitestack.installs import venv_manifest, venv_stack
from tests.conftest import playbook_copy, run_invoke, tree
from tests.contexts import offline_context

integration = pytest.mark.integration


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def snapshot(path: Path) -> dict[str, tuple[int, int]]:
    """(inode, mtime_ns) of every path below ``path`` (symlinks not followed), except the lock file
    every applying run takes (``.sitestack/provision.lock``)."""
    out = {}
    for p in [path, *path.rglob("*")]:
        if p.name == "provision.lock":
            continue
        st = p.lstat()
        out[str(p.relative_to(path))] = (st.st_ino, st.st_mtime_ns)
    return out


# -- the local stack, for real -------------------------------------------------------------------------
@integration
def test_stack_is_made_from_the_build_and_torch_works(local_stack):
    v = local_stack.venv
    assert v.is_symlink() and v.resolve().name.startswith(".2.13.0-cpu.gen-")  # a generation behind a symlink
    assert "changed  stack-venv" in local_stack.venv_output
    out = subprocess.run(
        [str(v / "bin" / "python"), "-c", "import torch, mpi4py, mpi4py.MPI as M; print(torch.__version__, "
         "mpi4py.__file__, M.Get_library_version().split()[0])"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    version, where, mpi = out.stdout.split()
    # imported from the generation the stable path pointed at when it started, not through the link
    assert version == "2.13.0+cpu" and where.startswith(str(v.resolve()) + "/") and mpi == "MPICH"
    print(f"\nstack made in {local_stack.seconds['install-venv']:.1f}s (mpi4py step "
          f"{local_stack.seconds['build-mpi4py']:.1f}s)")


@integration
def test_manifest_lists_exactly_what_is_installed(local_stack):
    manifest = json.loads(local_stack.manifest.read_text())
    site_packages = local_stack.venv / "lib" / "python3.11" / "site-packages"
    dists = {p.name for p in site_packages.iterdir() if p.name.endswith((".dist-info", ".egg-info"))}
    assert {p["dist_info"] for p in manifest["packages"]} == dists
    by_name = {venv_stack.normalize(p["name"]): p for p in manifest["packages"]}
    for p in manifest["packages"]:
        record = site_packages / p["dist_info"] / "RECORD"
        assert p["record_sha256"] == sha256(record), p["name"]
        assert p["version"] and p["source"]["kind"] in ("index", "built", "environment")
    torch = by_name["torch"]
    assert torch["version"] == "2.13.0+cpu" and torch["source"]["requested"]
    # Each distribution's installer is the one that wrote its files (its INSTALLER file): pip, or uv
    # where present; a generation filled from a template keeps the template's, and a later in-place
    # update may use the other, so one manifest can hold both.
    for p in manifest["packages"]:
        installer_file = site_packages / p["dist_info"] / "INSTALLER"
        if installer_file.is_file():
            assert p["source"]["installer"] == installer_file.read_text().strip(), p["name"]
    # pip's report names the file and its hash; uv leaves only the installed metadata (tests/test_venv_uv.py)
    if torch["source"]["installer"] == "pip":
        wheel = Path(torch["source"]["url"].replace("file://", "").replace("%2B", "+"))
        assert wheel.is_file() and torch["source"]["sha256"] == sha256(wheel)  # the wheel pip installed, by hash
    else:
        assert torch["source"] == {"kind": "index", "index_url": None, "requested": True, "installer": "uv"}
    assert not by_name["filelock"]["source"]["requested"]  # a dependency of torch
    mpi4py = by_name["mpi4py"]
    stamp = json.loads((local_stack.prefix / "mpi4py" / "4.1.2" / ".sitestack" / "install.json").read_text())
    assert mpi4py["source"]["kind"] == "built" and mpi4py["source"]["sha256"] == stamp["artefact"]["sha256"]
    assert mpi4py["source"]["install"] == str(local_stack.prefix / "mpi4py" / "4.1.2")
    assert manifest["plan"]["requirements"] == ["torch==2.13.0+cpu"]
    # What the validation job imports is in the stack users get (a fresh stack once lacked numpy).
    assert manifest["plan"]["checks"] == ["numpy"] and by_name["numpy"]["source"]["requested"]
    assert manifest["plan"]["built"]["mpi4py"]["sha256"] == stamp["artefact"]["sha256"]
    assert manifest["python"].startswith("3.11.") and manifest["name"] == "pytorch/2.13.0-cpu"


@integration
def test_rerun_with_nothing_changed_is_a_fast_noop(local_stack):
    # A generation the session's earlier runs retired may have become collectable since (the local site keeps
    # one 10 minutes, facts.scheduler.max_job_time): a first run collects it, and nothing else.
    settle = run_invoke("install-venv", "--site", "local", "--prefix", str(local_stack.prefix), env=local_stack.env)
    changed = [line for line in settle.stdout.splitlines() if "] changed" in line]
    assert settle.returncode == 0 and all("retired generation" in line for line in changed), settle.stdout
    before = snapshot(local_stack.prefix)
    start = time.monotonic()
    again = run_invoke("install-venv", "--site", "local", "--prefix", str(local_stack.prefix), env=local_stack.env)
    wall = time.monotonic() - start
    assert again.returncode == 0, again.stdout + again.stderr
    assert "[localhost] ok       stack-venv" in again.stdout and "[localhost] ok       venv-hook" in again.stdout
    step_time = float(again.stdout.strip().splitlines()[-1].split()[-1].rstrip("s"))
    print(f"\nno-op re-run: {wall:.2f}s wall, {step_time:.2f}s in the steps")
    assert step_time < 2.0, again.stdout
    assert snapshot(local_stack.prefix) == before  # nothing written, not even a timestamp
    check = run_invoke("install-venv", "--site", "local", "--prefix", str(local_stack.prefix), "--check",
                       "--fail-on-change", env=local_stack.env)
    assert check.returncode == 0, check.stdout


@integration
def test_a_changed_pin_makes_a_new_generation_and_never_writes_into_the_published_one(local_stack, tmp_path: Path):
    """A changed extra is installed into a copy of the current generation (its files hard-linked), which
    is then switched in; the generation users had loaded keeps every file's inode and mtime."""
    prefix, v = local_stack.prefix, local_stack.venv
    generation = v.parent / os.readlink(v)
    published = snapshot(generation)
    torch_init = Path("lib/python3.11/site-packages/torch/__init__.py")
    original = json.loads(local_stack.manifest.read_text())
    added = playbook_copy(tmp_path, facts={"torch": {"extras": ["six"]}})
    plan = run_invoke("install-venv", "--playbook", str(added), "--prefix", str(prefix), "--check", "--diff",
                      env=local_stack.env)
    assert plan.returncode == 0 and "would change: extras: +six" in plan.stdout and '+    "six"' in plan.stdout
    run = run_invoke("install-venv", "--playbook", str(added), "--prefix", str(prefix), env=local_stack.env)
    try:
        assert run.returncode == 0, run.stdout + run.stderr
        assert "changed  stack-venv: extras: +six" in run.stdout
        # the pip install under a provision-like task reports its progress, console and provision.log alike
        # facts.python.installer auto: uv where on the site's PATH (sitestack's own venv is not the site's)
        tool = "uv pip" if shutil.which("uv", path=site_environ()["PATH"]) else "pip"
        assert f"[localhost] pytorch/2.13.0-cpu: {tool} install (+0s): six" in run.stdout, run.stdout
        logs = sorted(Path(local_stack.env["SITESTACK_LOG_DIR"]).rglob("provision.log"), key=os.path.getmtime)
        assert f"pytorch/2.13.0-cpu: {tool} install" in logs[-1].read_text()
        new = v.parent / os.readlink(v)
        assert new != generation and generation.is_dir()  # a new generation; the old one retired, not removed
        assert snapshot(generation) == published          # nothing written into the published generation
        # the copy shares torch's files with the generation it was made from (hard links): cheap
        assert (new / torch_init).stat().st_ino == (generation / torch_init).stat().st_ino
        assert not list((generation / "lib/python3.11/site-packages").glob("six-*.dist-info"))
        manifest = json.loads(local_stack.manifest.read_text())
        assert manifest["generation"] == new.name
        six = next(p for p in manifest["packages"] if p["name"] == "six")
        assert six["source"]["kind"] == "index" and six["source"]["requested"]
        assert six["source"]["installer"] == tool.split()[0]
        assert six["source"]["sha256"] if tool == "pip" else "sha256" not in six["source"]  # pip's report has it
        assert {p["name"] for p in manifest["packages"]} == {p["name"] for p in original["packages"]} | {"six"}
        assert run_invoke("install-venv", "--playbook", str(added), "--prefix", str(prefix), "--check",
                          "--fail-on-change", env=local_stack.env).returncode == 0
    finally:
        back = run_invoke("install-venv", "--site", "local", "--prefix", str(prefix), env=local_stack.env)
    assert back.returncode == 0 and "changed  stack-venv: extras: -six" in back.stdout, back.stdout + back.stderr
    assert not list(v.resolve().glob("lib/python3.11/site-packages/six-*.dist-info"))
    restored = json.loads(local_stack.manifest.read_text())
    assert restored["plan"] == original["plan"]
    assert [{k: p[k] for k in ("name", "version")} for p in restored["packages"]] == \
        [{k: p[k] for k in ("name", "version")} for p in original["packages"]]


@integration
def test_content_that_differs_from_the_manifest_is_drift(local_stack):
    sp = local_stack.venv / "lib" / "python3.11" / "site-packages"
    stray = sp / "stray-1.0.dist-info"
    stray.mkdir()
    try:
        check = run_invoke("install-venv", "--site", "local", "--prefix", str(local_stack.prefix), "--check",
                           "--fail-on-change", env=local_stack.env)
        assert check.returncode == 2, check.stdout
        assert "content differs from the manifest: +stray-1.0.dist-info" in check.stdout
    finally:
        stray.rmdir()


@integration
def test_horovod_from_its_build_is_in_the_stack(local_stack):
    if local_stack.horovod:
        pytest.skip(local_stack.horovod)
    out = subprocess.run(
        [str(local_stack.venv / "bin" / "python"), "-c", "import torch, mpi4py, horovod.torch as hvd; print(hvd.__file__)"],
        capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith(f"{local_stack.venv.resolve()}/"), out.stderr
    manifest = json.loads(local_stack.manifest.read_text())
    assert next(p for p in manifest["packages"] if p["name"].lower() == "horovod")["source"]["kind"] == "built"


# -- bad input: one message, exit 1, nothing half-written ------------------------------------------------------
def stack_files(prefix: Path) -> list[str]:
    """What install-venv would have written (the provision lock file is not the stack's)."""
    return [p for p in tree(prefix) if not p.startswith(".sitestack")]


@integration
def test_unreachable_wheel_index_fails_before_anything_is_written(tmp_path: Path):
    book = playbook_copy(tmp_path / "book", facts={"torch": {"index_url": "http://127.0.0.1:9/simple"}})
    prefix = tmp_path / "prefix"
    out = run_invoke("install-venv", "--playbook", str(book), "--prefix", str(prefix),
                     env={"SITESTACK_LOG_DIR": str(tmp_path / "logs")})
    assert out.returncode == 1, out.stdout
    assert "wheel index http://127.0.0.1:9/simple cannot be reached from localhost" in out.stdout
    assert "Traceback" not in out.stdout + out.stderr
    assert stack_files(prefix) == []


@integration
def test_a_failed_install_leaves_no_half_environment(tmp_path: Path):
    book = playbook_copy(tmp_path / "book", facts={"torch": {"extras": [str(tmp_path / "missing-1.0-py3-none-any.whl")]}})
    prefix = tmp_path / "prefix"
    out = run_invoke("install-venv", "--playbook", str(book), "--prefix", str(prefix),
                     env={"SITESTACK_LOG_DIR": str(tmp_path / "logs")})
    assert out.returncode == 1 and "failed   stack-venv" in out.stdout, out.stdout
    assert stack_files(prefix) == []  # the generation it was building is gone


@pytest.mark.parametrize("task", ["install-venv", "install-modulefiles"])
def test_site_without_module_system_is_refused(task: str, tmp_path: Path):
    book = playbook_copy(tmp_path / "book", facts={"modules": {"system": "none", "init": None}})
    prefix = tmp_path / "prefix"
    out = run_invoke(task, "--playbook", str(book), "--prefix", str(prefix))
    assert out.returncode == 1
    assert out.stderr.strip().count("\n") == 0 and "has no module system" in out.stderr, out.stderr
    assert "facts.modules.system" in out.stderr and out.stdout == "" and not prefix.exists()


@integration
def test_a_foreign_directory_at_the_stack_path_is_left_alone(tmp_path: Path):
    prefix = tmp_path / "prefix"
    mine = prefix / "pytorch" / "2.13.0-cpu"
    (mine / "bin").mkdir(parents=True)
    (mine / "notes.txt").write_text("hand-made\n")
    out = run_invoke("install-venv", "--site", "local", "--prefix", str(prefix),
                     env={"SITESTACK_LOG_DIR": str(tmp_path / "logs")})
    assert out.returncode == 1 and "exists and is not a stack sitestack installed" in out.stdout, out.stdout
    assert (mine / "notes.txt").read_text() == "hand-made\n" and sorted(os.listdir(prefix / "pytorch")) == ["2.13.0-cpu"]


# -- the other sites, without their machines -----------------------------------------------------------------------
def site_step(name: str, *, stack: str | None = None):
    """The site's stack-venv step (of the playbook's own stack, or of ``stack`` of its ``stacks:``)."""
    site = pb.load(name).for_stack(stack)
    ctx = offline_context(site, home="/home/alice", user="alice", account="proj123")
    spec = next(s for s in site.steps if s.action == "stack-venv" and s.stack == stack)
    return ctx, venv.StackVenv.from_spec(spec, ctx)


def test_torch_pins_carry_the_wheel_variant():
    expected = {
        "cirrus": ("torch==2.3.1+cu121", "torchaudio==2.3.1+cu121", "torchtext==0.18.0", "torchvision==0.18.1+cu121"),
        "frontier": ("torch==2.2.2+rocm5.7", "torchaudio==2.2.2+rocm5.7", "torchvision==0.17.2+rocm5.7"),
        "local": ("torch==2.13.0+cpu",),
        "lumi": (),   # torch comes with the container
        "dawn": (),
    }
    for name, pins in expected.items():
        ctx, step = site_step(name)
        assert step.stack.requirements == pins, name
        assert venv_stack.torch_requirements(ctx.facts)[0].endswith("+" + ctx.facts.torch.variant)


def test_stack_paths_and_names():
    _, cirrus = site_step("cirrus")
    assert cirrus.stack.path == "/work/proj123/shared/sitestack/pytorch/2.3.1-gpu"  # the name Cirrus' instructions use
    assert cirrus.stack.manifest == cirrus.stack.path + ".manifest.json"
    assert cirrus.stack.system_site_packages  # the module's Miniconda packages stay visible
    _, local = site_step("local")
    assert local.stack.name == "pytorch/2.13.0-cpu" and not local.stack.system_site_packages
    assert local.stack.site_packages.endswith("/pytorch/2.13.0-cpu/lib/python3.11/site-packages")


def test_commands_for_each_kind_of_base_python():
    _, cirrus = site_step("cirrus")
    (create,) = cirrus.base.create("/g")
    assert create[:2] == ["bash", "-c"] and "module load python/3.12.1-gpu" in create[2]
    assert create[-6:] == ["python", "-m", "venv", "--without-pip", "--system-site-packages", "/g"]
    _, frontier = site_step("frontier")
    (create,) = frontier.base.create("/g")
    assert "module load miniforge3/23.11.0-0" in create[2] and "module load rocm/5.7.1" in create[2]
    assert create[-8:] == ["conda", "create", "--yes", "--quiet", "--prefix", "/g", "python=3.10", "pip"]
    assert frontier.base.env_python("/g", ["-m", "pip"])[-3:] == ["/g/bin/python", "-m", "pip"]
    _, lumi = site_step("lumi")
    (create,) = lumi.base.create("/g")
    # the container-image step links the LUMI AI Factory image into the prefix (playbooks/lumi.yml); the
    # venv needs only the prefix bound, and the image's Python is its venv's, /opt/venv
    image = "/projappl/proj123/sitestack/container/lumi-multitorch-full-u24r70f21m50t210-20260415_130625.sif"
    i = create.index("singularity")
    assert create[i:i + 3] == ["singularity", "exec", "--bind"] and create[i + 4] == image
    assert create[i + 3].split(",") == ["/projappl/proj123/sitestack"]
    assert create[i + 5:] == ["/opt/venv/bin/python", "-m", "venv", "--without-pip", "--system-site-packages", "/g"]
    _, easybuild = site_step("lumi", stack="easybuild")
    (create,) = easybuild.base.create("/g")
    i = create.index("singularity")
    assert create[i + 4].endswith("pytorch-v2.7.1-dockerhash-0d479e852886.sif") and "/opt/cray" in create[i + 3].split(",")
    assert create[i + 5:] == ["/opt/miniconda3/envs/pytorch/bin/python", "-m", "venv", "--without-pip",
                              "--system-site-packages", "/g"]
    _, local = site_step("local")
    assert local.base.create("/g") == [["python3", "-m", "venv", "--without-pip", "/g"]]


def test_plan_changes_are_explained():
    old = {"base": {"python": "3.11"}, "requirements": ["torch==2.13.0+cpu"], "extras": ["six"], "built": {}}
    new = {"base": {"python": "3.11"}, "requirements": ["torch==2.13.1+cpu"], "extras": [],
           "built": {"mpi4py": {"version": "4.1.2", "sha256": "x"}}}
    text = venv_manifest.explain(old, new)
    assert text == "requirements: +torch==2.13.1+cpu, -torch==2.13.0+cpu; extras: -six; +mpi4py 4.1.2 (built)"
    assert not venv_manifest.needs_new_generation(old, new)
    assert venv_manifest.needs_new_generation(old, {**new, "base": {"python": "3.12"}})
    assert venv_manifest.requirement_name("Torch_Vision[extra]==0.1") == "torch-vision"


def test_origins_come_from_the_pip_report():
    report = {"install": [
        {"metadata": {"name": "Torch", "version": "2.13.0+cpu"}, "requested": True,
         "download_info": {"url": "file:///opt/wheels/torch-2.13.0%2Bcpu-cp311-cp311-linux_x86_64.whl",
                           "archive_info": {"hashes": {"sha256": "ab"}}}},
        {"metadata": {"name": "mpi4py", "version": "4.1.2"}, "requested": True,
         "download_info": {"url": "file:///p/mpi4py/4.1.2/.sitestack/wheels/mpi4py-4.1.2-cp311-cp311-linux_x86_64.whl",
                           "archive_info": {"hash": "sha256=cd"}}}]}
    built = [venv_stack.Built(recipe="mpi4py", version="4.1.2", dest="/p/mpi4py/4.1.2", description="", homepage="",
                        settings=None, values={}, installed=True,
                        wheel="/p/mpi4py/4.1.2/.sitestack/wheels/mpi4py-4.1.2-cp311-cp311-linux_x86_64.whl",
                        wheel_sha256="cd")]
    origins = venv_manifest.origins_from_report(json.dumps(report), built)
    assert origins["torch"] == {"kind": "index", "url": report["install"][0]["download_info"]["url"], "sha256": "ab",
                                "requested": True}
    assert origins["mpi4py"]["kind"] == "built" and origins["mpi4py"]["sha256"] == "cd"


# -- the conda and container variants, for real, with stand-ins for conda and singularity ---------------------------
def stand_in(tmp: Path, module: str, command: str, script: str) -> Path:
    """A site module ``module`` (Lua) that puts a stand-in ``command`` on PATH; returns the module root."""
    bindir = tmp / "stand-ins" / module.replace("/", "-")
    bindir.mkdir(parents=True)
    (bindir / command).write_text("#!/bin/bash\n" + script)
    (bindir / command).chmod(0o755)
    root = tmp / "site-modules"
    (root / module).parent.mkdir(parents=True, exist_ok=True)
    (root / f"{module}.lua").write_text(f'prepend_path("PATH", "{bindir}")\n')
    return root


@integration
def test_a_conda_stack_is_made_with_the_site_conda_module(tmp_path: Path):
    """Frontier's variant: `conda create --prefix` with the site's conda module loaded, then pip from the env."""
    root = stand_in(tmp_path, "miniforge3/23.11.0-0", "conda", r"""
# conda create --yes --quiet --prefix P python=X pip: a Python env with pip at P
[ "$1" = create ] || { echo "unexpected: conda $*" >&2; exit 2; }
echo "$@" > "$(dirname "$0")/argv"
while [ $# -gt 0 ]; do case "$1" in --prefix) p=$2; shift ;; esac; shift; done
exec python3 -m venv "$p"
""")
    book = playbook_copy(tmp_path / "book", facts={
        "modules": {"use": [str(root)], "load": ["miniforge3/23.11.0-0"]},
        "python": {"source": "conda", "module": "miniforge3/23.11.0-0", "version": "3.11", "executable": "python3"}})
    prefix = tmp_path / "prefix"
    env = {"SITESTACK_LOG_DIR": str(tmp_path / "logs")}
    out = run_invoke("install-venv", "--playbook", str(book), "--prefix", str(prefix), env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    argv = (tmp_path / "stand-ins" / "miniforge3-23.11.0-0" / "argv").read_text().split()
    assert argv == ["create", "--yes", "--quiet", "--prefix", argv[4], "python=3.11", "pip"]
    assert Path(argv[4]).name.startswith(".2.13.0-cpu.gen-")
    manifest = json.loads((prefix / "pytorch" / "2.13.0-cpu.manifest.json").read_text())
    kinds = {p["name"]: p["source"]["kind"] for p in manifest["packages"]}
    assert kinds["torch"] == "index" and kinds["pip"] == "environment"  # conda's own pip: made with the env
    assert manifest["plan"]["base"]["module"] == "miniforge3/23.11.0-0"
    modules = run_invoke("install-modulefiles", "--playbook", str(book), "--prefix", str(prefix), env=env)
    assert modules.returncode == 0, modules.stdout
    text = (prefix / "modules" / "pytorch" / "2.13.0-cpu.lua").read_text()
    assert 'depends_on("miniforge3/23.11.0-0")' in text  # the base Python's module by default


@integration
def test_a_container_stack_is_made_inside_the_image(tmp_path: Path):
    """LUMI's and Dawn's variant: the venv is made and filled by the image's Python (here a stand-in
    `singularity exec` that runs the command on the host), on top of the image's packages."""
    root = stand_in(tmp_path, "singularity/4.1", "singularity", r"""
# singularity exec --bind B IMAGE COMMAND...
echo "$1 $2 $3 $4" >> "$(dirname "$0")/calls"
[ "$1" = exec ] && [ "$2" = --bind ] || exit 2
shift 4
exec "$@"
""")
    prefix = tmp_path / "prefix"
    image = tmp_path / "pytorch.sif"  # the stack-venv step checks that the image it runs in exists
    image.write_text("stand-in image\n")
    env = {"SITESTACK_LOG_DIR": str(tmp_path / "logs")}
    book = playbook_copy(tmp_path / "book", facts={
        "modules": {"use": [str(root)], "load": ["singularity/4.1"]},
        "python": {"source": "container", "version": "3.11", "executable": "python3"},
        "container": {"runtime": "singularity", "image": str(image), "bind": ["/scratch"]},
        "torch": {"extras": ["toml", "six"]}},
        without=("horovod",))  # Horovod is not built on the host for a stack inside its image
    out = run_invoke("install-venv", "--playbook", str(book), "--prefix", str(prefix), env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    calls = (tmp_path / "stand-ins" / "singularity-4.1" / "calls").read_text().splitlines()
    assert calls and all(c == f"exec --bind {prefix},/scratch {image}" for c in calls)
    manifest = json.loads((prefix / "pytorch" / "2.13.0-cpu.manifest.json").read_text())
    # torch (and six, which the stand-in image has) are the image's: only toml is the venv's
    assert [p["name"] for p in manifest["packages"]] == ["toml"]
    assert manifest["plan"]["requirements"] == [] and manifest["plan"]["base"]["image"] == str(image)
    cfg = (prefix / "pytorch" / "2.13.0-cpu" / "pyvenv.cfg").read_text()
    assert "include-system-site-packages = true" in cfg
    modules = run_invoke("install-modulefiles", "--playbook", str(book), "--prefix", str(prefix), env=env)
    assert modules.returncode == 0, modules.stdout
    text = (prefix / "modules" / "pytorch" / "2.13.0-cpu.lua").read_text()
    assert f'pushenv("SIF", "{image}")' in text
    assert f'sitestack_generation("{prefix}/pytorch/2.13.0-cpu", ' in text
    assert 'prepend_path("SINGULARITYENV_PREPEND_PATH", sitestack_root .. "/bin")' in text
    assert f'append_path("SINGULARITY_BINDPATH", "{prefix}", ",")' in text


def test_a_container_stacks_interpreter_is_its_link_to_the_image(tmp_path):
    """A container stack's bin/python links to the image's interpreter, which the host lacks: the link
    counts as present (found on the Dawn twin, where every provision rebuilt the stack and then failed
    with "bin/python missing"); a host stack's dangling link does not."""
    from sitestack.core.host import LocalHost
    from sitestack.installs.venv_env import list_dists
    (tmp_path / "env" / "bin").mkdir(parents=True)
    (tmp_path / "env" / "bin" / "python").symlink_to("/opt/miniconda3/envs/pytorch/bin/python-not-on-this-host")
    (tmp_path / "env" / "lib" / "python3.12" / "site-packages" / "six-1.0.dist-info").mkdir(parents=True)

    def stack(source: str) -> venv_stack.Stack:
        return venv_stack.Stack(site="lumi", name="pytorch/2.7.1-rocm", path=str(tmp_path / "env"), source=source,
                                python_version="3.12", requirements=(), extras=(), checks=(), index_url=None,
                                system_site_packages=True, compile=False)

    host = LocalHost()
    assert list_dists(host, stack("container")) == (True, {"six-1.0.dist-info"})
    assert list_dists(host, stack("venv")) == (False, {"six-1.0.dist-info"})
