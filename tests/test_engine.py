"""The engine's contract (converge) against an in-memory host."""

from __future__ import annotations

import pytest

from sitestack.core.errors import CannotProbe, MutationRefused, SitestackError
from sitestack.core.step import Step, converge, selected
from tests.fakehost import FakeHost


class FileStep(Step):
    """Make ``path`` hold ``text``."""

    def __init__(self, name: str, path: str, text: str, *, tags=(), notify=()):
        self.name, self.path, self.text = name, path, text
        self.tags, self.notify = frozenset(tags), tuple(notify)
        self.applied = 0

    def pending(self, host):
        current = host.read_text(self.path)
        return None if current == self.text else ("missing" if current is None else "differs")

    def apply(self, host):
        self.applied += 1
        host.write_text(self.path, self.text)


class LyingStep(FileStep):
    """Claims to apply but does not change anything."""

    def apply(self, host):
        self.applied += 1


class FailingStep(FileStep):
    def apply(self, host):
        raise SitestackError("disk full")


class BuggyStep(FileStep):
    def pending(self, host):
        raise ZeroDivisionError("bug")


class UnprobeableStep(FileStep):
    def pending(self, host):
        raise CannotProbe("no module system")


class CountingHandler(FileStep):
    def pending(self, host):
        return None  # a handler's own pending says nothing is needed; notification forces it


def statuses(results):
    return [(r.step, r.status) for r in results]


def test_apply_then_ok():
    host = FakeHost()
    step = FileStep("a", "/a", "hello")
    assert statuses(converge([step], host)) == [("a", "changed")]
    assert host.files["/a"] == "hello"
    assert statuses(converge([step], host)) == [("a", "ok")]
    assert step.applied == 1


def test_check_mode_never_mutates():
    host = FakeHost()
    host.files["/b"] = "old"
    steps = [FileStep("a", "/a", "x"), FileStep("b", "/b", "new", notify=["h"])]
    handler = CountingHandler("h", "/h", "")
    view = host.read_only_view()
    results = converge(steps, view, check=True, handlers=[handler])
    assert statuses(results) == [("a", "changed"), ("b", "changed"), ("h", "changed")]
    assert results[0].message == "would change: missing"
    assert results[1].message == "would change: differs"
    assert host.mutations == [] and host.files == {"/b": "old"}
    assert all(s.applied == 0 for s in steps) and handler.applied == 0


def test_read_only_host_refuses_mutation_even_if_a_step_tries():
    view = FakeHost().read_only_view()
    with pytest.raises(MutationRefused):
        view.write_text("/x", "y")
    with pytest.raises(MutationRefused):
        view.run(["rm", "-rf", "/"])


def test_apply_is_verified_by_a_second_pending():
    host = FakeHost()
    results = converge([LyingStep("liar", "/l", "x")], host)
    assert results[0].status == "failed"
    assert results[0].message == "still pending after apply: missing"


def test_failed_step_stops_the_host_and_skips_the_rest():
    host = FakeHost()
    steps = [FileStep("a", "/a", "x", notify=["h"]), FailingStep("b", "/b", "y"), FileStep("c", "/c", "z")]
    results = converge(steps, host, handlers=[CountingHandler("h", "/h", "")])
    assert statuses(results) == [("a", "changed"), ("b", "failed"), ("c", "skipped"), ("h", "skipped")]
    assert results[1].message == "disk full"
    assert "/c" not in host.files


def scoped(step: Step, scope: str) -> Step:
    step.scope = scope
    return step


@pytest.mark.parametrize("concurrency", [1, 3])
def test_a_failed_step_of_a_scope_skips_only_that_scope(concurrency: int):
    """A further stack whose step fails (its image gone from the site) skips its own later steps only:
    the other stack's steps and the steps of no scope after it still run, handlers too; the failure of
    a step of no scope still stops everything after it."""
    host = FakeHost()
    steps = [FileStep("a", "/a", "x", notify=["h"]), scoped(FailingStep("seed-image", "/s1", "y"), "stack seed"),
             scoped(FileStep("other-venv", "/o", "o"), "stack other"), scoped(FileStep("seed-venv", "/s2", "z"), "stack seed"),
             FileStep("helpers", "/helpers", "h")]
    for step in steps:
        step.concurrent = True
    results = converge(steps, host, handlers=[CountingHandler("h", "/h", "")], concurrency=concurrency)
    assert statuses(results) == [("a", "changed"), ("seed-image", "failed"), ("other-venv", "changed"),
                                 ("seed-venv", "skipped"), ("helpers", "changed"), ("h", "changed")]
    assert results[3].message == "not run: an earlier step of stack seed failed" and "/s2" not in host.files
    host = FakeHost()
    results = converge([FailingStep("main", "/m", "x"), scoped(FileStep("seed-venv", "/s2", "z"), "stack seed")], host)
    assert statuses(results) == [("main", "failed"), ("seed-venv", "skipped")]


