"""The check table and the launcher table: each name is spelled in its table only, and a row is all
a new check or launcher needs (its function or template exists, everything derived agrees)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

from sitestack.core.shipped import imported
from sitestack.onsite import launchers
from sitestack.onsite.ddpcheck import checks, rank_progress, runner
from sitestack.onsite.ddpcheck.ranks import discover_rank
from sitestack.validation.jobs import TEMPLATES

PACKAGE = Path(__file__).resolve().parent.parent / "sitestack"
TABLES = {"onsite/ddpcheck/checks.py", "onsite/launchers.py"}

#: Words that are a check's or a launcher's name and also name something else, where that other thing
#: is meant: module -> the words allowed there.
PACKAGES = {"mpi4py", "horovod"}  # the recipes and import names of the packages the checks are named after
ALLOWED: dict[str, set[str]] = {
    **{m: PACKAGES for m in ("cli/build_tasks.py", "engine/partial_run.py", "installs/venv_stack.py",
                             "onsite/ddpcheck/mpi.py", "onsite/ddpcheck/result_file.py")},
    "installs/venv_manifest.py": PACKAGES | {"environment"},  # a venv's source kind: created with the environment
    "onsite/ddpcheck/libraries.py": PACKAGES | {"net-plugin"},  # the kinds of library a rank maps
    "installs/modulefile_specs.py": {"net-plugin"},  # the network plugin's module-file template
    "engine/perflog.py": {"compute"},  # a performance variable of the ReFrame-style perflog
    "onsite/ddpcheck/training.py": {"checkpoint"},  # the checkpoint's directory in the results
    # the site's MPI launch command (facts mpi.launcher: srun, mpiexec or mpirun) and srun as a
    # command, not the validation job's launcher
    "model/facts.py": {"srun", "mpiexec"},
    "installs/target.py": {"srun", "mpiexec"},
    "installs/installer.py": {"srun"},
    "onsite/fingerprint.py": {"srun"},
    "validation/jobs.py": PACKAGES | {"srun", "mpiexec"},
    "validation/launch_helpers.py": {"srun", "mpiexec"},
}


def _names() -> dict[str, str]:
    """Every name the tables hold -> what it names (a launcher's detected labels where they are distinct)."""
    names = {name: "check" for name in checks.CHECKS}
    names.update({name: "launcher" for name in launchers.LAUNCHERS})
    for source in launchers.RANK_SOURCES:
        if source.launcher is not None:  # "env" (and "none") are words too common to be names here
            names.setdefault(source.label, "rank source")
    return names


def _keys_and_docs(tree: ast.AST) -> set[int]:
    """The constants that are a key of a document (a dict display's key, a subscript other than
    ``run.checks[...]``, the first argument of ``.get``/``.pop``/``.setdefault``), or a docstring: the
    sections of result.json and check-config.json are named after the checks that fill them."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            out.update(id(k) for k in node.keys if k is not None)
        elif isinstance(node, ast.Subscript):
            if not (isinstance(node.value, ast.Attribute) and node.value.attr == "checks"):
                out.add(id(node.slice))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args \
                and node.func.attr in ("get", "pop", "setdefault"):
            out.add(id(node.args[0]))
        elif isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body \
                and isinstance(node.body[0], ast.Expr):
            out.add(id(node.body[0].value))
    return out


def spelled_outside(root: Path = PACKAGE) -> list[str]:
    """Where a check's, launcher's or rank source's name is a string constant outside its table."""
    names, found = _names(), []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel in TABLES:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip = _keys_and_docs(tree)
        hits = [node for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)
                and node.value in names and id(node) not in skip and node.value not in ALLOWED.get(rel, set())]
        found += [f"{rel}:{n.lineno}: {names[str(n.value)]} {n.value!r}" for n in sorted(hits, key=lambda n: n.lineno)]
    return found


def test_no_check_or_launcher_name_is_spelled_outside_its_table() -> None:
    assert spelled_outside() == []


