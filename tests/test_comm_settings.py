"""A playbook's communication-library settings are checked when it is loaded: a variable the stack's
NCCL/RCCL does not read is refused with the nearest name it does, a setting known to break the
version is refused with its citation unless the playbook allows that issue; all naming file, line
and key, with exit code 1 and nothing written (sitestack/model/comm_settings.py)."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sitestack.core.errors import InputError
from sitestack.engine import playbook as pb
from sitestack.model import comm_libraries, comm_settings
from sitestack.model.site import list_sites
from tests.conftest import REPO

FRONTIER = (REPO / "playbooks" / "frontier.yml").read_text()


def variant(tmp_path: Path, old: str, new: str, text: str = FRONTIER) -> tuple[Path, int]:
    """Frontier's playbook as site ``fr`` with ``old`` replaced by ``new``: the file and the line of ``new``'s
    last line."""
    assert old in text
    changed = text.replace("site: frontier", "site: fr", 1).replace(old, new, 1)
    path = tmp_path / "fr.yml"
    path.write_text(changed)
    return path, changed[:changed.index(new) + len(new)].count("\n") + 1


def refused(path: Path) -> str:
    with pytest.raises(InputError) as caught:
        pb.load(None, path)
    return str(caught.value)


def test_a_misspelled_variable_is_refused_with_the_nearest_name(tmp_path):
    path, line = variant(tmp_path, "    NCCL_SOCKET_IFNAME: hsn0", "    NCCL_SOCKET_IFNAM: hsn0")
    message = refused(path)
    assert message.startswith(f"{path}:{line}: facts.env.NCCL_SOCKET_IFNAM: not a variable the RCCL of ROCm 5.7.1 reads")
    assert "did you mean NCCL_SOCKET_IFNAME?" in message


def test_each_family_is_judged_and_others_are_not(tmp_path):
    env = "    NCCL_SOCKET_IFNAME: hsn0"
    for name, near in (("NCCL_DEBUG_SUBSYTEM", "NCCL_DEBUG_SUBSYS"), ("FI_CXI_DEFAULT_CQ_SIZ", "FI_CXI_DEFAULT_CQ_SIZE"),
                       ("OFI_NCCL_USE_IPV6_TPC", "OFI_NCCL_USE_IPV6_TCP"), ("RCCL_MSCL_ENABLE", "RCCL_MSCCL_ENABLE")):
        path, _ = variant(tmp_path, env, f"{env}\n    {name}: '1'")
        assert f"facts.env.{name}: not a variable" in refused(path) and f"did you mean {near}?" in refused(path)
    # MIOPEN_*, HSA_* and other libfabric providers' names have no reader in the table: taken as they are
    path, _ = variant(tmp_path, env, f"{env}\n    MIOPEN_ANYTHING: '1'\n    FI_EFA_USE_DEVICE_RDMA: '1'")
    assert pb.load(None, path).facts.env["MIOPEN_ANYTHING"] == "1"


def test_a_stack_overlay_and_a_tuning_candidate_are_checked_too(tmp_path):
    path, line = variant(tmp_path, "        FI_MR_CACHE_MONITOR: kdreg2", "        NCCL_CROSS_NCI: '1'")
    assert refused(path).startswith(f"{path}:{line}: stacks.rocm7.facts.env.NCCL_CROSS_NCI: not a variable the RCCL "
                                    "of ROCm 7.1.1 reads; did you mean NCCL_CROSS_NIC?")
    local = (REPO / "playbooks" / "local.yml").read_text().replace("site: local", "site: lo", 1)
    (tmp_path / "lo.yml").write_text(local.replace("      OMP_NUM_THREADS:\n", "      NCCL_BUFFSZE:\n", 1))
    with pytest.raises(InputError, match=r"lo\.yml:\d+: facts\.tuning\.variables\.NCCL_BUFFSZE: not a variable NCCL "
                                         r"or RCCL reads; did you mean NCCL_BUFFSIZE\?"):
        pb.load(None, tmp_path / "lo.yml")


def test_a_setting_known_to_break_the_version_is_refused_unless_allowed(tmp_path):
    allow = "      allow_known_issues: [rccl-rocm7-net-gdr-level-hang]\n"
    assert allow in FRONTIER   # the ROCm 7 stack keeps OLCF's NCCL_NET_GDR_LEVEL=3 tuning candidate knowingly
    assert pb.load("frontier").stacks["rocm7"][0].allow_known_issues == ("rccl-rocm7-net-gdr-level-hang",)
    unallowed = FRONTIER.replace(allow, "")
    path, _ = variant(tmp_path, "      NCCL_NET_GDR_LEVEL:\n", "      NCCL_NET_GDR_LEVEL:\n", unallowed)
    line = unallowed[:unallowed.index("      NCCL_NET_GDR_LEVEL:\n")].count("\n") + 1
    message = refused(path)
    assert message.startswith(f"{path}:{line}: facts.tuning.variables.NCCL_NET_GDR_LEVEL: NCCL_NET_GDR_LEVEL=3: multi-node jobs")
    assert "laifs-container-recipes/issues/30" in message and "allow_known_issues: [rccl-rocm7-net-gdr-level-hang]" in message
    # set in a ROCm 7 stack's env: refused at that line; the ROCm 5.7.1 stack may set it
    untuned = unallowed.replace(unallowed[unallowed.index("      NCCL_NET_GDR_LEVEL:\n"):unallowed.index("      NCCL_ALGO:\n")], "")
    overlay = "        FI_MR_CACHE_MONITOR: kdreg2"
    path, line = variant(tmp_path, overlay, f"{overlay}\n        NCCL_NET_GDR_LEVEL: PHB", untuned)
    assert refused(path).startswith(f"{path}:{line}: stacks.rocm7.facts.env.NCCL_NET_GDR_LEVEL: NCCL_NET_GDR_LEVEL=PHB: ")
    path, _ = variant(tmp_path, "    NCCL_SOCKET_IFNAME: hsn0", "    NCCL_SOCKET_IFNAME: hsn0\n    NCCL_NET_GDR_LEVEL: PHB",
                      untuned.replace(overlay, overlay + "\n      allow_known_issues: [rccl-rocm7-net-gdr-level-hang]"))
    assert pb.load(None, path).stacks["rocm7"][0].env["NCCL_NET_GDR_LEVEL"] == "PHB"
    typo = FRONTIER.replace(allow, "      allow_known_issues: [rccl-gdr-hang]\n")
    path, _ = variant(tmp_path, overlay, overlay, typo)
    assert "stacks.rocm7.facts.allow_known_issues: 'rccl-gdr-hang' is not a known issue" in refused(path)


def test_the_shipped_playbooks_use_only_names_their_libraries_read():
    for site in list_sites():
        loaded = pb.load(site)   # the loader's own check
        assert loaded.facts is not None


def test_the_command_line_says_it_in_one_line_with_exit_code_1(tmp_path):
    path, line = variant(tmp_path, "    NCCL_SOCKET_IFNAME: hsn0", "    NCCL_SOCKET_IFNAM: hsn0")
    out = subprocess.run([sys.executable, "-m", "invoke", "show-site", "--playbook", str(path), "--account", "abc"],
                         capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert f"fr.yml:{line}: facts.env.NCCL_SOCKET_IFNAM" in out.stderr + out.stdout


def test_the_names_come_from_the_upstream_sources():
    """variables.yml holds what scripts/comm_variables.py read at each tag: spot checks against the sources."""
    nccl = comm_settings.known_names("nccl", None, "NCCL_")
    assert {"NCCL_SOCKET_IFNAME", "NCCL_DEBUG_SUBSYS", "NCCL_NET_GDR_LEVEL", "NCCL_NET_PLUGIN", "NCCL_IB_HCA"} <= nccl
    assert "NCCL_LL128_C2C" in nccl and "NCCL_LL128_C2C" not in comm_settings.known_names("rccl", ">=2.17,<2.20", "NCCL_")
    assert comm_settings.unknown_variable("NCCL_SOCKET_IFNAME", None) is None
    assert all(issue.source.startswith("https://") for issue in comm_libraries.table().known_issues)


def test_the_job_warns_of_its_own_settings():
    """check-config.json's settings, as the job judges its environment (ddpcheck/comm_env.py)."""
    from sitestack.model.facts import Facts
    from sitestack.onsite.ddpcheck.comm_env import setting_warnings

    facts: Facts = pb.load("frontier").stacks["rocm7"][0]
    settings = comm_settings.job_settings(facts)
    assert settings["library"] == "the RCCL of ROCm 7.1.1" and settings["issues"] == []   # allowed by the playbook
    env = {"NCCL_SOCKET_IFNAM": "hsn0", "NCCL_SOCKET_IFNAME": "hsn0", "MIOPEN_X": "1", "FI_CXI_ATS": "0"}
    assert setting_warnings(env, settings) == [
        "NCCL_SOCKET_IFNAM: not a variable the RCCL of ROCm 7.1.1 reads; did you mean NCCL_SOCKET_IFNAME?"]
    issue = comm_settings.job_settings(dataclasses.replace(facts, allow_known_issues=()))
    assert [i["id"] for i in issue["issues"]] == ["rccl-rocm7-net-gdr-level-hang"]
    warned = setting_warnings({"NCCL_NET_GDR_LEVEL": "phb"}, issue)
    assert warned and warned[0].startswith("NCCL_NET_GDR_LEVEL=phb: multi-node jobs") and "issues/30" in warned[0]
    assert setting_warnings(env, None) == [] and setting_warnings(env, {"known": "x"}) == []


