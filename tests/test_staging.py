"""NVMe staging for real on the test Slurm cluster: the stack env packed once (stage-archive), broadcast
with sbcast to node-local storage, unpacked, fixed up and used (sitestack-stage-env), and the validation
job's two `import torch` times (shared prefix, node-local) in its report.

The site is the local one with staging switched on (``node.stage_env: true``, local_scratch under the
test's directory), as Frontier has it. Its stack is the session's torch venv, linked where the
stack-venv step would put it (the stable path of a stack is a link to its generation too): building
the stack for real takes minutes and is tested in test_provision_local.py.
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from sitestack.core.paths import PLAYBOOK_DIR
from tests.conftest import LMOD_INIT, run_invoke

pytestmark = pytest.mark.integration


def stage_site(root: Path, venv: Path, python_facts: str = "") -> dict:
    """The local site staging its env into ``root``: the playbook (with ``python_facts`` replacing its
    ``python:`` source line where given), a prefix with the stack linked to ``venv``, pack and helpers."""
    scratch = root / "node-local"
    playbook = root / "playbooks" / "local.yml"
    playbook.parent.mkdir()
    text = (PLAYBOOK_DIR / "local.yml").read_text()
    assert "    local_scratch: /tmp\n" in text and "    source: system\n" in text
    text = text.replace("    local_scratch: /tmp\n", f"    local_scratch: {scratch}\n    stage_env: true\n")
    playbook.write_text(text.replace("    source: system\n", python_facts) if python_facts else text)
    prefix = root / "prefix"
    (prefix / "pytorch").mkdir(parents=True)
    (prefix / "pytorch" / "2.13.0-cpu").symlink_to(venv)
    first = run_invoke("provision", "--playbook", str(playbook), "--prefix", str(prefix), "--tags", "pack,launch",
                       timeout=900)
    assert first.returncode == 0, first.stdout + first.stderr
    return {"playbook": playbook, "prefix": prefix, "scratch": scratch, "venv": venv, "first": first.stdout}


@pytest.fixture(scope="module")
def staged(tmp_path_factory, validation_python) -> dict:
    """The staging local site: playbook, prefix with the stack linked in, pack and helpers installed."""
    python, env = validation_python
    site = stage_site(tmp_path_factory.mktemp("staging"), Path(python).parent.parent)
    return {**site, "python": python, "env": env}


def sbatch(cluster, script: Path, out: Path, env: dict[str, str] | None = None) -> tuple[int, str]:
    result = cluster.sbatch_wait("--parsable", "--ntasks=2", f"--output={out}", str(script), timeout=600, env=env)
    log = out.read_text() if out.exists() else ""
    job = int(result.stdout.strip().split(";")[0]) if result.stdout.strip() else -1
    return result.returncode, f"job {job}\n{log}{result.stderr}" if result.returncode else log


def job_values(log: str) -> dict[str, list[str]]:
    """The ``key=value`` lines a job printed: key -> its values, in the order printed."""
    values: dict[str, list[str]] = {}
    for line in log.splitlines():
        if "=" in line:
            key, value = line.split("=", 1)
            values.setdefault(key, []).append(value)
    return values


def passed_job(slurm_cluster, script: Path, out: Path) -> tuple[dict[str, list[str]], str]:
    """``script`` run with sbatch, which must succeed: its ``key=value`` lines (:func:`job_values`) and its log."""
    rc, log = sbatch(slurm_cluster, script, out)
    assert rc == 0, log + slurm_cluster.logs()
    return job_values(log), log


def test_pack_is_made_once(staged):
    pack = staged["prefix"] / "packs" / "pytorch-2.13.0-cpu.tar.gz"
    assert "changed  stage-archive" in staged["first"], staged["first"]
    with tarfile.open(pack) as tar:
        names = set(tar.getnames())
    assert {".sitestack-unpack.py", ".sitestack-pack.json", "./bin/python", "./pyvenv.cfg"} <= names
    stamp = json.loads((pack.parent / (pack.name + ".json")).read_text())
    assert stamp["kind"] == "venv" and stamp["source"] == str(staged["venv"])
    again = run_invoke("provision", "--playbook", str(staged["playbook"]), "--prefix", str(staged["prefix"]),
                       "--tags", "pack,launch")
    assert again.returncode == 0 and "changed" not in again.stdout.split("RECAP")[0], again.stdout
    # A new stack (its manifest changes) needs a new pack; check mode says so and changes nothing.
    manifest = staged["prefix"] / "pytorch" / "2.13.0-cpu.manifest.json"
    manifest.write_text('{"changed": true}\n')
    try:
        planned = run_invoke("provision", "--playbook", str(staged["playbook"]), "--prefix", str(staged["prefix"]),
                             "--tags", "pack", "--check", "--fail-on-change")
        assert planned.returncode == 2 and "the stack changed since it was packed" in planned.stdout, planned.stdout
    finally:
        manifest.unlink()


def test_sbcast_unpack_fixup_and_use(staged, slurm_cluster, tmp_path: Path):
    bindir = staged["prefix"] / "bin"
    script = tmp_path / "job.sh"
    script.write_text(f"""#!/bin/bash
