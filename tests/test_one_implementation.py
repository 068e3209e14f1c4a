"""Concepts the controller has exactly one implementation of: writing a file atomically, reading a
file of any size bounded, and showing text from outside on a terminal. A second copy is how the
copies drift apart (one of the two forgets the fsync, the cap or an escape)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "sitestack"


def controller_modules() -> dict[str, ast.Module]:
    return {str(p.relative_to(ROOT)): ast.parse(p.read_text(), str(p)) for p in sorted(PACKAGE.rglob("*.py"))
            if "onsite" not in p.relative_to(PACKAGE).parts}


def calls(tree: ast.Module, attr: str) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and n.func.attr == attr]


def test_one_atomic_writer_in_controller_code():
    """os.replace (the rename that makes a write atomic) only in core/files.py; everything else writes
    through it (Host.write_text, the caches, user_file)."""
    found = sorted(path for path, tree in controller_modules().items()
                   if any(isinstance(c.func, ast.Attribute) and isinstance(c.func.value, ast.Name)
                          and c.func.value.id == "os" for c in calls(tree, "replace")))
    assert found == ["sitestack/core/files.py"], found


def test_one_bounded_reader_in_controller_code():
    """A file read with a cap (read_tail of limit + 1 bytes, then a length test) only in core/bounded.py."""
    found = sorted(path for path, tree in controller_modules().items()
                   if any(isinstance(a, ast.BinOp) and isinstance(a.op, ast.Add) for c in calls(tree, "read_tail")
                          for a in c.args[1:2]))
    assert found == ["sitestack/core/bounded.py"], found


def test_one_sanitiser():
    """Escaping text for a terminal (unicode_escape, or a class of control characters) only in
    onsite/visible.py, which the controller imports too."""
    found = sorted(str(p.relative_to(ROOT)) for p in PACKAGE.rglob("*.py")
                   if "unicode_escape" in p.read_text() or "\\x00-\\x1f" in p.read_text())
    assert found == ["sitestack/onsite/visible.py"], found
