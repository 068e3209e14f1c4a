"""Field faults of the NCCL/RCCL log reader (sitestack/onsite/nccl_log.py): a network NCCL_NET names
and NCCL does not find, a plugin loaded on some hosts only, program output glued to NCCL's lines,
and many hosts of a socket run. The lines copy NCCL's formats from the real logs of
tests/data/nccl-logs/ (named beside each); tests/test_nccl_log.py runs the whole corpus.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sitestack.onsite import nccl_lines
from sitestack.onsite import nccl_log as nl

DATA = Path(__file__).resolve().parent / "data" / "nccl-logs"
CXI = nl.Expectation(transport="ofi", provider="cxi", plugin="aws-ofi-nccl")

# NCCL 2.20+ lines of a healthy 2-node run of aws-ofi-nccl on Slingshot, in the formats of
# aws/aws-ofi-nccl#801 (its "comm ... nRanks 2 nNodes 2" and provider lines) and #889 ("Initializing").
HEALTHY = """\
nid001049:12345:12345 [0] NCCL INFO Bootstrap : Using hsn0:10.100.1.49<0>
nid001049:12345:12345 [0] NCCL INFO NET/OFI Initializing aws-ofi-nccl 1.14.2
nid001049:12345:12345 [0] NCCL INFO NET/OFI Selected Provider is cxi (found 4 nics)
nid001049:12345:12345 [0] NCCL INFO Using network AWS Libfabric
nid001049:12345:12370 [0] NCCL INFO comm 0x5581 rank 0 nRanks 2 nNodes 2 localRanks 1 localRank 0 MNNVL 0
nid001049:12345:12370 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/AWS Libfabric/0/GDRDMA
nid001050:23456:23456 [0] NCCL INFO Bootstrap : Using hsn0:10.100.1.50<0>
nid001050:23456:23456 [0] NCCL INFO NET/OFI Initializing aws-ofi-nccl 1.14.2
nid001050:23456:23456 [0] NCCL INFO NET/OFI Selected Provider is cxi (found 4 nics)
nid001050:23456:23456 [0] NCCL INFO Using network AWS Libfabric
nid001050:23456:23471 [0] NCCL INFO comm 0x6621 rank 1 nRanks 2 nNodes 2 localRanks 1 localRank 0 MNNVL 0
nid001050:23456:23471 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [receive] via NET/AWS Libfabric/0/GDRDMA
"""


def glued(text: str, before: str = "", after: str = "", every: int = 2) -> str:
    """``text`` with a program's output glued before and after every ``every``-th line."""
    return "\n".join(f"{before}{ln}{after}" if i % every == 0 else ln for i, ln in enumerate(text.splitlines())) + "\n"


def test_a_healthy_two_node_log_passes():
    for expect in (nl.Expectation(), CXI):
        verdict = nl.read(HEALTHY, expect)
        assert verdict.status == nl.PASS and "2 hosts used OFI" in verdict.cause, verdict.cause


@pytest.mark.parametrize("before, after", [("-1", ""), ("loss=0.25", ""), ("", "-1"), ("-1", " epoch 1 done"),
                                           ("[rank0]: step 3 ", "")])
def test_program_output_glued_to_nccl_lines_changes_nothing(before, after):
    verdict = nl.read(glued(HEALTHY, before, after), CXI)
    assert sorted(h.host for h in verdict.hosts) == ["nid001049", "nid001050"]
    assert verdict.status == nl.PASS and "2 hosts used OFI" in verdict.cause, verdict.cause
    assert nl.read(glued(HEALTHY, before, after)).status == nl.PASS
    # a real 2-node RoCE log (NVIDIA/nccl-tests#133), glued the same way, reads as it does bare
    real = (DATA / "nccl-tests-133-roce-2.10.3.log").read_text()
    bare = [(h.host, h.transport) for h in nl.classify(nl.parse(real)[0])]
    assert [(h.host, h.transport) for h in nl.classify(nl.parse(glued(real, before, after))[0])] == bare


