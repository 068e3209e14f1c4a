#!/usr/bin/env python3
"""Extract the environment variables a communication library reads, from a git dir at a ref: how
``sources/comm/variables.yml`` is made (``--all --out-dir DIR`` writes ``variables-compact.yml``, which is
that file, and ``variables.yml`` with each tag's detail). Needs the upstream repositories as git
directories under MIRROR (github.com/NVIDIA/nccl, ROCm/rccl, aws/aws-ofi-nccl, ROCm/aws-ofi-rccl,
ofiwg/libfabric); a maintainer's tool, not run by the tests.

Mechanical, regex-based extraction over the source tree at one git ref (no checkout needed:
files are read with `git cat-file --batch`). C/C++ comments are stripped first so that
commented-out reads are not counted.

Kinds and rules (the "via" tag of each rule is kept in the detailed output):

  nccl / rccl  (files: src/**, excluding any path component starting with "ext-")
    param      NCCL_PARAM(Name, "ENV", ...)            -> "NCCL_" + ENV   (src/include/param.h)
    param      RCCL_PARAM(Name, "ENV", ...)            -> "RCCL_" + ENV   (rccl src/include/param.h)
    param      DEFINE_NCCL_PARAM(name, type, KEY, ...) -> KEY             (nccl >= 2.30 src/include/param/param.h)
    getenv     getenv/secure_getenv/ncclGetEnv/rcclGetEnv/std::getenv("NAME") -> NAME
    other_call "NCCL_X" / "RCCL_X" literal passed as an argument to any other call, e.g.
               ncclGetLevel(&lvl, NULL, "NCCL_NET_GDR_LEVEL") or getNthreads("NCCL_NTHREADS", ...)
  aws-ofi-nccl / aws-ofi-rccl  (files: src/**, include/**)
    param      OFI_NCCL_PARAM*( ..., "ENV", ...)  (first string literal) -> "OFI_NCCL_" + ENV
    getenv     getenv/secure_getenv("NAME") -> NAME
  libfabric-cxi  (files: src/**, prov/util/**, prov/cxi/** except prov/cxi/test/**)
    param      fi_param_define(NULL|&core_prov, "name", ...) -> "FI_" + NAME   (src/var.c: "FI_%s")
    param      fi_param_define(&cxip_prov, "name", ...)      -> "FI_CXI_" + NAME (src/var.c: "FI_%s_%s",
               provider->name == "cxi")
    getenv     getenv("NAME") -> NAME

Usage:
  comm_variables.py --git-dir DIR --kind nccl --ref v2.27.3-1           # one ref, YAML to stdout
  comm_variables.py --all --out-dir DIR                                 # the built-in job list,
                                                                      # writes variables.yml and
                                                                      # variables-compact.yml
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Set, Tuple

import yaml

MIRROR = Path(os.environ.get("COMM_SOURCES", "mirror"))   # <owner>+<name>/repo git directories
SRC_EXT = (".c", ".cc", ".cpp", ".cxx", ".cu", ".cuh", ".h", ".hh", ".hpp", ".in")

GETENV_RE = re.compile(
    r'\b(?:std::)?(?:secure_getenv|getenv|ncclGetEnv|rcclGetEnv)\s*\(\s*"([A-Za-z_][A-Za-z0-9_]*)"\s*\)')
NCCL_PARAM_RE = re.compile(r'\bNCCL_PARAM\s*\(\s*\w+\s*,\s*"([A-Za-z0-9_]+)"')
RCCL_PARAM_RE = re.compile(r'\bRCCL_PARAM\s*\(\s*\w+\s*,\s*"([A-Za-z0-9_]+)"')
DEFINE_NCCL_PARAM_RE = re.compile(r'\bDEFINE_NCCL_PARAM\s*\(\s*\w+\s*,\s*[^,]+?,\s*([A-Z][A-Z0-9_]+)\s*,')
# the closing delimiter is looked ahead, not consumed: ncclGetLevel(&l, "NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL")
OTHER_CALL_RE = re.compile(r'[(,]\s*"((?:NCCL|RCCL)_[A-Z0-9_]+)"(?=\s*[,)])')
# OFI_NCCL_PARAM(type, name, "ENV", default), OFI_NCCL_PARAM_INT(name, "ENV", default) and the other forms
# (include/nccl_ofi_param.h): the call's first string literal, not looking past the next call (some end
# without ";"), with the macros' own #define lines taken out
OFI_PARAM_RE = re.compile(r'\bOFI_NCCL_PARAM(?!_VALUE_SET)\w*\s*\((?:(?!OFI_NCCL_PARAM)[^;"])*"([A-Za-z0-9_]+)"')
DEFINE_RE = re.compile(r'^[ \t]*#[ \t]*define\b[^\n]*(?:\\\n[^\n]*)*', re.M)
# the cxi provider's man page names the variables HPE's releases read too (FI_CXI_COMPAT, ...)
FI_CXI_DOC_RE = re.compile(r'\b(FI_CXI_[A-Z0-9_]*[A-Z0-9])\b')
STRLIT_RE = re.compile(r'"([A-Za-z0-9_]+)"')
FI_PARAM_RE = re.compile(r'\bfi_param_define\s*\(\s*([^,]+?)\s*,\s*"([A-Za-z0-9_]+)"')
FI_PROVIDER_NAMES = {"NULL": None, "&core_prov": None, "&cxip_prov": "cxi"}


def strip_comments(text: str) -> str:
    """Remove /* */ and // comments, keeping string and char literals intact."""
    out: List[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == '"' or c == "'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            i = n if j < 0 else j + 2
            out.append(" ")
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def git(git_dir: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(git_dir), *args], check=True,
                          capture_output=True, text=True).stdout


