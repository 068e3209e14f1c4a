"""The environment check: ranks found under the launcher, world size as the job expects, versions
(torch, NCCL/RCCL, MPI) the same on every rank and as the site facts say, a device per rank."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

from .. import hostlist
from ..launchers import rank_source
from .affinity import cpu_list
from .checks import ENVIRONMENT
from .comm_env import setting_warnings
from .devices import VISIBLE_VARS, select_device
from .imports import import_problems, origins, own_dirs
from .libraries import expected_dirs, judge_libraries
from .resources import limit_problems, limits, memory_cgroup, scratch_problems
from .state import Run
from .threads import THREAD_VARS, numpy_version, oversubscription, share_cpus, thread_settings
from .verdicts import FAILED, PASSED, job_environment


def environment(run: Run) -> None:
    """Load torch, choose this rank's device, record what this rank is (``run.me``) and what it alone
    finds wrong; the comparison across ranks (:func:`environment_after`) needs the process group."""
    import torch  # type: ignore[import-not-found, unused-ignore]
    import torch.distributed as dist  # type: ignore[import-not-found, unused-ignore]

    run.torch, run.dist = torch, dist
    device = run.device = select_device(torch, run.info.local_rank, run.info.local_world_size, run.env,
                                        force_cpu=run.args.device == "cpu")
    if device.kind == "cuda" and device.index is not None:
        torch.cuda.set_device(device.index)
    elif device.kind == "xpu" and device.index is not None:
        torch.xpu.set_device(device.index)
    try:
        affinity = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = []
    if device.kind == "cpu" and not run.env.get("OMP_NUM_THREADS"):
        # CPU ranks share the node's cores: one torch thread pool per core, not per rank
        share = len(affinity) // max(1, run.info.local_world_size or 1) if affinity else 1
        torch.set_num_threads(max(1, share))
    run.me = rank_record(run, torch, affinity)
    if run.progress is not None:  # a result a watchdog writes later names them (fault_result)
        # and its memory cgroup: a rank killed later is named out of memory where its cgroup counts the kill
        run.progress.data.update(backend=device.backend, device=device.name, torch=torch.__version__,
                                 memory=memory_cgroup())
        run.progress.save()
    run.log(f"launcher {run.info.launcher} ({run.info.source}), local rank {run.info.local_rank}, "
            f"device {device.name} ({device.library}), CPUs {cpu_list(affinity)}, torch {torch.__version__}")
    problems = run.pre_problems = own_problems(run, torch.__version__)
    if problems:
        run.set(ENVIRONMENT.name, FAILED, problems[0], problems=problems)
    else:  # what this rank alone can tell; the comparison across ranks needs the process group
        run.set(ENVIRONMENT.name, PASSED, f"rank {run.info.rank} of {run.info.world_size} under "
                f"{run.info.launcher}, {device.name} with {device.backend}, torch {torch.__version__} "
                "(not compared across ranks: the process group did not start)")


def rank_record(run: Run, torch: Any, affinity: list[int]) -> dict[str, Any]:
    """What this rank is and runs with, as every rank reports it to the others and result.json lists it."""
    device = run.dev
    nccl = device_name = None
    if device.kind == "cuda":
        with contextlib.suppress(Exception):
            version = torch.cuda.nccl.version()
            nccl = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
    if device.kind == "cuda" and device.index is not None:
        with contextlib.suppress(Exception):
            device_name = torch.cuda.get_device_name(device.index)
    return {
        "rank": run.info.rank, "local_rank": run.info.local_rank, "world_size": run.info.world_size,
        "local_world_size": run.info.local_world_size, "launcher": run.info.launcher,
        "source": run.info.source, "host": run.host, "pid": os.getpid(),
        "python": sys.version.split()[0], "torch": torch.__version__, "numpy": numpy_version(),
        "hip": getattr(torch.version, "hip", None), "cuda": getattr(torch.version, "cuda", None),
        "nccl": nccl, "device": device.name, "device_name": device_name,
        "device_count": device.count, "physical_gpu": device.physical,
        "backend": device.backend, "library": device.library,
        "affinity": affinity, "threads": thread_settings(torch, run.env, affinity),
        "mpi_library": run.mpi_data.get("library_short"),
        "visible": {v: run.env[v] for v in VISIBLE_VARS if v in run.env},
        "master": f"{run.env.get('MASTER_ADDR', '?')}:{run.env.get('MASTER_PORT', '?')}",
        "fault": run.env.get("SITESTACK_CHECK_FAULT") or None,
        "setting": job_environment(run.env, (run.config.get("network") or {}).get("net_plugin")),
        "limits": limits(), "imports": origins(),
    }


def own_problems(run: Run, torch_version: str) -> list[str]:
    """What this rank alone finds wrong: world size, rank, device, torch version, GPUs not seen."""
    problems = []
    expected = run.args.expect_world_size
    if expected and expected != run.info.world_size:
        problems.append(f"the job expects {expected} ranks but the launcher ({run.info.launcher}, "
                        f"{run.info.source}) says world size {run.info.world_size}")
    if not 0 <= run.info.rank < run.info.world_size:
        problems.append(f"rank {run.info.rank} is outside world size {run.info.world_size}")
    if run.dev.problem:
        problems.append(run.dev.problem)
    want_torch = run.config.get("torch_version")
    if want_torch and torch_version.split("+")[0] != want_torch:
        problems.append(f"torch {torch_version} here, the site facts say {want_torch}")
    if run.config.get("gpu_vendor") not in (None, "none") and run.dev.kind == "cpu" and run.args.device != "cpu":
        problems.append(f"the site has {run.config['gpu_vendor']} GPUs but torch sees none on {run.host}")
    for var in THREAD_VARS:
        value = run.env.get(var)
        # OpenMP also takes a list, one number per nesting level: OMP_NUM_THREADS=8,2
        if value is not None and not all(part.strip().isdigit() and int(part) > 0 for part in value.split(",")):
            problems.append(f"{var}={value!r} is not a number of threads (a positive integer)")
    return problems + resource_problems(run)


def resource_problems(run: Run) -> list[str]:
    """This rank's limits, scratch directories and imports (:mod:`.resources`, :mod:`.imports`), each
    problem led by the rank and its host."""
    who = f"rank {run.info.rank} on {run.host}"
    found = [f"{who}: {p}" for p in limit_problems(run.me.get("limits") or limits()) + scratch_problems(run.env)]
    expect = expected_dirs(run.config, run.env.get("SITESTACK_STAGED_ENV"))
    return found + import_problems(run.me.get("imports") or origins(), expect, own_dirs(), who)


def gather_ranks(run: Run) -> None:
    """Every rank's report (``run.ranks``), once the ranks met in the process group."""
    run.ranks = run.all_gather({**run.me, "problems": run.pre_problems})


