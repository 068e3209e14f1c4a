"""The corpus of malformed playbooks: each is refused with one message naming file, line and
key, exit code 1, no traceback, and nothing written anywhere.

Each file in tests/data/bad/ says what it expects in its first two lines
(``# expect-key: KEY`` and ``# expect: FRAGMENT``) and marks the offending line with
``# <- error`` (no marker: line 1).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import tree

BAD = sorted((Path(__file__).parent / "data" / "bad").glob("*.yml"))


def expectation(path: Path) -> tuple[int, str, str]:
    lines = path.read_text().splitlines()
    key = lines[0].removeprefix("# expect-key:").strip()
    fragment = lines[1].removeprefix("# expect:").strip()
    marked = [i + 1 for i, line in enumerate(lines) if "# <- error" in line]
    return (marked[0] if marked else 1), key, fragment


def test_corpus_is_big_enough():
    assert len(BAD) >= 25


@pytest.mark.parametrize("path", BAD, ids=[p.stem for p in BAD])
def test_bad_playbook_is_refused(path: Path, cli, tmp_path: Path):
    line, key, fragment = expectation(path)
    prefix = tmp_path / "prefix"
    home = tmp_path / "home"
    home.mkdir()
    result = cli("provision", "--playbook", str(path), "--prefix", str(prefix),
                 env={"HOME": str(home), "SITESTACK_LOG_DIR": str(tmp_path / "logs")})
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    message = result.stderr.strip()
    assert len(message.splitlines()) == 1, message
    where = f"{path}:{line}" if not key else f"{path}:{line}: {key}:"
    shown = message.replace(str(Path.cwd()) + "/", "")
    assert re.search(re.escape(str(path.name)) + rf":{line}\b", shown), (where, message)
    if key:
        assert f": {key}:" in message, (key, message)
    assert fragment in message, (fragment, message)
    assert result.stdout == ""  # nothing ran, nothing planned
    assert not prefix.exists() and tree(home) == [] and not (tmp_path / "logs").exists()


def test_unknown_site_names_the_option_and_known_sites(cli):
    result = cli("provision", "--site", "atlantis")
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "error: --site: unknown site 'atlantis' (known sites: " + ", ".join(
            sorted(p.stem for p in (Path(__file__).parent.parent / "playbooks").glob("*.yml"))) + ")")


def test_unknown_tag_is_refused(cli, tmp_path: Path):
    result = cli("provision", "--site", "local", "--check", "--tags", "nosuchtag", "--prefix", str(tmp_path / "p"))
    assert result.returncode == 1
    assert "--tags: no step of playbooks/local.yml has tag 'nosuchtag'" in result.stderr
    assert not (tmp_path / "p").exists()


def test_show_site_refuses_bad_playbook_too(cli):
    path = Path(__file__).parent / "data" / "bad" / "wrong-type-int.yml"
    result = cli("show-site", "--playbook", str(path))
    assert result.returncode == 1
    assert "facts.node.cores: expected an integer, got a string ('two')" in result.stderr


def test_missing_site_option_is_explained(cli):
    result = cli("provision", "--check")
    assert result.returncode == 1
    assert result.stderr.strip() == "error: --site: missing: name a site (see `invoke sites`) or give --playbook FILE"
