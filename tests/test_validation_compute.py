"""The compute check's judgement and the ranks' thread settings, on records as the ranks write them:
turns, balance between ranks, the site's reference, the likely cause (thread oversubscription, a
CPU quota, a stopped rank, a busy machine), the cgroup quota files, numpy's version, the report's
threads column, and the reference from the playbook to check-config.json."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from sitestack.core.errors import InputError
from sitestack.engine import playbook as pb
from sitestack.onsite import ddp_report
from sitestack.onsite.ddpcheck import compute, env_check, threads

HEALTHY = 145.0  # GFLOPS of one rank here, idle


def rank(r: int, host: str = "h0", cpus: tuple[int, ...] = (0, 1), torch_threads: int = 1, sharing: int = 2,
         env: dict | None = None, device: str = "cpu", gpu: int | None = None) -> dict:
    """A rank's report as env_check.rank_record writes it (after share_cpus)."""
    return {"rank": r, "host": host, "affinity": list(cpus), "device": device, "physical_gpu": gpu,
            "threads": {"torch_threads": torch_threads, "interop_threads": 2, "cpus": len(cpus), "ranks_sharing": sharing,
                        "env": {"OMP_NUM_THREADS": None, "MKL_NUM_THREADS": None, "OPENBLAS_NUM_THREADS": None,
                                **(env or {})}, "quota": None}}


def record(r: int, gflops: float = HEALTHY, own: float | None = None, ran: float = 0.99, waited: float = 0.01,
           quota: dict | None = None, throttled: list | None = None, host: str = "h0", device: str = "cpu") -> dict:
    """A rank's compute record as compute.measure writes it."""
    return {"rank": r, "host": host, "device": device, "turn": 0, "threads": 1, "gflops": gflops,
            "gflops_own": gflops if own is None else own, "windows": [gflops] * 5, "ran_per_s": ran,
            "waited_per_s": waited, "quota": quota, "throttled": throttled}


QUOTA = {"cpus": 0.3, "text": "cpu.max 30000 100000", "dir": "/sys/fs/cgroup/job"}


# -- turns ---------------------------------------------------------------------------------------------

def test_ranks_time_at_once_unless_they_outnumber_their_cpus():
    assert compute.turns([rank(0), rank(1)]) == [0, 0]  # 2 ranks, 2 shared CPUs: at once, as they train
    assert compute.turns([rank(i, sharing=4) for i in range(4)]) == [0, 0, 1, 1]  # 4 ranks on 2 cores
    assert compute.turns([rank(0, cpus=(0,)), rank(1, cpus=(1,)), rank(2, cpus=(0,))]) == [0, 0, 1]
    # more threads than CPUs is not hidden by turns: it slows the ranks as it slows training
    assert compute.turns([rank(0, torch_threads=32), rank(1, torch_threads=32)]) == [0, 0]
    # each host on its own; unknown CPUs compete with everything
    assert compute.turns([rank(0, cpus=()), rank(1, cpus=()), rank(2, host="h1", cpus=())]) == [0, 1, 0]


def test_gpu_ranks_take_turns_only_on_a_shared_gpu():
    gpus = [rank(i, device=f"cuda:{i}", gpu=i, cpus=tuple(range(64))) for i in range(4)]
    assert compute.turns(gpus) == [0, 0, 0, 0]
    assert compute.turns([rank(0, device="cuda:0", gpu=0), rank(1, device="cuda:0", gpu=0)]) == [0, 1]


# -- balance between ranks -----------------------------------------------------------------------------

def test_ranks_in_balance_pass():
    assert compute.judge_balance([record(0, 148.9), record(1, 141.0)], [rank(0), rank(1)]) == []
    assert compute.judge_balance([record(0)], [rank(0)]) == []  # one rank: nothing to compare


def test_a_rank_held_by_its_cgroup_quota_is_named_with_the_quota():
    records = [record(0), record(1, gflops=43.0, own=140.0, ran=0.3, waited=0.7, quota=QUOTA, throttled=[11, 11])]
    found = compute.judge_balance(records, [rank(0), rank(1)])
    assert len(found) == 1 and found[0].startswith("slow rank: rank 1 on h0 is 3.4x slower than the other ranks")
    assert "CPU quota: its cgroup allows 0.3 CPUs (cpu.max 30000 100000) for 1 thread, throttled in 11 of 11" in found[0]


