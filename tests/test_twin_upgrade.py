"""Cirrus' user flow across an upgrade, on the Cirrus twin (the build instructions' venv on the stack with
extend-venv-activate, https://github.com/hpc-uk/build-instructions): a user's venv keeps working when the administrator upgrades the stack; a process started in
it before the upgrade keeps importing from the generation it started with, which stays while the
process runs; the next activation gets the new generation (docs/operating.md)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

#: Waits for its trigger file, then imports filelock (one of torch's dependencies: in the stack itself, not
#: in the base Python the venv sees) and says where from (it runs across the upgrade).
WAITER = """import sys, time, os
trigger, out = sys.argv[1], sys.argv[2]
while not os.path.exists(trigger):
    time.sleep(0.2)
import filelock
with open(out, "w") as handle:
    handle.write(filelock.__file__ + "\\n")
"""


def test_a_users_venv_and_its_running_process_across_an_upgrade(site_twins, tmp_path: Path):
    running = site_twins("cirrus")
    twin = running.twin
    prefix = f"/work/{twin.account}/shared/sitestack"
    venv, home = f"{twin.home}/upgrade-venv", twin.home
    # the generation `module load` gives: where the module put python
    loaded = f'module use {prefix}/modules\nmodule load pytorch\ndirname "$(dirname "$(command -v python)")"\n'
    (twin.site_dir(home) / "waiter.py").write_text(WAITER)
    made = running.shell(
        f"{loaded}python -m venv --system-site-packages {venv}\nextend-venv-activate {venv}\nmodule purge\n"
        f"source {venv}/bin/activate\npython -c 'import torch'\n"
        f"nohup python -u {home}/waiter.py {home}/go {home}/where > {home}/waiter.log 2>&1 &\necho started")
    assert made.returncode == 0 and "started" in made.stdout, made.stdout + made.stderr
    old = made.stdout.strip().splitlines()[0]
    assert ".gen-" in old, made.stdout
    extra = tmp_path / "upgrade.yml"
    extra.write_text("facts:\n  torch:\n    extras: [six]\n")
    facts = f"{running.env['SITESTACK_FACTS']}:{extra}"
    try:
        upgraded = running.invoke("provision", "--site", "cirrus", "--account", twin.account, "--tags", "stack-venv",
                                  env={"SITESTACK_FACTS": facts})
        assert upgraded.returncode == 0 and "changed  stack-venv: extras: +six" in upgraded.stdout, \
            upgraded.stdout + upgraded.stderr
        (twin.site_dir(home) / "go").write_text("")
        where = twin.site_dir(home) / "where"
        for _ in range(300):
            if where.exists() and where.read_text().endswith("\n"):
                break
            time.sleep(0.2)
        # the process started before the upgrade imported from its generation, which is still there
        assert where.read_text().startswith(f"{old}/lib/"), where.read_text()
        assert twin.site_dir(old).is_dir()
        after = running.shell(f"source {venv}/bin/activate\npython -c 'import six, filelock; print(filelock.__file__)'\n"
                              f"deactivate\n{loaded}")
        assert after.returncode == 0, after.stdout + after.stderr
        new = after.stdout.strip().splitlines()[-1]
        assert new != old and after.stdout.startswith(f"{new}/lib/")   # the next activation: the new generation
    finally:
        back = running.invoke("provision", "--site", "cirrus", "--account", twin.account, "--tags", "stack-venv")
    assert back.returncode == 0 and "changed  stack-venv: extras: -six" in back.stdout, back.stdout + back.stderr
