"""Unit tests of the validation job's pieces: CPU masks, rank discovery, device and
backend choice, NCCL log judgement, bandwidth definitions, the verdict and the report."""

from __future__ import annotations

import json
import re
import socket
import sys
import types
from pathlib import Path

import pytest

from sitestack.engine import playbook as pb
from sitestack.onsite import ddp_report, nccl_log, report_plot, result_schema
from sitestack.onsite.ddpcheck import (
    affinity,
    bandwidth,
    devices,
    faults,
    mpi,
    netplugin,
    procgroup,
    ranks,
    verdicts,
)
from sitestack.onsite.ddpcheck.checks import CHECKS
from sitestack.validation import masks
from sitestack.validation.jobs import PORT_BASE, PORT_SPAN, master_port

LUMI_MASKS = ("0x00fe000000000000,0xfe00000000000000,0x0000000000fe0000,0x00000000fe000000,"
              "0x00000000000000fe,0x000000000000fe00,0x000000fe00000000,0x0000fe0000000000")


# -- CPU masks -------------------------------------------------------------------------------------

def test_lumi_masks_derived_from_the_facts_match_the_documented_ones():
    binding = masks.Binding.from_facts(pb.load("lumi").facts)
    assert ",".join(masks.rank_masks(binding)) == LUMI_MASKS
    assert masks.cores_for_gpu(binding, 0) == list(range(49, 56))  # GCD 0 -> CCD 6, core 48 reserved


def test_frontier_gets_the_same_masks_from_its_own_facts():
    assert ",".join(masks.rank_masks(masks.Binding.from_facts(pb.load("frontier").facts))) == LUMI_MASKS


def test_smt_masks_add_the_sibling_threads():
    binding = masks.Binding((6, 7, 2, 3, 0, 1, 4, 5), 8, 64, tuple(range(0, 64, 8)), threads_per_core=2)
    first = masks.rank_masks(binding)[0]
    assert int(first, 16) == 0xfe00000000000000fe000000000000  # LUMI's SMT affinity check mask
    assert masks.cpus_for_gpu(binding, 4) == [1, 2, 3, 4, 5, 6, 7, 65, 66, 67, 68, 69, 70, 71]


def test_masks_refuse_inconsistent_facts():
    with pytest.raises(ValueError, match="NUMA 9"):
        masks.cores_for_gpu(masks.Binding((9,), 8, 64), 0)
    with pytest.raises(ValueError, match="reserved"):
        masks.cores_for_gpu(masks.Binding((0,), 1, 2, (0,)), 0)
    assert affinity.parse_masks("0x3,0xc") == [{0, 1}, {2, 3}]
    assert affinity.parse_mask("00ff,fe000000") == set(range(25, 40))
    assert affinity.cpu_list({1, 2, 3, 5}) == "1-3,5"


def test_sites_without_cpu_bind_have_no_masks():
    assert masks.Binding.from_facts(pb.load("dawn").facts) is None
    assert masks.Binding.from_facts(pb.load("cirrus").facts) is None


# -- rank discovery --------------------------------------------------------------------------------

SLURM_BATCH = {"SLURM_JOB_ID": "77", "SLURM_PROCID": "0", "SLURM_NTASKS": "8", "SLURM_LOCALID": "0",
               "SLURM_JOB_NODELIST": "nid[001-002]"}