def test_a_stopped_rank_is_named_and_a_busy_machine_is_not():
    stopped = record(1, gflops=43.0, own=145.0, ran=0.3, waited=0.0)  # SIGSTOP 70% of the time: neither ran nor waited
    found = compute.judge_balance([record(0), stopped], [rank(0), rank(1)])
    assert found and "rank 1 on h0 is 3.4x slower" in found[0] and "stopped part of the time" in found[0]
    # other processes took the CPU from rank 0 (it waited): its own CPU time shows it computes as fast
    busy = record(0, gflops=50.9, own=134.4, ran=0.38, waited=0.62)
    assert compute.judge_balance([busy, record(1, gflops=99.8, own=138.8, ran=0.71, waited=0.29)],
                                 [rank(0), rank(1)]) == []


def test_the_slowest_of_many_ranks_leads_and_each_slow_rank_is_listed():
    records = [record(0), record(1, gflops=20.0, own=20.0), record(2), record(3, gflops=60.0, own=60.0)]
    found = compute.judge_balance(records, [rank(i) for i in range(4)])
    assert [f.split(" is ")[0] for f in found] == ["slow rank: rank 1 on h0", "slow rank: rank 3 on h0"]
    assert "it had its CPU and computed slower" in found[0]
    assert compute.judge_balance([record(0), record(1, gflops=0.0, own=0.0)], [rank(0), rank(1)])[0].startswith(
        "slow rank: rank 1 on h0 is infx slower")


def test_a_ratio_under_one_and_a_half_passes():
    assert compute.judge_balance([record(0, own=140.0), record(1, own=94.0)], [rank(0), rank(1)]) == []
    assert compute.judge_balance([record(0, own=140.0), record(1, own=93.0)], [rank(0), rank(1)])


# -- the site's reference -------------------------------------------------------------------------------

REFERENCE = {"gflops": 140.0, "lower": -0.67, "source": "measured here"}


def test_without_a_reference_nothing_is_judged():
    assert compute.judge_reference([record(0, gflops=1.0, own=1.0)], [rank(0)], None) == ([], None)


@pytest.mark.parametrize("config", [{"compute": "fast"}, {"compute": {"gflops": -3}}, {"compute": {"gflops": 9, "lower": 2}},
                                    {"compute": {"lower": -1.5}}, {"compute": {"gflops": True}},
                                    {"compute": {"gflops": float("inf")}}])
def test_a_reference_that_is_not_one_is_named(config):
    reference, wrong, _ = compute.read_reference(config)
    assert reference is None and wrong is not None and wrong.startswith("check-config.json: compute is not a reference (")
    assert compute.read_reference({"compute": None}) == (None, None, None) == compute.read_reference({})
    assert compute.read_reference({"compute": REFERENCE}) == (REFERENCE, None, None)


def test_every_rank_below_the_reference_names_thread_oversubscription():
    ranks = [rank(r, torch_threads=2, env={"OMP_NUM_THREADS": "32"}) for r in (0, 1)]
    records = [record(0, gflops=30.2, own=32.3, ran=0.5, waited=0.5), record(1, gflops=40.1, own=38.5, ran=0.5, waited=0.5)]
    found, compared = compute.judge_reference(records, ranks, REFERENCE)
    assert compared == {**REFERENCE, "minimum_gflops": 46.2}
    assert found[0].startswith("every rank below the site's compute reference: rank 0 on h0 reaches 32.3 GFLOPS, "
                               "4.3x below 140 (minimum 46.2; measured here): OMP_NUM_THREADS=32 on rank 0 (torch runs 2): "
                               "2 ranks x 2 threads on 2 CPUs of h0: thread oversubscription")
    assert len(found) == 2


def test_a_busy_machine_is_judged_on_the_ranks_own_cpu_time_but_a_quota_by_the_clock():
    busy = [record(0, gflops=40.0, own=135.0, ran=0.3, waited=0.7), record(1, gflops=45.0, own=140.0, ran=0.3, waited=0.7)]
    assert compute.judge_reference(busy, [rank(0), rank(1)], REFERENCE)[0] == []
    quota = [record(r, gflops=40.0, own=140.0, ran=0.29, waited=0.71, quota=QUOTA, throttled=[12, 11]) for r in (0, 1)]
    found = compute.judge_reference(quota, [rank(0), rank(1)], REFERENCE)[0]
    assert len(found) == 2 and "3.5x below 140" in found[0] and "CPU quota: its cgroup allows 0.3 CPUs" in found[0]
    gpu = record(0, gflops=40.0, own=900.0, device="cuda")  # a GPU rank is judged by the clock
    assert "its GPU is slower or shared" in compute.judge_reference([gpu], [rank(0, device="cuda:0", gpu=0)], REFERENCE)[0][0]


