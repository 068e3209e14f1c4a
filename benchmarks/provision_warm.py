"""``provision --site local`` into a new prefix with warm caches: how long a second prefix takes.

The build cache already holds what the playbook builds (mpi4py's and Horovod's wheels) and the
stack's venv template (made by the first stack built with pip; see sitestack/installs/
venv_template.py). A fresh prefix is provisioned with the whole playbook; the figure is the whole
CLI process, with each step's time from ``--json``. The first run of this benchmark on a machine
may build the template (a pip install); it is run once untimed when no template exists. A run
after the check results or the MPI probe's wheel left the cache (a new Horovod artefact, another
toolchain, ``invoke gc``) runs the checks and builds the probe, and stores them for the next.
Afterwards the new stack is checked: the same distributions as the template's stack, and every
script's ``#!`` names the new prefix. Target: at most 20 s. Then the stack alone without the
template, by pip and by uv (:func:`installers`): what a template miss costs with each.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, loadavg, sitestack_env, target, write

TARGET_S = 20.0
STACK = "pytorch/2.13.0-cpu"


def provision(prefix: Path, logs: Path, report: Path) -> float:
    argv = [sys.executable, "-m", "invoke", "provision", "--site", "local", "--prefix", str(prefix), "--json", str(report)]
    start = time.perf_counter()
    out = subprocess.run(argv, cwd=ROOT, env=sitestack_env(SITESTACK_LOG_DIR=str(logs)), capture_output=True, text=True)
    took = time.perf_counter() - start
    if out.returncode != 0:
        raise SystemExit(f"provision into {prefix} failed:\n{out.stdout[-3000:]}{out.stderr[-1000:]}")
    return took


def installers(tmp: Path, repeat: int = 2) -> dict[str, object] | None:
    """The stack alone (``install-venv``, torch 2.13.0 CPU and numpy) into fresh prefixes without
    the venv template: with pip (no uv on the PATH) and with uv (facts.python.installer auto),
    alternating, ``repeat`` times each. None when there is no uv next to this interpreter."""
    uv = shutil.which("uv", path=os.path.dirname(sys.executable))
    if uv is None:
        print("  no uv next to this interpreter (pip install uv): pip/uv comparison skipped")
        return None
    plain = os.pathsep.join(d for d in os.environ["PATH"].split(os.pathsep) if not os.path.exists(os.path.join(d, "uv")))
    paths = {"pip": plain, "uv": f"{os.path.dirname(uv)}{os.pathsep}{plain}"}
    times: dict[str, list[float]] = {"pip": [], "uv": []}
    for i in range(repeat):
        for name, path in paths.items():
            argv = [sys.executable, "-m", "invoke", "install-venv", "--site", "local", "--prefix", str(tmp / f"{name}{i}")]
            env = sitestack_env(SITESTACK_LOG_DIR=str(tmp / "logs"), SITESTACK_VENV_TEMPLATE="off", PATH=path)
            start = time.perf_counter()
            out = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
            times[name].append(time.perf_counter() - start)
            if out.returncode != 0 or (name == "uv") != ("uv pip install" in out.stdout):
                raise SystemExit(f"install-venv with {name} failed or used the other installer:\n{out.stdout[-3000:]}")
            shutil.rmtree(tmp / f"{name}{i}", ignore_errors=True)
    pip_s, uv_s = statistics.median(times["pip"]), statistics.median(times["uv"])
    print(f"stack venv without a template (install-venv, median of {repeat}): pip {pip_s:.1f} s, uv {uv_s:.1f} s "
          f"({pip_s / uv_s:.1f}x)")
    return {"pip_s": times["pip"], "uv_s": times["uv"], "pip_over_uv": pip_s / uv_s}


def main() -> int:
    load_before = loadavg()
    tmp = Path(tempfile.mkdtemp(prefix="sitestack-bench-warm-"))
    try:
        templates = Path.home() / ".cache/sitestack/builds/venvs"
        if not any(templates.glob("pytorch-*/template.json")):
            print("  no venv template yet: a first provision builds the stack with pip (untimed)")
            provision(tmp / "first", tmp / "logs", tmp / "first.json")
        prefix = tmp / "prefix"
        took = provision(prefix, tmp / "logs", tmp / "run.json")
        doc = json.loads((tmp / "run.json").read_text())
        steps = {r["step"]: r["elapsed"] for h in doc["hosts"] for r in h["steps"]}
        stack = prefix / STACK
        scripts = [p for p in (stack / "bin").iterdir() if p.is_file() and not p.is_symlink()]
        firsts = {p.name: p.read_bytes().split(b"\n", 1)[0] for p in scripts}
        # a script run by a Python named by path (pip's console scripts) must name this prefix's
        foreign = [name for name, first in firsts.items()
                   if first.startswith(b"#!/") and b"/bin/python" in first and str(prefix).encode() not in first]
        manifest = json.loads(Path(f"{stack}.manifest.json").read_text())
        dists = sorted(p["dist_info"] for p in manifest["packages"])
        by_installer = installers(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"warm-cache provision --site local into a new prefix: {took:.1f} s (whole CLI process)")
    for name, seconds in sorted(steps.items(), key=lambda kv: -kv[1])[:6]:
        print(f"  {name:<24} {seconds:7.2f} s")
    print(f"  stack: {len(dists)} distributions; scripts naming another prefix: {foreign or 'none'}")
    if foreign:
        print("  the stack's scripts do not point at the new prefix")
        return 1
    path = write("provision_warm", {"cli_process_s": took, "steps_s": steps, "distributions": dists,
                                    "stack_without_template": by_installer},
                 [target("warm-cache provision into a new prefix, wall", took, TARGET_S)], load_before)
    print(f"  results: {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
