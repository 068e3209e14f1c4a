"""Cold ``provision --site local``: independent steps one after the other vs at the same time.

Each run provisions the whole local playbook into a fresh prefix with an empty build cache: its own
``HOME`` under ``BENCH_DIR/provision_cold`` (so the build cache, the build environments, the probe
cache and the venv template are all empty, and the real ``~/.cache`` is untouched). Only the source
tarballs are copied in from the real ``~/.cache/sitestack/sources`` (the machine has no network), and
pip's user configuration is kept (``PIP_CONFIG_FILE``: the local wheel index). The system packages
are already installed, so the apt step only checks them.

The runs, side by side in one invocation (``BENCH_COLD_RUNS``, comma-separated, to choose):

- ``serial``: ``--parallel-steps 1``, every step after the one before;
- ``concurrent``: the default, as many independent steps at once as the process has cores
  (mpi4py's build beside Horovod's build environment and build);
- ``concurrent-1core``: the default under ``taskset -c 0``: one usable core, so one step at a time.

Each figure: the CLI process's wall time and CPU time (user + system of it and every process it
waited for), and each step's time from ``--json``. Target: ``concurrent`` at least 25% shorter than
``serial`` (wall). A run takes about 6 minutes on 2 idle cores: about 20 minutes for all three.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _common import BENCH_DIR, ROOT, loadavg, sitestack_env, target, write

TARGET_CUT_PCT = 25.0
RUNS = {"serial": ((), ("--parallel-steps", "1")),
        "concurrent": ((), ()),
        "concurrent-1core": (("taskset", "-c", "0"), ())}
#: The steps whose times the table shows (the rest take a second or two together).
SHOWN = ("mpi4py", "horovod", "stack-venv", "validation-job")


def fresh_home(base: Path, real_home: Path) -> Path:
    """An empty HOME for one run, with the source tarballs (not the build cache) copied in."""
    if base.exists():
        shutil.rmtree(base)
    home = base / "home"
    sources = real_home / ".cache" / "sitestack" / "sources"
    target_dir = home / ".cache" / "sitestack" / "sources"
    target_dir.parent.mkdir(parents=True)
    target_dir.parent.chmod(0o700)
    if sources.is_dir():
        shutil.copytree(sources, target_dir)
    return home


def one_run(name: str, base: Path, real_home: Path) -> dict[str, Any]:
    """Provision the local site cold into ``base``; wall, CPU, per-step times, and the load."""
    wrapper, options = RUNS[name]
    home = fresh_home(base, real_home)
    report = base / "run.json"
    argv = [*wrapper, sys.executable, "-m", "invoke", "provision", "--site", "local", "--prefix", str(base / "prefix"),
            "--json", str(report), *options]
    env = sitestack_env(HOME=str(home), SITESTACK_LOG_DIR=str(base / "logs"),
                        SITESTACK_BUILD_CACHE=str(home / ".cache" / "sitestack" / "builds"))
    pip_conf = real_home / ".config" / "pip" / "pip.conf"
    if pip_conf.is_file() and "PIP_CONFIG_FILE" not in env:
        env["PIP_CONFIG_FILE"] = str(pip_conf)
    load = loadavg()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    out = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    (base / "stdout.txt").write_text(out.stdout + out.stderr)
    if out.returncode != 0:
        raise SystemExit(f"{name}: provision failed ({out.returncode}); output in {base / 'stdout.txt'}:\n"
                         f"{out.stdout[-3000:]}{out.stderr[-1000:]}")
    doc = json.loads(report.read_text())
    steps = {r["step"]: r["elapsed"] for h in doc["hosts"] for r in h["steps"]}
    return {"wall_s": round(wall, 1), "cpu_s": round(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, 1),
            "steps_s": steps, "load_before": load, "load_after": loadavg(), "argv": argv[len(wrapper):][3:]}


def main() -> None:
    names = [n.strip() for n in os.environ.get("BENCH_COLD_RUNS", ",".join(RUNS)).split(",") if n.strip()]
    unknown = [n for n in names if n not in RUNS]
    if unknown or not names:
        raise SystemExit(f"BENCH_COLD_RUNS: {', '.join(unknown) or 'empty'}: the runs are {', '.join(RUNS)}")
    if "concurrent-1core" in names and shutil.which("taskset") is None:
        raise SystemExit("concurrent-1core needs taskset (util-linux)")
    real_home = Path.home()
    root = BENCH_DIR / "provision_cold"
    load_before = loadavg()
    runs: dict[str, dict[str, Any]] = {}
    for name in names:
        print(f"  {name}: cold provision of the local site (about 6 minutes) ...", flush=True)
        runs[name] = one_run(name, root / name, real_home)
        r = runs[name]
        shown = ", ".join(f"{s} {r['steps_s'][s]:.0f}s" for s in SHOWN if s in r["steps_s"])
        print(f"  {name:<18} wall {r['wall_s']:7.1f} s  CPU {r['cpu_s']:7.1f} s  ({shown}; load {r['load_before']})",
              flush=True)
    targets = []
    if "serial" in runs and "concurrent" in runs:
        cut = 100 * (1 - runs["concurrent"]["wall_s"] / runs["serial"]["wall_s"])
        targets.append(target("cold provision, concurrent vs serial: shorter by", cut, TARGET_CUT_PCT, "%",
                              at_least=True))
    write("provision_cold", {"runs": runs, "cores": len(os.sched_getaffinity(0))}, targets, load_before)


if __name__ == "__main__":
    main()