def test_the_passed_summary_says_when_the_ranks_waited_for_a_cpu():
    text = compute.passed_summary([record(0, gflops=95.0, own=142.8, ran=0.66, waited=0.34),
                                   record(1, gflops=98.9, own=144.0, ran=0.68, waited=0.32)],
                                  {**REFERENCE, "minimum_gflops": 46.2})
    assert text == ("2 ranks at 143-144 GFLOPS on their own CPU time (95-98.9 by the clock: they waited up to 0.34 s per "
                    "second for a CPU that other processes used), within 1.5x of each other; at least 46.2 (reference 140; "
                    "measured here)")
    assert compute.passed_summary([record(0)], None).endswith("not judged against a reference: the site has none")


# -- threads against CPUs ------------------------------------------------------------------------------

def test_oversubscription_names_the_variable_ranks_threads_and_cpus():
    omp = rank(0, torch_threads=32, env={"OMP_NUM_THREADS": "32"})
    assert threads.oversubscription(omp) == ("OMP_NUM_THREADS=32 on rank 0: 2 ranks x 32 threads on 2 CPUs of h0: "
                                             "thread oversubscription (set OMP_NUM_THREADS to at most 1, the CPUs per rank)")
    assert threads.oversubscription(rank(1, torch_threads=8, env={"MKL_NUM_THREADS": "8"})).startswith(
        "MKL_NUM_THREADS=8 on rank 1: 2 ranks x 8 threads")
    assert threads.oversubscription(rank(0, torch_threads=4)).startswith("torch.get_num_threads() on rank 0: 2 ranks x 4")
    assert threads.oversubscription(rank(0, torch_threads=1, sharing=4)) is None  # more ranks than cores: the job's choice
    assert threads.oversubscription(rank(0, cpus=tuple(range(8)), torch_threads=4)) is None  # 2 x 4 on 8 CPUs
    assert threads.oversubscription({"rank": 0}) is None  # a rank reported before its threads were known


def test_ranks_sharing_count_the_ranks_of_a_host_whose_cpus_overlap():
    ranks = [rank(0, cpus=(0, 1)), rank(1, cpus=(1, 2)), rank(2, cpus=(3,)), rank(3, cpus=(0,), host="h1")]
    threads.share_cpus(ranks)
    assert [r["threads"]["ranks_sharing"] for r in ranks] == [2, 2, 1, 1]
    unknown = [rank(0, cpus=()), rank(1, cpus=(5,))]
    threads.share_cpus(unknown)
    assert [r["threads"]["ranks_sharing"] for r in unknown] == [2, 2]


def test_thread_variables_that_are_not_numbers_are_named():
    run = SimpleNamespace(args=SimpleNamespace(expect_world_size=None, device="cpu"), info=SimpleNamespace(rank=0, world_size=1),
                          dev=SimpleNamespace(problem=None, kind="cpu"), config={}, host="h0", me={},
                          env={"OMP_NUM_THREADS": "lots", "MKL_NUM_THREADS": "8,2", "OPENBLAS_NUM_THREADS": "0"})
    assert env_check.own_problems(run, "2.13.0") == [  # type: ignore[arg-type]
        "OMP_NUM_THREADS='lots' is not a number of threads (a positive integer)",
        "OPENBLAS_NUM_THREADS='0' is not a number of threads (a positive integer)"]


# -- the cgroup's CPU quota and the kernel's schedule ---------------------------------------------------

@pytest.mark.parametrize("files, cpus", [
    ({"cpu.max": "30000 100000"}, 0.3), ({"cpu.max": "max 100000"}, None), ({"cpu.max": "garbage"}, None),
    ({"cpu.cfs_quota_us": "150000", "cpu.cfs_period_us": "100000"}, 1.5),
    ({"cpu.cfs_quota_us": "-1", "cpu.cfs_period_us": "100000"}, None), ({}, None)])
