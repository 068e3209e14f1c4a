"""No-op ``invoke provision --site local``: the whole playbook when everything is already in place.

Provisions a prefix once (kept in the bench directory, ``~/.cache/sitestack/bench``, so later runs
only check it), then times:

- the whole CLI process (``python -m invoke provision --site local --prefix P``): wall and CPU;
- the library call in this process (the tool's own time: load, probe every step, recap);
- the same checks as an Ansible playbook (``benchmarks/ansible/local_noop.yml``, ansible-core in a
  venv of its own), and the ratio of the two.

Also reports what the CLI imports (``python -X importtime``). Targets: the CLI process at most
0.3 s; sitestack at least 30 times faster than Ansible (``SITESTACK_BENCH_ANSIBLE=off`` leaves
Ansible out).
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from _ansible import ansible_env, ansible_playbook
from _common import BENCH_DIR, ROOT, loadavg, sitestack_env, summary, target, timed, timed_process, write

from sitestack.core.report import Reporter
from sitestack.engine import playbook as pb
from sitestack.model.recipe import load_recipe

REPEAT = 7
PREFIX = BENCH_DIR / "local-prefix"
CLI = [sys.executable, "-m", "invoke", "provision", "--site", "local", "--prefix", str(PREFIX)]


def provisioned() -> bool:
    """Provision the prefix (a real run the first time); True when a second run changes nothing."""
    for _ in range(2):
        out = subprocess.run(CLI, cwd=ROOT, env=sitestack_env(), capture_output=True, text=True)
        if out.returncode != 0:
            print(f"  provision failed:\n{out.stdout[-3000:]}{out.stderr[-1000:]}")
            return False
    recap = out.stdout.strip().splitlines()[-1].split()
    return recap[2] == "0"  # host ok changed ...


def import_profile() -> dict[str, object]:
    """What the no-op CLI imports: total and the costliest top-level packages (self time, ms)."""
    out = subprocess.run([sys.executable, "-X", "importtime", *CLI[1:]], cwd=ROOT, env=sitestack_env(),
                         capture_output=True, text=True)
    per: dict[str, int] = {}
    for line in out.stderr.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+\d+ \|\s*(\S+)", line)
        if m:
            name = m.group(2)
            group = ".".join(name.split(".")[:2]) if name.startswith("sitestack") else name.split(".")[0]
            per[group] = per.get(group, 0) + int(m.group(1))
    top = sorted(per.items(), key=lambda kv: -kv[1])[:8]
    return {"total_ms": sum(per.values()) / 1000, "top_ms": {k: v / 1000 for k, v in top}}


def ansible_vars(site: pb.Site) -> dict[str, object]:
    """The variables of the Ansible playbook: what sitestack checks, for the same prefix."""
    args = {s.action: s.args for s in site.steps}
    expected_dir = BENCH_DIR / "ansible-expected"
    shutil.rmtree(expected_dir, ignore_errors=True)
    files = [PREFIX / "share/sitestack/site.json", *sorted((PREFIX / "modules").rglob("*.lua")),
             PREFIX / "pytorch/2.13.0-cpu/bin/extend-venv-activate",
             *sorted(p for p in (PREFIX / "pytorch/2.13.0-cpu/share/sitestack").rglob("*") if p.is_file()),
             *sorted(p for p in (PREFIX / "validation").rglob("*") if p.is_file() and "mpi-probe" not in p.parts
                     and "src" not in p.relative_to(PREFIX / "validation").parts)]
    expected = []
    for path in files:
        copy = expected_dir / path.relative_to(PREFIX)
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, copy)
        expected.append({"src": str(copy), "dest": str(path), "mode": f"{path.stat().st_mode & 0o7777:04o}"})
    installs = []
    for name, version in (("mpi4py", "4.1.2"), ("horovod", "0.28.1")):
        dest = PREFIX / name / version
        stamp = dest / ".sitestack" / "install.json"
        installs.append({"name": name, "dest": str(dest), "stamp": str(stamp),
                         "digest": json.loads(stamp.read_text())["digest"], "sanity": list(load_recipe(name).sanity)})
    pythons = sorted((Path.home() / ".cache/sitestack/builds/envs").glob("torch-*/bin/python"))
    stack = PREFIX / "pytorch/2.13.0-cpu"
    return {"packages": list(args["apt-packages"]["packages"]), "tools": list(args["require-tools"]["tools"]),
            "lmod_init": "/usr/share/lmod/lmod/init/bash",
            "dirs": [str(PREFIX), *(str(PREFIX / d) for d in ("modules", "src", "share/sitestack"))],
            "installs": installs, "torch_python": str(pythons[0]) if pythons else "python3",
            "stack": {"manifest": f"{stack}.manifest.json", "site_packages": f"{stack}/lib/python3.11/site-packages"},
            "expected": expected}


def main() -> int:
    load_before = loadavg()
    site = pb.load("local")
    if not provisioned():
        return 1
    walls, cpus = timed_process(CLI, REPEAT, env=sitestack_env())
    options = pb.Options(prefix=str(PREFIX), log_root=BENCH_DIR / "logs")

    def in_process() -> None:
        runs = pb.provision(pb.load("local"), options, Reporter(io.StringIO()))
        assert not any(r.changed or r.failed for r in runs), "a no-op run changed something"

    tool = summary(timed(in_process, REPEAT))
    cli, cli_cpu = summary(walls), summary(cpus)
    imports = import_profile()
    print(f"no-op provision --site local ({len(site.steps)} steps), median of {REPEAT}")
    print(f"  whole CLI process   wall {cli['median_s']:.3f} s  cpu {cli_cpu['median_s']:.3f} s"
          f"  (wall min {cli['min_s']:.3f}, max {cli['max_s']:.3f})")
    print(f"  tool's own time     {tool['median_s']:.3f} s (in this process)")
    print(f"  imports of the CLI  {imports['total_ms']:.0f} ms: "
          + ", ".join(f"{k} {v:.0f}" for k, v in imports["top_ms"].items()))  # type: ignore[union-attr]
    data: dict[str, object] = {"steps": len(site.steps), "cli_process": cli, "cli_cpu": cli_cpu, "tool_own_time": tool,
                               "imports": imports}
    targets = [target("no-op CLI process, wall (median)", cli["median_s"], 0.3)]
    exe = None if os.environ.get("SITESTACK_BENCH_ANSIBLE") == "off" else ansible_playbook()
    if exe is None:
        print("  ansible: skipped (ansible-core cannot be installed here)")
    else:
        vars_file = BENCH_DIR / "ansible-vars.json"
        vars_file.write_text(json.dumps(ansible_vars(site), indent=1))
        argv = [str(exe), "-i", "localhost,", str(ROOT / "benchmarks/ansible/local_noop.yml"), "-e", f"@{vars_file}"]
        check = subprocess.run(argv, env=ansible_env(), capture_output=True, text=True)
        if check.returncode != 0 or "changed=0" not in check.stdout:
            print(f"  ansible run failed or changed something:\n{check.stdout[-3000:]}{check.stderr[-1000:]}")
            return 1
        a_walls, a_cpus = timed_process(argv, 3, env=ansible_env())
        ansible, ansible_cpu = summary(a_walls), summary(a_cpus)
        ratio, cpu_ratio = ansible["median_s"] / cli["median_s"], ansible_cpu["median_s"] / cli_cpu["median_s"]
        tasks = len(re.findall(r"^TASK \[", check.stdout, re.M))
        print(f"  ansible-playbook    wall {ansible['median_s']:.3f} s  cpu {ansible_cpu['median_s']:.3f} s"
              f"  ({tasks} tasks, median of 3)")
        print(f"  sitestack is {ratio:.1f}x faster (wall), {cpu_ratio:.1f}x (cpu)")
        data.update(ansible=ansible, ansible_cpu=ansible_cpu, ansible_tasks=tasks, ratio_wall=ratio, ratio_cpu=cpu_ratio)
        targets.append(target("Ansible / sitestack, wall (medians)", ratio, 30, "x", at_least=True))
    path = write("provision_noop", data, targets, load_before)
    print(f"  results: {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
