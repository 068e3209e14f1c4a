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
#: Self-contained programs shipped to sites as single files: they import nothing of sitestack.
STANDALONE = {"programs"}
#: Modules of the validation package that run on the site on their own (no sitestack imports): the
#: check program's entry point and every module of its package, its report and plot, the NCCL log reader.
STANDALONE_MODULES = {"sitestack.validation.ddp_check", "sitestack.validation.ddp_report", "sitestack.validation.report_plot",
                      "sitestack.validation.nccl_log", "sitestack.validation.nccl_lines", "sitestack.validation.nccl_parse",
                      "sitestack.validation.nccl_nodes", "sitestack.validation.history"}
#: Packages shipped whole beside those modules: each of their modules is standalone too.
STANDALONE_PACKAGES = ("sitestack.validation.ddpcheck",)


def standalone(name: str) -> bool:
    """Whether ``name`` is shipped to sites as a program (it may import only other shipped modules)."""
    return (layer_of(name) in STANDALONE or name in STANDALONE_MODULES
            or any(name == p or name.startswith(p + ".") for p in STANDALONE_PACKAGES))


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


def test_imports_go_down_the_layers():
    wrong = []
    for name, targets in graph().items():
        layer = layer_of(name)
        if standalone(name):
            # shipped programs import one another from the directory they are installed in
            parents = {n.rsplit(".", 1)[0] for n in STANDALONE_MODULES} | {"sitestack.programs"}
            wrong += [f"{name} -> {t} (a shipped program imports nothing of sitestack but other shipped programs)"
                      for t in targets if not standalone(t) and t not in parents]
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


#: Programs shipped to sites as one self-contained file each, named in docs/design.md: exempt from the size rule.
SHIPPED = ("sitestack.programs.activate_hook", "sitestack.validation.history", "sitestack.validation.ddp_report")


@pytest.mark.parametrize("name", [n for n in sorted(all_modules()) if n not in SHIPPED])
def test_no_module_over_400_lines(name):
    lines = len(all_modules()[name].read_text().splitlines())
    assert lines <= 400, f"{name} has {lines} lines"


def test_the_shipped_programs_are_named_in_the_design():
    design = (ROOT / "docs" / "design.md").read_text()
    for name in SHIPPED:
        assert name.replace(".", "/") + ".py" in design, f"docs/design.md does not name {name}"


@pytest.mark.parametrize("name", SHIPPED)
def test_the_single_file_programs_stay_under_750_lines(name):
    lines = len(all_modules()[name].read_text().splitlines())
    assert lines <= 750, f"{name} has {lines} lines"
