"""One table of Slurm host lists (tests/data/hostlists.json) through every place that expands them:
the parser itself (sitestack/onsite/hostlist.py), get-master as the container-image step installs
it, the validation job's check program as installed, and the users' sitestack-launch-env sourced in
each shell. ClusterShell's NodeSet is the oracle for the valid lists (as sets: it sorts and merges
duplicates, while ``scontrol show hostnames`` keeps the order written, which the table states)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from ClusterShell.NodeSet import NodeSet

from sitestack.installs.runscripts import scripts
from sitestack.onsite import hostlist
from tests.onsite_dir import install_programs
from tests.test_launch_env import render

TABLE = json.loads((Path(__file__).parent / "data" / "hostlists.json").read_text())
VALID = TABLE["valid"]
INVALID = TABLE["invalid"]
SHELLS = [s for s in ("sh", "bash", "dash", "zsh") if shutil.which(s)]


def check_hosts(case: dict, hosts: list[str]) -> None:
    """``hosts`` are the case's, in the table's order."""
    if "hosts" in case:
        assert hosts == case["hosts"], case["list"]
    else:
        assert (len(hosts), hosts[0], hosts[-1]) == (case["count"], case["first"], case["last"]), case["list"]


@pytest.mark.parametrize("case", VALID, ids=[c["list"] for c in VALID])
def test_the_table_agrees_with_clustershell(case: dict) -> None:
    if case.get("nodeset", True):
        expected = case["hosts"] if "hosts" in case else [case["first"], case["last"]]
        nodes = NodeSet(case["list"])
        assert set(expected) <= set(nodes) and len(nodes) == len(set(hostlist.expand(case["list"])))
    check_hosts(case, hostlist.expand(case["list"]))
    assert hostlist.first(case["list"]) == hostlist.expand(case["list"])[0]


@pytest.mark.parametrize("case", INVALID, ids=[c["list"] or "(empty)" for c in INVALID])
def test_the_module_refuses_bad_lists(case: dict) -> None:
    with pytest.raises(hostlist.HostlistError, match=case["error"].replace("[", r"\[")):
        hostlist.expand(case["list"])


def run_all(argv_of: object, cases: list[dict]) -> list[subprocess.CompletedProcess[str]]:
    """Run one program per case, a few at a time."""
    procs = [subprocess.Popen(argv_of(c["list"]), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,  # type: ignore[operator]
                              env={"PATH": os.environ["PATH"], "USER": "u"}) for c in cases]
    outputs = [p.communicate(timeout=120) for p in procs]  # read first: a long list fills the pipe
    return [subprocess.CompletedProcess(p.args, p.returncode, *out) for p, out in zip(procs, outputs)]


def check_programs(argv_of: object, split: str) -> None:
    """Every valid case prints its hosts (joined by ``split``); every invalid one fails with its error."""
    for case, out in zip(VALID, run_all(argv_of, VALID)):
        assert out.returncode == 0, (case["list"], out.stderr)
        check_hosts(case, out.stdout.strip("\n").split(split))
    for case, out in zip(INVALID, run_all(argv_of, INVALID)):
        assert out.returncode != 0 and case["error"] in out.stderr and "Traceback" not in out.stderr, (case, out.stderr)


def test_get_master_as_installed(tmp_path: Path) -> None:
    from sitestack.engine import playbook as pb
    for name, (text, mode) in scripts("lumi", pb.load("lumi").facts).items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
        (tmp_path / name).chmod(mode)
    check_programs(lambda text: [sys.executable, "-E", "-s", str(tmp_path / "get-master"), "--all", "--", text], "\n")
    first = subprocess.run([sys.executable, "-E", "-s", str(tmp_path / "get-master"), "nid[005-007]"], capture_output=True, text=True)
    assert first.stdout == "nid005\n"


def test_the_check_program_as_installed(tmp_path: Path) -> None:
    """The installed job's package reads host lists with the hostlist.py installed beside it."""
    install_programs(tmp_path)
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from onsite import hostlist\n"
            "assert hostlist.__file__ == sys.argv[1] + '/onsite/hostlist.py', hostlist.__file__\n"
            "try:\n    print('\\n'.join(hostlist.expand(sys.argv[2])))\n"
            "except hostlist.HostlistError as exc:\n    sys.exit(f'error: {exc}')\n")
    check_programs(lambda text: [sys.executable, "-I", "-c", code, str(tmp_path), text], "\n")


@pytest.mark.parametrize("shell", SHELLS)
def test_the_launch_helper_in_each_shell(shell: str, tmp_path: Path) -> None:
    helper = render("lumi", tmp_path)
    check_programs(lambda text: [shell, "-c", '. "$1" >/dev/null && sitestack_hostlist "$2"', shell, str(helper), text], ",")


@pytest.mark.parametrize("shell", SHELLS)
def test_the_launch_helper_sets_nodelist_from_the_table(shell: str, tmp_path: Path) -> None:
    """Sourced in a job, the helper's NODELIST is the table's expansion of SLURM_JOB_NODELIST."""
    helper = render("lumi", tmp_path)
    script = 'SLURM_JOB_NODELIST=$2; export SLURM_JOB_NODELIST; . "$1" >/dev/null 2>&1; printf "%s\\n" "$NODELIST"'
    for case, out in zip(VALID, run_all(lambda text: [shell, "-c", script, shell, str(helper), text], VALID)):
        assert out.returncode == 0, (case["list"], out.stderr)
        check_hosts(case, out.stdout.strip("\n").split(","))


def test_the_job_script_without_a_launch_helper_takes_master_addr_from_the_table(tmp_path: Path) -> None:
    """``invoke validate --python`` installs no launch helper: the job script's own MASTER_ADDR block
    expands SLURM_JOB_NODELIST with the job's hostlist.py, and refuses a list it cannot read."""
    from sitestack.installs.site_stack import job_inputs
    from sitestack.validation import jobs
    from tests.test_validation_jobs import context

    ctx = context("local")
    files = jobs.job_files(job_inputs(ctx, str(tmp_path), sys.executable))
    text = next(t for name, (t, _) in files.items() if name.endswith(".sbatch"))
    block = text[text.index("# MASTER_ADDR:"):text.index("export MASTER_ADDR")] + 'echo "$NODELIST"\n'
    install_programs(tmp_path, ("hostlist.py",))
    script = f'PYTHON={sys.executable}; VALIDATION_DIR={tmp_path}; SLURM_JOB_NODELIST=$1\n{block}'
    for case, out in zip(VALID, run_all(lambda text: ["bash", "-c", script, "bash", text], VALID)):
        assert out.returncode == 0, (case["list"], out.stderr)
        check_hosts(case, out.stdout.strip("\n").split(","))
    refused = [c for c in INVALID if c["list"]]   # an empty SLURM_JOB_NODELIST is no Slurm job: this host
    for case, out in zip(refused, run_all(lambda text: ["bash", "-c", script, "bash", text], refused)):
        assert out.returncode != 0 and out.stderr.startswith("sitestack: SLURM_JOB_NODELIST: cannot parse host list: "), \
            (case, out.stderr)
        assert case["error"] in out.stderr and out.stderr.count("\n") == 1 and out.stdout == "", (case, out)