def test_failure_on_one_host_leaves_another_alone():
    good, bad = FakeHost("good"), FakeHost("bad")
    bad.files["/b"] = "x"

    class OnlyFailsOnBad(FileStep):
        def apply(self, host):
            if host.name == "bad":
                raise SitestackError("broken host")
            super().apply(host)

    steps = [OnlyFailsOnBad("b", "/b", "y"), FileStep("c", "/c", "z")]
    assert statuses(converge(steps, bad)) == [("b", "failed"), ("c", "skipped")]
    assert statuses(converge(steps, good)) == [("b", "changed"), ("c", "changed")]


def test_unexpected_exception_fails_the_step_with_a_traceback_for_debug():
    results = converge([BuggyStep("bug", "/x", "y"), FileStep("next", "/n", "n")], FakeHost())
    assert statuses(results) == [("bug", "failed"), ("next", "skipped")]
    assert "ZeroDivisionError" in results[0].message and "Traceback" in results[0].detail


def test_handlers_run_once_however_many_notify():
    host = FakeHost()
    handler = CountingHandler("reload", "/h", "done")
    steps = [FileStep(n, f"/{n}", n, notify=["reload"]) for n in "abc"]
    results = converge(steps, host, handlers=[handler])
    assert statuses(results)[-1] == ("reload", "changed")
    assert results[-1].handler and results[-1].message == "notified by a"
    assert handler.applied == 1
    again = converge(steps, host, handlers=[handler])
    assert [r.status for r in again] == ["ok", "ok", "ok"]  # nothing changed: handler not notified
    assert handler.applied == 1


def test_tags_select_steps():
    steps = [FileStep("a", "/a", "1", tags=["build"]), FileStep("b", "/b", "2", tags=["modules"]),
             FileStep("c", "/c", "3", tags=["always"])]
    results = converge(steps, FakeHost(), tags=["modules"])
    assert statuses(results) == [("a", "skipped"), ("b", "changed"), ("c", "changed")]
    results = converge(steps, FakeHost(), skip_tags=["modules", "always"])
    assert statuses(results) == [("a", "changed"), ("b", "skipped"), ("c", "skipped")]
    assert selected(steps[0], tags=["a"])  # a step's name works as a tag


def test_unprobeable_step_is_planned_in_check_mode_and_fails_when_applying():
    step = UnprobeableStep("mods", "/m", "x")
    planned = converge([step], FakeHost().read_only_view(), check=True)
    assert planned[0].status == "changed" and not planned[0].probed
    assert planned[0].message == "would mods (not probed: no module system)"
    applied = converge([step], FakeHost())
    assert applied[0].status == "failed" and applied[0].message == "cannot run: no module system"


def test_host_that_is_not_the_site_is_planned_without_probing():
    host = FakeHost()
    step = FileStep("a", "/a", "x")
    results = converge([step], host.read_only_view(), check=True, not_probed="not a lumi host")
    assert results[0].status == "changed" and not results[0].probed
    assert host.probes == []
    assert converge([step], host, not_probed="not a lumi host")[0].status == "failed"
    assert host.files == {}


def test_check_mode_keeps_planning_after_a_failure():
    steps = [BuggyStep("bug", "/x", "y"), FileStep("next", "/n", "n")]
    results = converge(steps, FakeHost().read_only_view(), check=True)
    assert statuses(results) == [("bug", "failed"), ("next", "changed")]


def test_diff_is_collected_only_when_asked():
    class DiffStep(FileStep):
        def diff(self, host):
            return f"-{host.read_text(self.path)}\n+{self.text}\n"

    host = FakeHost()
    host.files["/d"] = "old"
    assert converge([DiffStep("d", "/d", "new")], host.read_only_view(), check=True)[0].diff is None
    assert converge([DiffStep("d", "/d", "new")], host.read_only_view(), check=True, want_diff=True)[0].diff == "-old\n+new\n"