. {bindir}/sitestack-launch-env
. {bindir}/sitestack-stage-env || exit 1
srun --ntasks=2 sh -c 'echo "python=$(command -v python)"; python -c "import sys, torch; print(\\"torch=\\" + torch.__file__)"; echo "pip=$(head -n 1 "$SITESTACK_STAGED_ENV/bin/pip")"'
sitestack_unstage
echo "left=$(ls -A {staged['scratch']})"
""")
    values, log = passed_job(slurm_cluster, script, tmp_path / "out")
    # no stack module loaded: the playbook's own stack, which the helper's last line names
    own = "the stack env of pytorch/2.13.0-cpu (no stack module is loaded: the playbook's own stack) runs from"
    assert any(line.startswith(f"sitestack-stage-env: {own}") for line in log.splitlines()), log
    dest = f"{staged['scratch']}/sitestack-env-"
    pythons = values.get("python", [])
    assert len(pythons) == 2 and all(p.startswith(dest) and p.endswith("/bin/python") for p in pythons), log
    root = pythons[0].rsplit("/bin/python", 1)[0]
    assert values.get("torch", []) == [f"{root}/lib/python3.11/site-packages/torch/__init__.py"] * 2, log
    assert values.get("pip", []) == [f"#!{root}/bin/python3.11"] * 2, log  # shebang fixed up
    assert values.get("left", []) == [""], log  # sitestack_unstage removed the copy


def test_the_staged_copy_wins_over_the_stack_module(staged, slurm_cluster, tmp_path: Path):
    """With the stack's module loaded by real Lmod, as users load it, the packages imported after staging are
    the node-local copy's: through PATH after sitestack-stage-env, and with the copy's own interpreter, as
    OLCF's sbcast guide runs it (https://docs.olcf.ornl.gov/software/python/sbcast_conda.html). The module
    puts no site-packages of the shared prefix on PYTHONPATH, which would win over the copy's own."""
    if not Path(LMOD_INIT, "bash").exists():  # pragma: no cover - the test script installs lmod
        pytest.skip("Lmod is not installed (Debian package lmod)")
    manifest = staged["prefix"] / "pytorch" / "2.13.0-cpu.manifest.json"  # the stack is the session's venv, linked
    manifest.write_text("{}\n")
    try:
        modules = run_invoke("provision", "--playbook", str(staged["playbook"]), "--prefix", str(staged["prefix"]),
                             "--tags", "modules")
    finally:
        manifest.unlink()
    assert modules.returncode == 0, modules.stdout + modules.stderr
    bindir = staged["prefix"] / "bin"
    script = tmp_path / "job.sh"
    where = "import torch, pip; print(\\\"torch=\\\" + torch.__file__); print(\\\"pip=\\\" + pip.__file__)"
    script.write_text(f"""#!/bin/bash
. {LMOD_INIT}/bash
module use {staged['prefix']}/modules
module load pytorch/2.13.0-cpu || exit 4
echo "pythonpath=${{PYTHONPATH:-}}"
. {bindir}/sitestack-stage-env || exit 1
echo "staged=$SITESTACK_STAGED_ENV"
srun --ntasks=1 sh -c 'python -c "{where}"'
srun --ntasks=1 sh -c '"$SITESTACK_STAGED_ENV/bin/python" -c "{where}"'
sitestack_unstage
""")
    values, log = passed_job(slurm_cluster, script, tmp_path / "out")
    staged_root = values.get("staged", [])[0]
    site = f"{staged_root}/lib/python3.11/site-packages"
    assert values.get("torch", []) == [f"{site}/torch/__init__.py"] * 2, log
    assert values.get("pip", []) == [f"{site}/pip/__init__.py"] * 2, log
    assert str(staged["venv"]) not in values.get("pythonpath", [])[0], log


