"""Settings are checked like options: the ``sitestack:`` section of Invoke's configuration, the
``SITESTACK_*`` and ``INVOKE_SITESTACK_*`` variables, empty option values (``--limit ''``), ``gc``'s
cache root, and ``installer: uv`` without uv in a ``--check`` plan.

Every bad value is refused before anything runs, with the corpus's one assertion
(:func:`tests.test_hostile.assert_refused_cleanly`): exit 1, one ``error:`` line naming the variable,
option or file and key, no traceback, nothing written.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sitestack.core import envvars
from sitestack.installs.installer import CACHE_MARKER, CLEAN_SCRIPT
from tests.conftest import REPO
from tests.test_hostile import Case, assert_refused_cleanly, git_status, run_case

CHECK = ("provision", "--site", "local", "--check")


@pytest.fixture(scope="module")
def checkout_before() -> str:
    """``git status`` of the checkout before the cases: none of them may change it."""
    return git_status()


def env_case(name: str, value: str, expect: str = "", args: tuple[str, ...] = CHECK) -> Case:
    return Case(f"{name}={value!r}", re.escape(name), args=args, expect=expect, extra_env={name: value})


# -- SITESTACK_* variables: each has a type and a range --------------------------------------------------
ENV_CASES = [
    *(env_case("SITESTACK_PROGRESS_INTERVAL", v, "number of seconds") for v in ("-1", "soon", "nan", "inf", "1e3", " 5")),
    env_case("SITESTACK_PROGRESS_INTERVAL", "0", "between"),
    env_case("SITESTACK_PROGRESS_INTERVAL", "100000", "between"),
    env_case("SITESTACK_VENV_TEMPLATE", "bogus", "link, copy, off"),
    env_case("SITESTACK_VENV_TEMPLATE", "link "),
    env_case("SITESTACK_SOURCE_CACHE", "rel", "absolute"),
    env_case("SITESTACK_SOURCE_CACHE", "/", "system directory"),
    env_case("SITESTACK_BUILD_CACHE", "/", "system directory"),
    env_case("SITESTACK_BUILD_CACHE", "/tmp", "system directory"),
    env_case("SITESTACK_BUILD_CACHE", "/x/../y", ".."),
    env_case("SITESTACK_LOG_DIR", "/usr", "system directory"),
    env_case("SITESTACK_LOG_DIR", "/x\ny", "newline"),
    *(env_case(f"SITESTACK_{n}_CACHE", v, "on or off") for n in ("PROBE", "PARSE", "RENDER") for v in ("maybe", "2")),
    env_case("SITESTACK_ACCOUNT", "a/b", "account name"),
    env_case("SITESTACK_ACCOUNT", "../x"),
    env_case("SITESTACK_MIRROR", "rel/mirror", "absolute"),
    env_case("SITESTACK_MIRROR", "/srv/ok:rel", "absolute"),
    env_case("SITESTACK_FACTS", "facts.yml", "absolute"),
    env_case("SITESTACK_DATA_DIR", "/nonexistent-data", "playbooks/"),
    env_case("SITESTACK_DATA_DIR", "rel-data", "absolute"),
    env_case("SITESTACK_SSH_CONFIG", "rel-config", "absolute"),
    # the Invoke variables of the section: a known key, a value of its kind
    env_case("INVOKE_SITESTACK_FORKS", "lots", "whole number"),
    env_case("INVOKE_SITESTACK_FORKS", "0"),
    env_case("INVOKE_SITESTACK_BOGUS", "1", "not a sitestack setting"),
    env_case("INVOKE_SITESTACK_PREFIX", "rel/prefix", "absolute"),
    env_case("INVOKE_SITESTACK_LOG_DIR", "/", "system directory"),
    env_case("INVOKE_SITESTACK_ACCOUNT", "a b"),
    # show-site reads the variables too
    dataclasses.replace(env_case("SITESTACK_PROGRESS_INTERVAL", "nan", args=("show-site", "--site", "local")),
                        id="show-site-progress-interval-nan"),
]

# -- an empty option value is refused (it would mean the default: --limit '' is every host) -----------
OPTION_CASES = [
    Case("limit-empty", "--limit", args=(*CHECK, "--limit", ""), expect="empty"),
    Case("limit-blank", "--limit", args=(*CHECK, "--limit", "   "), expect="empty"),
    Case("limit-empty-applying", "--limit", args=("provision", "--site", "local", "--tags", "layout", "--limit", "")),
    Case("tags-empty", "--tags", args=(*CHECK, "--tags", "")),
    Case("skip-tags-blank", "--skip-tags", args=(*CHECK, "--skip-tags", " ")),
    Case("rebuild-empty", "--rebuild", args=(*CHECK, "--rebuild", "")),
    Case("rocm-empty", "--rocm", args=("build-rccl-plugin", "--site", "lumi", "--check", "--rocm", "")),
    Case("python-empty", "--python", args=("build-horovod", "--site", "local", "--check", "--python", "")),
    Case("python-blank-validate", "--python", args=("validate", "--site", "local", "--python", "  ")),
    Case("host-blank", "--host", args=(*CHECK, "--host", " ")),
    Case("show-site-prefix-dotdot", "--prefix", args=("show-site", "--site", "local", "--prefix", "../../.."),
         expect="absolute"),
    Case("show-site-prefix-relative", "--prefix", args=("show-site", "--site", "local", "--prefix", "rel")),
    Case("show-site-prefix-inner-dotdot", "--prefix", args=("show-site", "--site", "local", "--prefix", "/x/../../etc")),
    Case("show-site-prefix-system", "--prefix", args=("show-site", "--site", "local", "--prefix", "/usr")),
    Case("show-site-prefix-empty", "--prefix", args=("show-site", "--site", "local", "--prefix", "")),
    Case("show-site-account-empty", "--account", args=("show-site", "--site", "lumi", "--account", "")),
    Case("gc-build-cache-root", "SITESTACK_BUILD_CACHE", args=("gc", "--site", "local", "--dry-run", "--max-size", "0"),
         extra_env={"SITESTACK_BUILD_CACHE": "/"}),
    Case("gc-build-cache-root-no-trim", "SITESTACK_BUILD_CACHE", args=("gc", "--site", "local", "--dry-run"),
         extra_env={"SITESTACK_BUILD_CACHE": "/"}),
    # a leading // is / to Linux, and os.path.normpath keeps it: //tmp would lose its sticky bit
    Case("prefix-double-slash-tmp", "--prefix", args=("show-site", "--site", "local", "--prefix", "//tmp"),
         expect="system directory"),
    Case("prefix-dev-shm", "--prefix", args=("show-site", "--site", "local", "--prefix", "/dev/shm/"),
         expect="system directory"),
    Case("log-dir-double-slash", "SITESTACK_LOG_DIR", args=("show-site", "--site", "local"),
         extra_env={"SITESTACK_LOG_DIR": "//tmp"}),
    Case("gc-max-size-other-digits", "--max-size", args=("gc", "--site", "local", "--dry-run", "--max-size", "\u0661G")),
    Case("uninstall-blank", "NAME", args=("uninstall", " ", "--site", "local")),
    Case("uninstall-glob", "NAME", args=("uninstall", "*", "--site", "local")),
    Case("uninstall-two-versions", "NAME", args=("uninstall", "a@1@2", "--site", "local")),
    Case("uninstall-newline", "NAME", args=("uninstall", "a\nb", "--site", "local"), expect="a\\nb"),
]


@pytest.mark.parametrize("case", ENV_CASES + OPTION_CASES, ids=lambda c: c.id)
def test_bad_setting_is_refused_cleanly(case: Case, tmp_path: Path, checkout_before: str):
    result, paths = run_case(case, tmp_path)
    assert_refused_cleanly(case, result, paths, checkout_before)


@pytest.mark.parametrize("where", ["home", "home-parent"])
def test_gc_refuses_home_as_the_build_cache(where: str, tmp_path: Path, checkout_before: str):
    home = tmp_path / "home"
    root = home if where == "home" else tmp_path
    case = Case(f"gc-{where}", "SITESTACK_BUILD_CACHE", args=("gc", "--site", "local", "--dry-run", "--max-size", "0"),
                expect="home directory", extra_env={"SITESTACK_BUILD_CACHE": str(root)})
    result, paths = run_case(case, tmp_path)
    assert_refused_cleanly(case, result, paths, checkout_before)


# -- the sitestack: section of Invoke's configuration files ----------------------------------------------
SECTION_CASES = [
    ("null", "sitestack: null\n", r"sitestack: ", "mapping"),
    ("list", "sitestack: [1, 2]\n", r"sitestack: ", "mapping"),
    ("string", "sitestack: forks\n", r"sitestack: ", "mapping"),
    ("unknown-key", "sitestack:\n  forkz: 4\n", r"sitestack\.forkz: ", "not a setting"),
    ("unknown-key-newline", 'sitestack:\n  "a\\nb": 4\n', r"sitestack\.a\\nb: ", "not a setting"),
    ("forks-word", "sitestack:\n  forks: lots\n", r"sitestack\.forks: ", "whole number"),
    ("forks-list", "sitestack:\n  forks: [4]\n", r"sitestack\.forks: ", ""),
    ("forks-bool", "sitestack:\n  forks: true\n", r"sitestack\.forks: ", ""),
    ("forks-zero", "sitestack:\n  forks: 0\n", r"sitestack\.forks: ", ""),
    ("forks-float", "sitestack:\n  forks: 2.5\n", r"sitestack\.forks: ", ""),
    ("prefix-mapping", "sitestack:\n  prefix: {a: 1}\n", r"sitestack\.prefix: ", ""),
    ("prefix-relative", "sitestack:\n  prefix: stack/here\n", r"sitestack\.prefix: ", "absolute"),
    ("prefix-empty", "sitestack:\n  prefix: ''\n", r"sitestack\.prefix: ", ""),
    ("prefix-system", "sitestack:\n  prefix: /usr\n", r"sitestack\.prefix: ", "system directory"),
    ("log-dir-root", "sitestack:\n  log_dir: /\n", r"sitestack\.log_dir: ", "system directory"),
    ("mirror-relative", "sitestack:\n  mirror: tarballs\n", r"sitestack\.mirror: ", "absolute"),
    ("sources-dir-newline", 'sitestack:\n  sources_dir: "/x\\ny"\n', r"sitestack\.sources_dir: ", "newline"),
    ("account-slash", "sitestack:\n  account: a/b\n", r"sitestack\.account: ", "account name"),
    ("file-is-a-list", "- sitestack\n", "", "mapping"),
]
#: Files Invoke itself cannot parse: a YAML error, a tag its safe loader refuses (never runs).
PARSE_CASES = [
    ("python-tag", "sitestack: !!python/object/apply:os.system ['touch {mark}']\n", "constructor"),
    ("python-name-tag", "sitestack:\n  forks: !!python/name:os.system\n", "constructor"),
    ("yaml-error", "sitestack: [\n", "expected"),
    ("tab-indent", "sitestack:\n\tforks: 2\n", ""),
]


def run_with_config(tmp_path: Path, text: str, *, where: str, program: str,
                    args: tuple[str, ...] = CHECK) -> tuple[subprocess.CompletedProcess[str], dict[str, Path], Path]:
    """Run with ``text`` as ~/.invoke.yaml (``where="user"``) or as ``-f FILE`` (``"runtime"``), by
    ``invoke`` or the ``sitestack`` command; the paths of the corpus's assertion, and the file."""
    home, cwd, conf = tmp_path / "home", tmp_path / "cwd", tmp_path / "conf"
    for d in (home, cwd, conf):
        d.mkdir()
    mark = tmp_path / "SITESTACK_PWNED"
    config = home / ".invoke.yaml" if where == "user" else conf / "settings.yaml"
    config.write_text(text.replace("{mark}", str(mark)))
    core = ("-f", str(config)) if where == "runtime" else ()
    head = [sys.executable, "-m", "invoke", "--search-root", str(REPO)] if program == "invoke" else \
        [sys.executable, "-c", "from sitestack.cli.program import main; main()"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SITESTACK_LOG_DIR", "SITESTACK_ACCOUNT", "INVOKE_"))}
    env.update({"HOME": str(home), "PYTHONPATH": str(REPO)})
    result = subprocess.run([*head, *core, *args, "--prefix", str(tmp_path / "prefix")], cwd=cwd, env=env, text=True,
                            capture_output=True, timeout=60)
    if where == "user":
        config.unlink()   # the case's own file: the assertion wants HOME as it was
    return result, {"home": home, "cwd": cwd, "prefix": tmp_path / "prefix", "mark": mark}, config


#: Every section case by every program and file, but a top level that is not a mapping in ~/.invoke.yaml
#: under ``invoke``: Invoke merges that file before it loads sitestack (docs/cli.md).
SECTION_RUNS = [(*c, where, program) for c in SECTION_CASES
                for where, program in (("user", "invoke"), ("runtime", "invoke"), ("user", "sitestack"))
                if not (c[0] == "file-is-a-list" and (where, program) == ("user", "invoke"))]


@pytest.mark.parametrize(("name", "text", "key", "expect", "where", "program"), SECTION_RUNS,
                         ids=[f"{r[0]}-{r[4]}-{r[5]}" for r in SECTION_RUNS])
def test_bad_configuration_section_is_refused(name: str, text: str, key: str, expect: str, where: str, program: str,
                                              tmp_path: Path, checkout_before: str):
    result, paths, config = run_with_config(tmp_path, text, where=where, program=program)
    case = Case(name, re.escape(f"error: {config}: ") + key, expect=expect)
    assert_refused_cleanly(case, result, paths, checkout_before)


@pytest.mark.parametrize(("where", "program"), [("runtime", "invoke"), ("user", "sitestack"), ("runtime", "sitestack")])
@pytest.mark.parametrize(("name", "text", "expect"), PARSE_CASES, ids=[c[0] for c in PARSE_CASES])
def test_configuration_file_that_cannot_be_parsed_is_refused(name: str, text: str, expect: str, where: str,
                                                             program: str, tmp_path: Path, checkout_before: str):
    """``invoke`` reads ~/.invoke.yaml before it loads sitestack (docs/cli.md): that file's parse errors
    are refused cleanly by the ``sitestack`` command, and by both programs for ``-f FILE``."""
    result, paths, config = run_with_config(tmp_path, text, where=where, program=program)
    case = Case(name, re.escape(f"error: {config}") + r"(:\d+)?: not a valid Invoke configuration file", expect=expect)
    assert_refused_cleanly(case, result, paths, checkout_before)


def test_good_configuration_is_taken(tmp_path: Path):
    """The checks refuse only what is wrong: a full section, null keys (not set) and Invoke's own
    sections pass, and the value reaches the run."""
    text = (f"sitestack:\n  forks: 3\n  account: project_1\n  mirror: {tmp_path}\n  sources_dir: null\n"
            f"  log_dir: {tmp_path / 'logs'}\nrun:\n  echo: false\n")
    result, _, _ = run_with_config(tmp_path, text, where="user", program="invoke", args=("show-site", "--site", "lumi"))
    assert result.returncode == 0, result.stderr
    assert "project_1" in result.stdout


# -- gc: only sitestack's own cache, any entry name ---------------------------------------------------------
def make_entry(root: Path, name: str) -> Path:
    entry = root / name / "0123abcd"
    entry.mkdir(parents=True)
    (entry / "artefact.json").write_text("{}\n")
    (entry / "tree.tar").write_bytes(b"x" * 1000)
    return entry


def gc(tmp_path: Path, cache: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SITESTACK_")}
    env.update({"HOME": str(home), "SITESTACK_BUILD_CACHE": str(cache)})
    return subprocess.run([sys.executable, "-m", "invoke", "--search-root", str(REPO), "gc", "--site", "local",
                           "--max-size", "0", *extra], cwd=tmp_path, env=env, text=True, capture_output=True, timeout=60)


def test_gc_lists_an_entry_named_with_a_newline(tmp_path: Path):
    cache = tmp_path / "cache"
    odd = make_entry(cache, "hello\nworld")
    (cache / CACHE_MARKER).touch()
    out = gc(tmp_path, cache, "--dry-run")
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert f"would remove {cache}/hello\\nworld/0123abcd (" in out.stdout, out.stdout
    assert odd.is_dir()   # a dry run
    doc = json.loads(gc(tmp_path, cache, "--dry-run", "--json", "-").stdout)
    assert [r["path"] for r in doc["removed"]] == [str(odd)]
    out = gc(tmp_path, cache)
    assert out.returncode == 0 and not odd.exists(), out.stdout + out.stderr


def test_gc_refuses_a_directory_that_is_not_a_sitestack_cache(tmp_path: Path):
    other = tmp_path / "data"
    entry = make_entry(other, "project")
    out = gc(tmp_path, other)   # not a dry run: the refusal is what keeps the directory
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.startswith("error: SITESTACK_BUILD_CACHE: ") and CACHE_MARKER in out.stderr, out.stderr
    assert out.stdout == "" and entry.is_dir()


def test_gc_takes_the_default_cache_made_before_the_marker(tmp_path: Path):
    home = tmp_path / "home"
    legacy = make_entry(home / ".cache" / "sitestack" / "builds", "mpi4py")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SITESTACK_")}
    out = subprocess.run([sys.executable, "-m", "invoke", "--search-root", str(REPO), "gc", "--site", "local",
                          "--max-size", "0", "--dry-run"], cwd=tmp_path, env={**env, "HOME": str(home)}, text=True,
                         capture_output=True, timeout=60)
    assert out.returncode == 0 and f"would remove {legacy} " in out.stdout, out.stdout + out.stderr


def test_a_build_marks_its_cache(tmp_path: Path):
    """The script every install runs first writes the marker into an existing cache (not through a link)."""
    cache = tmp_path / "cache"
    cache.mkdir()
    subprocess.run(["bash", "-c", CLEAN_SCRIPT, "sitestack", str(tmp_path / "builds"), "x-*", str(cache), CACHE_MARKER],
                   check=True)
    assert (cache / CACHE_MARKER).is_file()
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / CACHE_MARKER).symlink_to(tmp_path / "elsewhere")
    subprocess.run(["bash", "-c", CLEAN_SCRIPT, "sitestack", str(tmp_path / "builds"), "x-*", str(linked), CACHE_MARKER],
                   check=True)
    assert not (tmp_path / "elsewhere").exists()


# -- installer: uv without uv is a failure of the plan, as of the run -------------------------------------------
def test_check_reports_installer_uv_without_uv(tmp_path: Path):
    data = yaml.safe_load((REPO / "playbooks" / "local.yml").read_text())
    data["facts"].setdefault("python", {})["installer"] = "uv"
    book = tmp_path / "book" / "local.yml"
    book.parent.mkdir()
    book.write_text(yaml.safe_dump(data, sort_keys=False))
    path = os.pathsep.join(d for d in os.environ["PATH"].split(os.pathsep) if not os.path.exists(os.path.join(d, "uv")))
    env = {k: v for k, v in os.environ.items() if k not in ("SITESTACK_LOG_DIR", "SITESTACK_ACCOUNT")}
    env.update({"HOME": str(tmp_path / "home"), "PATH": path})
    out = subprocess.run([sys.executable, "-m", "invoke", "--search-root", str(REPO), "provision", "--check",
                          "--playbook", str(book), "--prefix", str(tmp_path / "prefix"), "--tags", "stack-venv"],
                         cwd=tmp_path, env=env, text=True, capture_output=True, timeout=120)
    assert out.returncode == 1, out.stdout + out.stderr
    assert re.search(r"failed +stack-venv: .*installer is uv, but uv is not on the PATH", out.stdout), out.stdout
    assert not (tmp_path / "prefix").exists()


# -- one table: the code reads it, the docs show it --------------------------------------------------------------
def test_docs_show_the_table_of_variables():
    assert envvars.markdown_table() in (REPO / "docs" / "cli.md").read_text()


def test_no_module_reads_a_sitestack_variable_past_the_table():
    """The controller's code reads SITESTACK_* variables only through sitestack/core/envvars.py (the
    shipped programs check theirs themselves)."""
    direct = re.compile(r"""environ(?:\.get\(|\[)\s*["']SITESTACK_|getenv\(\s*["']SITESTACK_""")
    offenders = [str(p.relative_to(REPO)) for p in sorted((REPO / "sitestack").rglob("*.py"))
                 if p.parts[-2] not in ("onsite", "validation", "ddpcheck") and p.name != "envvars.py"
                 and direct.search(p.read_text())]
    assert offenders == []


@pytest.mark.parametrize(("value", "expected"), [("30", 30.0), ("0.5", None), ("86400", 86400.0), ("", None)])
def test_progress_interval_range(value: str, expected: float | None, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SITESTACK_PROGRESS_INTERVAL", value)
    if expected is None and value:
        with pytest.raises(envvars.InputError):
            envvars.get("SITESTACK_PROGRESS_INTERVAL")
    else:
        assert envvars.get("SITESTACK_PROGRESS_INTERVAL") == expected


def test_cases_are_distinct():
    ids = [c.id for c in ENV_CASES + OPTION_CASES]
    assert len(ids) == len(set(ids))
