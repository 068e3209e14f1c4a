"""The probe cache (sitestack/core/probecache.py) and the local command runner, with real commands:
an answer is reused only while the files it names are unchanged, and never kept when racy or failed."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from sitestack.core import probecache, yamlfile
from sitestack.core.host import LocalHost, run_local
from tests.fakehost import FakeHost


@pytest.fixture
def cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A HOME of its own, so the test's answers go to its own cache; files made by the test count as
    settled (no racy window: their ctime is now), except where a test sets the window back."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home" / ".cache" / "sitestack").mkdir(parents=True)  # made by a first run
    monkeypatch.setattr(probecache, "RACY", -60.0)
    monkeypatch.setattr(yamlfile, "RACY", -60.0)
    monkeypatch.delenv("SITESTACK_PROBE_CACHE", raising=False)
    return tmp_path / "home"


def aged(path: Path, seconds: float = 60) -> None:
    """Make ``path`` look changed ``seconds`` ago (older than the racy window)."""
    old = time.time() - seconds
    os.utime(path, (old, old))


def counting_probe(tmp_path: Path) -> tuple[list[str], Path, Path]:
    """A probe that appends to a counter file each time it really runs and prints the data file."""
    data, counter = tmp_path / "data.txt", tmp_path / "runs"
    data.write_text("one\n")
    aged(data)
    argv = ["sh", "-c", 'echo x >> "$2"; cat "$1"', "sh", str(data), str(counter)]
    return argv, data, counter


def runs(counter: Path) -> int:
    return len(counter.read_text().splitlines()) if counter.exists() else 0


def test_answer_reused_until_a_vouched_file_changes(tmp_path: Path, cache_home: Path):
    argv, data, counter = counting_probe(tmp_path)
    host = LocalHost()
    first = probecache.cached_probe(host, argv, lambda out: [str(data)])
    second = probecache.cached_probe(host, argv, lambda out: [str(data)])
    assert first.stdout == second.stdout == "one\n" and runs(counter) == 1
    data.write_text("two, longer\n")
    aged(data, 30)
    third = probecache.cached_probe(host, argv, lambda out: [str(data)])
    assert third.stdout == "two, longer\n" and runs(counter) == 2
    assert oct((cache_home / ".cache" / "sitestack" / "probes").stat().st_mode & 0o777) == "0o700"


def test_racy_failed_and_unvouched_answers_are_not_kept(tmp_path: Path, cache_home: Path,
                                                        monkeypatch: pytest.MonkeyPatch):
    argv, data, counter = counting_probe(tmp_path)
    host = LocalHost()
    monkeypatch.setattr(probecache, "RACY", 2.0)
    data.touch()  # changed just now: the probe may have read it half-written
    probecache.cached_probe(host, argv, lambda out: [str(data)])
    probecache.cached_probe(host, argv, lambda out: [str(data)])
    assert runs(counter) == 2
    monkeypatch.setattr(probecache, "RACY", -60.0)
    probecache.cached_probe(host, argv, lambda out: None)  # the caller says: not an answer to keep
    probecache.cached_probe(host, argv, lambda out: None)
    assert runs(counter) == 4
    failing = ["sh", "-c", 'echo x >> "$1"; exit 3', "sh", str(counter)]
    assert probecache.cached_probe(host, failing, lambda out: [str(data)]).rc == 3
    assert probecache.cached_probe(host, failing, lambda out: [str(data)]).rc == 3
    assert runs(counter) == 6


def test_environment_and_switch_off(tmp_path: Path, cache_home: Path, monkeypatch: pytest.MonkeyPatch):
    argv, data, counter = counting_probe(tmp_path)
    host = LocalHost()
    probecache.cached_probe(host, argv, lambda out: [str(data)])
    monkeypatch.setenv("SITESTACK_TEST_SETTING", "another environment")
    probecache.cached_probe(host, argv, lambda out: [str(data)])
    assert runs(counter) == 2
    monkeypatch.setenv("SITESTACK_PROBE_CACHE", "off")
    probecache.cached_probe(host, argv, lambda out: [str(data)])
    assert runs(counter) == 3
    fake = FakeHost()  # a stand-in host's answers are never kept
    probecache.cached_probe(fake, ["true"], lambda out: [str(data)])
    probecache.cached_probe(fake, ["true"], lambda out: [str(data)])
    assert fake.probes == ["true", "true"]


def test_shell_signature_matches_itself(tmp_path: Path):
    """The signature a shell-reached host computes (one ``stat`` command) is stable and sees changes."""
    data = tmp_path / "f"
    data.write_text("a")
    host = LocalHost()
    shell = super(LocalHost, host).file_signature  # the SSH host's way, run here
    one = shell([str(data), str(tmp_path / "missing")])
    assert one == shell([str(data), str(tmp_path / "missing")]) and one["files"][1] == []
    data.write_text("bb")
    assert shell([str(data), str(tmp_path / "missing")]) != one
    # missing paths anywhere (a dangling symlink is missing: stat -L), odd names: the same files as os.stat sees
    (tmp_path / "a dir\nb").mkdir()
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    paths = [str(tmp_path / "missing"), str(data), str(tmp_path / "dangling"), str(tmp_path / "a dir\nb"), str(tmp_path / "-x")]
    assert shell(paths)["files"] == host.file_signature(paths)["files"] and shell(paths)["files"][0] == []
    assert shell([str(tmp_path / "missing")])["files"] == [[]]
    assert "_signature_env" in host.__dict__  # read once: the later signatures have only files
    assert LocalHost().file_signature([])["env"] and super(LocalHost, LocalHost()).file_signature([])["files"] == []


def test_run_local_streams_times_out_and_kills_the_group():
    class Sink:
        def __init__(self) -> None:
            self.text = ""

        def write(self, text: str) -> int:
            self.text += text
            return len(text)

    sink = Sink()
    out = run_local("echo out; echo err >&2; exit 4", out=sink)  # type: ignore[arg-type]
    assert out.return_code == 4 and sorted(sink.text.split()) == ["err", "out"] and out.stdout == sink.text
    quiet = run_local("echo a; echo b >&2")
    assert (quiet.stdout, quiet.stderr) == ("a\n", "b\n")
    start = time.monotonic()
    slow = run_local("sleep 30 & sleep 30", timeout=0.5)  # a child keeping the pipes open is killed too
    assert slow.return_code == 124 and time.monotonic() - start < 10
    assert "timed out" in slow.stderr


def test_parsed_yaml_is_kept_while_the_file_is_unchanged(tmp_path: Path, cache_home: Path):
    data = tmp_path / "d.yml"
    data.write_text("a: 1\nb:\n  - x\n")
    aged(data)
    first = yamlfile.load_yaml(data)
    assert list((cache_home / ".cache" / "sitestack" / "parsed").iterdir())
    again = yamlfile.load_yaml(data)
    assert again == first == {"a": 1, "b": ["x"]} and again.lines == {"a": 1, "b": 2} and again["b"].lines == [3]
    data.write_text("a: 2\n")
    aged(data)
    assert yamlfile.load_yaml(data) == {"a": 2}


def test_rendered_text_is_kept_until_a_template_or_the_inputs_change(tmp_path: Path, cache_home: Path):
    from sitestack.core import templates

    tdir = tmp_path / "templates"
    tdir.mkdir()
    (tdir / "t.j2").write_text("v={{ v }}\n")
    renders: list[str] = []

    def render(v: str) -> str:
        renders.append(v)
        return templates.environment([tdir]).get_template("t.j2").render(v=v)

    assert templates.cached_text([tdir], repr(("t", "1")), lambda: render("1")) == "v=1\n"
    assert templates.cached_text([tdir], repr(("t", "1")), lambda: render("1")) == "v=1\n"
    assert renders == ["1"]
    assert templates.cached_text([tdir], repr(("t", "2")), lambda: render("2")) == "v=2\n"
    (tdir / "t.j2").write_text("value={{ v }}\n")
    assert templates.cached_text([tdir], repr(("t", "1")), lambda: render("1")) == "value=1\n"
    assert renders == ["1", "2", "1"]


def test_nothing_is_kept_before_the_first_run_made_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A fresh HOME (no ~/.cache/sitestack yet): every cache is bypassed and nothing is written there."""
    from sitestack.core import templates

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    data = tmp_path / "d.yml"
    data.write_text("a: 1\n")
    aged(data)
    yamlfile.load_yaml(data)
    templates.cached_text([tmp_path], "x", lambda: "text")
    probecache.cached_probe(LocalHost(), ["true"], lambda out: [str(data)])
    assert list((tmp_path / "home").iterdir()) == []


@pytest.mark.parametrize("tamper", [
    lambda e: {**e, "rc": "0"}, lambda e: {**e, "at": "yesterday"}, lambda e: {**e, "vouch": "/etc/passwd"},
    lambda e: {**e, "vouch": ["relative"]}, lambda e: {**e, "stdout": None}, lambda e: [e],
    lambda e: {**e, "stdout": "x" * (probecache.MAX_ENTRY_BYTES + 1)},
])
def test_an_entry_not_written_by_the_cache_is_probed_again(tmp_path: Path, cache_home: Path, tamper):
    """The cache reads back its own files: an entry of the wrong shape (or too large) is no answer, never a
    traceback: the probe runs again and its answer stands."""
    import json

    argv, data, counter = counting_probe(tmp_path)
    host = LocalHost()
    probecache.cached_probe(host, argv, lambda out: [str(data)])
    (entry,) = (cache_home / ".cache" / "sitestack" / "probes").glob("*.json")
    entry.write_text(json.dumps(tamper(json.loads(entry.read_text()))))
    again = probecache.cached_probe(host, argv, lambda out: [str(data)])
    assert again.stdout == "one\n" and runs(counter) == 2