@pytest.mark.parametrize("env, want", [
    ({**SLURM_BATCH, "SLURM_STEP_ID": "0", "SLURM_PROCID": "5", "SLURM_STEP_NUM_TASKS": "8", "SLURM_LOCALID": "1",
      "SLURM_NODEID": "1", "SLURM_STEP_TASKS_PER_NODE": "4(x2)"}, (5, 8, 1, 4, "srun")),
    ({**SLURM_BATCH, "TORCHELASTIC_RUN_ID": "77", "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "3",
      "LOCAL_WORLD_SIZE": "4"}, (3, 4, 3, 4, "torchrun")),
    ({**SLURM_BATCH, "PMI_RANK": "6", "PMI_SIZE": "8", "MPI_LOCALRANKID": "2", "MPI_LOCALNRANKS": "4"},
     (6, 8, 2, 4, "mpiexec (Hydra)")),
    # Hydra starts its proxies with srun: the ranks see the proxy step's SLURM_* too; PMI wins
    ({**SLURM_BATCH, "SLURM_STEP_ID": "1", "SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "2",
      "PMI_RANK": "7", "PMI_SIZE": "8", "MPI_LOCALRANKID": "3", "MPI_LOCALNRANKS": "4"}, (7, 8, 3, 4, "mpiexec (Hydra)")),
    ({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
      "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, (2, 4, 0, 2, "mpirun (Open MPI)")),
    ({"HOROVOD_RANK": "1", "HOROVOD_SIZE": "2", "HOROVOD_LOCAL_RANK": "1", "HOROVOD_LOCAL_SIZE": "2",
      "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}, (1, 2, 1, 2, "horovodrun")),
    ({"PALS_RANKID": "9", "PMI_SIZE": "16", "PALS_LOCAL_RANKID": "1"}, (9, 16, 1, None, "mpiexec (PALS)")),
    ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}, (1, 2, 1, None, "env")),
    ({}, (0, 1, 0, 1, "none")),
])
def test_ranks_are_found_under_every_launcher(env, want):
    info = ranks.discover_rank(env)
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size, info.launcher) == want


def test_a_batch_step_is_not_mistaken_for_srun_ranks():
    # the batch script itself has SLURM_PROCID=0 and SLURM_NTASKS=8 but no step: a single process
    assert ranks.discover_rank(SLURM_BATCH).launcher == "none"


def test_garbage_rank_variables_are_named():
    with pytest.raises(ValueError, match="PMI_RANK"):
        ranks.discover_rank({"PMI_RANK": "x", "PMI_SIZE": "2", "MPI_LOCALRANKID": "0"})


# -- device and backend ----------------------------------------------------------------------------

def fake_torch(cuda: int = 0, hip: str | None = None, xpu: int = 0, xccl: bool = False):
    return types.SimpleNamespace(
        cuda=types.SimpleNamespace(is_available=lambda: cuda > 0, device_count=lambda: cuda),
        xpu=types.SimpleNamespace(is_available=lambda: xpu > 0, device_count=lambda: xpu),
        version=types.SimpleNamespace(hip=hip, cuda="12.1" if cuda and not hip else None),
        distributed=types.SimpleNamespace(is_xccl_available=lambda: xccl))


def test_rocm_uses_nccl_backend_on_rccl_and_maps_the_physical_gcd():
    dev = devices.select_device(fake_torch(cuda=8, hip="6.2.4"), 3, 8, {})
    assert (dev.kind, dev.index, dev.backend, dev.library, dev.physical) == ("cuda", 3, "nccl", "RCCL", 3)
    # srun --gpus-per-task=1 --gpu-bind=closest: one visible GCD, device 0, physical from ROCR_VISIBLE_DEVICES
    dev = devices.select_device(fake_torch(cuda=1, hip="5.7"), 5, 8, {"ROCR_VISIBLE_DEVICES": "6"})
    assert (dev.index, dev.physical) == (0, 6)


def test_cuda_uses_nccl_and_too_few_devices_is_a_problem():
    dev = devices.select_device(fake_torch(cuda=4), 1, 4, {"CUDA_VISIBLE_DEVICES": "0,1,2,3"})
    assert (dev.backend, dev.library, dev.index) == ("nccl", "NCCL", 1)
    bad = devices.select_device(fake_torch(cuda=2), 3, 4, {})
    assert bad.index is None and "sees only 2 devices" in bad.problem


def test_intel_xpu_prefers_xccl_then_ccl():
    assert devices.select_device(fake_torch(xpu=8, xccl=True), 2, 8, {"ZE_AFFINITY_MASK": "0,1,2,3,4,5,6,7"}).backend == "xccl"
    dev = devices.select_device(fake_torch(xpu=8, xccl=False), 2, 8, {})
    assert dev.backend == "ccl" and dev.library == "oneCCL"
    if "oneccl_bindings_for_pytorch" not in sys.modules:
        assert "oneccl_bindings_for_pytorch" in dev.problem


def test_cpu_uses_gloo():
    dev = devices.select_device(fake_torch(), 0, 2, {})
    assert (dev.kind, dev.backend, dev.index) == ("cpu", "gloo", None)
    assert devices.select_device(fake_torch(cuda=4), 0, 2, {}, force_cpu=True).backend == "gloo"


# -- affinity ----------------------------------------------------------------------------------------

def ranks_on(host: str, affinities: list[list[int]], gpus: list[int | None] | None = None) -> list[dict]:
    return [{"rank": i, "local_rank": i, "host": host, "affinity": a,
             "physical_gpu": (gpus[i] if gpus else None)} for i, a in enumerate(affinities)]


def test_affinity_matches_the_masks_or_names_the_rank():
    cfg = {}
    good = ranks_on("vm", [[0], [1]])
    status, summary, _ = affinity.judge_affinity(good, cfg, [{0}, {1}])
    assert status == "passed" and "all 2 ranks" in summary
    status, summary, _ = affinity.judge_affinity(ranks_on("vm", [[1], [0]]), cfg, [{0}, {1}])
    assert status == "failed" and "rank 0 on vm runs on CPUs 1, expected 0" in summary


def test_affinity_against_the_gpu_numa_map_folds_smt_siblings():
    cfg = {"cpu_bind": {"gpu_cpus": [list(range(49, 56)), list(range(57, 64))], "node_cores": 64}}
    ok = ranks_on("nid001", [list(range(49, 56)) + list(range(113, 120)), list(range(57, 64))], gpus=[0, 1])
    assert affinity.judge_affinity(ok, cfg, None)[0] == "passed"
    swapped = ranks_on("nid001", [list(range(57, 64)), list(range(49, 56))], gpus=[0, 1])
    status, summary, _ = affinity.judge_affinity(swapped, cfg, None)
    assert status == "failed" and "closest to GPU 0" in summary


def test_all_ranks_on_one_core_is_the_torchrun_pitfall():
    status, summary, _ = affinity.judge_affinity(ranks_on("frontier01", [[1], [1], [1]]), {}, None)
    assert status == "failed" and "same CPU 1" in summary and "torchrun" in summary


# -- NCCL / RCCL logs ----------------------------------------------------------------------------------
# Excerpts in the formats of public NCCL_DEBUG=INFO logs (hosts and pids changed):
#   plugin loaded over cxi: aws/aws-ofi-nccl#801 ("NET/OFI Selected Provider is cxi (found 8 nics)",
#     "Using network AWS Libfabric"), determined-ai/environments#169 (nid hosts, provider cxi),
#     aws/aws-ofi-nccl#161 ("NET/OFI Using aws-ofi-nccl 1.3.0aws"), LUMI user guide
#     (https://docs.lumi-supercomputer.eu/software/packages/pytorch/).
#   socket fallback: NVIDIA/nccl#352 and #226 ("NET/Plugin : No plugin found (libnccl-net.so)."
#     then "NET/Socket : Using [0]..."), NVIDIA/nccl#1126 ("... using internal implementation",
#     "Using network Socket"), NVIDIA/nccl-tests#188 ("Plugin load (libnccl-net.so) returned 2 : ...").

PLUGIN_OK = """\
nid005011:51404:52019 [0] NCCL INFO Bootstrap : Using hsn0:10.253.6.64<0>
nid005011:51404:52019 [0] NCCL INFO NET/OFI Using aws-ofi-rccl 1.4.0
nid005011:51404:52019 [0] NCCL INFO NET/OFI Selected Provider is cxi (found 4 nics)
nid005011:51404:52019 [0] NCCL INFO Using network AWS Libfabric
nid005012:61338:62013 [0] NCCL INFO NET/OFI Using aws-ofi-rccl 1.4.0
nid005012:61338:62013 [0] NCCL INFO NET/OFI Selected Provider is cxi (found 4 nics)
nid005012:61338:62013 [0] NCCL INFO Using network AWS Libfabric
nid005012:61338:62013 [0] NCCL INFO Channel 00/0 : 8[0] -> 0[0] [receive] via NET/AWS Libfabric/0
"""

SOCKET_FALLBACK = """\
nid005011:17754:17754 [0] NCCL INFO Bootstrap : Using [0]hsn0:10.253.6.64<0>
nid005011:17754:17754 [0] NCCL INFO NET/Plugin : No plugin found (libnccl-net.so).
nid005011:17754:17754 [0] NCCL INFO NET/IB : No device found.
nid005011:17754:17754 [0] NCCL INFO NET/Socket : Using [0]hsn0:10.253.6.64<0>
nid005012:17755:17755 [0] NCCL INFO NET/Plugin : No plugin found (libnccl-net.so).
nid005012:17755:17755 [0] NCCL INFO NET/Socket : Using [0]hsn0:10.253.6.65<0>
nid005012:17755:17766 [0] NCCL INFO Using network Socket
"""

NEWER_FALLBACK = """\
user1:852750:852750 [0] NCCL INFO NET/Plugin : Plugin load (libnccl-net.so) returned 2 : libnccl-net.so: cannot open shared object file: No such file or directory
user1:852750:852750 [0] NCCL INFO NET/Plugin : No plugin found, using internal implementation
user2:39964:40050 [6] NCCL INFO Using network IB
"""


def test_plugin_loaded_on_every_host_passes():
    status, summary, evidence = netplugin.judge_net_plugin(PLUGIN_OK, hosts=2, plugin="aws-ofi-rccl", provider="cxi")
    assert status == "passed", summary
    assert "2 hosts used OFI" in summary and "aws-ofi-rccl 1.4.0" in summary and "provider cxi" in summary
    assert any("Selected Provider is cxi" in e for e in evidence)


def test_socket_fallback_fails_with_the_log_line():
    status, summary, _ = netplugin.judge_net_plugin(SOCKET_FALLBACK, hosts=2, plugin="aws-ofi-rccl", provider="cxi")
    assert status == "failed"
    assert summary.startswith("plugin not found on nid005011") and "No plugin found" in summary and "it used Socket" in summary


def test_socket_fallback_fails_even_where_no_plugin_is_expected():
    status, summary, _ = netplugin.judge_net_plugin(SOCKET_FALLBACK, hosts=2, plugin=None, provider=None)
    assert status == "failed" and "TCP sockets" in summary


def test_missing_plugin_with_native_ib_fails_where_the_plugin_is_required_only():
    status, summary, _ = netplugin.judge_net_plugin(NEWER_FALLBACK, hosts=2, plugin="aws-ofi-nccl", provider=None)
    assert status == "failed" and "plugin not found on user1" in summary and "returned 2" in summary
    status, summary, _ = netplugin.judge_net_plugin(NEWER_FALLBACK.splitlines()[-1], hosts=2, plugin=None, provider=None)
    assert status == "passed" and "IB" in summary
    status, summary, _ = netplugin.judge_net_plugin(NEWER_FALLBACK.splitlines()[-1], hosts=2, plugin=None, provider=None,
                                             transport="ib")
    assert status == "passed" and "IB" in summary


def test_wrong_provider_and_one_host_without_plugin_fail():
    tcp = PLUGIN_OK.replace("Selected Provider is cxi", "Selected Provider is tcp")
    assert "wrong provider on nid005011: tcp" in netplugin.judge_net_plugin(tcp, hosts=2, plugin="aws-ofi-rccl", provider="cxi")[1]
    half = "\n".join(line for line in PLUGIN_OK.splitlines() if not line.startswith("nid005012") or "Bootstrap" in line)
    half += "\nnid005012:1:1 [0] NCCL INFO Bootstrap : Using hsn0:10.253.6.65<0>\n"
    status, summary, _ = netplugin.judge_net_plugin(half, hosts=2, plugin="aws-ofi-rccl", provider="cxi")
    assert status == "failed" and "nid005012" in summary


def test_single_node_judges_whether_the_plugin_loaded_and_no_log_on_multi_node_fails():
    # one node: NCCL/RCCL open the plugin in ncclInit on any node count, so "No plugin found" fails with its reason
    one = SOCKET_FALLBACK.replace("nid005012", "nid005011")
    status, summary, _ = netplugin.judge_net_plugin(one, hosts=1, plugin="aws-ofi-rccl", provider="cxi")
    assert status == "failed" and "aws-ofi-rccl did not load on nid005011" in summary, summary
    assert '"NET/Plugin : No plugin found (libnccl-net.so)."' in summary and "sockets" in summary
    loaded = "\n".join(ln for ln in PLUGIN_OK.splitlines() if ln.startswith("nid005011"))
    status, summary, _ = netplugin.judge_net_plugin(loaded, hosts=1, plugin="aws-ofi-rccl", provider="cxi")
    assert status == "passed" and "aws-ofi-rccl loaded on every host" in summary and "aws-ofi-rccl 1.4.0" in summary
    # a site that expects no plugin: nothing to prove on one node
    assert netplugin.judge_net_plugin(one, hosts=1, plugin=None, provider=None)[0] == "skipped"
    status, summary, _ = netplugin.judge_net_plugin("", hosts=1, plugin="aws-ofi-rccl", provider="cxi")
    assert status == "failed" and "no NCCL/RCCL log line" in summary
    status, summary, _ = netplugin.judge_net_plugin("", hosts=4, plugin="aws-ofi-rccl", provider="cxi")
    assert status == "failed" and "cannot prove" in summary


@pytest.mark.parametrize("lines, cause", [
    # another plugin first on the path (HPC-X's SHARP libnccl-net.so, NVIDIA/nccl#1357), or NCCL's own IBext
    (["NET/Plugin: Loaded net plugin NCCL RDMA Plugin v6 (v6)", "Using network IBext"], "the plugin 'NCCL RDMA Plugin v6' loaded"),
    (["NET/Plugin: Loaded net plugin IBext (v8)", "Using network IBext"], "the plugin 'IBext' loaded"),
    # the expected plugin loaded, but NCCL set up another network (it did not start, or NCCL_NET forced one)
    (["NET/Plugin: Loaded net plugin AWS Libfabric (v5)", "Using network Socket"], "NCCL set up the network 'Socket'"),
    (["NET/OFI Initializing aws-ofi-nccl 1.14.0", "NCCL_NET set by environment to Socket", "Using network Socket"],
     "NCCL set up the network 'Socket' (forced by NCCL_NET)"),
    (["NET/OFI Initializing aws-ofi-nccl 1.14.0", "Using network IB"], "NCCL set up the network 'IB'"),
])
def test_single_node_names_another_plugin_or_network(lines, cause):
    log = "\n".join(f"nid005011:1:1 [0] NCCL INFO {ln}" for ln in lines)
    status, summary, _ = netplugin.judge_net_plugin(log, hosts=1, plugin="aws-ofi-rccl", provider="cxi",
                                                    names=["AWS Libfabric", "Libfabric", "OFI"])
    assert status == "failed" and cause in summary and "the site expects aws-ofi-rccl" in summary, summary


def test_single_node_takes_each_name_the_plugin_goes_by():
    for lines in (["NET/OFI Initializing aws-ofi-nccl 1.18.0", "Using network Libfabric"],
                  ["NET/Plugin: Loaded net plugin Libfabric (v10)", "Using network Libfabric"],
                  ["NET/OFI Using aws-ofi-rccl 1.4.0", "Using network AWS Libfabric"]):
        log = "\n".join(f"nid005011:1:1 [0] NCCL INFO {ln}" for ln in lines)
        status, summary, _ = netplugin.judge_net_plugin(log, hosts=1, plugin="aws-ofi-rccl", provider="cxi",
                                                        names=["AWS Libfabric", "Libfabric", "OFI"])
        assert status == "passed", (lines, summary)


def test_timestamped_log_lines_are_parsed_too():
    line = "2025-05-16T16:39:51.208-07:00 | ip-10-36-29-253:79:79 [0] NCCL INFO Using network Socket"
    assert [ln.host for ln in nccl_log.parse(line.replace(" | ", ": "))[0]] == ["ip-10-36-29-253"]


# -- bandwidth ----------------------------------------------------------------------------------------

def test_busbw_follows_nccl_tests():
    assert bandwidth.bus_factor("allreduce", 16) == pytest.approx(2 * 15 / 16)
    assert bandwidth.bus_factor("allgather", 8) == pytest.approx(7 / 8)
    assert bandwidth.bus_factor("broadcast", 8) == 1.0
    row = bandwidth.bandwidth_row(134217728, 134217728 / 45.3e9, 16)
    assert row["algbw_gbs"] == pytest.approx(45.3) and row["busbw_gbs"] == pytest.approx(84.94, rel=1e-3)


def test_reference_comparison_is_reframe_style():
    ref = {"busbw_gbs": 85.0, "lower": -0.05, "message_bytes": 134217728, "source": "lumi-reframe-tests"}
    rows = [bandwidth.bandwidth_row(s, s / 40e9, 16) for s in (33554432, 67108864, 134217728)]
    status, summary, compared = bandwidth.judge_bandwidth(rows, ref, nodes=2)
    assert status == "failed" and "below 80.8 GB/s" in summary and "multi-node" in summary
    assert compared["minimum_gbs"] == pytest.approx(80.75)
    fast = [bandwidth.bandwidth_row(134217728, 134217728 / 46e9, 16)]
    assert bandwidth.judge_bandwidth(fast, ref, nodes=2)[0] == "passed"
    small = [bandwidth.bandwidth_row(4 << 20, (4 << 20) / 46e9, 16)]
    assert "largest size" in bandwidth.judge_bandwidth(small, ref, nodes=2)[1]
    assert "not judged" in bandwidth.judge_bandwidth(small, None, nodes=1)[1]


def test_sweep_sizes_and_size_parsing():
    assert bandwidth.sweep_sizes(4096, 4 << 20, 4) == [4096, 16384, 65536, 262144, 1 << 20, 4 << 20]
    assert bandwidth.parse_size("64M") == 64 << 20 and bandwidth.parse_size("4KiB") == 4096
    assert ddp_report.human_bytes(134217728) == "128 MiB" and ddp_report.human_bytes(1000) == "1000 B"


# -- process group failures, ports ---------------------------------------------------------------------

def test_master_port_is_unique_per_job_and_below_the_ephemeral_range():
    assert master_port(4242) == PORT_BASE + 4242 % PORT_SPAN
    assert master_port(1) != master_port(2)
    assert all(PORT_BASE <= master_port(j) < 32768 for j in (0, 1, 9999, 10000, 123456789))


def test_a_port_that_is_listened_on_is_reported():
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("0.0.0.0", 0))
        server.listen(1)
        port = server.getsockname()[1]
        assert "in use" in procgroup.port_in_use(port)
    assert procgroup.port_in_use(port) is None


