"""What a no-op provision no longer starts, and why that stays correct: the action and package tables
import a class when first named, and the assertion and interpreter probes are kept in the probe cache
only while the files that decide their answer stay the same (real shells, real interpreters)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sitestack.actions import ACTIONS
from sitestack.core import probecache, yamlfile
from sitestack.core.errors import SitestackError
from sitestack.core.host import LocalHost
from sitestack.engine import playbook as pb
from sitestack.installs.toolchain import Found, probe_interpreter
from sitestack.packages import HOOKS
from tests.contexts import offline_context


@pytest.fixture
def cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A HOME (and probe cache) of the test's own; files it makes count as settled."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home" / ".cache" / "sitestack").mkdir(parents=True)
    monkeypatch.setattr(probecache, "RACY", -60.0)
    monkeypatch.setattr(yamlfile, "RACY", -60.0)
    monkeypatch.delenv("SITESTACK_PROBE_CACHE", raising=False)
    return tmp_path / "home"


def test_every_table_entry_imports_and_is_the_class_it_is_named_for():
    for name, cls in ACTIONS.items():
        assert cls.action == name
    for name, hooks in HOOKS.items():
        assert isinstance(hooks, type), name
    with pytest.raises(KeyError):
        ACTIONS["no-such-action"]
    assert "no-such-action" not in ACTIONS and len(ACTIONS) == len(list(ACTIONS))


def require_tools_step(tools: list[str]):
    site = pb.load("local")
    spec = next(s for s in site.steps if s.action == "require-tools")
    step = ACTIONS["require-tools"].from_spec(spec, offline_context(site))
    return type(step)(spec, type(step.args)(tools=tuple(tools)), step.ctx)


def settled(path: Path, ago: float = 60) -> None:
    """``path`` changed ``ago`` seconds ago: outside the racy window, and (with another ``ago``) another
    mtime than a change within the same second would leave."""
    old = time.time() - ago
    os.utime(path, (old, old))


def test_a_cached_tool_check_sees_a_tool_removed_or_added(tmp_path, cache_home, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "sitestack-test-tool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    settled(bin_dir)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    host = LocalHost()
    step = require_tools_step(["sitestack-test-tool", "sh"])
    assert step.pending(host) is None
    assert any(probecache.derived_cache("probes").iterdir())   # the answer was kept
    assert step.pending(host) is None                         # and reused
    tool.unlink()                                             # the directory's mtime changes
    settled(bin_dir, 40)
    with pytest.raises(SitestackError, match="missing on .*sitestack-test-tool"):
        step.pending(host)
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    settled(bin_dir, 20)
    assert step.pending(host) is None


class CountingHost(LocalHost):
    """This machine, counting the probes that really start an interpreter."""

    def __init__(self) -> None:
        super().__init__()
        self.interpreter_runs = 0

    def probe(self, argv, **kwargs):
        if any("import json, os, sys, sysconfig" in word for word in argv):
            self.interpreter_runs += 1
        return super().probe(argv, **kwargs)


def test_the_interpreter_is_probed_again_when_what_chose_it_changes(tmp_path, cache_home):
    """A venv's interpreter is kept while its binary and pyvenv.cfg stay; a wrapper script that is not
    pyenv's is run every time (it may choose by anything)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    found = Found(str(python), os.path.realpath(python), "Python")
    host, facts = CountingHost(), pb.load("local").facts
    first = probe_interpreter(host, facts, str(python), "test", found)
    assert first["realpath"] == os.path.realpath(python)
    assert probe_interpreter(host, facts, str(python), "test", found) == first
    assert host.interpreter_runs == 1
    settled(venv / "pyvenv.cfg", 30)        # the venv's base may have changed
    assert probe_interpreter(host, facts, str(python), "test", found) == first
    assert host.interpreter_runs == 2
    wrapper = tmp_path / "wrapper"
    wrapper.write_text(f'#!/bin/sh\nexec {python} "$@"\n')
    wrapper.chmod(0o755)
    settled(tmp_path)
    for _ in range(2):
        probe_interpreter(host, facts, str(wrapper), "test", Found(str(wrapper), str(wrapper), "Python"))
    assert host.interpreter_runs == 4
