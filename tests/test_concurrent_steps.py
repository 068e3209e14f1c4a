"""Independent steps run at the same time when applying, with results in the playbook's order.

Real provisions of playbooks of ``command`` steps (``concurrent: true``) on this machine. Overlap is
proven by ordering evidence, never by timing: a step that waits for a file another step makes
sees it only when the two run at once (else its wait ends at a timeout and it records "alone").
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from sitestack.core.cores import local_cores
from sitestack.core.host import local_host
from sitestack.core.step import Result, Step, converge
from tests.conftest import REPO

pytestmark = pytest.mark.integration

#: Wait (in tenths of a second, at most 60 s) for file $1; write "together" or "alone" into $2.
WAIT = ('i=0; while [ ! -e "$1" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; '
        '[ -e "$1" ] && echo together > "$2" || echo alone > "$2"')


def command(name: str, script: str, d: Path, *, concurrent: bool | None = True, notify: tuple[str, ...] = ()) -> dict:
    """A ``command`` step running ``script`` (sh, with $D the evidence directory), then making $D/<name>.ok
    (what says it is done); each start and end is a line of $D/events."""
    step: dict = {"name": name, "action": "command",
                  "args": {"argv": ["sh", "-c", f'D="$1"; echo "{name} start" >> "$D/events"; {script}; '
                                    f'echo "{name} end" >> "$D/events"; touch "$D/{name}.ok"', "sh", str(d)],
                           "creates": str(d / f"{name}.ok")}}
    if concurrent is not None:
        step["concurrent"] = concurrent
    if notify:
        step["notify"] = list(notify)
    return step


def playbook(tmp: Path, steps: list[dict], handlers: list[dict] = ()) -> Path:
    """The local site's facts with only ``steps`` (and ``handlers``)."""
    data = yaml.safe_load((REPO / "playbooks" / "local.yml").read_text())
    data["steps"], data["handlers"] = steps, list(handlers)
    path = tmp / "local.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def run(cli, tmp: Path, book: Path, *extra: str, env: dict[str, str] | None = None, prefix: tuple[str, ...] = ()):
    argv = ["provision", "--playbook", str(book), "--prefix", str(tmp / "prefix"), *extra]
    if not prefix:
        return cli(*argv, env={"SITESTACK_LOG_DIR": str(tmp / "logs"), **(env or {})})
    return subprocess.run([*prefix, sys.executable, "-m", "invoke", *argv], cwd=REPO, text=True, capture_output=True,
                          env={**os.environ, "SITESTACK_LOG_DIR": str(tmp / "logs"), **(env or {})}, timeout=600)


def result_lines(stdout: str) -> list[str]:
    """``status name`` of each result line, in printed order."""
    return [" ".join(line.split()[1:3]).rstrip(":") for line in stdout.splitlines() if line.startswith("[localhost] ")]


def evidence(tmp: Path) -> Path:
    d = tmp / "evidence"
    d.mkdir(exist_ok=True)
    return d


def test_independent_steps_overlap_and_report_in_playbook_order(cli, tmp_path: Path):
    """a waits until b has ended, so b ends first; a's result is still printed first, and the handler
    both notify runs once, notified by a (the first in the playbook's order)."""
    d = evidence(tmp_path)
    steps = [command("first", "true", d, concurrent=None),
             command("a", f'touch "$D/a.start"; set -- "$D/b.ok" "$D/a.saw"; {WAIT}; touch "$D/a.ok"', d,
                     notify=("h",)),
             command("b", f'set -- "$D/a.start" "$D/b.saw"; touch "$D/b.start"; {WAIT}; touch "$D/b.ok"', d,
                     notify=("h",)),
             command("last", 'cat "$D/a.saw" "$D/b.saw" > "$D/last.saw"; touch "$D/last.ok"', d, concurrent=None)]
    handler = command("h", 'echo h >> "$D/handler-runs"', d, concurrent=None)
    (d / "h.ok").touch()  # the handler's own state says done: it runs because it was notified
    out = run(cli, tmp_path, playbook(tmp_path, steps, [handler]), "--parallel-steps", "2")
    assert out.returncode == 0, out.stdout + out.stderr
    assert (d / "a.saw").read_text().strip() == "together"   # b ended while a ran
    assert (d / "b.saw").read_text().strip() == "together"   # a had started when b did
    events = (d / "events").read_text().splitlines()
    assert events.index("b end") < events.index("a end")      # b ended first ...
    assert result_lines(out.stdout) == ["changed first", "changed a", "changed b", "changed last",
                                        "changed handler"]   # ... yet a is reported first
    assert events.index("a end") < events.index("last start")  # a step that may not overlap waits for all
    assert (d / "last.saw").read_text().split() == ["together", "together"]
    assert (d / "handler-runs").read_text().split() == ["h"]
    assert "handler h: notified by a" in out.stdout
    log = next((tmp_path / "logs").rglob("provision.log")).read_text()
    assert [line.split()[2] for line in log.splitlines() if line.startswith("[localhost] changed")] == \
        ["first:", "a:", "b:", "last:", "handler"]


