"""Filling a venv from a template (sitestack/onsite/venv_clone.py), with real venvs: scripts and
their RECORD lines name the new venv, a moved wheel's direct_url.json names the new wheel, other
files are hard links, and the template is never written to."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from sitestack.installs.venv_template import CLONE

PY = f"python{sys.version_info.major}.{sys.version_info.minor}"


def venv(path: Path, python: str = sys.executable) -> Path:
    subprocess.run([python, "-m", "venv", "--without-pip", str(path)], check=True)
    return path


def record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def installed_like_pip(root: Path, wheel: str) -> None:
    """A distribution as pip leaves it: a module, a console script naming ``root``, a RECORD, a direct_url."""
    sp = root / "lib" / PY / "site-packages"
    (sp / "demo").mkdir()
    (sp / "demo" / "__init__.py").write_text("VALUE = 42\n")
    script = f"#!{root}/bin/python\nimport demo\nprint(demo.VALUE)\n".encode()
    (root / "bin" / "demo").write_bytes(script)
    (root / "bin" / "demo").chmod(0o755)
    info = sp / "demo-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Name: demo\nVersion: 1.0\n\n")
    direct = json.dumps({"archive_info": {}, "url": f"file://{wheel}"}, sort_keys=True).encode()
    (info / "direct_url.json").write_bytes(direct)
    rows = [f"demo/__init__.py,{record_hash(b'VALUE = 42' + bytes([10]))},11",
            f"../../../bin/demo,{record_hash(script)},{len(script)}",
            f"demo-1.0.dist-info/direct_url.json,{record_hash(direct)},{len(direct)}",
            "demo-1.0.dist-info/RECORD,,"]
    (info / "RECORD").write_text("\n".join(rows) + "\n")


def clone(template: Path, new: Path, old_root: Path, *moved: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(new / "bin" / "python"), "-c", CLONE, str(template), str(new), str(old_root), "link",
                           *moved], capture_output=True, text=True)


def test_clone_rewrites_what_names_the_old_venv_and_links_the_rest(tmp_path: Path):
    old = venv(tmp_path / "old")
    installed_like_pip(old, "/p1/demo/1.0/demo-1.0-py3-none-any.whl")
    template = tmp_path / "template"
    subprocess.run(["cp", "-a", str(old), str(template)], check=True)
    before = {p: p.read_bytes() for p in template.rglob("*") if p.is_file() and not p.is_symlink()}
    new = venv(tmp_path / "new")
    out = clone(template, new, old, "/p1/demo/1.0/demo-1.0-py3-none-any.whl=/p2/demo/1.0/demo-1.0-py3-none-any.whl")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.splitlines()[-1])["rewritten"] == 2
    assert subprocess.run([str(new / "bin" / "demo")], capture_output=True, text=True).stdout == "42\n"
    assert (new / "bin" / "demo").read_text().startswith(f"#!{new}/bin/python\n")
    sp = new / "lib" / PY / "site-packages"
    assert json.loads((sp / "demo-1.0.dist-info/direct_url.json").read_text())["url"] == \
        "file:///p2/demo/1.0/demo-1.0-py3-none-any.whl"
    for row in (sp / "demo-1.0.dist-info/RECORD").read_text().splitlines():  # every hash is the file's
        path, digest, size = row.rsplit(",", 2)
        if digest:
            data = (sp / path).resolve().read_bytes()
            assert (digest, int(size)) == (record_hash(data), len(data)), path
    assert (sp / "demo" / "__init__.py").stat().st_nlink == 2  # shared with the template
    assert (new / "pyvenv.cfg").stat().st_nlink == 1  # the new venv's own
    assert {p: p.read_bytes() for p in before} == before  # the template is unchanged


def test_a_template_for_another_interpreter_is_refused(tmp_path: Path):
    template = venv(tmp_path / "template")
    new = venv(tmp_path / "new")
    cfg = template / "pyvenv.cfg"
    cfg.write_text(cfg.read_text().replace("version", "version = 0.0.0\nignored", 1))
    out = clone(template, new, template)
    assert out.returncode == 3 and "another interpreter" in out.stdout
    assert sorted(p.name for p in (new / "lib" / PY / "site-packages").iterdir()) == []


@pytest.mark.parametrize("mode", ["copy"])
def test_copy_mode_shares_nothing(tmp_path: Path, mode: str):
    old = venv(tmp_path / "old")
    installed_like_pip(old, "/w.whl")
    new = venv(tmp_path / "new")
    out = subprocess.run([str(new / "bin" / "python"), "-c", CLONE, str(old), str(new), str(old), mode],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert (new / "lib" / PY / "site-packages" / "demo" / "__init__.py").stat().st_nlink == 1
