"""What an installed on-site command carries (:func:`sitestack.core.shipped.installed`): the modules its
entry imports, found from the imports themselves, are enough to import it with nothing else on the path."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sitestack.core.shipped import imported, installed, launcher
from sitestack.onsite import ENTRY_POINTS


@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
def test_an_entry_installed_alone_imports_with_only_its_modules(name: str, tmp_path: Path):
    files = installed(name, package="lib/tool")
    assert list(files)[-1] == f"bin/{name}" and files[f"bin/{name}"][1] == 0o755
    for relative, (text, mode) in files.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(text)
        (tmp_path / relative).chmod(mode)
    module = ENTRY_POINTS[name]
    probe = (f"import sys; sys.path.insert(0, {str(tmp_path / 'lib/tool')!r}); import onsite.{module} as m; "
             f"print(m.__file__)")
    out = subprocess.run([sys.executable, "-I", "-B", "-c", probe], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(tmp_path / "lib/tool/onsite" / f"{module}.py")


def test_the_closure_follows_relative_imports_and_packages():
    hook = imported("activate_hook")
    assert hook[0] == "__init__.py" and "activate/__init__.py" in hook and "activate/csh.py" in hook
    assert not any(path.startswith("ddpcheck/") for path in hook)
    check = imported("ddp_check")
    assert {"ddpcheck/__init__.py", "ddpcheck/runner.py", "ddp_report.py", "hostlist.py"} <= set(check)
    with pytest.raises(ValueError):
        imported("no_such_module")


def test_a_launcher_beside_its_package_is_the_job_directorys():
    """The job directory's launchers keep their text; an installed one points elsewhere and writes no bytecode."""
    beside = launcher("ddp_check.py")
    assert "sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))\n" in beside
    assert "dont_write_bytecode" not in beside
    away = launcher("extend-venv-activate", package="../share/sitestack")
    assert "sys.dont_write_bytecode = True" in away and "'../share/sitestack'" in away
