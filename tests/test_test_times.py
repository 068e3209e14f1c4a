"""scripts/test_times.py: where a test run's time went, per file, from a real pytest run's JUnit report;
and scripts/test.sh records the report where the README says."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO

SCRIPT = REPO / "scripts" / "test_times.py"


def test_seconds_per_file_from_a_real_junit_report(tmp_path):
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "__init__.py").write_text("")
    (tests / "test_slow.py").write_text("import time\n\ndef test_a():\n    time.sleep(0.6)\n\n"
                                        "class TestB:\n    def test_b(self):\n        time.sleep(0.3)\n")
    (tests / "test_quick.py").write_text("def test_c():\n    pass\n")
    report = tmp_path / "junit.xml"
    ran = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}",
                          "tests"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import test_times
    finally:
        sys.path.remove(str(SCRIPT.parent))
    files, wall = test_times.per_file(report, tmp_path)
    assert set(files) == {"tests/test_slow.py", "tests/test_quick.py"}   # the class's test counts for its file
    assert files["tests/test_slow.py"][1] == 2 and 0.9 <= files["tests/test_slow.py"][0] < 5
    assert wall >= files["tests/test_slow.py"][0]
    shown = subprocess.run([sys.executable, str(SCRIPT), str(report), "--top", "1"], capture_output=True, text=True)
    lines = shown.stdout.splitlines()
    assert shown.returncode == 0 and lines[0] == f"where the time went ({report}):", shown.stdout
    # run here, the classnames name no file of this checkout: each is listed by its classname
    assert lines[2].split()[0].startswith("tests.test_slow") and lines[-2].startswith("(2 more files)")
    assert lines[-1].startswith("total: ") and " in 3 tests of 3 files; pytest's wall time " in lines[-1]


def test_a_missing_or_broken_report_is_one_line(tmp_path):
    (tmp_path / "bad.xml").write_text("<testsuites><testcase")
    for path in (tmp_path / "missing.xml", tmp_path / "bad.xml"):
        out = subprocess.run([sys.executable, str(SCRIPT), str(path)], capture_output=True, text=True)
        assert out.returncode == 1 and out.stdout == "", out.stdout
        assert out.stderr.startswith(f"scripts/test_times.py: {path}: not a JUnit report (") and out.stderr.count("\n") == 1


def test_the_test_command_records_durations_where_the_readme_says():
    script = (REPO / "scripts" / "test.sh").read_text()
    readme = (REPO / "README.md").read_text()
    assert "JUNIT=build/test-results/junit.xml" in script and "build/test-results/junit.xml" in readme
    assert '--durations=25 --junitxml="$JUNIT"' in script and 'scripts/test_times.py "$JUNIT"' in script
    assert "/build/" in (REPO / ".gitignore").read_text().split()