def resolve(git_dir: Path, ref: str) -> str:
    return git(git_dir, "rev-parse", f"{ref}^{{commit}}").strip()


def read_files(git_dir: Path, commit: str, paths: List[str]) -> Iterable[Tuple[str, str]]:
    """Yield (path, text) for each path at commit, via one `git cat-file --batch` process."""
    proc = subprocess.Popen(["git", "-C", str(git_dir), "cat-file", "--batch"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin and proc.stdout
    for p in paths:
        proc.stdin.write(f"{commit}:{p}\n".encode())
        proc.stdin.flush()
        header = proc.stdout.readline().decode().split()
        if len(header) < 3 or header[1] != "blob":
            continue
        data = proc.stdout.read(int(header[2]))
        proc.stdout.read(1)
        yield p, data.decode("utf-8", errors="replace")
    proc.stdin.close()
    proc.wait()


def select_paths(kind: str, all_paths: List[str]) -> List[str]:
    def ok(p: str) -> bool:
        if not p.endswith(SRC_EXT):
            return False
        parts = p.split("/")
        if kind in ("nccl", "rccl"):
            return parts[0] == "src" and not any(x.startswith("ext-") for x in parts)
        if kind in ("aws-ofi-nccl", "aws-ofi-rccl"):
            return parts[0] in ("src", "include")
        if kind == "libfabric-cxi":
            if p.startswith("prov/cxi/test/"):
                return False
            return parts[0] == "src" or p.startswith("prov/util/") or p.startswith("prov/cxi/")
        raise ValueError(kind)
    return [p for p in all_paths if ok(p)]


def extract(git_dir: Path, kind: str, ref: str) -> Dict[str, object]:
    """Return {commit, variables, via} for one ref; via maps variable -> sorted rule tags."""
    commit = resolve(git_dir, ref)
    all_paths = git(git_dir, "ls-tree", "-r", "--name-only", commit).split("\n")
    paths = select_paths(kind, all_paths)
    found: Dict[str, Set[str]] = {}

    def add(name: str, via: str) -> None:
        if not name.endswith("_"):   # a prefix a name is built from ("OFI_NCCL_" + env), not a name
            found.setdefault(name, set()).add(via)

    for _, raw in read_files(git_dir, commit, paths):
        text = strip_comments(raw)
        for m in GETENV_RE.finditer(text):
            add(m.group(1), "getenv")
        if kind in ("nccl", "rccl"):
            for m in NCCL_PARAM_RE.finditer(text):
                add("NCCL_" + m.group(1), "param")
            for m in RCCL_PARAM_RE.finditer(text):
                add("RCCL_" + m.group(1), "param")
            for m in DEFINE_NCCL_PARAM_RE.finditer(text):
                add(m.group(1), "param")
            for m in OTHER_CALL_RE.finditer(GETENV_RE.sub("", text)):
                add(m.group(1), "other_call")
        elif kind in ("aws-ofi-nccl", "aws-ofi-rccl"):
            for m in OFI_PARAM_RE.finditer(DEFINE_RE.sub("", text)):
                add("OFI_NCCL_" + m.group(1), "param")
        elif kind == "libfabric-cxi":
            for m in FI_PARAM_RE.finditer(text):
                prov, name = m.group(1).replace(" ", ""), m.group(2)
                if prov not in FI_PROVIDER_NAMES:
                    print(f"warning: {ref}: fi_param_define on {prov!r} ({name}) skipped", file=sys.stderr)
                    continue
                pname = FI_PROVIDER_NAMES[prov]
                add(("FI_%s_%s" % (pname, name) if pname else "FI_%s" % name).upper(), "param")
    if kind == "libfabric-cxi":
        for _, page in read_files(git_dir, commit, [p for p in ("man/fi_cxi.7.md",) if p in all_paths]):
            for m in FI_CXI_DOC_RE.finditer(page):
                add(m.group(1), "documented")
    return {"commit": commit, "variables": sorted(found),
            "via": {k: sorted(v) for k, v in sorted(found.items()) if v != {"param"} and v != {"getenv"}}}


#: PyTorch reads a few NCCL_ names itself, the older names of its TORCH_NCCL_* settings
#: (pytorch/pytorch torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp, 2.2 and later; the first two are in
#: the strings of the 2.13.0 wheel's libtorch_cpu.so). Not extracted: PyTorch is not scanned.
TORCH = ("2.13.0", ["NCCL_ASYNC_ERROR_HANDLING", "NCCL_BLOCKING_WAIT", "NCCL_DESYNC_DEBUG", "NCCL_ENABLE_TIMING"])


# ---------------------------------------------------------------- built-in job list
NCCL_TAGS = ["v2.16.5-1", "v2.17.1-1", "v2.18.3-1", "v2.19.3-1", "v2.20.5-1", "v2.21.5-1",
             "v2.22.3-1", "v2.23.4-1", "v2.24.3-1", "v2.25.1-1", "v2.26.6-1", "v2.27.3-1",
             "v2.27.7-1", "v2.28.9-1", "v2.29.7-1", "v2.30.7-1"]
# (ref, rccl version from makefiles/version.mk, ROCm release)
RCCL_REFS = [("rocm-5.7.1", "2.17.1", "5.7.1"), ("rocm-6.0.2", "2.18.3", "6.0.2"),
             ("rocm-6.1.2", "2.18.6", "6.1.2"), ("rocm-6.2.2", "2.20.5", "6.2.2"),
             ("release-staging/rocm-rel-6.3", "2.21.5", "6.3.0")]
OFI_TAGS = ["v1.6.0", "v1.7.4-aws", "v1.9.2-aws", "v1.14.0", "v1.18.0", "v1.19.0", "v1.21.1"]
LIBFABRIC_TAGS = ["v1.20.0", "v1.21.0", "v1.22.0", "v2.0.0", "v2.1.0", "v2.2.0", "v2.3.1",
                  "v2.4.0", "v2.5.1", "v2.6.0"]


def version_of(tag: str) -> str:
    m = re.match(r"v?(\d+(?:\.\d+)*)", tag)
    return m.group(1) if m else tag


def jobs() -> List[Tuple[str, Path, str, str, str, Optional[str]]]:
    """(library, git dir, kind, ref, version label, rocm release or None)."""
    out = [("nccl", MIRROR / "NVIDIA+nccl/repo", "nccl", t, version_of(t), None) for t in NCCL_TAGS]
    out += [("rccl", MIRROR / "ROCm+rccl/repo", "rccl", r, v, rocm) for r, v, rocm in RCCL_REFS]
    out += [("aws-ofi-nccl", MIRROR / "aws+aws-ofi-nccl/repo", "aws-ofi-nccl", t, version_of(t), None)
            for t in OFI_TAGS]
    out.append(("aws-ofi-rccl", MIRROR / "ROCm+aws-ofi-rccl/repo", "aws-ofi-rccl",
                "17d41cbf5618536c4b1076d29748416ab307040f", "1.4.0", None))
    out += [("libfabric-cxi", MIRROR / "ofiwg+libfabric/repo", "libfabric-cxi", t, version_of(t), None)
            for t in LIBFABRIC_TAGS]
    return out


def vkey(v: str) -> Tuple[int, ...]:
    return tuple(int(x) for x in v.split("."))


def ranges(present: List[bool], versions: List[str]) -> List[str]:
    """PEP 440 ranges over the scanned versions: one per contiguous run where present."""
    out, i, n = [], 0, len(versions)
    while i < n:
        if not present[i]:
            i += 1
            continue
        j = i
        while j + 1 < n and present[j + 1]:
            j += 1
        lo = "" if i == 0 else f">={versions[i]}"
        hi = "" if j == n - 1 else f"<{versions[j + 1]}"
        out.append(",".join(x for x in (lo, hi) if x) or "*")
        i = j + 1
    return out


def run_all(out_dir: Path) -> None:
    detailed: Dict[str, Dict[str, object]] = {}
    per_lib: Dict[str, List[Tuple[str, Set[str], Optional[str]]]] = {}
    for lib, gdir, kind, ref, ver, rocm in jobs():
        res = extract(gdir, kind, ref)
        key = ref if lib != "rccl" else f"{ref} (rccl {ver}, rocm {rocm})"
        entry = {"version": ver, **res}
        if rocm:
            entry["rocm"] = rocm
        detailed.setdefault(lib, {})[key] = entry
        per_lib.setdefault(lib, []).append((ver, set(res["variables"]), rocm))  # type: ignore[arg-type]
        print(f"{lib} {ref}: {len(res['variables'])} variables", file=sys.stderr)
    compact: Dict[str, Dict[str, object]] = {}
    for lib, rows in per_lib.items():
        rows.sort(key=lambda r: vkey(r[0]))
        versions = [r[0] for r in rows]
        allvars = sorted(set().union(*(r[1] for r in rows)))
        comp: Dict[str, object] = {}
        for var in allvars:
            rs = ranges([var in r[1] for r in rows], versions)
            comp[var] = rs[0] if len(rs) == 1 else rs
        compact[lib] = {"scanned_versions": versions, "variables": comp}
        if lib == "rccl":
            compact[lib]["rocm_of_version"] = {r[0]: r[2] for r in rows}
    compact["torch"] = {"scanned_versions": [TORCH[0]], "variables": {name: "*" for name in TORCH[1]}}
    header = ("# Generated by scripts/comm_variables.py --all (see its docstring for the extraction rules).\n"
              "# 'via' lists variables found by a rule other than a single param/getenv rule.\n")
    (out_dir / "variables.yml").write_text(header + yaml.safe_dump(detailed, sort_keys=False, width=120))
    cheader = ("# Generated by scripts/comm_variables.py --all. Ranges are PEP 440 over the *scanned* versions only:\n"
               "# '>=A,<B' means present from scanned version A and absent at the next scanned version B.\n"
               "# '*' means present in every scanned version. A list means several disjoint runs.\n"
               "# rccl versions are RCCL's own (NCCL-base) versions; rocm_of_version maps them to ROCm.\n")
    (out_dir / "variables-compact.yml").write_text(cheader + yaml.safe_dump(compact, sort_keys=False, width=120))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--git-dir", type=Path)
    ap.add_argument("--kind", choices=["nccl", "rccl", "aws-ofi-nccl", "aws-ofi-rccl", "libfabric-cxi"])
    ap.add_argument("--ref", action="append")
    ap.add_argument("--all", action="store_true", help="run the built-in job list")
    ap.add_argument("--out-dir", type=Path, default=Path(__file__).resolve().parent)
    a = ap.parse_args()
    if a.all:
        run_all(a.out_dir)
        return 0
    if not (a.git_dir and a.kind and a.ref):
        ap.error("--git-dir, --kind and --ref are required without --all")
    print(yaml.safe_dump({a.kind: {r: extract(a.git_dir, a.kind, r) for r in a.ref}}, sort_keys=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