def test_init_failures_are_explained():
    info = ranks.RankInfo(0, 4, 0, 4, "env", "RANK/WORLD_SIZE")
    timeout = RuntimeError("Timed out after 11 seconds waiting for clients. 1/3 clients joined.")
    text = procgroup.explain_init_failure(timeout, "vm", "20001", info, 10)
    assert "1 of 3 ranks joined" in text and "world size 4" in text
    used = RuntimeError("The server socket has failed to listen on any local network address. port: 20001, "
                        "useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use")
    assert "already in use" in procgroup.explain_init_failure(used, "vm", "20001", info, 10)
    iface = RuntimeError("[enforce fail at ../third_party/gloo/gloo/transport/tcp/device.cc:84] ifa != nullptr. "
                         "Unable to find address for: hsn9")
    assert procgroup.explain_init_failure(iface, "vm", "20001", info, 10).startswith(
        "GLOO_SOCKET_IFNAME names an interface this host does not have (hsn9: ")
    assert procgroup.does_not_resolve("localhost") is None
    assert procgroup.does_not_resolve("nosuchhost.invalid")


# -- verdict and report -----------------------------------------------------------------------------------

def sample_result(**over) -> dict:
    rows = [bandwidth.bandwidth_row(s, s / 1e9, 4) for s in (4096, 65536, 1 << 20)]
    result = {"site": "local", "verdict": "passed", "world_size": 4, "nodes": 1, "hosts": ["vm"], "launcher": "srun",
              "backend": "gloo", "device": "cpu", "torch": "2.13.0", "elapsed_s": 12.5,
              "checks": [{"name": "environment", "status": "passed", "summary": "4 ranks", "details": {}},
                         {"name": "horovod", "status": "skipped", "summary": "skipped: Horovod not in this stack",
                          "details": {}}],
              "ranks": [{"rank": 0, "local_rank": 0, "host": "vm", "device": "cpu", "affinity": [0, 1]}],
              "bandwidth": {"op": "allreduce", "dtype": "float32", "ranks": 4, "iters": 5, "rows": rows,
                            "reference": None, "definition": "algbw = bytes / time"},
              "mpi": {}, "artefacts": {"json": "result.json", "markdown": "summary.md", "plot": "bandwidth.png"}}
    result.update(over)
    return result