def test_a_glued_name_is_not_taken_off_a_host_of_its_own():
    lines = [nccl_lines.Line("node1", "10", "INFO", "x", 1), nccl_lines.Line("gpunode1", "20", "INFO", "x", 2),
             nccl_lines.Line("-1node1", "10", "INFO", "x", 3), nccl_lines.Line("=node1", "30", "INFO", "x", 4)]
    assert [ln.host for ln in nccl_lines.unglue(lines)] == ["node1", "gpunode1", "node1", "node1"]


NOT_FOUND = (DATA / "cscs-docs-75-network-aws-libfabric-not-found.log").read_text()


@pytest.mark.parametrize("expect", [nl.Expectation(), CXI, nl.Expectation(multi_node=False), nl.Expectation("socket")])
def test_a_forced_network_that_is_not_found_fails_naming_it(expect):
    verdict = nl.read(NOT_FOUND, expect)
    assert verdict.status == nl.FAIL, verdict.cause
    assert verdict.cause.startswith("NCCL_NET names the network 'AWS Libfabric', which NCCL did not find on nid006352")
    # NCCL_NET unset and no network came up at all: NCCL prints the same line with no name (src/net.cc)
    none = nl.read("nid006352:34157:34217 [1] net.cc:626 NCCL WARN Error: network  not found.\n", expect)
    assert none.status == nl.FAIL and none.cause.startswith("NCCL found no network it could use on nid006352"), none.cause


def test_a_missing_network_names_the_plugin_message_and_every_host_with_its_ranks():
    # NCCL 2.21's lines where the plugin is absent (NVIDIA/nccl-tests#188) and NCCL_NET forces it
    log = "".join(f"{host}:{pid}:{pid} [0] NCCL INFO {msg}\n" for host, pid in (("nid001049", 11), ("nid001050", 22)) for msg in (
        f"comm 0x1 rank {pid // 11 - 1} nranks 2 cudaDev 0 nvmlDev 0 busId 1000 commId 0x2 - Init START",
        "NCCL_NET set by environment to AWS Libfabric",
        "NET/Plugin : Plugin load (libnccl-net.so) returned 2 : libnccl-net.so: cannot open shared object file: "
        "No such file or directory")) + "nid001049:11:11 [0] net.cc:626 NCCL WARN Error: network AWS Libfabric not found.\n" \
        "nid001050:22:22 [0] net.cc:626 NCCL WARN Error: network AWS Libfabric not found.\n"
    verdict = nl.read(log)
    assert verdict.status == nl.FAIL
    assert "did not find on nid001049 (rank 0), nid001050 (rank 1)" in verdict.cause, verdict.cause
    assert "libnccl-net.so: cannot open shared object file" in verdict.cause


# One run whose plugin loaded on one node only: node-a as aws/aws-ofi-nccl#889 (NCCL 2.21), node-b as
# NVIDIA/nccl#1925 (NCCL 2.27: "Could not find: libnccl-net.so", then sockets).
SOME_HOSTS = """\
node-a:4101:4151 [0] NCCL INFO NET/OFI Initializing aws-ofi-nccl 1.14.2
node-a:4101:4151 [0] NCCL INFO NET/OFI Selected Provider is cxi (found 4 nics)
node-a:4101:4151 [0] NCCL INFO Using network AWS Libfabric
node-a:4101:4151 [0] NCCL INFO comm 0x1 rank 0 nRanks 4 nNodes 2 localRanks 2 localRank 0 MNNVL 0
node-a:4102:4152 [1] NCCL INFO comm 0x2 rank 1 nRanks 4 nNodes 2 localRanks 2 localRank 1 MNNVL 0
node-b:5201:5251 [0] NCCL INFO NET/Plugin: Could not find: libnccl-net.so
node-b:5201:5251 [0] NCCL INFO NET/IB : No device found.
node-b:5201:5251 [0] NCCL INFO NET/Socket : Using [0]hsn0:10.0.0.6<0>
node-b:5201:5251 [0] NCCL INFO Using network Socket
node-b:5201:5251 [0] NCCL INFO comm 0x3 rank 2 nRanks 4 nNodes 2 localRanks 2 localRank 0 MNNVL 0
node-b:5202:5252 [1] NCCL INFO comm 0x4 rank 3 nRanks 4 nNodes 2 localRanks 2 localRank 1 MNNVL 0
"""


