"""The package's shape: imports go one way (down the layers of docs/design.md), never in a cycle,
and the action table is the same whichever module is imported first."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "sitestack"

#: Each subpackage's layer: a module may import from its own layer and the ones below, never above.
LAYERS = {"core": 0, "model": 1, "builders": 2, "packages": 3, "installs": 4, "validation": 4, "actions": 5,
          "engine": 6, "cli": 7}
#: The package that runs on sites' nodes (sitestack/onsite/): standard library only, and nothing of
#: sitestack outside it; everything shipped to a site lives there, and nothing else is shipped.
ONSITE = "onsite"
STANDALONE = {ONSITE}


def standalone(name: str) -> bool:
    """Whether ``name`` runs on sites (it may import only the standard library and the on-site package)."""
    return layer_of(name) == ONSITE


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """Every sitestack module ``name`` imports, at module level or inside functions."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            targets = [module] + [f"{module}.{a.name}" for a in node.names]
        for target in targets:
            if target in known and target != name:
                found.add(target)
    # "from sitestack.x import y" names module sitestack.x.y where y is a module; otherwise sitestack.x.
    return found


def graph() -> dict[str, set[str]]:
    mods = all_modules()
    return {name: imports_of(name, path, set(mods)) for name, path in mods.items()}


def layer_of(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else None


def test_no_import_cycles():
    edges = graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    sys.setrecursionlimit(10000)
    for v in edges:
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_no_import_cycles_between_packages():
    """Two subpackages never import each other, even through modules that do not form a module cycle
    (installs/ and validation/ did: each is then one package in all but name)."""
    edges: dict[str, set[str]] = {}
    for name, targets in graph().items():
        edges.setdefault(str(layer_of(name)), set()).update(str(layer_of(t)) for t in targets)
    reach = {a: set(bs) - {a} for a, bs in edges.items()}
    for _ in edges:  # the transitive closure: a cycle of any length shows as two packages reaching each other
        reach = {a: bs.union(*(reach.get(b, set()) for b in bs)) for a, bs in reach.items()}
    both = sorted({tuple(sorted((a, b))) for a, bs in reach.items() for b in bs if a != b and a in reach.get(b, set())})
    assert not both, f"subpackages that import each other (directly or through others): {both}"


def test_imports_go_down_the_layers():
    wrong = []
    for name, targets in graph().items():
        layer = layer_of(name)
        if standalone(name):
            wrong += [f"{name} -> {t} (the on-site package imports nothing of sitestack outside it)"
                      for t in targets if not standalone(t)]
            continue
        if layer not in LAYERS:
            continue
        for target in targets:
            other = layer_of(target)
            if other in LAYERS and LAYERS[other] > LAYERS[layer]:
                wrong.append(f"{name} ({layer}) -> {target} ({other})")
    assert not wrong, "imports that go up a layer:\n" + "\n".join(wrong)


def test_no_action_imports_another_action():
    """Actions share helpers through the layers below (installs/, model/), never through each other:
    only actions/action.py and the table in actions/__init__.py may be imported by an action."""
    allowed = {"sitestack.actions", "sitestack.actions.action"}
    wrong = [f"{name} -> {target}" for name, targets in graph().items()
             if layer_of(name) == "actions" and name not in allowed
             for target in targets if layer_of(target) == "actions" and target not in allowed]
    assert not wrong, "actions that import another action:\n" + "\n".join(wrong)



def test_module_names_are_not_reused_across_subpackages():
    """A module's name says what it holds in its own layer: no two subpackages hold a module of the
    same name (``engine/cli.py`` beside the ``cli/`` package, or two ``launch_env.py``, read as one)."""
    seen: dict[str, list[str]] = {}
    for name in all_modules():
        parts = name.split(".")
        if len(parts) > 2 and parts[-1] != "__init__":
            seen.setdefault(parts[-1], []).append(name)
    subpackages = {p.name for p in PACKAGE.iterdir() if p.is_dir()}
    reused = {base: names for base, names in seen.items() if len(names) > 1 or base in subpackages}
    assert not reused, f"module names used twice (or named like a subpackage): {reused}"

def test_every_subpackage_is_in_the_layer_table():
    """A new subpackage must be given its place: in LAYERS, or in STANDALONE when shipped on its own."""
    subpackages = {p.name for p in PACKAGE.iterdir() if p.is_dir() and any(p.glob("*.py"))}
    missing = sorted(subpackages - set(LAYERS) - STANDALONE)
    assert not missing, f"subpackages not in tests/test_layers.py LAYERS or STANDALONE: {missing}"
    assert not (set(LAYERS) | STANDALONE) - subpackages, "the layer table names a subpackage that is gone"


#: The longest a function or method in sitestack/ may be, in lines (its decorators and docstring included).
MAX_FUNCTION_LINES = 60


def long_functions() -> dict[str, str]:
    """qualified name -> where and how long, for every function over the limit."""
    out = {}
    for name, path in all_modules().items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                length = (node.end_lineno or node.lineno) - first + 1
                if length > MAX_FUNCTION_LINES:
                    out[f"{name}.{node.name}"] = f"{name}:{node.lineno} {node.name} ({length} lines)"
    return out


def test_no_function_over_60_lines():
    found = long_functions()
    assert not found, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(found.values())


def test_every_module_belongs_to_a_layer():
    loose = [n for n in all_modules() if n.count(".") == 1 and n not in ("sitestack.__init__",)
             and not (PACKAGE / n.split(".")[1]).is_dir()]
    assert loose == [], f"modules outside the layers: {loose}"


def test_the_action_table_is_complete_whichever_module_is_imported_first():
    expected = None
    script = ("import importlib, json, sys; importlib.import_module(sys.argv[1]); "
              "from sitestack.actions import ACTIONS; print(json.dumps(sorted(ACTIONS)))")
    names = [n for n in all_modules() if not standalone(n)]
    procs = {n: subprocess.Popen([sys.executable, "-c", script, n], cwd=ROOT, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for n in names}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, f"import {name}: {err}"
        table = json.loads(out)
        expected = expected or table
        assert table == expected, f"importing {name} first gives {table}, not {expected}"
    assert expected and {"recipe-install", "directory", "stack-venv", "modulefiles"} <= set(expected)


@pytest.mark.parametrize("name", sorted(all_modules()))
def test_no_module_over_400_lines(name):
    lines = len(all_modules()[name].read_text().splitlines())
    assert lines <= 400, f"{name} has {lines} lines"


STDLIB = set(sys.stdlib_module_names) | {"__future__"}
#: Imports an on-site module may try and do without (a stack's own packages, probed at run time).
OPTIONAL = {"torch", "numpy", "matplotlib", "horovod", "mpi4py", "oneccl_bindings_for_pytorch"}


def test_the_on_site_package_imports_only_the_standard_library_and_itself():
    """Everything under sitestack/onsite/ runs with a node's bare Python: each import is of the
    standard library, of the package itself (relatively), or of a stack package it probes for."""
    wrong = []
    for name, path in all_modules().items():
        if not standalone(name):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            roots = ([a.name.split(".")[0] for a in node.names] if isinstance(node, ast.Import)
                     else [(node.module or "").split(".")[0]] if isinstance(node, ast.ImportFrom) and not node.level
                     else [])
            wrong += [f"{name}: import {r}" for r in roots if r not in STDLIB | OPTIONAL]
    assert not wrong, "\n".join(wrong)


def test_single_file_programs_import_nothing_of_the_package():
    """A program shipped as its own text (``python -c``, or a file copied alone) has no package beside it."""
    from sitestack.onsite import ENTRY_POINTS, SINGLE_FILE
    wrong = [f"sitestack.onsite.{m} -> {t}" for m in SINGLE_FILE for t in graph()[f"sitestack.onsite.{m}"]]
    assert not wrong, "single-file programs that import the package:\n" + "\n".join(wrong)
    modules = {p.stem for p in (PACKAGE / ONSITE).glob("*.py")}
    assert set(SINGLE_FILE) <= modules and set(ENTRY_POINTS.values()) <= modules
