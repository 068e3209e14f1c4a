"""The sites' own user commands (tests/data/site_commands/<site>.yaml) are well-formed data.

Each file lists, for one site, every command its public documents show users typing, copied
verbatim, and says for each what sitestack does with it: run it on the site's twin (with only the
document's own placeholders, what it tells users to choose, and what the twin's hardware forces
substituted, each with a reason), replace it by one of sitestack's own tasks (``served_by``), or
not serve it (``served: false``, with the reason). The runner that executes them on the twins reads
the same files; this module checks only the data, fast and without a twin, and prints the counts
per site. The format is described in tests/data/site_commands/README.md.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.test_docs import OUTSIDE  # what would point at local copies of the documents, not their URLs

DATA = Path(__file__).resolve().parent / "data" / "site_commands"
FILES = DATA / "files"
SITES = ("lumi", "frontier", "dawn", "cirrus")
KEBAB = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
WHERE = {"login", "job", "container", "file"}
KINDS = {"placeholder", "choice", "sitestack", "twin", "stand-in", "display"}
TORCH_FROM = {"image", "staged", "env"}
EXPECT_KEYS = {"exit", "output", "stdout_regex", "stdout_absent_regex", "torch_from", "world_size", "env_inside",
               "env_inside_regex"}

#: (served: run on the twin, served_by: replaced by a sitestack task, not served, files the user writes)
COUNTS = {
    "lumi": (11, 4, 0, 1),
    "frontier": (6, 10, 1, 0),
    "dawn": (3, 7, 1, 0),
    "cirrus": (8, 6, 0, 0),
}


def load(site: str) -> dict[str, Any]:
    data = yaml.safe_load((DATA / f"{site}.yaml").read_text())
    assert isinstance(data, dict), site
    return data


def status(command: dict[str, Any]) -> str:
    """served, served_by, not_served or file: what the runner does with the command."""
    if command.get("served") is False:
        return "not_served"
    if "served_by" in command:
        return "served_by"
    return "file" if command.get("where") == "file" else "served"


def check_expect(where: str, expect: Any, context: str) -> None:
    """An ``expect`` block: known keys, an exit status, regexes that compile, known torch origins."""
    assert isinstance(expect, dict), f"{context}: expect must be a mapping"
    assert set(expect) <= EXPECT_KEYS, f"{context}: unknown expect keys {set(expect) - EXPECT_KEYS}"
    assert isinstance(expect.get("exit"), int), f"{context}: expect.exit is required"
    if where == "job":
        assert isinstance(expect.get("output"), str), f"{context}: a job says which output file is read"
    for key in ("stdout_regex", "stdout_absent_regex"):
        for pattern in expect.get(key, []):
            re.compile(pattern)
    if "torch_from" in expect:
        assert expect["torch_from"] in TORCH_FROM, f"{context}: torch_from {expect['torch_from']!r}"
    if "world_size" in expect:
        assert isinstance(expect["world_size"], int) and expect["world_size"] > 0, context
    for name, value in expect.get("env_inside", {}).items():
        assert isinstance(value, str), f"{context}: env_inside {name} must be a string"
    for pattern in expect.get("env_inside_regex", {}).values():
        re.compile(pattern)


def step_tags(site: str) -> set[str]:
    """The tags of the steps of ``playbooks/<site>.yml``."""
    steps = yaml.safe_load((DATA.parents[2] / "playbooks" / f"{site}.yml").read_text())["steps"]
    return {tag for step in steps for tag in step.get("tags") or ()}


def check_run(entry: dict[str, Any], ids: list[str], context: str) -> None:
    """What a run needs: where, the job's script and submission, an earlier shell, the files, the
    playbook tags it depends on, expect. ``context`` starts with ``<site>:``."""
    where = entry.get("where")
    assert where in WHERE, f"{context}: where {where!r}"
    for need in entry.get("needs", []):
        assert need == "provision" or need in ids, f"{context}: needs {need!r}, not an earlier command"
    for name in entry.get("files", []):
        assert (FILES / name).is_file(), f"{context}: no file {name} under {FILES}"
    if where == "file":
        assert isinstance(entry.get("path"), str), f"{context}: a file entry names its path"
        return
    if where == "job":
        assert isinstance(entry.get("script"), str) and entry["script"] in entry.get("submit", ""), \
            f"{context}: a job names its script and the submission line that submits it"
    assert set(entry.get("twin_tags", [])) <= step_tags(context.split(":")[0]), f"{context}: twin_tags must be tags of the site's playbook steps"
    if where == "container":
        assert entry.get("inside") in ids, f"{context}: inside must name the earlier command that opens the shell"
    check_expect(where, entry.get("expect"), context)
    for variant in entry.get("variants", []):
        assert KEBAB.match(variant.get("name", "")), f"{context}: variant name"
        check_expect(where, variant.get("expect"), f"{context} variant {variant['name']}")


def apply_substitutions(command: dict[str, Any], context: str) -> str:
    """The text the runner runs: each substitution replaces text present in ``verbatim`` (in order)."""
    text = command["verbatim"]
    for sub in command.get("substitutions", []):
        assert set(sub) == {"from", "to", "kind", "why"}, f"{context}: substitution keys {set(sub)}"
        assert sub["kind"] in KINDS, f"{context}: substitution kind {sub['kind']!r}"
        assert isinstance(sub["why"], str) and sub["why"].strip(), f"{context}: a substitution says why"
        assert sub["from"] and sub["from"] in text, f"{context}: {sub['from']!r} is not in the verbatim text"
        text = text.replace(sub["from"], sub["to"])
    return text


def check_command(site: str, command: dict[str, Any], documents: dict[str, str], ids: list[str]) -> None:
    context = f"{site}:{command.get('id')}"
    assert KEBAB.match(command.get("id", "")), f"{context}: id must be kebab-case"
    assert command["document"] in documents, f"{context}: document {command['document']!r} is not listed"
    assert isinstance(command.get("section"), str) and command["section"].strip(), f"{context}: section"
    assert isinstance(command.get("verbatim"), str) and command["verbatim"].strip(), f"{context}: verbatim"
    apply_substitutions(command, context)
    kind = status(command)
    if kind in ("served_by", "not_served"):
        assert isinstance(command.get("why"), str) and command["why"].strip(), f"{context}: {kind} says why"
        assert "where" not in command and "expect" not in command, f"{context}: {kind} is not run as written"
    if kind == "served_by":
        assert isinstance(command["served_by"], str) and command["served_by"].strip(), context
        if "replacement" in command:
            replacement = command["replacement"]
            assert isinstance(replacement.get("run"), str) and replacement["run"].strip(), f"{context}: replacement.run"
            check_run(replacement, ids, f"{context} replacement")
    elif kind in ("served", "file"):
        check_run(command, ids, context)


@pytest.mark.parametrize("site", SITES)
def test_site_commands_file(site: str) -> None:
    """The file is well-formed: ids unique, documents https URLs, substitutions only of text present,
    every run command with its expected exit status, every command not run with its reason."""
    data = load(site)
    assert data["site"] == site
    assert isinstance(data.get("account"), str) and isinstance(data.get("workdir"), str)
    documents = data["documents"]
    assert documents and all(re.match(r"^https://\S+$", url) for url in documents.values()), documents
    ids: list[str] = []
    for command in data["commands"]:
        assert command.get("id") not in ids, f"{site}: duplicate id {command.get('id')}"
        check_command(site, command, documents, ids)
        ids.append(command["id"])
    unused = set(documents) - {c["document"] for c in data["commands"]}
    assert not unused, f"{site}: documents no command comes from: {unused}"


@pytest.mark.parametrize("site", SITES)
def test_no_local_copies_named(site: str) -> None:
    """The data cites the documents by their public URLs only (test_docs' rule, which skips tests/data)."""
    lines = (DATA / f"{site}.yaml").read_text().splitlines()
    assert not [line for line in lines if OUTSIDE.search(line)]


def test_counts_per_site(capsys: pytest.CaptureFixture[str]) -> None:
    """The counts reported for the sites (served on the twin, served by a sitestack task, not served)."""
    found = {}
    for site in SITES:
        kinds = [status(c) for c in load(site)["commands"]]
        found[site] = tuple(kinds.count(k) for k in ("served", "served_by", "not_served", "file"))
    with capsys.disabled():
        for site, (served, served_by, not_served, files) in found.items():
            print(f"\n{site}: {served} served on the twin, {served_by} served by a sitestack task, "
                  f"{not_served} not served, {files} file(s) the user writes")
    assert found == COUNTS