@pytest.mark.parametrize("expect", [nl.Expectation(), CXI, nl.Expectation("socket")])
def test_a_plugin_loaded_on_some_hosts_only_fails_naming_both(expect):
    verdict = nl.read(SOME_HOSTS, expect)
    assert verdict.status == nl.FAIL, verdict.cause
    assert verdict.cause.startswith('plugin not found on node-b (ranks 2-3) ("NET/Plugin: Could not find: libnccl-net.so"), '
                                    "but loaded on node-a (ranks 0-1) (aws-ofi-nccl 1.14.2): the run's hosts differ; "
                                    "node-b used Socket"), verdict.cause


def test_many_socket_hosts_read_socket():
    for name, count in (("nccl-226-socket-2.4.7-eighteen-hosts.log", 18), ("nccl-226-socket-2.4.7-nine-hosts.log", 8)):
        verdict = nl.read((DATA / name).read_text())
        assert [h.transport for h in verdict.hosts] == ["socket"] * count
        assert verdict.status == nl.WARN and f"it used Socket; {count - 1} more hosts" in verdict.cause, verdict.cause
        assert "PASS: " not in nl.render(verdict) and "unknown" not in nl.render(verdict)
    # where another host shows IB, a host with only the old bootstrap's socket line stays unknown
    ib = nl.classify(nl.parse((DATA / "nv-peer-memory-56-ib-2.4.7-bootstrap-socket.log").read_text())[0])
    assert {h.host: h.transport for h in ib} == {"master_node": "ib", "secondary_node": "unknown"}


def test_a_warning_of_nccl_keeps_a_log_from_passing_but_rccls_advice_does_not():
    warned = HEALTHY + "nid001050:23456:23471 [0] proxy.cc:1519 NCCL WARN [Proxy Service 1] Failed to execute operation Connect\n"
    verdict = nl.read(warned, CXI)
    assert verdict.status == nl.WARN and 'NCCL warned: "[Proxy Service 1] Failed to execute operation Connect"' in verdict.cause
    # ROCm/rccl#1026's advice on a kernel option is not a fault of the run
    advice = HEALTHY + 'nid001050:23456:23471 [0] NCCL WARN Missing "iommu=pt" from kernel command line which can lead to system instablity or hang!\n'
    assert nl.read(advice, CXI).status == nl.PASS
    # nor is NCCL's topology search falling back to a simple order (NVIDIA/nccl#487)
    search = HEALTHY + "nid001049:12345:12370 [0] NCCL WARN Could not find a path for pattern 4, falling back to simple order\n"
    assert nl.read(search, CXI).status == nl.PASS


def test_no_interface_for_the_bootstrap_fails_naming_the_host():
    # NCCL's warning when NCCL_SOCKET_IFNAME names no interface of the host (src/bootstrap.cc; the
    # message as EasonXiao-888/MambaTree#14 quotes it), in the line format of NVIDIA/nccl#1232
    log = HEALTHY + "nid001050:23456:23456 [0] bootstrap.cc:57 NCCL WARN Bootstrap : no socket interface found\n"
    for expect in (nl.Expectation(), CXI, nl.Expectation(multi_node=False)):
        verdict = nl.read(log, expect)
        assert verdict.status == nl.FAIL and verdict.cause.startswith(
            "no network interface for NCCL's bootstrap on nid001050 (rank 1): \"Bootstrap : no socket interface found\""), verdict.cause