def test_quota_files_of_cgroup_v2_and_v1(tmp_path, files, cpus):
    for name, text in files.items():
        (tmp_path / name).write_text(text + "\n")
    level = threads._level_quota(str(tmp_path))
    assert (level and level[0]) == cpus


def test_throttled_periods_from_cpu_stat(tmp_path):
    (tmp_path / "cpu.stat").write_text("usage_usec 1\nnr_periods 44\nnr_throttled 42\nthrottled_usec 2888\n")
    assert threads.throttling({"dir": str(tmp_path)}) == (44, 42)
    (tmp_path / "cpu.stat").write_text("usage_usec 1\n")
    assert threads.throttling({"dir": str(tmp_path)}) is None and threads.throttling(None) is None


def test_this_process_schedule_and_quota_are_read_from_proc():
    before = threads.sched_seconds()
    assert before is not None and before[0] > 0
    quota = threads.cpu_quota()  # whatever this machine has: a quota is a fraction of CPUs with its file
    assert quota is None or (quota["cpus"] > 0 and quota["text"].startswith(("cpu.max", "cpu.cfs_quota_us")))


def test_numpy_version_missing_broken_or_present(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "numpy", None)
    assert threads.numpy_version() is None
    monkeypatch.delitem(sys.modules, "numpy")
    (tmp_path / "numpy").mkdir()
    (tmp_path / "numpy" / "__init__.py").write_text("raise ImportError('numpy C-extensions failed')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert threads.numpy_version() == "broken: ImportError: numpy C-extensions failed"
    (tmp_path / "numpy" / "__init__.py").write_text("__version__ = '2.4.6'\n")
    monkeypatch.delitem(sys.modules, "numpy", raising=False)
    assert threads.numpy_version() == "2.4.6"


# -- report and facts -----------------------------------------------------------------------------------

def test_the_report_shows_each_ranks_threads():
    r = rank(0, torch_threads=2, env={"OMP_NUM_THREADS": "32"})
    assert ddp_report.threads_text(r["threads"]) == "2 torch (2 inter-op) · OMP_NUM_THREADS=32 · 2 ranks share its 2 CPUs"
    assert ddp_report.threads_text(None) == "—"
    text = ddp_report.markdown({"verdict": "passed", "checks": [], "ranks": [{**r, "local_rank": 0, "device": "cpu"}]})
    assert "| threads |" in text and "| 2 torch (2 inter-op) · OMP_NUM_THREADS=32 · 2 ranks share its 2 CPUs |" in text


def test_the_compute_reference_goes_from_the_playbook_to_the_check_config():
    local = pb.load("local").facts.validation
    assert local is not None and local.compute is not None and local.compute.lower == -0.67
    assert local.compute.gflops is None and local.single_node is not None and local.single_node.busbw_gbs is None
    lumi = pb.load("lumi").facts.validation
    assert lumi is not None and lumi.compute is None  # no published figure: measured, not judged


@pytest.mark.parametrize("bad, message", [({"gflops": -1}, "gflops must be positive"),
                                          ({"gflops": 10, "lower": -1.5}, "lower must be in (-1, 0], not -1.5"),
                                          ({"gflops": "calibrate"}, "gflops")])
def test_a_bad_compute_reference_is_refused(tmp_path, bad, message):
    book = yaml.safe_load((Path(pb.__file__).resolve().parents[2] / "playbooks" / "local.yml").read_text())
    book["site"] = "bad"
    book["facts"]["validation"]["compute"] = bad
    (tmp_path / "bad.yml").write_text(yaml.safe_dump(book))
    with pytest.raises(InputError, match=r"facts\.validation\.compute"):
        try:
            pb.load(path=tmp_path / "bad.yml")
        except InputError as exc:
            assert message in str(exc)
            raise


def test_check_config_json_carries_the_reference(tmp_path):
    from tests.test_validation_jobs import rendered
    # no gflops in the playbook: calibrated on the machine itself (tests/test_calibration.py)
    assert json.loads(rendered("local")["check-config.json"][0])["compute"] == {
        "gflops": None, "lower": -0.67, "source": "calibrated on this machine (1 thread per rank)"}
    assert json.loads(rendered("dawn")["check-config.json"][0])["compute"] is None