def test_a_failed_sbcast_stops_the_job(staged, slurm_cluster, tmp_path: Path):
    """sbcast's exit code is checked: a directory where the tarball must go makes it fail."""
    bindir = staged["prefix"] / "bin"
    script = tmp_path / "job.sh"
    script.write_text(f"""#!/bin/bash
mkdir -p "{staged['scratch']}/sitestack-env-$SLURM_JOB_ID/.sitestack-pack.tar.gz"
. {bindir}/sitestack-stage-env || {{ rm -rf "{staged['scratch']}/sitestack-env-$SLURM_JOB_ID"; exit 3; }}
echo "not reached"
""")
    rc, log = sbatch(slurm_cluster, script, tmp_path / "out")
    assert rc != 0 and "not reached" not in log, log
    assert "sitestack-stage-env: sbcast of" in log and "failed (exit" in log, log


def test_validation_reports_both_import_times(staged, slurm_cluster, tmp_path: Path):
    common = ("--playbook", str(staged["playbook"]), "--prefix", str(staged["prefix"]), "--python", staged["python"])
    installed = run_invoke("install-validation-job", *common, env=staged["env"], timeout=900)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    result = run_invoke("validate", *common, "--results", str(tmp_path), "--timeout", "600",
                        env={**staged["env"], **slurm_cluster.env}, timeout=700)
    out = sorted(p for p in tmp_path.glob("sitestack-validation-*") if p.is_dir())[-1]
    report = json.loads((out / "result.json").read_text())
    assert result.returncode == 0, result.stdout + result.stderr
    startup = report["startup"]
    assert startup["shared_path"] == staged["python"]
    assert startup["staged_path"].startswith(f"{staged['scratch']}/sitestack-env-")
    assert startup["shared_s"] > 0 and startup["staged_s"] > 0, startup
    assert report["verdict"] == "passed"
    summary = (out / "summary.md").read_text()
    assert "## Start-up" in summary and "from node-local storage" in summary
    log = (out.parent / f"{out.name}.log").read_text()
    assert (f"every rank imported torch after {startup['shared_s']} s from the shared prefix, "
            f"{startup['staged_s']} s staged (staging {startup['stage_s']} s)") in log, log[-2000:]
    print(f"import torch: {startup['shared_s']} s from the shared prefix, {startup['staged_s']} s node-local")


def test_a_conda_source_stack_that_is_a_venv_is_packed_and_staged_as_one(validation_python, slurm_cluster,
                                                                         tmp_path_factory, tmp_path: Path):
    """``python.source: conda`` whose stack env is a venv (what the Frontier twin's conda stand-in makes,
    ``python3 -m venv``): the pack follows what the env is (pyvenv.cfg, no conda-meta/), so it is a tar with
    sitestack's fix-up, not conda-pack, and the staged copy is fixed up and used as a venv."""
    python, _env = validation_python
    conda = "    source: conda\n    module: miniforge3/23.11.0-0\n"
    site = stage_site(tmp_path_factory.mktemp("conda-staging"), Path(python).parent.parent, conda)
    pack = site["prefix"] / "packs" / "pytorch-2.13.0-cpu.tar.gz"
    assert json.loads((pack.parent / (pack.name + ".json")).read_text())["kind"] == "venv"
    assert not (site["prefix"] / "tools" / "conda-pack").exists()
    with tarfile.open(pack) as tar:
        assert {".sitestack-unpack.py", "./pyvenv.cfg"} <= set(tar.getnames())
    script = tmp_path / "job.sh"
    script.write_text(f"""#!/bin/bash
. {site['prefix']}/bin/sitestack-stage-env || exit 1
echo "venv=${{VIRTUAL_ENV:-}}"
echo "conda=${{CONDA_PREFIX:-}}"
srun --ntasks=2 sh -c 'python -c "import sys; print(\\"prefix=\\" + sys.prefix)"; echo "pip=$(head -n 1 "$SITESTACK_STAGED_ENV/bin/pip")"'
sitestack_unstage
""")
    values, log = passed_job(slurm_cluster, script, tmp_path / "out")
    root = values.get("venv", [])[0]
    assert root.startswith(f"{site['scratch']}/sitestack-env-"), log
    assert values.get("conda", []) == [""], log
    assert values.get("prefix", []) == [root] * 2, log
    assert values.get("pip", []) == [f"#!{root}/bin/python3.11"] * 2, log
