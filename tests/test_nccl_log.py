"""The NCCL/RCCL log classifier (sitestack/onsite/nccl_log.py).

The corpus test runs over real logs users posted in public issue threads (tests/data/nccl-logs/,
each with its source in index.yml): every host's transport, the providers, the plugin states and
each verdict against a stated expectation must come out as recorded. The unit tests below feed one
cause each; their lines copy the message formats of those real logs (named beside each), changed
only where a case has no public log (said so).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sitestack.onsite import nccl_log as nl
from sitestack.onsite.ddpcheck import netplugin
from tests.onsite_dir import install_programs

DATA = Path(__file__).resolve().parent / "data" / "nccl-logs"
INDEX = yaml.safe_load((DATA / "index.yml").read_text())


def test_the_corpus_holds_forty_real_logs_each_with_its_source():
    files = sorted(p.name for p in DATA.glob("*.log"))
    assert files == sorted(e["file"] for e in INDEX), "every log has one index entry and every entry a log"
    # users' logs from public threads; a few are the job's own logs from real GPU runs ("recorded: ...")
    assert all(e["source"].startswith(("https://github.com/", "recorded: ")) for e in INDEX)
    assert sum(e["source"].startswith("https://github.com/") for e in INDEX) >= 40
    formats = {e["format"].split(",")[0] for e in INDEX}
    assert {"host:pid:tid", "openmpi", "cloudwatch", "pdsh", "no-prefix"} <= formats
    transports = {t for e in INDEX for t in e["hosts"].values()}
    assert {"ofi", "ib", "ibext", "socket", "mixed", "intra-node"} <= transports
    assert {"RCCL", "NCCL"} <= {e["library"] for e in INDEX}


@pytest.mark.parametrize("entry", INDEX, ids=[e["file"] for e in INDEX])
def test_each_real_log_is_read_right(entry):
    lines, version = nl.parse((DATA / entry["file"]).read_text())
    hosts = nl.classify(lines)
    assert version == entry["version"]
    assert nl.nodes(lines).multi is entry["nodes"]  # what the log itself shows of the nodes
    assert {h.host: h.transport for h in hosts} == entry["hosts"]
    assert sorted({h.provider for h in hosts if h.provider}) == entry["providers"]
    assert sorted({h.plugin_state for h in hosts}) == entry["plugin_states"]
    for check in entry["checks"]:
        verdict = nl.judge(hosts, nl.Expectation(**check["expect"]), version, nl.nodes(lines))
        assert (verdict.status, check["cause"] in verdict.cause) == (check["verdict"], True), (check, verdict.cause)


# -- one cause each ---------------------------------------------------------------------------------

OFI = nl.Expectation(transport="ofi", provider="cxi", plugin="aws-ofi-rccl", multi_node=True)

# aws-ofi-rccl on Slingshot, in the format of aws/aws-ofi-nccl#161 (no public RCCL log with the plugin
# loaded was found; "aws-ofi-rccl" replaces "aws-ofi-nccl").
OFI_OK = """\
nid005011:51404:52019 [0] NCCL INFO Bootstrap : Using hsn0:10.253.6.64<0>
nid005011:51404:52019 [0] NCCL INFO NET/OFI Using aws-ofi-rccl 1.4.0
nid005011:51404:52019 [0] NCCL INFO NET/OFI Selected Provider is cxi (found 4 nics)
nid005011:51404:52019 [0] NCCL INFO Using network AWS Libfabric
nid005012:61338:62013 [0] NCCL INFO Bootstrap : Using hsn0:10.253.6.65<0>
nid005012:61338:62013 [0] NCCL INFO NET/OFI Using aws-ofi-rccl 1.4.0
nid005012:61338:62013 [0] NCCL INFO NET/OFI Selected provider is cxi, fabric is cxi (found 4 nics)
nid005012:61338:62013 [0] NCCL INFO Channel 00/0 : 8[0] -> 0[0] [receive] via NET/AWS Libfabric/0/GDRDMA
"""


def test_the_site_plugin_with_its_provider_passes():
    verdict = nl.read(OFI_OK, OFI)
    assert verdict.status == nl.PASS
    assert "2 hosts used OFI" in verdict.cause and "provider cxi" in verdict.cause and "aws-ofi-rccl 1.4.0" in verdict.cause
    assert [h.provider for h in verdict.hosts] == ["cxi", "cxi"]  # the lowercase "Selected provider is" too


def test_provider_tcp_on_a_cxi_site_fails():
    verdict = nl.read(OFI_OK.replace("Provider is cxi", "Provider is tcp"), OFI)
    assert verdict.status == nl.FAIL and "wrong provider on nid005011: tcp, the site expects cxi" in verdict.cause


def test_plugin_not_found_names_the_line():
    log = OFI_OK.replace("NET/OFI Using aws-ofi-rccl 1.4.0", "NET/Plugin : No plugin found (librccl-net.so), using internal implementation")
    log = "\n".join(ln for ln in log.splitlines() if "Provider" not in ln and "provider" not in ln)
    log = log.replace("Using network AWS Libfabric", "Using network Socket").replace("NET/AWS Libfabric/0/GDRDMA", "NET/Socket/0")
    verdict = nl.read(log, OFI)
    assert verdict.status == nl.FAIL
    assert verdict.cause.startswith("plugin not found on nid005011 (\"NET/Plugin : No plugin found (librccl-net.so)")
    assert "it used Socket" in verdict.cause


def test_a_plugin_that_failed_to_initialise_is_quoted_not_reported_as_missing():
    # aws/aws-ofi-nccl#715: the plugin loaded, failed, and NCCL fell back to sockets.
    verdict = nl.read((DATA / "aws-ofi-nccl-715-init-failed-socket.log").read_text(), OFI)
    assert verdict.status == nl.FAIL
    assert "plugin found but failed to initialise on algo-1: \"NET/OFI aws-ofi-nccl initialization failed\"" in verdict.cause


def test_an_ib_plugin_where_ofi_is_expected_fails_as_the_wrong_plugin():
    verdict = nl.read((DATA / "nccl-1357-ibext-sharp.log").read_text(), OFI)
    assert verdict.status == nl.FAIL and verdict.cause.startswith("wrong plugin on qh100-gpu19: IBext")


def test_nccl_net_forced_to_sockets_is_named():
    # "NCCL_NET set by environment to ..." is NCCL's ENV line format (NVIDIA/nccl#1053 shows it for
    # NCCL_IB_DISABLE); no public log with NCCL_NET forced to Socket was found.
    log = OFI_OK.replace("NCCL INFO Bootstrap", "NCCL INFO NCCL_NET set by environment to Socket\n"
                         "nid005011:51404:52019 [0] NCCL INFO Bootstrap", 1)
    log = log.replace("Using network AWS Libfabric", "Using network Socket")
    verdict = nl.read(log, OFI)
    assert verdict.status == nl.FAIL and "NCCL_NET forced to 'Socket' by the environment on nid005011" in verdict.cause


def test_nccl_net_forced_to_the_expected_network_is_not_the_cause():
    # The job forces NCCL_NET to the plugin's name on two nodes: a missing plugin is still "not found".
    log = ("nid005011:1:1 [0] NCCL INFO NCCL_NET set by environment to AWS Libfabric\n"
           "nid005011:1:1 [0] NCCL INFO NET/Plugin : No plugin found (librccl-net.so), using internal implementation\n"
           "nid005012:2:2 [0] NCCL INFO NET/OFI Selected Provider is cxi\n")
    verdict = nl.read(log, OFI)
    assert verdict.status == nl.FAIL and verdict.cause.startswith("plugin not found on nid005011")


def test_nccl_2_26_plugin_messages():
    # NCCL >= 2.26 (src/plugin/net.cc: "Failed to initialize NET plugin %s", "Initialized NET plugin %s");
    # no issue thread with a multi-node log of these was found, so the lines are built from the source's formats.
    failed = ("h1:1:1 [0] NCCL INFO NET/Plugin: Loaded net plugin Libfabric (v10)\n"
              "h1:1:1 [0] NCCL INFO Failed to initialize NET plugin Libfabric\n"
              "h1:1:1 [0] NCCL INFO Failed to initialize NET plugin IB\n"
              "h1:1:1 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>\n"
              "h1:1:1 [0] NCCL INFO Initialized NET plugin Socket\n"
              "h2:2:2 [0] NCCL INFO NET/Plugin: libnccl-net.so: /lib/x86_64-linux-gnu/libc.so.6: version `GLIBC_2.38' not found\n"
              "h2:2:2 [0] NCCL INFO Initialized NET plugin Socket\n")
    verdict = nl.read(failed, nl.Expectation(transport="ofi", multi_node=True))
    assert [(h.transport, h.plugin_state) for h in verdict.hosts] == [("socket", "failed"), ("socket", "failed")]
    assert verdict.status == nl.FAIL and "\"Failed to initialize NET plugin Libfabric\"" in verdict.cause
    assert "GLIBC_2.38" in verdict.hosts[1].plugin_message


def test_ib_disabled_is_the_cause_where_ib_is_expected():
    verdict = nl.read((DATA / "horovod-3658-openmpi-ib-disabled-socket.log").read_text(),
                      nl.Expectation(transport="ib", multi_node=True))
    assert verdict.status == nl.FAIL and "IB disabled by NCCL_IB_DISABLE=1 on ip-172-31-12-129" in verdict.cause


def test_the_pre_2_4_8_bootstrap_socket_line_is_not_a_fallback():
    # NVIDIA/nccl#229: NCCL 2.4.6 prints "NET/Socket : Using" for its bootstrap, then OFI carries the data.
    verdict = nl.read((DATA / "nccl-229-ofi-tcp-2.4.6-bootstrap-socket.log").read_text(),
                      nl.Expectation(transport="ofi", provider="tcp", multi_node=True))
    assert verdict.status == nl.PASS
    assert any("bootstrap" in n for n in verdict.notes)
    assert all(h.bootstrap_socket and h.transport == "ofi" for h in verdict.hosts)
    # ... while a 2.4.2 log whose channels go "via NET/Socket" is a real socket transport (pytorch/pytorch#22531).
    lines, _ = nl.parse((DATA / "pytorch-22531-socket-2.4.2.log").read_text())
    assert [h.transport for h in nl.classify(lines)] == ["socket"]


def test_the_verbs_provider_passes_where_it_is_expected():
    log = OFI_OK.replace("Provider is cxi", "Provider is verbs;ofi_rxm").replace("provider is cxi", "provider is verbs;ofi_rxm")
    verdict = nl.read(log, nl.Expectation(transport="ofi", provider="verbs", multi_node=True))
    assert verdict.status == nl.PASS, verdict.cause


def test_line_prefixes_are_read_and_lines_without_a_host_count_under_one():
    stamped = "  | 2025-05-22T14:26:33.407-07:00 | ip-10-36-22-140:86:2501 [0] NCCL INFO Using network Socket"
    ompi = "[1,23]<stdout>:ip-172-32-45-165:72593:73427 [7] create_nccl_ofi_component:459 NCCL WARN NET/OFI Couldn't open AV."
    bare = "[0] NCCL INFO Using network AWS Libfabric"
    lines, _ = nl.parse("\n".join((stamped, ompi, bare)))
    assert [(ln.host, ln.level, ln.msg) for ln in lines] == [
        ("ip-10-36-22-140", "INFO", "Using network Socket"),
        ("ip-172-32-45-165", "WARN", "NET/OFI Couldn't open AV."),
        (nl.NO_HOST, "INFO", "Using network AWS Libfabric")]


def test_colours_and_json_wrapped_lines_are_read():
    coloured = "\x1b[36m(RayTrainWorker pid=950, ip=10.67.132.202)\x1b[0mworker-p5:950:3034 [0] NCCL INFO Using network IB"
    wrapped = '{"log":"worker-p6:951:3035 [0] NCCL INFO Using network IB\\n","stream":"stderr"}'
    lines, _ = nl.parse(coloured + "\n" + wrapped)
    assert [(ln.host, ln.msg) for ln in lines] == [("worker-p5", "Using network IB"), ("worker-p6", "Using network IB")]


def test_a_warning_from_the_network_turns_a_pass_into_a_warn():
    log = OFI_OK + "nid005012:61338:62013 [0] create_nccl_ofi_component:459 NCCL WARN NET/OFI Couldn't open AV. RC: -22\n"
    verdict = nl.read(log, OFI)
    assert verdict.status == nl.WARN and "NET/OFI Couldn't open AV" in verdict.cause


def test_strict_expectations_fail_hosts_without_evidence_and_empty_logs():
    half = "\n".join(ln for ln in OFI_OK.splitlines() if not ln.startswith("nid005012") or "Bootstrap" in ln)
    assert nl.read(half, OFI).status == nl.WARN
    strict = nl.Expectation(transport="ofi", provider="cxi", multi_node=True, strict=True)
    verdict = nl.read(half, strict)
    assert verdict.status == nl.FAIL and "nid005012" in verdict.cause
    assert nl.read("", strict).status == nl.FAIL
    assert nl.read("", nl.Expectation()).status == nl.WARN


def test_one_node_passes_unless_the_plugin_failed():
    one = nl.Expectation(transport="ofi", multi_node=False)
    assert nl.read((DATA / "nccl-1126-socket-lo.log").read_text(), one).status == nl.PASS
    verdict = nl.read((DATA / "gpustack-5553-ofi-init-failed-2.28.log").read_text(), one)
    assert verdict.status == nl.WARN and "failed to initialise" in verdict.cause


# -- the command line --------------------------------------------------------------------------------

# A plain python3 (the system's, without this project's environment), as on a site.
PLAIN_PYTHON = shutil.which("python3", path="/usr/bin:/bin") or sys.executable


@pytest.fixture(scope="module")
def script(tmp_path_factory) -> Path:
    """nccl_log.py and the on-site package it runs from, installed as the validation job installs
    them (jobs.PROGRAMS) into a directory of their own: it must run with nothing of sitestack."""
    return install_programs(tmp_path_factory.mktemp("job"), ("nccl_log.py",)) / "nccl_log.py"


def run(script: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PLAIN_PYTHON, "-E", "-s", str(script), *args], capture_output=True, text=True, cwd="/",
                          check=False)


def test_the_script_prints_hosts_and_verdict_and_exits_by_it(script):
    good = run(script, str(DATA / "nccl-1597-efa-p5en.log"), "--expect-transport", "ofi", "--expect-provider", "efa")
    assert good.returncode == 0, good.stderr
    assert "8h200-3" in good.stdout and "OFI (provider efa)" in good.stdout and "PASS: 2 hosts used OFI" in good.stdout
    bad = run(script, str(DATA / "nccl-1597-efa-p5en.log"), "--expect-transport", "ofi", "--expect-provider", "cxi", "--json")
    assert bad.returncode == 1
    data = json.loads(bad.stdout)
    assert data["status"] == "FAIL" and data["hosts"][1]["provider"] == "efa"


def test_the_script_names_an_unreadable_file(script):
    result = run(script, "/nonexistent/nccl.log")
    assert result.returncode == 2 and result.stderr.startswith("error: /nonexistent/nccl.log:") and "Traceback" not in result.stderr


# -- invoke nccl-log -------------------------------------------------------------------------------------

def test_invoke_nccl_log_judges_against_the_sites_facts(cli, tmp_path):
    lumi = cli("nccl-log", str(DATA / "nccl-1357-ibext-sharp.log"), "--site", "lumi")
    assert lumi.returncode == 1, lumi.stderr
    assert "qh100-gpu20" in lumi.stdout and "FAIL: wrong plugin on qh100-gpu19: IBext" in lumi.stdout
    assert "OFI through aws-ofi-nccl with provider cxi" in lumi.stdout  # playbooks/lumi.yml's network facts (the AI Factory image's plugin)
    cirrus = cli("nccl-log", str(DATA / "nccl-1357-ibext-sharp.log"), "--site", "cirrus", "--json", str(tmp_path / "v.json"))
    assert cirrus.returncode == 0 and "PASS: 2 hosts used IBext" in cirrus.stdout  # Cirrus: InfiniBand, no plugin
    doc = json.loads((tmp_path / "v.json").read_text())
    assert doc["command"] == "nccl-log" and doc["site"] == "cirrus" and doc["status"] == "PASS"
    # several files, a glob and a directory read as one run; --json - prints only the document
    both = cli("nccl-log", f"{DATA}/nccl-1597-efa-p5en.log,{DATA}/aws-ofi-nccl-801-*.log", "--json", "-")
    assert both.returncode == 0 and json.loads(both.stdout)["status"] == "PASS"
    (tmp_path / "nccl").mkdir()
    (tmp_path / "nccl" / "a.log").write_text((DATA / "nccl-447-socket-gcp-2.7.8.log").read_text())
    directory = cli("nccl-log", str(tmp_path / "nccl"), "--site", "frontier")
    assert directory.returncode == 1 and "plugin not found on slurm-train-compute-0-0" in directory.stdout


@pytest.mark.parametrize("args, message", [
    (("/no/such.log",), "error: /no/such.log: no such file"),
    (("/no/such/*.log",), "error: /no/such/*.log: no file matches this pattern"),
    ((str(DATA / "nccl-1597-efa-p5en.log"), "--site", "nosuch"), "error: --site: unknown site 'nosuch'"),
    ((str(DATA / "nccl-1597-efa-p5en.log"), "--site", "dawn"), "error: --site: dawn uses oneccl collectives"),
    ((str(DATA / "nccl-1597-efa-p5en.log"), "--nodes", "many"), "error: --nodes: must be multi or single"),
    ((str(DATA / "nccl-1597-efa-p5en.log"), "--json", "/no/such/dir/v.json"), "error: --json: cannot write /no/such/dir/v.json: directory /no/such/dir does not exist"),
])
def test_invoke_nccl_log_bad_input_is_one_message(cli, args, message):
    result = cli("nccl-log", *args)
    assert result.returncode == 1 and result.stderr.startswith(message) and "Traceback" not in result.stderr
    assert result.stdout == ""


PREFIXES = {"openmpi": "[1,3]<stdout>:", "timestamp": "2024-11-28T07:42:11.528Z ", "cloudwatch": "  | 2025-05-16T16:39:51.208-07:00 | ",
            "slurm label": "12: ", "torchrun": "[default0]:", "python logging": "[2023-04-01 10:00:00,123] [INFO] "}


@pytest.mark.parametrize("prefix", PREFIXES.values(), ids=PREFIXES.keys())
def test_a_prefix_on_every_line_changes_no_classification(prefix):
    for entry in INDEX:
        text = (DATA / entry["file"]).read_text()
        plain = nl.classify(nl.parse(text)[0])
        prefixed = nl.classify(nl.parse("\n".join(prefix + line for line in text.splitlines()))[0])
        assert [(h.host, h.transport, h.provider, h.plugin_state) for h in prefixed] == \
               [(h.host, h.transport, h.provider, h.plugin_state) for h in plain], entry["file"]


# -- how many nodes: the log's own evidence ----------------------------------------------------------
# tests/data/nccl-logs/cases/ holds runs no public thread shows whole, written in the formats of NCCL's
# source and of the real logs above (each file's first line names them): 2 nodes x 2 GPUs, ranks 0-1 on
# the first node, 2-3 on the second. A "# shape:" line is not NCCL's and must not be read as NCCL's.

CASES = DATA / "cases"
CXI = nl.Expectation(transport="ofi", provider="cxi", plugin="aws-ofi-nccl")
IB = nl.Expectation(transport="ib")
# failure class -> (expectation, words of its cause, where it happened)
FAILURES = {"socket": (IB, "it used Socket, the site expects IB", "node-a"),
            "plugin-not-found": (CXI, "plugin not found on node-a", "node-a"),
            "plugin-failed": (CXI, "plugin found but failed to initialise on node-a", "node-a"),
            "wrong-provider": (CXI, "wrong provider on node-b", "node-b"),
            "wrong-plugin": (CXI, "wrong plugin on node-a", "node-a")}
RANKS_OF = {"node-a": [0, 1], "node-b": [2, 3]}


def read_files(*paths: Path, expect: nl.Expectation) -> nl.Verdict:
    return nl.read("\n".join(p.read_text() for p in paths), expect)


@pytest.mark.parametrize("failure", FAILURES)
def test_per_host_files_of_a_failure_fail_together_and_one_at_a_time(failure):
    expect, words, host = FAILURES[failure]
    files = sorted((CASES / f"per-host-{failure}").glob("*.log"))
    together = read_files(*files, expect=expect)
    assert together.status == nl.FAIL and words.replace(host, f"{host} (ranks {RANKS_OF[host][0]}-{RANKS_OF[host][1]})") \
        in together.cause, together.cause
    assert together.nodes and together.nodes.multi and together.nodes.by_nccl
    for path in files:  # one file holds one process: one host name, yet its lines show a network between nodes
        host_of_file = path.name.split(".")[0]
        alone = read_files(path, expect=expect)
        assert alone.nodes and alone.nodes.multi, alone.nodes
        if failure == "wrong-provider" and host_of_file == "node-a":  # only node-b's provider is wrong
            assert alone.status == nl.PASS and "between nodes" in alone.cause
            continue
        rank = alone.hosts[0].ranks
        assert alone.status == nl.FAIL and f"{host_of_file} (rank {rank[0]})" in alone.cause, alone.cause


@pytest.mark.parametrize("failure", FAILURES)
def test_one_host_name_for_every_node_fails_each_failure(failure):
    expect, words, host = FAILURES[failure]
    log = CASES / f"one-hostname-{failure}.log"
    verdict = read_files(log, expect=expect)
    name = "algo-1" if "algo-1:" in log.read_text() else "ubuntu"
    assert verdict.status == nl.FAIL and verdict.nodes and verdict.nodes.multi, verdict.cause
    assert words.split(" on ")[0] in verdict.cause and name in verdict.cause
    if "Bootstrap : Using" in log.read_text():  # processes told apart by their bootstrap address, and named with their ranks
        address = {"node-a": "10.0.0.5", "node-b": "10.0.0.6"}[host]
        assert f"{name} ({address}) (ranks {RANKS_OF[host][0]}-{RANKS_OF[host][1]})" in verdict.cause
        assert sorted(h.host for h in verdict.hosts) == [f"{name} (10.0.0.5)", f"{name} (10.0.0.6)"]
    # the job's check: the launcher sees one host name, the log shows two nodes: judged, not skipped
    status, summary, _ = netplugin.judge_net_plugin(log.read_text(), hosts=1, plugin=expect.plugin, provider=expect.provider,
                                                    transport=expect.transport)
    assert status == "failed" and words.split(" on ")[0] in summary, summary


@pytest.mark.parametrize("log, how", [("single-node-nnodes1.log", "nNodes 1"),
                                      ("single-node-p2p-only.log", "every one of the 2 ranks printed its channels")])
def test_a_healthy_one_node_log_passes_by_what_it_shows(log, how):
    for expect in (nl.Expectation(), CXI, IB):
        verdict = read_files(CASES / log, expect=expect)
        assert verdict.status == nl.PASS and verdict.cause.startswith(f"one node ({how}"), verdict.cause


def test_a_log_that_cannot_tell_the_nodes_says_so_and_does_not_pass():
    log = CASES / "cannot-tell-one-process.log"
    verdict = read_files(log, expect=CXI)
    assert verdict.status == nl.WARN and verdict.nodes and verdict.nodes.multi is None
    assert verdict.cause.startswith("cannot tell: the log does not show whether the run spanned nodes")
    assert "nNodes" in verdict.cause and "ranks seen: 1 of 4" in verdict.cause and "--nodes single|multi decides" in verdict.cause
    assert read_files(log, expect=nl.Expectation()).status == nl.WARN
    for multi in (True, False):  # the user's word decides
        assert read_files(log, expect=nl.Expectation("ofi", "cxi", multi_node=multi)).status == nl.PASS
    # a failure it shows is still a failure, with the missing count in a note
    tcp = read_files(log, expect=nl.Expectation("ofi", "tcp"))
    assert tcp.status == nl.FAIL and "wrong provider on node-a (rank 1)" in tcp.cause
    assert any("--nodes single|multi decides" in n for n in tcp.notes)


def test_one_node_given_yields_to_nccls_lines_but_not_to_names():
    verdict = read_files(CASES / "per-host-socket" / "node-a.4102.log", expect=nl.Expectation("ib", multi_node=False))
    assert verdict.status == nl.FAIL and any("judged as several nodes although one was given" in n for n in verdict.notes)
    # two host names (or addresses) may be one machine the user knows better: one node given, one node judged
    two_names = (DATA / "nccl-1597-efa-p5en.log").read_text()
    assert nl.read(two_names, nl.Expectation("ib", multi_node=False)).status == nl.PASS


def test_stripped_lines_are_read_and_program_output_is_not():
    lines, _ = nl.parse((CASES / "stripped-wrong-provider.log").read_text())
    assert [ln.msg for ln in lines] == [
        "NET/Plugin: Failed to find ncclNetPlugin_v9 symbol.", "NET/Plugin: Loaded net plugin Libfabric (v8)",
        "NET/OFI Initializing aws-ofi-nccl 1.14.2", "NET/OFI Selected Provider is tcp", "Using network Libfabric",
        "Channel 00/0 : 1[1] -> 2[0] [send] via NET/Libfabric/0", "Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read"]
    assert {ln.host for ln in lines} == {nl.NO_HOST}
    verdict = nl.read((CASES / "stripped-wrong-provider.log").read_text(), CXI)
    assert verdict.status == nl.FAIL and "wrong provider on ? (ranks 0-1): tcp" in verdict.cause
    assert verdict.nodes and verdict.nodes.multi and "a channel via NET" in verdict.nodes.how
    # the stripped line of the user's report (aws/aws-ofi-nccl#801's format)
    assert [h.provider for h in nl.classify(nl.parse("NET/OFI Selected Provider is cxi")[0])] == ["cxi"]


def test_a_hosts_network_is_taken_from_its_peers_channel_lines():
    text = (CASES / "peer-shows-node-b-ib.log").read_text()
    strict = nl.Expectation("ib", multi_node=True, strict=True)
    verdict = nl.read(text, strict)
    node_b = next(h for h in verdict.hosts if h.host == "node-b")
    assert verdict.status == nl.PASS and node_b.transport == "ib" and node_b.ranks == [2, 3]
    # node-a's first channel to one of node-b's ranks: rank 3's send to rank 0, printed by rank 0
    assert node_b.peer_evidence == "node-a Channel 00/0 : 3[1] -> 0[0] [receive] via NET/IB/0"
    assert any(e.startswith("node-a (a peer of rank 3) INFO Channel") for e in node_b.evidence)
    assert "shown by a peer's channel line" in nl.render(verdict)
    # without node-a's channel lines nothing shows node-b's network: the job's strict reading fails it
    alone = "\n".join(ln for ln in text.splitlines() if "Channel" not in ln)
    failed = nl.read(alone, strict)
    assert failed.status == nl.FAIL and "no line shows which network node-b (ranks 2-3) used" in failed.cause
    # the same shape in a real log (NVIDIA/nccl#229): rank 0's host shows no network, rank 15's channel to it does
    real = nl.classify(nl.parse((DATA / "nccl-229-ofi-via-net-aws-libfabric.log").read_text())[0])
    peer = next(h for h in real if h.host == "ip-192-168-16-255")
    assert peer.transport == "ofi" and peer.peer_evidence and "15 -> 0 [send] via NET/AWS Libfabric/0" in peer.peer_evidence


def test_the_script_and_invoke_judge_the_cases_by_default(script, cli):
    per_host = sorted((CASES / "per-host-plugin-failed").glob("*.log"))
    one = run(script, str(per_host[0]), "--expect-transport", "ofi", "--expect-provider", "cxi")
    assert one.returncode == 1 and "FAIL: plugin found but failed to initialise on node-a (rank 0)" in one.stdout, one.stdout
    assert "nodes: several" in one.stdout
    cannot = run(script, str(CASES / "cannot-tell-one-process.log"), "--expect-transport", "ofi", "--json")
    assert cannot.returncode == 0 and json.loads(cannot.stdout)["status"] == "WARN"
    assert json.loads(cannot.stdout)["nodes"]["multi"] is None
    assert run(script, str(CASES / "cannot-tell-one-process.log"), "--nodes", "single").stdout.startswith("node-a")
    single = run(script, str(CASES / "single-node-p2p-only.log"), "--expect-transport", "ofi")
    assert single.returncode == 0 and "PASS: one node" in single.stdout
    lumi = cli("nccl-log", str(CASES / "one-hostname-wrong-provider.log"), "--site", "lumi")
    assert lumi.returncode == 1 and "FAIL: wrong provider on ubuntu (10.0.0.6) (ranks 2-3): tcp" in lumi.stdout, lumi.stdout
    directory = cli("nccl-log", str(CASES / "per-host-socket"), "--site", "cirrus", "--json", "-")
    doc = json.loads(directory.stdout)
    assert directory.returncode == 1 and doc["status"] == "FAIL" and doc["nodes"]["multi"] is True
    assert doc["cause"].startswith("node-a (ranks 0-1): it used Socket, the site expects IB")
    file_alone = cli("nccl-log", str(CASES / "one-hostname-plugin-not-found.log"), "--site", "frontier")
    assert file_alone.returncode == 1 and "plugin not found on algo-1 (10.0.0.5) (ranks 0-1)" in file_alone.stdout
    cannot_cli = cli("nccl-log", str(CASES / "cannot-tell-one-process.log"), "--site", "lumi")
    assert cannot_cli.returncode == 0 and "WARN: cannot tell" in cannot_cli.stdout
    healthy = cli("nccl-log", str(CASES / "single-node-nnodes1.log"), "--site", "cirrus")
    assert healthy.returncode == 0 and "PASS: one node (nNodes 1" in healthy.stdout