def serial_book(tmp: Path, d: Path, *, concurrent: bool | None = True) -> Path:
    """a then b, each may overlap: b records whether a had ended when b started."""
    return playbook(tmp, [
        command("a", 'touch "$D/a.start"; sleep 1; touch "$D/a.ok"', d, concurrent=concurrent),
        command("b", '[ -e "$D/a.ok" ] && echo after > "$D/b.saw" || echo during > "$D/b.saw"; touch "$D/b.ok"', d,
                concurrent=concurrent)])


@pytest.mark.parametrize("how", ["option", "one-core", "slurm-one-cpu", "setting", "playbook-key"])
def test_one_at_a_time(cli, tmp_path: Path, how: str):
    """--parallel-steps 1, the setting, one usable core (taskset), a Slurm job with one CPU, or the
    playbook's ``concurrent: false``: b starts only after a has ended."""
    if how == "one-core" and not shutil.which("taskset"):
        pytest.skip("no taskset")
    d = evidence(tmp_path)
    book = serial_book(tmp_path, d, concurrent=how != "playbook-key")
    extra, env, prefix = {"option": (("--parallel-steps", "1"), {}, ()),
                          "one-core": ((), {}, ("taskset", "-c", "0")),
                          "slurm-one-cpu": ((), {"SLURM_JOB_ID": "7", "SLURM_CPUS_ON_NODE": "1"}, ()),
                          "setting": ((), {"INVOKE_SITESTACK_PARALLEL_STEPS": "1"}, ()),
                          "playbook-key": (("--parallel-steps", "2"), {}, ())}[how]
    out = run(cli, tmp_path, book, *extra, env=env, prefix=prefix)
    assert out.returncode == 0, out.stdout + out.stderr
    assert (d / "b.saw").read_text().strip() == "after"
    assert result_lines(out.stdout) == ["changed a", "changed b"]


def test_cores_decide_by_default(cli, tmp_path: Path):
    """Without the option, a host with two usable cores runs the two steps at once."""
    if local_cores() < 2:
        pytest.skip("this machine gives this process one core")
    d = evidence(tmp_path)
    book = playbook(tmp_path, [
        command("a", f'touch "$D/a.start"; set -- "$D/b.start" "$D/a.saw"; {WAIT}; touch "$D/a.ok"', d),
        command("b", f'touch "$D/b.start"; set -- "$D/a.start" "$D/b.saw"; {WAIT}; touch "$D/b.ok"', d)])
    out = run(cli, tmp_path, book)
    assert out.returncode == 0, out.stdout + out.stderr
    assert {(d / n).read_text().strip() for n in ("a.saw", "b.saw")} == {"together"}