@pytest.mark.parametrize("site, name, value", [
    ("cirrus", "NCCL_P2P_LEVEL", "NVL"),              # read through ncclGetLevel(..., "NCCL_P2P_LEVEL"), NCCL >= 2.3.4
    ("lumi", "FI_CXI_COMPAT", "0"),                   # HPE's cxi provider (man/fi_cxi.7.md)
    ("frontier", "NCCL_ASYNC_ERROR_HANDLING", "1"),   # PyTorch's own older name of TORCH_NCCL_ASYNC_ERROR_HANDLING
    ("frontier", "OFI_NCCL_PLATFORM", "AWS"),         # aws-ofi-nccl >= 1.18 include/nccl_ofi_param.h
])
def test_documented_settings_are_taken(tmp_path, site, name, value):
    text = (REPO / "playbooks" / f"{site}.yml").read_text().replace(f"site: {site}", "site: other", 1)
    env = "\n  env:\n"
    assert env in text
    (tmp_path / "other.yml").write_text(text.replace(env, f"{env}    {name}: '{value}'\n", 1))
    assert pb.load(None, tmp_path / "other.yml").facts.env[name] == value


def test_a_newer_rccl_may_set_names_no_scan_saw(tmp_path):
    overlay = "        FI_MR_CACHE_MONITOR: kdreg2"
    path, _ = variant(tmp_path, overlay, f"{overlay}\n        RCCL_P2P_BATCH_ENABLE: '1'")   # RCCL 2.27.7 (ROCm 7.1.1)
    assert pb.load(None, path).stacks["rocm7"][0].env["RCCL_P2P_BATCH_ENABLE"] == "1"
    path, _ = variant(tmp_path, "    NCCL_SOCKET_IFNAME: hsn0", "    NCCL_SOCKET_IFNAME: hsn0\n    RCCL_P2P_BATCH_ENABLE: '1'")
    assert "facts.env.RCCL_P2P_BATCH_ENABLE: not a variable the RCCL of ROCm 5.7.1 reads" in refused(path)


