"""``invoke render``: every file a playbook would install, rendered off the site at its site path under
--out, with an index of which step writes which; never a file outside --out."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sitestack.core.errors import InputError, SitestackError
from sitestack.core.paths import REPO
from sitestack.core.report import Reporter
from sitestack.engine import playbook as pb
from sitestack.engine import render
from sitestack.model.context import RunOptions
from sitestack.model.site import list_sites
from tests.conftest import playbook_copy

GOLDEN = Path(__file__).parent / "golden" / "modulefiles"
MODULES = "lustre/orion/proj123/world-shared/sitestack/modules"


def files_under(out: Path) -> set[str]:
    return {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file() or p.is_symlink()}


def test_frontier_off_the_site_renders_the_golden_module_files(tmp_path: Path):
    """On this machine (not a Frontier host) the task exits 0 and writes the module files the goldens hold,
    byte for byte; the current stack's (a further stack) and its rc file beside them, each file indexed once."""
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "invoke", "render", "--site", "frontier", "--account", "proj123",
                           "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "files of frontier rendered under" in done.stdout
    golden = GOLDEN / "frontier" / "lua"
    for path in golden.rglob("*"):
        if path.is_file():
            rendered = out / MODULES / path.relative_to(golden)
            assert rendered.read_bytes() == path.read_bytes(), rendered
    index = json.loads((out / render.INDEX_JSON).read_text())
    by_path = {entry["path"]: entry for entry in index["files"]}
    assert len(by_path) == len(index["files"])
    assert files_under(out) == {p.lstrip("/") for p in by_path} | {render.INDEX_JSON, render.INDEX_MD}
    root = "/" + MODULES
    assert by_path[f"{root}/pytorch/2.10.0-rocm7.1.lua"]["step"] == "rocm7-modulefiles"   # stack rocm7's facts
    assert by_path[f"{root}/pytorch/.modulerc.lua"]["step"] == "rocm7-modulefiles"        # default: true
    assert 'module_version("pytorch/2.10.0-rocm7.1", "default")' in (out / MODULES / "pytorch/.modulerc.lua").read_text()
    assert by_path[f"{root}/aws-ofi-rccl/1.4.0+17d41cb-rocm-5.7.1.lua"]["step"] == "rccl-net-plugin"
    helper = "/lustre/orion/proj123/world-shared/sitestack/bin/sitestack-launch"
    assert by_path[helper]["step"] == "launch-helpers" and by_path[helper]["mode"] == "0755"
    assert os.stat(out / helper.lstrip("/")).st_mode & 0o777 == 0o755
    assert "## rocm7-modulefiles (modulefiles, stack rocm7)" in (out / render.INDEX_MD).read_text()


@pytest.mark.parametrize("site", [s for s in list_sites() if s != "frontier"])  # frontier: above
def test_every_site_renders_each_file_once_inside_out(site: str, tmp_path: Path):
    loaded = pb.load(site)
    rendering = render.render_site(loaded, RunOptions(account="proj123"))
    assert [s.error for s in rendering.steps if s.error] == []
    document = render.write_rendering(rendering, tmp_path)
    paths = [entry["path"] for entry in document["files"]]
    assert len(paths) == len(set(paths)) and paths
    writers = {s.name for s in rendering.steps if s.files}
    assert {entry["step"] for entry in document["files"]} == writers
    assert files_under(tmp_path) == {p.lstrip("/") for p in paths} | {render.INDEX_JSON, render.INDEX_MD}
    for p in tmp_path.rglob("*"):
        assert not p.is_symlink() and p.resolve().is_relative_to(tmp_path.resolve())
    writes = {"install-validation-job", "install-launch-env", "modulefiles", "site-facts", "venv-hook",
              "apptainer-image", "container-image"}   # each step of these writes files known beforehand
    expected = {s.name for s in loaded.steps if s.action in writes and (s.args or {}).get("runscripts", True)}
    assert expected and [s.name for s in rendering.steps if s.name in expected and not s.files] == []
    assert {"install-validation-job", "install-launch-env", "modulefiles"} <= {s.action for s in rendering.steps}


def test_out_must_be_empty_unless_forced(tmp_path: Path):
    (tmp_path / "x").write_text("mine\n")
    with pytest.raises(InputError, match="not empty"):
        render.check_out(str(tmp_path), force=False)
    assert render.check_out(str(tmp_path), force=True) == tmp_path
    render.check_out(str(tmp_path / "new"), force=False)
    with pytest.raises(InputError, match="not a directory"):
        render.check_out(str(tmp_path / "x"), force=True)
    with pytest.raises(InputError, match="--out: missing"):
        render.check_out(None, force=False)


@pytest.mark.parametrize("path", ["relative/file", "/a/../../etc/passwd", "/a/./b", "/a//b", "/", "/index.json"])
def test_a_path_that_could_leave_out_is_refused(tmp_path: Path, path: str):
    with pytest.raises(SitestackError, match="cannot render"):
        render.local_path(tmp_path, path)


def test_a_link_in_out_is_never_followed(tmp_path: Path):
    """A re-render (--force) into a directory where a link stands for a site directory or file writes
    nothing through it."""
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    elsewhere.mkdir()
    out.mkdir()
    (out / "a").symlink_to(elsewhere)
    rendering = render.Rendering("s", "p.yml", {}, [render.StepFiles("one", "site-facts", None,
                                                                     {"/a/b/file": ("x\n", 0o644)})])
    with pytest.raises(SitestackError, match="not a directory"):
        render.write_rendering(rendering, out)
    (out / "a").unlink()
    (out / "a").mkdir()
    (out / "a" / "b").symlink_to(elsewhere / "target")
    rendering.steps[0].files = {"/a/b": ("x\n", 0o644)}
    with pytest.raises(SitestackError, match="not a regular file"):
        render.write_rendering(rendering, out)
    assert list(elsewhere.iterdir()) == []


def test_check_mode_off_the_site_points_to_render_once():
    stream = io.StringIO()
    runs = pb.provision(pb.load("frontier"), RunOptions(check=True, account="proj123"), Reporter(stream))
    assert not runs[0].failed
    text = stream.getvalue()
    assert text.count("invoke render --site frontier --out DIR") == 1
    assert "login is not a frontier host (/lustre/orion missing): to read the files" in text


def test_a_playbook_file_renders_and_is_named_by_its_path(tmp_path: Path):
    """--playbook FILE: a copy with its own prefix renders there; the check-mode hint names the file."""
    path = playbook_copy(tmp_path, "cirrus", facts={"prefix": "/srv/stack"})
    loaded = pb.load(path=path)
    assert pb.render_args(loaded) == f"--playbook {path}" and pb.render_args(pb.load("cirrus")) == "--site cirrus"
    rendering = render.render_site(loaded, RunOptions(account="proj123"))
    assert rendering.values["prefix"] == "/srv/stack"
    assert all(p.startswith("/srv/stack/") for p in rendering.final())