def test_the_scan_finds_a_name_spelled_outside_its_table(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text('"""ddp in a docstring"""\nrun.set("ddp", "passed", "ok")\n'
                                   'result.get("bandwidth")\nrun.checks["mpi-probe"]\nif x == "torchrun": pass\n'
                                   'y = "mpiexec (Hydra)"\n')
    assert spelled_outside(tmp_path) == ["a.py:2: check 'ddp'", "a.py:4: check 'mpi-probe'",
                                         "a.py:5: launcher 'torchrun'", "a.py:6: rank source 'mpiexec (Hydra)'"]


def test_every_check_row_is_enough() -> None:
    """The names derive from the rows in their order; every row's function exists and takes the run;
    every need is decided by the runner; every phase a row owns is a phase before the checks."""
    assert tuple(dict.fromkeys(row.name for row in checks.ROWS)) == checks.CHECKS
    assert len(checks.CHECKS) == len(set(checks.CHECKS))
    for row in checks.ROWS:
        assert callable(runner.function_of(row)), row
        assert set(row.needs) <= set(runner.NEEDS), row
    assert rank_progress.PHASES[3:3 + len(checks.CHECKS)] == checks.CHECKS
    assert set(checks.PHASE_CHECK) <= set(rank_progress.PHASES[:3])
    assert {"startup": checks.ENVIRONMENT.name, "import torch": checks.ENVIRONMENT.name,
                                  "MPI_Init": checks.MPI4PY.name} == checks.PHASE_CHECK
    assert {checks.MPI_PROBE.name, checks.MPI4PY.name, checks.HOROVOD.name} == checks.KEEP_NOT_RUN
    # each row constant is in the table, and each check's first row is its constant
    module = importlib.import_module(checks.__name__)
    rows = {v.name: v for v in vars(module).values() if isinstance(v, checks.CheckRow)}
    assert set(rows) == set(checks.CHECKS)
    assert all(next(r for r in checks.ROWS if r.name == name) is row for name, row in rows.items())


def test_every_check_rows_module_ships_with_the_job() -> None:
    """The job directory holds what its entry point imports (core/shipped.py), and a subpackage whole:
    the module of every row is there, though the runner loads it by name only when the row runs."""
    shipped = set(imported("ddp_check"))
    missing = sorted({row.function.partition(":")[0] for row in checks.ROWS} - {
        Path(m).stem for m in shipped if m.startswith("ddpcheck/")})
    assert missing == [], f"rows whose module the job would lack: {missing}"


def test_every_launcher_row_is_enough() -> None:
    """Each launcher has its template, each rank source belongs to a launcher of the table (or none),
    and each launcher's ranks are found by at least one source."""
    for name, row in launchers.LAUNCHERS.items():
        assert (TEMPLATES / row.template).is_file(), row
        assert row.sources, name
    for source in launchers.RANK_SOURCES:
        assert source.launcher is None or source.launcher in launchers.LAUNCHERS, source
    assert launchers.local_launchers() == ("mpiexec", "torchrun", "horovodrun")
    assert launchers.tune_launchers() == ("srun", "mpiexec", "torchrun")
    assert launchers.in_words(["a", "b", "c"]) == "a, b or c" and launchers.in_words(["a"]) == "a"


def test_each_rank_source_is_detected_by_its_own_variables() -> None:
    """A rank source's row is what discover_rank reads: its variables alone give its label."""
    for source in launchers.RANK_SOURCES:
        env = {name: "1" for name in (*source.any_of[:1], *source.all_of)}
        env.update({source.rank: "1", source.size[0]: "2"})
        if source.local:
            env[source.local] = "1"
        info = discover_rank(env)
        assert (info.launcher, info.rank, info.world_size) == (source.label, 1, 2), source
    assert discover_rank({}).launcher == launchers.NO_LAUNCHER.label
    assert launchers.rank_source("torchrun").sets_master and not launchers.rank_source("srun").sets_master
    assert not launchers.rank_source("env").horovod and launchers.rank_source("unknown").mpi


def test_the_net_plugin_fact_offers_the_plugins_of_the_comm_table():
    """``facts.network.net_plugin`` is a checked choice of exactly the plugins sources/comm/libraries.yml
    describes (whose NET names the validation job forces): a plugin added to the table is a choice, a
    choice without a row could never be forced by name, and a typo is refused with the closest name."""
    import dataclasses
    import typing

    import pytest

    from sitestack.core import schema
    from sitestack.core.errors import InputError
    from sitestack.model import comm_libraries
    from sitestack.model.facts import Network

    hints = typing.get_type_hints(Network)
    field = next(f for f in dataclasses.fields(Network) if f.name == "net_plugin")
    literal = next(a for a in typing.get_args(hints[field.name]) if typing.get_origin(a) is typing.Literal)
    assert set(typing.get_args(literal)) == {row.plugin for row in comm_libraries.table().plugins}
    with pytest.raises(InputError, match=r"net_plugin: must be one of 'aws-ofi-rccl', 'aws-ofi-nccl', not 'aws-ofi-rcl' "
                                         r"\(did you mean 'aws-ofi-rccl'\?\)"):
        schema.build(Network, {"fabric": "slingshot-11", "net_plugin": "aws-ofi-rcl"}, "f.yml")
