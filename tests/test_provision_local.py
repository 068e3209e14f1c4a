"""`invoke provision --site local` for real on this machine: check -> apply -> check -> apply."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import tree

pytestmark = pytest.mark.integration


#: The core steps of the local playbook (packages, preflight, layout, facts). The builds, the
#: stack and the validation job have their own tests; test_full_playbook_twice runs them all.
CORE = ("--tags", "system,preflight,layout")


def provision(cli, prefix: Path, *extra: str, core: bool = True):
    return cli("provision", "--site", "local", "--prefix", str(prefix), *(CORE if core else ()), *extra)


def recap_row(stdout: str, host: str = "localhost") -> dict[str, int]:
    lines = stdout.splitlines()
    header = lines[lines.index("RECAP") + 1].split()
    row = next(line.split() for line in lines if line.startswith(host + " "))
    return {k: int(v) for k, v in zip(header[1:-1], row[1:-1])}


def test_check_apply_check_apply(cli, scratch: Path):
    planned = provision(cli, scratch, "--check")
    assert planned.returncode == 0, planned.stderr
    assert "(check mode: nothing will be changed)" in planned.stdout
    assert "would change: " + str(scratch) + " missing" in planned.stdout
    assert not scratch.exists()
    assert provision(cli, scratch, "--check", "--fail-on-change").returncode == 2
    assert not scratch.exists()

    applied = provision(cli, scratch)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    counts = recap_row(applied.stdout)
    assert counts["failed"] == 0 and counts["changed"] >= 2
    record = json.loads((scratch / "share" / "sitestack" / "site.json").read_text())
    assert record["site"] == "local" and record["facts"]["prefix"] == str(scratch)
    assert record["facts"]["modules"]["install_root"] == f"{scratch}/modules"  # placeholders filled
    before = tree(scratch)

    again = provision(cli, scratch, "--check", "--fail-on-change")
    assert again.returncode == 0, again.stdout
    second = provision(cli, scratch)
    assert second.returncode == 0
    counts = recap_row(second.stdout)
    assert counts["changed"] == 0 and counts["failed"] == 0 and counts["ok"] == 5
    assert tree(scratch) == before


def test_drift_shows_as_diff_and_is_repaired(cli, scratch: Path):
    assert provision(cli, scratch).returncode == 0
    facts = scratch / "share" / "sitestack" / "site.json"
    good = facts.read_text()
    facts.write_text(good.replace('"site": "local"', '"site": "tampered"'))
    (scratch / "modules").chmod(0o700)
    drift = provision(cli, scratch, "--check", "--diff", "--fail-on-change")
    assert drift.returncode == 2
    assert '-  "site": "tampered"' in drift.stdout and '+  "site": "local"' in drift.stdout
    assert "mode 0700, want 0755" in drift.stdout
    assert '"tampered"' in facts.read_text()  # check mode changed nothing
    fixed = provision(cli, scratch, "--diff")
    assert fixed.returncode == 0 and facts.read_text() == good
    assert (scratch / "modules").stat().st_mode & 0o777 == 0o755


def test_a_diff_shows_control_characters_escaped(cli, scratch: Path):
    """A file on the host may hold terminal escape sequences (planted, or a hand edit): --diff
    prints them as \\xNN, never raw to the admin's terminal."""
    assert provision(cli, scratch).returncode == 0
    facts = scratch / "share" / "sitestack" / "site.json"
    facts.write_text(facts.read_text().replace('"site": "local"', '"site": "\x1b]0;owned\x07\x1b[2J\rlocal"'))
    drift = provision(cli, scratch, "--check", "--diff")
    assert drift.returncode == 0, drift.stdout + drift.stderr
    assert '-  "site": "\\x1b]0;owned\\x07\\x1b[2J\\x0dlocal"' in drift.stdout, drift.stdout
    assert not set(drift.stdout) & {"\x1b", "\x07", "\r"}


def test_tags_run_only_the_selected_steps(cli, scratch: Path):
    result = cli("provision", "--site", "local", "--prefix", str(scratch), "--tags", "layout", "--skip-tags", "site-facts")
    assert result.returncode == 0, result.stderr
    assert "[localhost] skipped  system-packages: not selected by tags" in result.stdout
    assert (scratch / "modules").is_dir()
    assert not (scratch / "share" / "sitestack" / "site.json").exists()


def test_apply_mode_failure_is_exit_1_and_stops_the_host(cli, tmp_path: Path):
    blocker = tmp_path / "file-not-dir"
    blocker.write_text("x")
    result = provision(cli, blocker / "prefix")
    assert result.returncode == 1
    assert "[localhost] failed" in result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr


@pytest.mark.slow
def test_full_playbook_twice(cli, scratch: Path):
    """The main job: the whole local playbook (builds from the session's build cache when an
    earlier test built the same inputs), then again as a no-op."""
    first = provision(cli, scratch, core=False)
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr
    assert recap_row(first.stdout)["failed"] == 0
    for path in ("mpi4py/4.1.2", "pytorch/2.13.0-cpu/bin/python", "pytorch/2.13.0-cpu/bin/extend-venv-activate",
                 "modules/pytorch/2.13.0-cpu.lua"):
        assert (scratch / path).exists(), path
    check = provision(cli, scratch, "--check", "--fail-on-change", core=False)
    assert check.returncode == 0, check.stdout
    second = provision(cli, scratch, core=False)
    counts = recap_row(second.stdout)
    assert second.returncode == 0 and counts["changed"] == 0 and counts["failed"] == 0, second.stdout


def test_a_prefix_behind_a_symlink_is_the_directory_it_names(cli, tmp_path: Path):
    """/appl/x -> /pfs/...: the layout goes into the directory behind the link, the link stays; a
    link to nothing or to a file is refused, naming the path, with nothing written."""
    real = tmp_path / "pfs" / "stack"
    real.mkdir(parents=True)
    prefix = tmp_path / "prefix"
    prefix.symlink_to(real)
    first = provision(cli, prefix)
    assert first.returncode == 0, first.stdout + first.stderr
    assert prefix.is_symlink() and (real / "modules").is_dir() and (real / "share" / "sitestack" / "site.json").is_file()
    again = provision(cli, prefix, "--check", "--fail-on-change")
    assert again.returncode == 0, again.stdout
    # the run's lock under the prefix is the first thing made there: that names the path and why
    for target, why in ((tmp_path / "gone", "No such file or directory"), (tmp_path / "file", "Not a directory")):
        if target.name == "file":
            target.write_text("x")
        bad = tmp_path / f"to-{target.name}"
        bad.symlink_to(target)
        out = provision(cli, bad)
        text = out.stdout + out.stderr
        assert out.returncode == 1 and f"cannot create lock {bad}/.sitestack/provision.lock" in text and why in text, text
        assert "Traceback" not in text and not (tmp_path / "gone").exists()
    # in check mode (no lock) the layout step says what is wrong with the path
    out = provision(cli, tmp_path / "to-gone", "--check")
    assert out.returncode == 1 and f"{tmp_path / 'to-gone'} is a symbolic link to nothing" in out.stdout, out.stdout