def test_a_plugin_path_the_library_cannot_open_is_refused(tmp_path):
    path, line = variant(tmp_path, "    NCCL_SOCKET_IFNAME: hsn0",
                         "    NCCL_SOCKET_IFNAME: hsn0\n    NCCL_NET_PLUGIN: /lustre/x/lib/librccl-net.so")
    message = refused(path)
    assert message.startswith(f"{path}:{line}: facts.env.NCCL_NET_PLUGIN: the RCCL of ROCm 5.7.1 opens lib...-net-<value>.so")
    assert "librccl-net-/lustre/x/lib/librccl-net.so.so" in message and "give the suffix (ofi" in message
    overlay = "        FI_MR_CACHE_MONITOR: kdreg2"   # RCCL of ROCm 7.1.1 takes the value as a path first
    path, _ = variant(tmp_path, overlay, f"{overlay}\n        NCCL_NET_PLUGIN: /sw/plugins/librccl-net.so")
    assert pb.load(None, path).stacks["rocm7"][0].env["NCCL_NET_PLUGIN"] == "/sw/plugins/librccl-net.so"


def test_messages_name_the_reader_of_each_family():
    lumi = comm_settings.stack_library("rccl", "6.2.4")
    assert comm_settings.unknown_variable("FI_CXI_RDV_PROTO", lumi).startswith(
        "not a variable libfabric's cxi provider reads; did you mean FI_CXI_RDZV_PROTO?")
    assert comm_settings.unknown_variable("OFI_NCCL_USE_IPV6_TPC", lumi).startswith(
        "not a variable the aws-ofi-nccl/aws-ofi-rccl plugin reads; did you mean OFI_NCCL_USE_IPV6_TCP?")


@pytest.mark.parametrize("broken, expect", [
    (lambda t: t.replace("\nrccl:\n", "\nrccl_gone:\n"), r"variables\.yml:\d+: rccl: missing"),
    (lambda t: t.replace("NCCL_SOCKET_IFNAME: '*'", "NCCL_SOCKET_IFNAME: 5", 1), r"variables\.yml:\d+: nccl\.variables\.NCCL_SOCKET_IFNAME"),
    (lambda t: t.replace("NCCL_SOCKET_IFNAME: '*'", "NCCL_SOCKET_IFNAME: '>=banana'", 1), r"variables\.yml:\d+: nccl: variables\.NCCL_SOCKET_IFNAME"),
])
def test_a_broken_variables_table_is_refused_cleanly(tmp_path, broken, expect):
    data = tmp_path / "data"
    for folder in ("playbooks", "sources", "patches", "modulefiles"):
        shutil.copytree(REPO / folder, data / folder)
    table = data / "sources" / "comm" / "variables.yml"
    table.write_text(broken(table.read_text()))
    out = subprocess.run([sys.executable, "-m", "invoke", "show-site", "--site", "frontier", "--account", "abc"],
                         capture_output=True, text=True, cwd=REPO, env={**os.environ, "SITESTACK_DATA_DIR": str(data)})
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert re.search(expect, out.stderr), out.stderr


def test_the_jobs_reader_takes_only_the_controllers_shape():
    from sitestack.onsite.ddpcheck.comm_env import setting_warnings

    env = {"NCCL_NET_GDR_LEVEL": "PHB", "PATH": "/bin"}
    for bad in ({"known": {"": ["X"]}}, {"known": {}, "issues": 5}, {"known": {}, "issues": [{"values": 3}]},
                {"known": {}, "issues": [{"variable": "NCCL_NET_GDR_LEVEL", "values": "PHB"}]}):
        assert setting_warnings(env, bad) == [], bad
