"""Real installs of small real projects (autotools, CMake, a Python sdist) through `invoke build-recipe`:
idempotence, rebuilds on changed inputs, the build cache, bad input and faults, kill safety, locking."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, run_invoke
from tests.recipe_projects import (
    HELLO_C,
    PATCHED_C,
    hello_recipe,
    hicmake_recipe,
    hipy_recipe,
    make_hello,
    make_hicmake,
    make_hipy,
    patch_text,
    sha256,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="session")
def tarballs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("projects")
    return {"1.0": make_hello(root, "1.0"), "1.1-raw": make_hello(root, "1.1", bootstrapped=False),
            "hicmake": make_hicmake(root), "hipy": make_hipy(root)}


class Project:
    """A scratch checkout-like layout: sources/, patches/, a prefix, caches, logs per run."""

    def __init__(self, root: Path, tarballs: dict[str, Path], name: str = "hello") -> None:
        self.root = root
        self.name = name
        self.tarballs = tarballs
        self.sources = root / "sources"
        self.patches = root / "patches" / name
        self.prefix = root / "prefix"
        self.sources.mkdir(parents=True)
        self.patches.mkdir(parents=True)
        self.env = {"SITESTACK_BUILD_CACHE": str(root / "build-cache"), "SITESTACK_SOURCE_CACHE": str(root / "src-cache")}
        self.runs = 0
        self.version = "1.0"

    @property
    def dest(self) -> Path:
        return self.prefix / self.name / self.version

    def recipe(self, text: str | None = None, **kwargs) -> None:
        if text is None:
            text = hello_recipe({"1.0": self.tarballs["1.0"]}, **kwargs)
        (self.sources / f"{self.name}.yml").write_text(text)

    def patch(self, name: str, text: str) -> None:
        (self.patches / name).write_text(text)

    def logs(self) -> Path:
        self.runs += 1
        return self.root / "logs" / str(self.runs)

    def argv(self, *extra: str) -> list[str]:
        return ["build-recipe", self.name, "--site", "local", "--sources-dir", str(self.sources),
                "--prefix", str(self.prefix), *extra]

    def run(self, *extra: str) -> subprocess.CompletedProcess[str]:
        logs = self.logs()
        out = run_invoke(*self.argv(*extra), env={**self.env, "SITESTACK_LOG_DIR": str(logs)})
        out.logs = logs  # type: ignore[attr-defined]
        return out

    def popen(self) -> tuple[subprocess.Popen, Path]:
        logs = self.logs()
        proc = subprocess.Popen([sys.executable, "-m", "invoke", *self.argv()], cwd=REPO, text=True,
                                env={**os.environ, **self.env, "SITESTACK_LOG_DIR": str(logs)},
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        return proc, logs

    def stamp(self) -> dict:
        return json.loads((self.dest / ".sitestack" / "install.json").read_text())

    def hello(self) -> str:
        return subprocess.run([str(self.dest / "bin" / "hello")], capture_output=True, text=True, check=True).stdout

    def beside_dest(self) -> list[str]:
        return sorted(p.name for p in self.dest.parent.iterdir())


def build_log(out) -> str:
    files = list(Path(out.logs).rglob("*.log"))
    return "\n".join(f.read_text() for f in files)


def status_line(out, project: Project) -> str:
    for line in out.stdout.splitlines():
        if line.startswith("[localhost]") and f"{project.name}@" in line:
            return line
    raise AssertionError(out.stdout + out.stderr)


@pytest.fixture
def project(tmp_path, tarballs) -> Project:
    p = Project(tmp_path, tarballs)
    p.recipe()
    return p


# -- idempotence: check -> build -> check -> build ------------------------------------------------------
def test_check_build_check_build(project):
    out = project.run("--check", "--fail-on-change")
    assert out.returncode == 2, out.stdout + out.stderr
    assert "would change: not installed" in status_line(out, project)
    assert not project.dest.exists()

    out = project.run()
    assert out.returncode == 0, out.stdout + out.stderr
    assert "changed  hello@1.0: not installed" in status_line(out, project)
    log = build_log(out)
    for phase in ("fetch", "extract", "configure", "build", "stage", "cache", "install", "sanity", "check", "commit", "stamp"):
        assert f"phase {phase} " in log, phase
    assert project.hello() == "hello from sitestack\n"
    assert project.dest.is_symlink() and os.readlink(project.dest).startswith(".1.0.tree-")
    stamp = project.stamp()
    assert stamp["recipe"] == "hello" and stamp["version"] == "1.0" and len(stamp["digest"]) == 64
    assert stamp["inputs"]["build"]["source"]["sha256"] == sha256(project.tarballs["1.0"])
    assert stamp["checks"] == [{"name": "greets", "ok": True, "output": "hello from sitestack"}]
    assert stamp["artefact"]["kind"] == "tree" and not stamp["artefact"]["from_cache"]
    assert project.beside_dest() == sorted([".1.0.lock", os.readlink(project.dest), "1.0"])
    assert list((project.prefix / ".sitestack" / "build").iterdir()) == []

    out = project.run("--check", "--fail-on-change")
    assert out.returncode == 0 and "ok       hello@1.0" in status_line(out, project)

    before = (project.dest / ".sitestack" / "install.json").stat().st_mtime_ns
    start = time.monotonic()
    out = project.run()
    took = time.monotonic() - start
    assert out.returncode == 0 and "ok       hello@1.0" in status_line(out, project)
    assert "phase" not in build_log(out)
    assert (project.dest / ".sitestack" / "install.json").stat().st_mtime_ns == before
    assert took < 10  # invoke start-up included; the step itself takes milliseconds
    elapsed = float(out.stdout.strip().splitlines()[-1].split()[-1].rstrip("s"))
    assert elapsed < 2, out.stdout


# -- changed inputs force a rebuild -------------------------------------------------------------------------
def test_new_patch_new_flag_and_edited_patch_rebuild(project):
    assert project.run().returncode == 0
    project.patch("0001-greeting.patch", patch_text(HELLO_C, PATCHED_C))
    project.recipe(patches=["0001-greeting.patch"])
    out = project.run("--check")
    assert "would change: inputs changed: patch 0001-greeting.patch added" in status_line(out, project)
    out = project.run()
    assert out.returncode == 0, out.stdout + out.stderr
    assert "phase patch" in build_log(out) and "phase configure" in build_log(out)
    assert project.hello() == "hello from sitestack, patched\n"

    project.recipe(patches=["0001-greeting.patch"], args=["CFLAGS=-O1"])
    out = project.run("--check")
    assert "inputs changed: build arguments changed: +CFLAGS=-O1" in status_line(out, project)
    out = project.run()
    assert out.returncode == 0 and "phase configure" in build_log(out)
    assert "CFLAGS=-O1" in json.dumps(project.stamp()["inputs"]["build"]["plan"])

    project.patch("0001-greeting.patch", patch_text(HELLO_C, PATCHED_C.replace("patched", "patched again")))
    out = project.run("--check")
    assert "inputs changed: patch 0001-greeting.patch changed" in status_line(out, project)
    assert project.run().returncode == 0
    assert project.hello() == "hello from sitestack, patched again\n"
    out = project.run()
    assert out.returncode == 0 and "ok       hello@1.0" in out.stdout


def test_already_applied_patch_is_skipped(project):
    older = HELLO_C.replace("hello from sitestack", "hi")
    project.patch("0001-upstreamed.patch", patch_text(older, HELLO_C, upstream="merged upstream in 1.0"))
    project.recipe(patches=["0001-upstreamed.patch"])
    out = project.run()
    assert out.returncode == 0, out.stdout + out.stderr
    assert "patch 0001-upstreamed.patch: already applied, skipped" in build_log(out)
    assert project.hello() == "hello from sitestack\n"


def test_patches_restricted_to_versions(project):
    project.patch("0001-greeting.patch", patch_text(HELLO_C, PATCHED_C, applies_to=">=2.0"))
    project.recipe(patches=["0001-greeting.patch"])
    out = project.run()
    assert out.returncode == 0 and "phase patch" not in build_log(out)
    assert project.hello() == "hello from sitestack\n"


# -- the build cache: build once, install many ------------------------------------------------------------
def test_reinstall_after_purge_comes_from_the_cache(project):
    assert project.run().returncode == 0
    tree = project.dest.parent / os.readlink(project.dest)
    subprocess.run(["rm", "-rf", str(project.dest), str(tree)], check=True)  # a purged scratch file system
    out = project.run()
    assert out.returncode == 0, out.stdout + out.stderr
    log = build_log(out)
    assert "phase cache" in log and "(no build needed)" in log
    assert "phase configure" not in log and "phase fetch" not in log
    assert project.stamp()["artefact"]["from_cache"] is True
    assert project.hello() == "hello from sitestack\n"


def test_python_sdist_wheel_is_shared_between_prefixes(tmp_path, tarballs):
    project = Project(tmp_path, tarballs, name="hipy")
    project.version = "0.1"
    project.recipe(hipy_recipe(tarballs["hipy"]))
    out = project.run()
    assert out.returncode == 0, out.stdout + out.stderr
    assert "phase build" in build_log(out)
    wheel = project.stamp()["artefact"]["file"]
    assert wheel.startswith("hipy-0.1-") and (project.dest / ".sitestack" / "wheels" / wheel).is_file()
    assert (project.dest / "hipy" / "__init__.py").is_file()
    project.prefix = tmp_path / "second-prefix"
    out = project.run()
    assert out.returncode == 0, out.stdout + out.stderr
    assert "phase build" not in build_log(out) and "(no build needed)" in build_log(out)
    assert project.stamp()["artefact"]["from_cache"] is True
    assert project.stamp()["checks"][0]["output"] == "hello from hipy"


def test_check_results_kept_in_the_cache_serve_a_new_prefix(tmp_path, tarballs):
    """A cached install into another prefix keeps the checks' result stored with the cache entry when
    everything they depend on is the same; a changed check, or --rebuild, runs them again."""
    project = Project(tmp_path, tarballs, name="hipy")
    project.version = "0.1"
    project.recipe(hipy_recipe(tarballs["hipy"]))
    assert project.run().returncode == 0
    assert project.stamp()["checks"] == [{"name": "imports", "ok": True, "output": "hello from hipy"}]
    entry = Path(project.stamp()["artefact"]["cache"])
    kept = list(entry.glob("checks-*.json"))
    assert len(kept) == 1, sorted(p.name for p in entry.iterdir())

    project.prefix = tmp_path / "second-prefix"
    out = project.run()
    assert out.returncode == 0, out.stdout + out.stderr
    log = build_log(out)
    assert "(no build needed)" in log and "vouched for by" in log
    checks = project.stamp()["checks"]
    assert [(c["name"], c["ok"], c["output"]) for c in checks] == [("imports", True, "hello from hipy")]
    assert checks[0]["vouched"]["by"] == str(kept[0])
    assert checks[0]["vouched"]["checked"]["tree"].startswith(str(tmp_path / "prefix"))

    # a changed input of the checks (here the check itself; the artefact stays cached) runs them again
    recipe = project.sources / "hipy.yml"
    recipe.write_text(recipe.read_text().replace("expect: hello from hipy", "expect: hello from"))
    project.prefix = tmp_path / "third-prefix"
    out = project.run()
    assert out.returncode == 0, out.stdout + out.stderr
    log = build_log(out)
    assert "(no build needed)" in log and "vouched for by" not in log and re.search(r"phase check \(\+\d+s\): imports\n", log)
    assert "vouched" not in project.stamp()["checks"][0]
    assert len(list(entry.glob("checks-*.json"))) == 2

    # --rebuild never takes a kept result
    project.prefix = tmp_path / "fourth-prefix"
    out = project.run("--rebuild")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "vouched" not in project.stamp()["checks"][0] and "vouched for by" not in build_log(out)


def test_bootstrap_runs_when_there_is_no_configure(project):
    project.version = "1.1"
    project.recipe(hello_recipe({"1.1": project.tarballs["1.1-raw"]}))
    out = project.run()
    assert out.returncode == 0, out.stdout + out.stderr
    assert "phase bootstrap" in build_log(out) and "autoreconf -fi" in build_log(out)
    assert project.hello() == "hello from sitestack\n"


def test_cmake_project(tmp_path, tarballs):
    project = Project(tmp_path, tarballs, name="hicmake")
    project.version = "0.1"
    project.recipe(hicmake_recipe(tarballs["hicmake"]))
    out = project.run()
    assert out.returncode == 0, out.stdout + out.stderr
    log = build_log(out)
    assert "-G Ninja" in log and "DESTDIR=" in log
    run = subprocess.run([str(project.dest / "bin" / "hicmake")], capture_output=True, text=True)
    assert run.stdout == "hello from cmake\n"
    assert project.run().stdout.count("ok       hicmake@0.1") == 1


def test_cmake_from_pypi_when_the_host_has_none_new_enough(tmp_path, tarballs):
    import re
    import shutil
    minimum = "3.18"
    if shutil.which("cmake"):
        have = re.search(r"(\d+)\.(\d+)", subprocess.run(["cmake", "--version"], capture_output=True, text=True).stdout)
        minimum = f"{have.group(1)}.{int(have.group(2)) + 1}"
    project = Project(tmp_path, tarballs, name="hicmake")
    project.version = "0.1"
    project.recipe(hicmake_recipe(tarballs["hicmake"], minimum=minimum))
    out = project.run()
    assert out.returncode == 0, out.stdout + out.stderr
    assert "phase tools (+" in build_log(out) and f"cmake>={minimum}" in build_log(out)
    assert project.stamp()["inputs"]["build"]["toolchain"]["tools"]["cmake"] == f"PyPI cmake>={minimum}"
    venv = Path(project.env["SITESTACK_BUILD_CACHE"]) / "tools" / f"cmake-{minimum}"
    assert (venv / ".complete").is_file() and f"{venv}/bin/cmake" in build_log(out)
    run = subprocess.run([str(project.dest / "bin" / "hicmake")], capture_output=True, text=True)
    assert run.stdout == "hello from cmake\n"


# -- bad input and faults: one message, exit 1, previous install untouched ---------------------------------------
def assert_untouched(project: Project, before: dict, tree: str) -> None:
    assert project.stamp() == before
    assert os.readlink(project.dest) == tree
    assert project.hello() == "hello from sitestack\n"


def installed(project: Project) -> tuple[dict, str]:
    out = project.run()
    assert out.returncode == 0, out.stdout + out.stderr
    return project.stamp(), os.readlink(project.dest)


def test_checksum_mismatch_builds_nothing(project, tmp_path):
    before, tree = installed(project)
    other = tmp_path / "other.tar.gz"
    other.write_bytes(b"not the release")
    text = (project.sources / "hello.yml").read_text().replace(sha256(project.tarballs["1.0"]), sha256(other))
    project.recipe(text)
    out = project.run()
    assert out.returncode == 1
    assert "sha256 mismatch for hello 1.0 downloaded from file://" in out.stdout
    assert "refusing it, nothing was built" in out.stdout and "Traceback" not in out.stdout + out.stderr
    assert "phase configure" not in build_log(out)
    assert_untouched(project, before, tree)


def test_source_option_with_wrong_file(project, tmp_path):
    project.recipe(extra="")  # same recipe
    wrong = tmp_path / "hello-1.0.tar.gz"
    wrong.write_bytes(b"something else")
    out = project.run("--source", str(wrong))
    assert out.returncode == 1
    assert f"sha256 mismatch for {wrong} (hello 1.0, from --source)" in out.stdout
    assert not project.dest.exists()
    out = project.run("--source", str(project.tarballs["1.0"]))
    assert out.returncode == 0 and project.hello() == "hello from sitestack\n"


def test_patch_that_does_not_apply(project):
    before, tree = installed(project)
    project.patch("0002-broken.patch", patch_text("int main(void) { return 1; }\n", "int main(void) { return 0; }\n"))
    project.recipe(patches=["0002-broken.patch"])
    out = project.run()
    assert out.returncode == 1
    assert "hello 1.0: patch 0002-broken.patch does not apply to hello 1.0" in out.stdout
    assert "Applies-to: >=1.0" in out.stdout and "phase configure" not in build_log(out)
    assert_untouched(project, before, tree)


def test_missing_compiler(project):
    before, tree = installed(project)
    project.recipe(tools=["no-such-compiler-xyz"])
    for extra in ((), ("--check",)):
        out = project.run(*extra)
        assert out.returncode == 1
        assert "hello 1.0: missing on localhost (with no site modules loaded): no-such-compiler-xyz" in out.stdout
    assert_untouched(project, before, tree)


def test_missing_mpi_wrapper(cli, repo, tmp_path):
    text = (repo / "playbooks" / "local.yml").read_text().replace("cc: mpicc", "cc: no-such-mpicc")
    (tmp_path / "local.yml").write_text(text)
    out = cli("build-mpi4py", "--playbook", str(tmp_path / "local.yml"), "--prefix", str(tmp_path / "p"),
              env={"SITESTACK_LOG_DIR": str(tmp_path / "logs"), "SITESTACK_SOURCE_CACHE": str(tmp_path / "src")})
    assert out.returncode == 1
    assert "mpi4py 4.1.2: missing on localhost (with no site modules loaded): no-such-mpicc" in out.stdout
    assert "facts.mpi.cc = 'no-such-mpicc'" in out.stdout
    assert not (tmp_path / "src").exists()  # refused before downloading anything


def test_failed_build_shows_log_tail(project):
    before, tree = installed(project)
    project.recipe(args=["CC=no-such-compiler-xyz"])
    out = project.run()
    assert out.returncode == 1
    assert "hello 1.0: phase configure failed (exit 77)" in out.stdout
    assert "log: " in out.stdout and "build dir: " in out.stdout
    assert "C compiler cannot create executables" in out.stdout  # the tail of the log
    assert_untouched(project, before, tree)


def test_failed_check_keeps_old_install(project):
    before, tree = installed(project)
    project.recipe(args=["--enable-shout"])  # prints HELLO..., the check expects "hello"
    out = project.run()
    assert out.returncode == 1
    assert "hello 1.0: check 'greets' failed: the output does not contain 'hello'" in out.stdout
    assert "HELLO FROM SITESTACK" in out.stdout
    assert_untouched(project, before, tree)
    assert [n for n in project.beside_dest() if ".tree-" in n] == [tree]


def test_foreign_directory_at_dest_is_replaced(project):
    project.dest.mkdir(parents=True)
    (project.dest / "junk").write_text("x")
    out = project.run("--check")
    assert "no stamp in" in out.stdout and "(unfinished or foreign install)" in out.stdout
    out = project.run()
    assert out.returncode == 0, out.stdout + out.stderr
    assert project.dest.is_symlink() and not (project.dest / "junk").exists()
    assert not [n for n in project.beside_dest() if ".old-" in n]


# -- kill -9 at any moment, then re-run: converges; never a half install at dest ----------------------------
class Watcher(threading.Thread):
    """Polls dest while a build runs: whenever it exists it must be a complete install."""

    def __init__(self, dest: Path) -> None:
        super().__init__(daemon=True)
        self.dest = dest
        self.stop = threading.Event()
        self.seen = 0
        self.bad: list[str] = []

    def run(self) -> None:
        while not self.stop.is_set():
            if os.path.lexists(self.dest):
                self.seen += 1
                for rel in ("bin/hello", "share/hello/greeting.txt"):
                    if not (self.dest / rel).exists():
                        self.bad.append(f"{rel} missing while {self.dest} exists")
            time.sleep(0.002)


def wait_for_phase(logs: Path, phase: str, proc: subprocess.Popen, timeout: float = 120) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for log in logs.rglob("hello-1.0.log"):
            text = log.read_text(errors="replace")
            if f"phase {phase} " in text:
                return text
        if proc.poll() is not None:
            raise AssertionError(f"the build ended before phase {phase}: {proc.stdout.read()}")
        time.sleep(0.005)
    raise AssertionError(f"no phase {phase} within {timeout}s")


@pytest.mark.parametrize("phase,with_old", [
    ("configure", False), ("build", False), ("stage", False), ("cache", False), ("install", False),
    ("commit", False), ("stamp", False),
    ("configure", True), ("stage", True), ("install", True), ("commit", True),
])
def test_kill_and_rerun(project, phase, with_old):
    if with_old:
        installed(project)
        old_tree = os.readlink(project.dest)
        project.recipe(args=["CFLAGS=-O1"])
    watcher = Watcher(project.dest)
    watcher.start()
    proc, logs = project.popen()
    try:
        wait_for_phase(logs, phase, proc)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        killed_log = next(logs.rglob("hello-1.0.log")).read_text()
        # dest is the old install, or nothing, or the complete new tree (never a part of one)
        if os.path.lexists(project.dest):
            assert project.hello() == "hello from sitestack\n"
            if with_old and "phase commit" not in killed_log:
                assert os.readlink(project.dest) == old_tree
        else:
            assert not with_old
        out = project.run()  # orphans of the killed run may still be running: a real kill -9 leaves them
        assert out.returncode == 0, out.stdout + out.stderr
        assert status_line(out, project).split()[1] in ("changed", "ok")
    finally:
        watcher.stop.set()
        watcher.join()
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert watcher.bad == []
    assert project.hello() == "hello from sitestack\n"
    out = project.run("--check", "--fail-on-change")
    assert out.returncode == 0, out.stdout
    stamp = project.stamp()
    assert ("CFLAGS=-O1" in json.dumps(stamp["inputs"])) is with_old
    trees = [n for n in project.beside_dest() if ".tree-" in n]
    assert trees == [os.readlink(project.dest)]
    assert not [n for n in project.beside_dest() if ".link-" in n or ".old-" in n]


# -- concurrent runs ---------------------------------------------------------------------------------------
def test_two_concurrent_runs_one_builds(project):
    first, first_logs = project.popen()
    try:
        wait_for_phase(first_logs, "configure", first)
        out = project.run()  # starts while the first is building: waits for it, then finds it done
        first_out, _ = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, first_out
    assert "changed  hello@1.0: not installed" in first_out
    assert out.returncode == 0 and "ok       hello@1.0" in status_line(out, project)
    assert "phase" not in build_log(out)
    assert project.hello() == "hello from sitestack\n"


def test_install_lock_serialises_steps_in_one_process(project, monkeypatch):
    """The per-install lock (not only the run's prefix lock): two steps, two threads, one build."""
    from sitestack.actions.recipe_install import RecipeInstall
    from sitestack.core.host import local_host
    from sitestack.core.step import converge
    from sitestack.engine import playbook as pb
    from sitestack.model.site import StepSpec

    site = pb.load("local")
    spec = StepSpec(name="hello", action="recipe-install", args={"recipe": "hello"})
    for key, value in project.env.items():
        monkeypatch.setenv(key, value)
    results: dict[str, list] = {}
    notes: list[str] = []

    def one(name: str) -> None:
        host = local_host()
        options = pb.Options(prefix=str(project.prefix), sources_dir=str(project.sources), progress=notes.append)
        ctx = pb.context_for(site, host, options, project.root / "logs" / name)
        results[name] = converge([RecipeInstall.from_spec(spec, ctx)], host)

    a = threading.Thread(target=one, args=("a",))
    a.start()
    deadline = time.monotonic() + 60
    while not any("configure" in n for n in notes):
        assert time.monotonic() < deadline and a.is_alive()
        time.sleep(0.01)
    b = threading.Thread(target=one, args=("b",))
    b.start()
    a.join(120)
    b.join(120)
    assert [r.status for r in results["a"]] == ["changed"]
    assert [r.status for r in results["b"]] == ["ok"]
    assert any("waiting for the install lock" in n for n in notes)
    assert sum("phase configure" in f.read_text() for f in (project.root / "logs").rglob("*.log")) == 1
