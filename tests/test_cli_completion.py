"""Shell completion of task names, options and --site values, for `sitestack` and `invoke`, in the
real bash, zsh and fish (scripts/completion.*; docs/cli.md)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

#: The commands the scripts complete: the installed console script, Invoke's, and Invoke's short name.
COMMANDS = ["sitestack", "invoke", "inv"]
SITES = sorted(p.stem for p in (REPO / "playbooks").glob("*.yml"))
#: The venv's bin/ first: `invoke` and `sitestack` (its console script) are there.
ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}


def shell(argv: list[str], cwd: Path | str = REPO) -> list[str]:
    out = subprocess.run(argv, cwd=cwd, env=ENV, text=True, capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def bash(*words: str, cwd: Path | str = REPO) -> list[str]:
    """What scripts/completion.bash offers for ``words`` (the last one is being completed)."""
    quoted = " ".join(f"'{w}'" for w in words)
    # the function bash itself would call for this command: the one `complete -p` has registered
    script = (f"source {REPO}/scripts/completion.bash; "
              f"fn=$(complete -p '{words[0]}' | sed -n 's/.* -F \\([^ ]*\\) .*/\\1/p'); [ -n \"$fn\" ] || exit 3; "
              f"COMP_WORDS=({quoted}); COMP_CWORD={len(words) - 1}; "
              f"\"$fn\" '{words[0]}' '{words[-1]}' '{words[-2]}'; printf '%s\\n' \"${{COMPREPLY[@]}}\"")
    return shell(["bash", "-c", script], cwd)


def zsh(*words: str, cwd: Path | str = REPO) -> list[str]:
    """What scripts/completion.zsh hands compadd for ``words`` under zsh's completion system
    (compadd itself, which filters by the typed prefix, only prints here)."""
    quoted = " ".join(f"'{w}'" for w in words)
    script = (f"autoload -Uz compinit && compinit -u -D; source {REPO}/scripts/completion.zsh; "
              f"[[ -n $_comps[{words[0]}] ]] || exit 3; "
              "compadd() { [[ $1 == -a ]] && print -l -- ${(P)2} }; "
              f"words=({quoted}); CURRENT={len(words)}; $_comps[{words[0]}]")
    return [w for w in shell(["zsh", "-f", "-c", script], cwd) if w.startswith(words[-1])]


def fish(line: str, cwd: Path | str = REPO) -> list[str]:
    """What fish completes for the command line ``line``, with scripts/completion.fish loaded."""
    return shell(["fish", "--no-config", "-c", f"source {REPO}/scripts/completion.fish; complete -C '{line}'"], cwd)


pytestmark = pytest.mark.skipif(not all(shutil.which(s) for s in ("bash", "zsh", "fish")), reason="needs bash, zsh, fish")


@pytest.mark.parametrize("command", COMMANDS)
def test_bash_completes_tasks_options_and_sites(command):
    assert "provision" in bash(command, "prov")
    assert bash(command, "provision", "--list") == ["--list-steps", "--list-tags"]
    assert bash(command, "provision", "--site", "l") == ["local", "lumi"]
    assert bash(command, "validate", "--site", "") == SITES


def test_sitestack_completes_from_any_directory():
    assert bash("sitestack", "show-site", "--site", "", cwd="/") == SITES
    assert fish("sitestack provision --site ", cwd="/") == SITES


@pytest.mark.parametrize("command", COMMANDS)
def test_zsh_completes_tasks_options_and_sites(command):
    assert zsh(command, "prov") == ["provision"]
    assert zsh(command, "provision", "--list") == ["--list-steps", "--list-tags"]
    assert zsh(command, "provision", "--site", "") == SITES


@pytest.mark.parametrize("command", COMMANDS)
def test_fish_completes_tasks_options_and_sites(command):
    assert fish(f"{command} prov") == ["provision"]
    assert fish(f"{command} provision --list") == ["--list-steps", "--list-tags"]
    assert fish(f"{command} provision --site ") == SITES
    assert fish(f"{command} provision --site l") == ["local", "lumi"]
