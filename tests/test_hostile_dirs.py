"""Results and decision directories someone else made: the batch script's results check, the job's own
directories inside OUT (``ranks/``, ``checkpoint/``, a sweep's ``points/<id>``) and ``invoke tune``'s
decision directory take a directory only when it is the user's own, not a link, and writable by no one
else; a fresh one is made private whatever the umask. Each refusal is one line naming the directory,
and nothing is written into it (or through a link planted there) before it.
"""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from sitestack.core.errors import SitestackError
from sitestack.core.host import local_host
from sitestack.engine.tune_run import write_decision
from sitestack.onsite.ddpcheck.rank_progress import Progress
from sitestack.onsite.ddpcheck.ranks import RankInfo
from sitestack.onsite.fileio import private_dir
from sitestack.validation.results_dir import OUT_REFUSED, dir_check, results_check

#: A user id that is not this process's (nobody).
OTHER = 65534


def _other_owner(d: Path) -> Path:
    d.mkdir()
    os.chown(d, OTHER, OTHER)
    return d


def _mode(mode: int) -> Callable[[Path], Path]:
    def make(d: Path) -> Path:
        d.mkdir()
        d.chmod(mode)
        return d
    return make


def _link(d: Path) -> Path:
    target = d.parent / "elsewhere"
    target.mkdir()
    d.symlink_to(target)
    return d


def _file(d: Path) -> Path:
    d.write_text("a file\n")
    return d


#: (id, how the hostile directory is made, what the one line says about it)
HOSTILE = [
    ("another-users", _other_owner, "is owned by another user"),
    ("world-writable", _mode(0o777), "is writable by others (mode 777)"),
    ("group-writable", _mode(0o770), "is writable by others (mode 770)"),
    ("sticky-shared", _mode(0o1777), "is writable by others (mode 1777)"),
    ("a-link", _link, "is a symbolic link"),
]
needs_chown = pytest.mark.skipif(os.geteuid() != 0, reason="making a directory another user owns needs root")


def _contents(d: Path) -> list[str]:
    """What is in ``d`` (through a link too), and what is in the directory a link points at."""
    return sorted(p.name for p in d.iterdir()) if d.is_dir() else []


@pytest.mark.parametrize("name, make, says", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_the_results_check_refuses_a_directory_it_does_not_own_alone(tmp_path, name, make, says):
    if name == "another-users" and os.geteuid() != 0:
        pytest.skip("making a directory another user owns needs root")
    out = make(tmp_path / "results")
    before = _contents(out)
    run = subprocess.run(results_check(str(out)), capture_output=True, text=True, timeout=30)
    assert run.returncode == OUT_REFUSED, run
    assert run.stderr.startswith(f"sitestack: results directory {out} {says}"), run.stderr
    assert len(run.stderr.strip().splitlines()) == 1 and "Traceback" not in run.stderr
    assert _contents(out) == before   # no write probe left, nothing written through the link


def test_a_fresh_results_directory_is_private_under_any_umask(tmp_path):
    out = tmp_path / "a" / "results"
    run = subprocess.run(["bash", "-c", 'umask 000 && exec "$@"', "x", *results_check(str(out))],
                         capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o700 and list(out.iterdir()) == []
    # and the same directory, now the user's own and private, is taken as it is
    assert subprocess.run(results_check(str(out)), capture_output=True, text=True, timeout=30).returncode == 0


def test_a_published_decision_directory_is_made_readable_not_writable_by_others(tmp_path):
    target = tmp_path / "prefix" / "tuning"
    run = subprocess.run(["bash", "-c", 'umask 000 && exec "$@"', "x", *dir_check(str(target), False, "decision directory")],
                         capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stderr
    assert stat.S_IMODE(target.stat().st_mode) == 0o755


@pytest.mark.parametrize("name, make, says", [*HOSTILE, ("a-file", _file, "is not a directory")],
                         ids=[*(h[0] for h in HOSTILE), "a-file"])
def test_the_jobs_own_directories_are_refused_unless_its_own(tmp_path, name, make, says):
    if name == "another-users" and os.geteuid() != 0:
        pytest.skip("making a directory another user owns needs root")
    d = make(tmp_path / "ranks")
    with pytest.raises(OSError, match=f"^{d} {says.replace('(', '[(]').replace(')', '[)]')}: sitestack writes only"):
        private_dir(str(d))
    old = os.umask(0)
    try:
        fresh = private_dir(str(tmp_path / "fresh"))
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(fresh).st_mode) == 0o700


def test_a_ranks_link_planted_in_out_is_never_written_through(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (out / "ranks").symlink_to(elsewhere)
    info = RankInfo(rank=0, world_size=1, local_rank=0, local_world_size=1, launcher="none", source="")
    Progress(str(out), info, "host", {}).enter("startup")
    assert list(elsewhere.iterdir()) == []


@needs_chown
def test_tune_refuses_a_decision_directory_another_user_made(tmp_path):
    results = tmp_path / "sitestack-tune-7"
    results.mkdir()
    decision = _other_owner(results / "decision")
    decision.chmod(0o777)
    outside = tmp_path / "outside.json"
    (decision / "tuning.json").symlink_to(outside)
    with pytest.raises(SitestackError) as exc:
        write_decision(local_host(), str(decision), {"points": []}, private=True)
    message = str(exc.value)
    assert message == f"sitestack: decision directory {decision} is owned by another user (nobody): choose a directory of your own"
    assert sorted(p.name for p in decision.iterdir()) == ["tuning.json"] and not outside.exists()
