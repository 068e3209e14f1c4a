"""The collectives check (``ddpcheck/collectives.py``): values whose sums stay exact in each dtype for
any world size, the judging of the ranks' reports, the faults of the test kit, the report's section,
and two real 2-rank gloo runs of the installed check program (healthy, and with both faults)."""

from __future__ import annotations

import json
import struct

import pytest

from sitestack.onsite import ddp_report
from sitestack.onsite.ddpcheck import collectives as co
from sitestack.onsite.ddpcheck.verdicts import FAILED, PASSED
from tests.ports import free_port
from tests.test_validation_run import checks_of, run_ranks

SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20]
WORLDS = (1, 2, 3, 7, 8, 9, 128, 129, 251, 255, 256, 257, 300, 502, 511, 2048, 2049, 5000, 65536, 251 * 257)


def exact_in(dtype: str, value: int) -> bool:
    """Whether the integer ``value`` survives a round trip through ``dtype`` (bfloat16: the top half of
    a float32, rounded to nearest even, as torch converts it)."""
    if dtype == "float16":
        return int(struct.unpack("<e", struct.pack("<e", value))[0]) == value
    bits = struct.unpack("<I", struct.pack("<f", value))[0]
    if dtype == "bfloat16":
        bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return int(struct.unpack("<f", struct.pack("<I", bits))[0]) == value


@pytest.mark.parametrize("dtype", co.DTYPES)
def test_the_exact_bound_is_the_dtypes_own(dtype):
    bound = co.EXACT[dtype]
    assert all(exact_in(dtype, v) for v in range(0, min(bound, 1 << 12) + 1)) and exact_in(dtype, bound)
    assert not exact_in(dtype, bound + 1)


@pytest.mark.parametrize("dtype", co.DTYPES)
@pytest.mark.parametrize("world", WORLDS)
def test_sums_over_the_ranks_stay_exact_and_tell_elements_apart(dtype, world):
    base = co.base_period(dtype, world)
    sums = co.summed_period(base, world)
    assert min(base) >= 0 and max(sums) <= co.EXACT[dtype] and len(sums) == len(base)
    if world <= 600:  # the closed form against the plain sum of every rank's rotated values
        assert sums == [sum(base[(k + r) % len(base)] for r in range(world)) for k in range(len(base))]
    assert len(set(sums)) > 1 and len(base) % 2 == 1  # odd: a power-of-two chunk never lines up with another


def test_all_gather_and_broadcast_values_are_the_plain_period():
    assert co.base_period("bfloat16", 1) == list(range(co.PERIODS[0])) == co.summed_period(co.base_period("float16", 1), 1)


def test_each_fault_spoils_its_place_only():
    env = {"SITESTACK_CHECK_FAULT": "collective-large@1,collective-half@0"}
    grid = [(op, dtype, size, it) for op in co.OPS for dtype in co.DTYPES for size in SIZES
            for it in range(1, co.repeats(size, SIZES[-1]) + 1)]
    assert [w for w in grid if co.spoiled(env, 1, w, SIZES[-1])] == [("all-reduce", "float32", 4 << 20, 3)]
    half = [w for w in grid if co.spoiled(env, 0, w, SIZES[-1])]
    assert {(op, dtype) for op, dtype, _, _ in half} == {("all-gather", "bfloat16"), ("all-gather", "float16")}
    assert len(half) == 2 * (len(SIZES) - 1 + co.REPEATS)
    assert not any(co.spoiled({}, 1, w, SIZES[-1]) for w in grid)


