"""The documentation says what the code does: every fact, action and task is documented."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from sitestack.actions import ACTIONS
from sitestack.engine import playbook  # noqa: F401  (registers every action)
from sitestack.engine.task_glue import SETTINGS
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


# -- references inside the repository -------------------------------------------------------------

#: Texts that may name modules and files: the docs, README, and the code's docstrings and comments
#: (the code itself too: a dotted path there that does not resolve would fail anyway), and the
#: comments of the recipes and playbooks.
TEXTS = [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md", *sorted((ROOT / "sitestack").rglob("*.py")),
         *sorted((ROOT / "tests").glob("*.py")), *sorted((ROOT / "tests" / "twins").glob("*.py")), ROOT / "tasks.py",
         *sorted((ROOT / "benchmarks").glob("*.py")), *sorted((ROOT / "sources").glob("*.yml")),
         *sorted((ROOT / "playbooks").glob("*.yml"))]
TEXTS.remove(Path(__file__).resolve())   # this file's examples of stale paths are deliberate
DOTTED = re.compile(r"(?<![\w./-])sitestack(?:\.[A-Za-z_]\w*)+")
SLASHED = re.compile(r"(?<![\w./-])sitestack/[\w./*-]*[\w*]")

#: ``sitestack.<name>`` strings that are not module paths: the ``sitestack:`` settings of the
#: invoke configuration (sitestack.forks ...), the configuration file's name, the tensor name the
#: Horovod check all-reduces, and test_layers' placeholder example.
NOT_MODULES = {f"sitestack.{key}" for key in SETTINGS} | {"sitestack.yaml", "sitestack.check", "sitestack.x",
                                                          "sitestack.x.y",
                                                          # made by setup.py in a wheel only (core/paths.py)
                                                          "sitestack/_data"}

def _defines(path: Path, name: str) -> bool:
    """Whether the module at ``path`` defines or imports ``name`` at any level."""
    pattern = rf"^\s*(?:async\s+)?(?:def|class)\s+{name}\b|^\s*{name}\s*[:=]|^\s*(?:from\s+\S+\s+)?import\s+.*\b{name}\b"
    return re.search(pattern, path.read_text(), re.M) is not None


def dotted_exists(ref: str) -> bool:
    """Whether ``sitestack.a.b.c`` names a package, a module, or something a module defines."""
    parts, path = ref.split("."), ROOT
    for i, part in enumerate(parts):
        if (path / part).is_dir():
            path = path / part
        elif (path / f"{part}.py").is_file():
            rest = parts[i + 1:]
            return not rest or _defines(path / f"{part}.py", rest[0])
        elif (path / "__init__.py").is_file():
            return _defines(path / "__init__.py", part)
        else:
            return False
    return True


def slashed_exists(ref: str) -> bool:
    return bool(list(ROOT.glob(ref))) if "*" in ref else (ROOT / ref).exists()


def stale_references(path: Path) -> list[str]:
    """``file:line: reference`` for each sitestack module path or file path in ``path`` that does not exist."""
    found = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        refs = [(m.group(0).rstrip("."), dotted_exists) for m in DOTTED.finditer(line)]
        refs += [(m.group(0).rstrip("."), slashed_exists) for m in SLASHED.finditer(line)]
        found += [f"{path.relative_to(ROOT)}:{number}: {ref}" for ref, exists in refs
                  if ref not in NOT_MODULES and not exists(ref)]
    return found


def test_the_reference_checker_finds_stale_paths(tmp_path):
    """The checker itself: moved modules and attributes are caught, existing ones are not."""
    assert dotted_exists("sitestack.core.errors.SitestackError") and dotted_exists("sitestack.packages.horovod")
    assert dotted_exists("sitestack.installs.stamp.installed_wheel") and slashed_exists("sitestack/packages/horovod*.py")
    assert not dotted_exists("sitestack.errors.SitestackError") and not dotted_exists("sitestack.install.installed_wheel")
    assert not dotted_exists("sitestack.installs.stamp.no_such_function") and not slashed_exists("sitestack/horovod.py")


def test_docs_and_docstrings_name_only_modules_and_files_that_exist():
    """Every ``sitestack.x.y`` and ``sitestack/x/y.py`` in the docs, README and the code's texts exists."""
    stale = [ref for path in TEXTS for ref in stale_references(path)]
    assert not stale, "\n".join(stale)


#: What points outside the repository: the site documents' local copies and our research notes.
#: Cite the public page by URL instead. (Built from pieces, so that this file does not match itself.)
OUTSIDE = re.compile("|".join([r"seed\s+0" + "0", r"\bseed" + "s'", r"\bpeer" + r"s\s*(?:s|§)\s*\d",
                               r"(?<![\w.-])resea" + "rch/", r"\.\./" + "shared"]), re.I)
OUTSIDE_DIRS = ("sitestack", "playbooks", "docs", "tests", "sources", "benchmarks", "scripts")
BINARY = {".pyc", ".gz", ".tar", ".whl", ".so", ".sif", ".png"}


def test_the_outside_pattern_catches_each_kind_of_pointer():
    """The pattern itself: each kind of outside pointer matches, a public URL does not."""
    for text in ("(seed " + "001)", "the seed" + "s' fixed port", "(peer" + "s s5.3)", "(peer" + "s §5.2)", "resea" + "rch/peers.md",
                 "../" + "shared/x"):
        assert OUTSIDE.search(text), text
    assert not OUTSIDE.search("(https://docs.olcf.ornl.gov/software/python/pytorch_frontier.html, peers' scripts)")


def test_nothing_points_outside_the_repository():
    """No file under sitestack/, playbooks/, docs/, tests/ (test data aside), sources/, benchmarks/,
    scripts/, nor README.md or tasks.py, cites the local copies of the site documents or research
    notes: comments and docs cite public URLs."""
    files = [ROOT / "README.md", ROOT / "tasks.py"] + [
        path for top in OUTSIDE_DIRS for path in sorted((ROOT / top).rglob("*"))
        if path.is_file() and path.suffix not in BINARY and "__pycache__" not in path.parts
        and not path.is_relative_to(ROOT / "tests" / "data")]
    hits = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}" for path in files
            for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1) if OUTSIDE.search(line)]
    assert not hits, "\n".join(hits)
