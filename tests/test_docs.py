"""The documentation says what the code does: every fact, action and task is documented."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sitestack.actions import ACTIONS
from sitestack.engine import playbook  # noqa: F401  (registers every action)
from sitestack.model.site import PLACEHOLDERS, facts_fields

ROOT = Path(__file__).resolve().parent.parent
PLAYBOOK_DOC = (ROOT / "docs" / "playbooks.md").read_text()
README = (ROOT / "README.md").read_text()


def test_generated_reference_is_fresh():
    """docs/playbooks.md's actions, facts and placeholders sections match the code."""
    result = subprocess.run([sys.executable, "-m", "sitestack.engine.reference", "--check"], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_every_fact_is_in_the_reference():
    missing = [key for key, _, _ in facts_fields() if f"| `{key}` |" not in PLAYBOOK_DOC]
    assert not missing, f"docs/playbooks.md lacks facts: {missing}"


def test_every_action_and_placeholder_is_documented():
    assert not [a for a in ACTIONS if f"### `{a}`" not in PLAYBOOK_DOC]
    assert not [p for p in PLACEHOLDERS if f"`{{{p}}}`" not in PLAYBOOK_DOC]


def test_readme_test_command_is_what_ci_runs():
    assert "\n    scripts/test.sh\n" in README
    assert "scripts/test.sh" in (ROOT / ".ci" / "run").read_text()


def test_every_task_has_a_description_and_documented_options():
    listing = subprocess.run([sys.executable, "-m", "invoke", "--list"], cwd=ROOT, capture_output=True, text=True)
    tasks = [line.split()[0] for line in listing.stdout.splitlines()[2:] if line.startswith("  ") and line.split()
             and not line.startswith("    ")]
    assert {"provision", "sites", "show-site"} <= set(tasks)
    for name in tasks:
        assert len(listing.stdout.split(f"  {name} ", 1)[1].split("\n")[0].strip()) > 10, name
        helptext = subprocess.run([sys.executable, "-m", "invoke", "--help", name], cwd=ROOT, capture_output=True,
                                  text=True).stdout
        options = [line.split()[0] for line in helptext.split("Options:")[-1].splitlines() if line.strip().startswith("--")]
        for option in options:
            row = next(line for line in helptext.splitlines() if line.strip().startswith(option))
            assert len(row.strip()) > len(option) + 5, f"{name} {option} has no help"


def test_every_setting_and_the_json_schema_are_in_the_cli_page():
    from sitestack.engine.results import SCHEMA_VERSION
    from sitestack.engine.task_glue import SETTINGS
    page = (ROOT / "docs" / "cli.md").read_text()
    assert not [key for key in SETTINGS if f"| `{key}` |" not in page]
    assert f'"schema_version": {SCHEMA_VERSION}' in page and "docs/cli.md" in README