def report(*found: tuple[tuple[str, str, int, int], int], unsupported: dict | None = None) -> dict:
    """A rank's report as check_rank builds it, with ``found``: (where, wrong elements)."""
    rank_report: dict = {"wrong": {}, "first": [], "unsupported": unsupported or {}}
    for where, wrong in found:
        size = where[2]
        co.record(rank_report, where, {"wrong": wrong, "elements": size // 4, "index": 7, "got": -1.0, "expected": 3.0},
                  co.repeats(size, SIZES[-1]))
    return rank_report


def test_a_healthy_run_passes_and_says_what_it_checked():
    status, summary, details = co.judge([report(), report()], SIZES, "gloo")
    assert status == PASSED, summary
    assert summary == ("all-reduce, all-gather, reduce-scatter, broadcast exact in float32, bfloat16, float16 at 6 sizes "
                       "4 KiB-4 MiB (3 times at 4 MiB) on all 2 ranks")
    assert details["wrong_elements"] == [0, 0] and details["wrong"] == {} and details["repeats"][str(4 << 20)] == 3


def test_one_wrong_element_fails_naming_rank_size_dtype_operation_and_iteration():
    status, summary, details = co.judge([report(), report((("all-reduce", "float32", 4 << 20, 3), 1))], SIZES, "gloo")
    assert status == FAILED
    assert summary == ("rank 1: all-reduce float32 at 4 MiB, iteration 3 of 3: 1 of 1048576 elements wrong "
                       "(element 7 is -1, expected 3)")
    assert details["wrong"] == {"1": {"all-reduce": {"float32": {str(4 << 20): 1}}}} and details["wrong_elements"] == [0, 1]


def test_many_wrong_results_are_counted_by_rank_op_dtype_and_size():
    half = [(("all-gather", dtype, size, 1), 2) for dtype in co.HALF for size in SIZES]
    status, summary, details = co.judge([report(*half), report((("broadcast", "float32", 4 << 10, 1), 5))], SIZES, "nccl")
    assert status == FAILED and summary.startswith("rank 0: all-gather bfloat16 at 4 KiB, iteration 1 of 1: 2 of")
    assert summary.endswith("; 29 wrong elements in all, on ranks 0, 1")
    assert details["wrong"]["0"]["all-gather"]["float16"] == {str(s): 2 for s in SIZES}
    assert details["wrong_elements"] == [24, 5] and len(details["problems"]) == co.KEPT + 1


def test_an_operation_the_backend_lacks_is_named_not_passed_over():
    reason = "ProcessGroupGloo does not support reduce_scatter"
    lacking = {"reduce-scatter": {"bfloat16": reason, "float16": reason}}
    status, summary, details = co.judge([report(unsupported=lacking), report(unsupported=lacking)], SIZES, "gloo")
    assert status == PASSED and details["unsupported"] == lacking
    assert summary.endswith(f"; reduce-scatter in bfloat16, float16 not supported by gloo ({reason})")
    assert co.UNSUPPORTED.search(reason) and not co.UNSUPPORTED.search("Connection closed by peer")


def test_an_empty_sweep_checks_nothing_and_fails():
    status, summary, _ = co.judge([report()], [], "gloo")
    assert status == FAILED and "no sizes to check" in summary


def test_the_summary_shows_each_operation_and_dtype():
    lacking = {"reduce-scatter": {"float16": "not supported"}}
    status, summary, details = co.judge([report(unsupported=lacking), report((("all-reduce", "float32", 4 << 20, 3), 1))],
                                        SIZES, "gloo")
    result = {"verdict": "failed", "backend": "gloo", "checks": [
        {"name": "collectives", "status": status, "summary": summary, "details": details, "seconds": 1.0}]}
    text = ddp_report.markdown(result)
    assert "| all-reduce | wrong: rank 1 at 4 MiB: 1 | exact | exact |" in text
    assert "| reduce-scatter | exact | exact | not supported by gloo |" in text
    assert "Sizes 4 KiB, 16 KiB, 64 KiB, 256 KiB, 1 MiB, 4 MiB (4 MiB 3 times)" in text


# -- the installed check program, 2 gloo ranks -------------------------------------------------------------

@pytest.mark.integration
@pytest.mark.parametrize("fault", ["", "collective-large@1,collective-half@0"])
def test_the_collectives_of_a_real_run(installed_local_job, tmp_path, fault, monkeypatch):
    """Two ranks started by hand (the plain env:// launcher): healthy, every operation and dtype is
    exact at every size of the bandwidth sweep; with the faults, the check fails naming each."""
    monkeypatch.setenv("SITESTACK_CHECK_FAULT", fault)
    out = tmp_path / "out"
    results = run_ranks(installed_local_job, out, world=2, nprocs=2, port=free_port(), extra=("--no-mpi",))
    assert [rc for rc, _ in results] == ([1, 1] if fault else [0, 0]), results[0][1][-3000:]
    result = json.loads((out / "result.json").read_text())
    check = checks_of(result)["collectives"]
    details, big = check["details"], str(4 << 20)
    assert details["sizes"] == [row["bytes"] for row in result["bandwidth"]["rows"]] == SIZES
    assert details["repeats"][big] == 3 and details["unsupported"] == {}  # gloo on CPU has every op and dtype
    summary = (out / "summary.md").read_text()
    if not fault:
        assert check["status"] == "passed" and details["wrong_elements"] == [0, 0], check["summary"]
        assert "| reduce-scatter | exact | exact | exact |" in summary
        return
    assert check["status"] == "failed" and result["cause"].startswith("collectives: rank 0: all-gather bfloat16 at 4 KiB")
    assert details["wrong"]["1"] == {"all-reduce": {"float32": {big: 1}}}
    assert details["wrong"]["0"] == {"all-gather": {d: {**{str(s): 1 for s in SIZES}, big: 3} for d in co.HALF}}
    assert "rank 1: all-reduce float32 at 4 MiB, iteration 3 of 3: 1 of 1048576 elements wrong" in details["problems"][-1]
    assert "| all-reduce | wrong: rank 1 at 4 MiB: 1 | exact | exact |" in summary
    others = {name: c["status"] for name, c in checks_of(result).items() if name != "collectives"}
    assert others["ddp"] == others["bandwidth"] == "passed", others