def environment_gathered(run: Run) -> None:
    """The environment check's part with every rank's report: the ranks compared, their libraries judged."""
    environment_after(run)
    judge_libraries(run)


def environment_after(run: Run) -> None:
    """With every rank's report: ranks unique, world consistent, versions equal."""
    ranks = run.ranks
    problems = list(run.checks[ENVIRONMENT.name].details.get("problems", []))
    for r in ranks:
        if r["rank"] != run.info.rank and r.get("problems"):
            # a problem that names its rank already (resource_problems) is taken as it is
            problems.extend(p if p.startswith(f"rank {r['rank']} ") else f"rank {r['rank']}: {p}" for p in r["problems"])
    share_cpus(ranks)
    if run.dev.kind == "cpu":  # the ranks compute on their CPUs: more threads than CPUs slow every one
        problems.extend(filter(None, (oversubscription(r) for r in ranks)))
    seen = sorted(r["rank"] for r in ranks)
    if seen != list(range(len(ranks))):
        problems.append(f"ranks are not 0..{len(ranks) - 1}: {seen}")
    sizes = sorted({r["world_size"] for r in ranks})
    if sizes != [len(ranks)]:
        problems.append(f"ranks disagree on the world size: {sizes} for {len(ranks)} ranks")
    by_host: dict[str, list[int]] = {}
    for r in ranks:
        by_host.setdefault(r["host"], []).append(r["local_rank"])
    for host, locals_ in by_host.items():
        if len(set(locals_)) != len(locals_):
            problems.append(f"duplicate local ranks on {host}: {sorted(locals_)}")
        if run.device and run.device.kind != "cpu":
            devices = [r["physical_gpu"] for r in ranks if r["host"] == host]
            if len(set(devices)) != len(devices):
                problems.append(f"ranks on {host} share GPUs: {devices}")
    for key in ("torch", "numpy", "nccl", "hip", "cuda", "python", "backend", "mpi_library"):
        values = sorted({str(r.get(key)) for r in ranks})
        if len(values) > 1:  # each version with the first rank (and host) that runs it
            firsts = [next(r for r in ranks if str(r.get(key)) == v) for v in values]
            problems.append(f"ranks run different {key} versions: " + ", ".join(
                f"{v} (rank {r['rank']} on {r['host']}{', from ' + r['imports'][key] if key in (r.get('imports') or {}) else ''})"
                for v, r in zip(values, firsts)))
    master = run.env.get("MASTER_ADDR")
    nodelist = run.env.get("SLURM_JOB_NODELIST")
    if master and nodelist and not rank_source(run.info.launcher).sets_master:
        with contextlib.suppress(ValueError):
            first_node = hostlist.first(nodelist)
            if first_node != master and first_node.split(".")[0] != master.split(".")[0]:
                problems.append(f"MASTER_ADDR is {master}, but the first host of {nodelist} is {first_node}")
    first = ranks[0]
    versions = [f"torch {first['torch']}"]
    if first.get("nccl"):
        versions.append(f"{first['library']} {first['nccl']}")
    if first.get("mpi_library"):
        versions.append(first["mpi_library"])
    hosts = sorted(by_host)
    summary = (f"{len(ranks)} ranks on {len(hosts)} node{'s' if len(hosts) != 1 else ''} under "
               f"{first['launcher']}, {first['device'].split(':')[0]} with {first['backend']}; {', '.join(versions)}")
    details: dict[str, Any] = {"hosts": hosts, "versions": versions}
    warnings = details["warnings"] = setting_warnings(run.env, run.config.get("settings"))
    if warnings:
        summary = f"warning: {'; '.join(warnings)}; {summary}"
    if problems:
        run.set(ENVIRONMENT.name, FAILED, problems[0] + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""),
                problems=problems, **details)
    else:
        run.set(ENVIRONMENT.name, PASSED, summary, **details)