def test_skipped_checks_pass_failed_ones_fail():
    assert verdicts.verdict([verdicts.Check("a", "passed"), verdicts.Check("b", "skipped")]) == "passed"
    assert verdicts.verdict([verdicts.Check("a", "passed"), verdicts.Check("b", "failed")]) == "failed"
    assert result_schema.exit_code({"verdict": "passed"}) == 0 and result_schema.exit_code({"verdict": "failed"}) == 1


def test_fault_injection_names_rank_and_kind():
    env = {"SITESTACK_CHECK_FAULT": "seed@1, allreduce@0"}
    assert verdicts.rank_fault(env, "seed", 1) and verdicts.rank_fault(env, "allreduce", 0)
    assert not verdicts.rank_fault(env, "seed", 0) and not verdicts.rank_fault({}, "seed", 1)


def test_markdown_report_has_the_verdict_table_and_bandwidth():
    text = ddp_report.markdown(sample_result())
    assert text.startswith("# sitestack validation: local — PASSED")
    assert "| environment | PASS | 4 ranks |" in text and "| horovod | skip |" in text
    assert "| 1 MiB |" in text and "![allreduce bandwidth vs message size](bandwidth.png)" in text
    table = ddp_report.verdict_table(sample_result(verdict="failed"))
    assert "FAILED" in table.splitlines()[0]