def test_a_failure_lets_running_steps_finish_and_skips_the_rest(cli, tmp_path: Path):
    """a fails while b runs: b finishes (changed), c (not started: both slots were taken) and the step
    after are skipped, the handler b notified does not run; the results keep the playbook's order."""
    d = evidence(tmp_path)
    steps = [command("a", f'touch "$D/a.start"; set -- "$D/b.start" "$D/a.saw"; {WAIT}; touch "$D/a.failing"; exit 3', d),
             command("b", f'touch "$D/b.start"; set -- "$D/a.failing" "$D/b.saw"; {WAIT}; touch "$D/b.ok"', d,
                     notify=("h",)),
             command("c", 'touch "$D/c.ok"', d),
             command("after", 'touch "$D/after.ok"', d, concurrent=None)]
    out = run(cli, tmp_path, playbook(tmp_path, steps, [command("h", 'touch "$D/h.ok"', d, concurrent=None)]),
              "--parallel-steps", "2")
    assert out.returncode == 1
    assert (d / "b.saw").read_text().strip() == "together"
    assert result_lines(out.stdout) == ["failed a", "changed b", "skipped c", "skipped after", "skipped handler"]
    assert "[localhost] skipped  c: not run: an earlier step failed" in out.stdout
    assert not (d / "c.ok").exists() and not (d / "after.ok").exists() and not (d / "h.ok").exists()


class Probe(Step):
    """A step that records which thread probed and applied it."""

    concurrent = True

    def __init__(self, name: str, seen: list[tuple[str, str]]) -> None:
        self.name, self.seen, self.done = name, seen, False

    def pending(self, host) -> str | None:
        self.seen.append((self.name, threading.current_thread().name))
        return None if self.done else "not applied"

    def apply(self, host) -> None:
        self.seen.append((self.name, threading.current_thread().name))
        self.done = True


def test_check_mode_plans_in_order_on_one_thread():
    """Check mode never runs steps at once, whatever the concurrency asked."""
    seen: list[tuple[str, str]] = []
    reported: list[Result] = []
    host = local_host(read_only=True)
    results = converge([Probe(n, seen) for n in "abc"], host, check=True, concurrency=4, on_result=reported.append)
    assert [r.step for r in reported] == ["a", "b", "c"] and {r.status for r in results} == {"changed"}
    assert seen == [(n, threading.current_thread().name) for n in "abc"]


def test_applying_runs_steps_in_threads_and_reports_in_order():
    seen: list[tuple[str, str]] = []
    reported: list[str] = []
    results = converge([Probe(n, seen) for n in "abc"], local_host(), concurrency=2,
                       on_result=lambda r: reported.append(r.step))
    assert reported == ["a", "b", "c"] and [r.status for r in results] == ["changed"] * 3
    main = threading.current_thread().name
    assert all(thread != main for _, thread in seen)  # every step ran in a thread of the pool


def local_steps(tmp: Path, change: dict[str, dict]) -> dict[str, Step]:
    """The local playbook's steps as built for this host, with ``change`` merged into the named steps."""
    from sitestack.actions import ACTIONS
    from sitestack.engine import playbook as pb
    from sitestack.model.context import RunOptions

    data = yaml.safe_load((REPO / "playbooks" / "local.yml").read_text())
    for step in data["steps"]:
        step.update(change.get(step["name"], {}))
    path = tmp / "local.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    site = pb.load(path=path)
    host = local_host(read_only=True)
    ctx = pb.context_for(site, host, RunOptions(check=True, prefix=str(tmp / "prefix")), None)
    return {s.name: ACTIONS[s.action].from_spec(s, ctx.for_step(s)) for s in site.steps}


def test_the_builds_of_the_local_site_are_independent_and_the_stack_waits(tmp_path: Path):
    steps = local_steps(tmp_path, {})
    assert [n for n, s in steps.items() if s.concurrent] == ["mpi4py", "horovod", "validation-job"]


@pytest.mark.parametrize("change", [{"concurrent": False}, {"args": {"recipe": "mpi4py", "version": "4.1.2",
                                                                      "python": "python3"}}])
def test_a_build_runs_alone_when_the_playbook_says_or_names_its_interpreter(tmp_path: Path, change: dict):
    steps = local_steps(tmp_path, {"mpi4py": change})
    assert not steps["mpi4py"].concurrent and steps["horovod"].concurrent


@pytest.mark.parametrize("change", [{"concurrent": False}, {"args": {"build_python": "/opt/stack/bin/python"}}])
def test_the_validation_job_runs_alone_when_the_playbook_says_or_its_probe_builds_with_a_named_python(
        tmp_path: Path, change: dict):
    steps = local_steps(tmp_path, {"validation-job": change})
    assert not steps["validation-job"].concurrent and steps["horovod"].concurrent