def test_without_matplotlib_the_plot_is_an_svg_and_the_summary_links_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    result = sample_result()
    ddp_report.write_report(result, str(tmp_path))
    assert result["artefacts"]["plot"] == "bandwidth.svg" and "plot_note" not in result["artefacts"]
    assert (tmp_path / "bandwidth.svg").read_text().startswith("<?xml")
    assert json.loads((tmp_path / "result.json").read_text())["artefacts"]["plot"] == "bandwidth.svg"
    assert "![allreduce bandwidth vs message size](bandwidth.svg)" in (tmp_path / "summary.md").read_text()


def test_a_result_without_bandwidth_has_a_note_instead_of_a_plot(tmp_path):
    result = sample_result(bandwidth={})
    ddp_report.write_report(result, str(tmp_path))
    assert result["artefacts"]["plot"] is None and result["artefacts"]["plot_note"] == "no bandwidth was measured"
    assert "Plot skipped: no bandwidth was measured." in (tmp_path / "summary.md").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["result.json", "summary.md"]


def test_report_cli_renders_a_result_again(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    path = tmp_path / "result.json"
    path.write_text(json.dumps(sample_result()))
    assert ddp_report.main([str(path)]) == 0
    assert "PASSED" in capsys.readouterr().out and (tmp_path / "summary.md").exists()
    assert json.loads(path.read_text())["artefacts"]["plot"] == "bandwidth.svg"  # it names the plot drawn now


def test_the_check_program_imports_nothing_from_sitestack():
    for path in [*Path(verdicts.__file__).parent.glob("*.py"), Path(ddp_report.__file__), Path(report_plot.__file__),
                 Path(nccl_log.__file__)]:
        assert not re.search(r"^\s*(import|from)\s+sitestack", path.read_text(), re.M), path


# -- invoke validate through a Host: a stand-in job script, here and over SSH -----------------------

#: The stand-in's result.json: one the builder made (onsite/result_schema.py), its verdict and status printf's.
FAKE_RESULT = json.dumps(result_schema.build_result(
    site="local", job_id=None, launcher="torchrun", job_launcher="torchrun", started=None, backend=None, device=None,
    world_size=1, hosts=[], torch=None, verdict="@V@", fault=None, ranks=[], time_limit={},
    checks=[{"name": "ddp", "status": "@V@", "summary": "ok"}])).replace('"@V@"', '"%s"')
FAKE_JOB = """#!/bin/bash
echo "fake job ran with ranks=${SITESTACK_RANKS_PER_NODE:-unset}"
mkdir -p "$SITESTACK_VALIDATION_OUT"
printf '""" + FAKE_RESULT + """' "${FAKE_VERDICT:-passed}" "${FAKE_VERDICT:-passed}" \\
  > "$SITESTACK_VALIDATION_OUT/result.json"
# the job's last words, as its guard says them (ddpcheck/guard.py): validate reads the result once it
# sees them, and waits up to RESULT_WAIT (45 s) for a job that never says them
verdict="${FAKE_VERDICT:-passed}"
echo "sitestack validation: ${verdict^^}, exit code ${FAKE_RC:-0}; summary: $SITESTACK_VALIDATION_OUT/summary.md"
exit "${FAKE_RC:-0}"
"""


def fake_installed_job(prefix: Path) -> Path:
    jobs = prefix / "validation" / "jobs"
    jobs.mkdir(parents=True)
    (jobs / "validate-torchrun.sbatch").write_text(FAKE_JOB)
    return jobs


def test_validate_without_a_scheduler_runs_the_script_through_the_host(tmp_path, monkeypatch):
    from sitestack.core.errors import SitestackError
    from sitestack.core.report import Reporter
    from sitestack.engine import validate as v

    fake_installed_job(tmp_path / "prefix")
    site = pb.load("local")
    options = v.ValidateOptions(scheduler="none", launcher="torchrun", prefix=str(tmp_path / "prefix"),
                                results=str(tmp_path / "results"), ranks_per_node=3, timeout=60)
    from sitestack.engine import batchjob
    reads: list[str] = []
    read_json = batchjob.read_json

    def counted(host, path, *args, **kwargs):
        reads.append(path)
        return read_json(host, path, *args, **kwargs)

    monkeypatch.setattr(batchjob, "read_json", counted)
    outcome = v.validate(site, options, Reporter())
    assert outcome.code == 0 and outcome.result is not None and outcome.result["verdict"] == "passed"
    # check-config.json read once: the checks before submitting and the history take it from there
    assert [p for p in reads if p.endswith("/check-config.json")] == [str(tmp_path / "prefix" / "validation" / "check-config.json")]
    assert outcome.log is not None and "fake job ran with ranks=3" in outcome.log.read_text()
    monkeypatch.setenv("FAKE_RC", "3")
    assert v.validate(site, options, Reporter()).code == 1  # passed checks, but the script failed
    monkeypatch.setenv("FAKE_VERDICT", "failed")
    monkeypatch.setenv("FAKE_RC", "0")
    assert v.validate(site, options, Reporter()).code == 1
    monkeypatch.setenv("SITESTACK_VALIDATION_OUT", "ignored")
    # a script that fails before the guard: the job's own last line (job.sbatch.j2) still ends its log
    (tmp_path / "prefix" / "validation" / "jobs" / "validate-torchrun.sbatch").write_text(
        "echo broken; echo 'sitestack validation: no summary was written (exit code 2): see the messages above'; exit 2\n")
    with pytest.raises(SitestackError, match=r"left no result .*exit code 2.*\n.*broken"):
        v.validate(site, options, Reporter())


def test_validate_on_a_host_over_ssh(tmp_path):
    from tests import sshd
    from tests.conftest import run_invoke

    if not sshd.available():
        pytest.skip("needs root and openssh-server")
    server = sshd.start_sshd(tmp_path / "srv", "login1")
    try:
        fake_installed_job(tmp_path / "prefix")
        env = {"SITESTACK_SSH_CONFIG": str(tmp_path / "ssh_config")}
        result = run_invoke("validate", "--site", "local", "--host", "login1", "--scheduler", "none", "--launcher",
                            "torchrun", "--prefix", str(tmp_path / "prefix"), "--results", str(tmp_path / "results"),
                            env=env, timeout=120)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "on login1 without a scheduler" in result.stdout and "sitestack validation of local: PASSED" in result.stdout
        assert [p.name.endswith(".log") for p in (tmp_path / "results").iterdir()].count(True) == 1
        missing = run_invoke("validate", "--site", "local", "--host", "login1", "--scheduler", "none", "--launcher",
                             "torchrun", "--prefix", str(tmp_path / "elsewhere"), env=env, timeout=120)
        assert missing.returncode == 1 and "missing on login1" in missing.stderr
    finally:
        server.stop()


# -- watchdog causes, balance, latency, time limits (issue 14) --------------------------------------------

def _rank(rank: int, phase: str, **extra) -> dict:
    return {"rank": rank, "host": f"nid00{rank}", "world_size": 2, "phase": phase, **extra}


def test_a_frozen_rank_is_named_with_its_phase():
    ranks = {0: _rank(0, "mpi4py"), 1: _rank(1, "mpi-probe", proc_state="T")}
    cause = faults.describe_fault("timeout", ranks, 520, 2)
    assert cause == ("the time limit of 520s passed: rank 1 on nid001 was frozen (stopped by SIGSTOP) during mpi-probe; "
                     "rank 0 on nid000 waited during mpi4py")


def test_a_hang_names_the_rank_behind_and_the_ranks_that_never_arrived():
    ranks = {0: _rank(0, "ddp", detail="step 1 backward", tick=3), 1: _rank(1, "ddp", detail="step 1 forward", tick=2)}
    assert faults.describe_fault("timeout", ranks, 60, 2) == (
        "the time limit of 60s passed: rank 1 on nid001 hung during ddp (step 1 forward); "
        "rank 0 on nid000 waited during ddp (step 1 backward)")
    cause = faults.describe_fault("timeout", {0: _rank(0, "process-group")}, 60, 2)
    assert "rank 1 never reached the check program" in cause and "rank 0 on nid000 waited during process-group" in cause
    assert "hung at start-up" in faults.describe_fault("timeout", {}, 60, 2)


def test_a_killed_or_crashed_rank_is_named_with_host_and_phase():
    ranks = {0: _rank(0, "ddp"), 1: _rank(1, "bandwidth", signal="SIGKILL")}
    assert faults.describe_fault("killed", ranks, 60, 2, culprit=1).startswith(
        "rank 1 on nid001 was killed by SIGKILL during bandwidth; rank 0 on nid000 was in the ddp check")
    ranks = {0: _rank(0, "MPI_Init", signal="SIGBUS", signal_text="Bus error", world_size=1)}
    assert faults.describe_fault("killed", ranks, 60, 1, culprit=0) == (
        "rank 0 on nid000 crashed with SIGBUS (Bus error) inside MPI_Init (importing mpi4py)")


def test_an_earlier_finding_leads_a_timeout_cause():
    checks = [{"name": "ddp", "status": "failed", "summary": "slow rank: rank 1 is 9x slower"}]
    ranks = {0: _rank(0, "bandwidth", checks=checks), 1: _rank(1, "bandwidth", proc_state="throttled")}
    cause = faults.describe_fault("timeout", ranks, 60, 2)
    assert cause.startswith("ddp: slow rank: rank 1 is 9x slower; then the time limit of 60s passed")
    assert "was stopped and continued in turns" in cause


def test_the_fault_result_keeps_rank_0s_checks(tmp_path, monkeypatch):
    monkeypatch.setenv("SITESTACK_TIME_LIMIT", "160")
    monkeypatch.setenv("SITESTACK_TIME_LIMIT_FROM", "the job's time left (4:00, squeue %L)")
    checks = [{"name": n, "status": "passed" if n == "environment" else "skipped", "summary": "ok" if n == "environment"
               else "not run", "details": {}, "seconds": 1.0} for n in CHECKS]
    for rank, phase in ((0, "ddp"), (1, "ddp")):
        (tmp_path / "ranks").mkdir(exist_ok=True)
        (tmp_path / "ranks" / f"rank-{rank}.json").write_text(json.dumps({**_rank(rank, phase), "checks": checks,
                                                                                  "backend": "gloo", "device": "cpu"}))
    assert faults.report_fault(str(tmp_path), {"kind": "timeout", "cause": "the time limit passed", "phase": "ddp"})
    assert not faults.report_fault(str(tmp_path), {"kind": "killed", "cause": "second", "phase": "ddp"})  # first wins
    result = json.loads((tmp_path / "result.json").read_text())
    by_name = {c["name"]: c for c in result["checks"]}
    assert result["verdict"] == "failed" and result["cause"] == "the time limit passed"
    assert by_name["environment"]["status"] == "passed" and by_name["ddp"]["status"] == "failed"
    assert by_name["bandwidth"]["summary"] == "not run: the run ended early (timeout)"
    summary = (tmp_path / "summary.md").read_text()
    assert summary.startswith("# sitestack validation: unknown — FAILED")
    # rank 0 had picked its device when the time ran out: the header names the backend
    assert result["backend"] == "gloo" and result["device"] == "cpu" and "backend gloo on cpu" in summary
    assert result["time_limit"] == {"seconds": 160.0, "from": "the job's time left (4:00, squeue %L)"}
    # made by the one builder: every field of a finished run's result, each of its type
    assert result_schema.problem(result) is None and set(result) == set(result_schema.FIELDS)


def test_a_fault_before_the_device_is_picked_says_so(tmp_path):
    (tmp_path / "ranks").mkdir()
    (tmp_path / "ranks" / "rank-0.json").write_text(json.dumps(_rank(0, "MPI_Init")))
    assert faults.report_fault(str(tmp_path), {"kind": "timeout", "cause": "the time limit passed", "phase": "MPI_Init"})
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["backend"] is None and result["torch"] is None
    summary = (tmp_path / "summary.md").read_text()
    assert "backend not chosen (the run ended before torch picked a device)" in summary and "None" not in summary


def test_latency_min_median_max_and_noise():
    quiet = mpi.latency_stats([1.0, 1.2, 1.3, 1.1, 2.0])
    assert (quiet["min_us"], quiet["median_us"], quiet["max_us"], quiet["noisy"]) == (1.0, 1.2, 2.0, False)
    noisy = mpi.latency_stats([1.3, 1.2, 1.4, 4880.0])
    assert noisy["noisy"] and "noisy: the maximum is" in ddp_report.latency_text(noisy)


def test_the_job_id_is_the_directorys():
    assert verdicts.job_id_for("/r/sitestack-validation-local-12-34", {"SITESTACK_JOB_ID": "99"}) == "local-12-34"
    assert verdicts.job_id_for("/r/elsewhere", {"SLURM_JOB_ID": "7"}) == "7"


@pytest.mark.parametrize("text, seconds", [("10", 600), ("00:10:00", 600), ("1-00", 86400), ("1-2:3:4", 93784),
                                           ("5:30", 330)])
def test_slurm_times_and_the_checks_limit(text, seconds):
    from sitestack.model.slurmtime import slurm_seconds
    from sitestack.validation.jobs import time_limit
    assert slurm_seconds(text) == seconds
    assert time_limit(600) == 520 and time_limit(60) == 60 and time_limit(86400) < 86400 - 8640


def test_the_job_environment_records_modules_settings_and_plugin_paths():
    env = {"LOADEDMODULES": "LUMI/24.03:aws-ofi-rccl/1.4:pytorch/2.7.1", "NCCL_NET": "AWS Libfabric",
           "FI_PROVIDER": "cxi", "HOME": "/h", "LD_LIBRARY_PATH": "/opt/rocm/lib:/p/aws-ofi-rccl/1.4/lib"}
    got = verdicts.job_environment(env, "aws-ofi-rccl")
    assert got == {"modules": ["LUMI/24.03", "aws-ofi-rccl/1.4", "pytorch/2.7.1"],
                   "variables": {"FI_PROVIDER": "cxi", "NCCL_NET": "AWS Libfabric"},
                   "plugin_library_path": ["/p/aws-ofi-rccl/1.4/lib"]}


def test_imports_are_checked_against_the_stack_manifest():
    from sitestack.core.errors import SitestackError
    from sitestack.engine.validate import check_imports
    from tests.fakehost import FakeHost
    host = FakeHost()
    config = {"stack": {"module": "pytorch/2.13.0-cpu", "manifest": "/p/pytorch/2.13.0-cpu.manifest.json",
                        "needs": ["torch", "numpy", "mpi4py"]}}
    host.files["/p/validation/check-config.json"] = json.dumps(config)
    with pytest.raises(SitestackError, match="has no manifest"):
        check_imports(host, "/p/validation", "local")
    host.files[config["stack"]["manifest"]] = json.dumps({"packages": [{"name": "torch"}, {"name": "mpi4py"}]})
    with pytest.raises(SitestackError, match=r"pytorch/2.13.0-cpu lacks numpy, which the validation job imports"):
        check_imports(host, "/p/validation", "local")
    host.files[config["stack"]["manifest"]] = json.dumps({"packages": [{"name": n} for n in ("torch", "NumPy", "mpi4py")]})
    check_imports(host, "/p/validation", "local")
    host.files["/p/validation/check-config.json"] = json.dumps({"stack": {"includes": []}})  # --python: no stack
    check_imports(host, "/p/validation", "local")
    # a container stack (Dawn, LUMI): torch and numpy are the image's, seen through --system-site-packages
    # (found on the Dawn twin: validate refused a working stack)
    host.files["/p/validation/check-config.json"] = json.dumps(config)
    host.files[config["stack"]["manifest"]] = json.dumps({"packages": [{"name": "mpi4py"}],
                                                          "base_packages": [{"name": "torch"}, {"name": "numpy"}]})
    check_imports(host, "/p/validation", "local")
