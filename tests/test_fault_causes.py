"""Causes, not symptoms: faults the check program must name by rank, host and cause, within seconds of
being knowable (not at the time limit), and a hang named by where each rank's Python was.

The faults are real, injected as tests/test_faults.py injects them (an overlay venv with a ``.pth``
hook, the job's environment, the test acting on a process); its helpers run the installed job.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from sitestack.onsite.ddpcheck import stacks
from tests.ports import free_port
from tests.test_faults import (
    LIMIT,
    assert_fault,
    overlay,
    run_by_hand,
    run_job,
    when_rank_reaches,
)

HOST = socket.gethostname().split(".")[0]

#: A .pth hook: once torch.distributed is imported, ``CALL`` of rank 1 runs ``ACTION`` (hang or exit).
PATCH_CALL = '''
import importlib.abc, importlib.util, os, sys, time

def _rank():
    return os.environ.get("RANK", os.environ.get("PMI_RANK"))

class _Patch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "{module}":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            real = getattr(module, "{call}")

            def patched(*args, **kwargs):
                if _rank() == "1":
                    {action}
                return real(*args, **kwargs)

            setattr(module, "{call}", patched)
        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, _Patch())
'''


def patch_hook(module: str, call: str, action: str) -> str:
    return PATCH_CALL.format(module=module, call=call, action=action)


# -- known before the deadline: the run ends at once, named ---------------------------------------------------

def test_master_addr_that_does_not_resolve_ends_the_run_at_once(installed_local_job, tmp_path):
    run = run_by_hand(installed_local_job, tmp_path, 2, 2, free_port(), MASTER_ADDR="nosuchhost.invalid")
    cause = assert_fault(run, "MASTER_ADDR nosuchhost.invalid does not resolve", f"on {HOST}", "rank ")
    assert run.seconds < 20, f"named after {run.seconds:.0f}s, not at once: {cause}"


@pytest.mark.parametrize("code", [0, 7])
def test_a_rank_that_exits_early_is_named_with_its_code(installed_local_job, tmp_path, code):
    hook = patch_hook("torch.distributed.distributed_c10d", "all_reduce", f"os._exit({code})")
    python = overlay(installed_local_job, tmp_path / "venv", hook)
    run = run_job(installed_local_job, tmp_path, SITESTACK_PYTHON=python)
    cause = assert_fault(run, f"rank 1 on {HOST} exited with code {code}", "during")
    assert "running" not in cause.split(";")[0], cause
    assert run.seconds < LIMIT, f"named after {run.seconds:.0f}s (the limit is {LIMIT}s): {cause}"


def test_a_launcher_killed_is_named(installed_local_job, tmp_path):
    def kill_launcher(out: Path) -> None:
        data = when_rank_reaches(out, 1, "collectives")
        # the rank's watchdog's parent is Hydra's proxy; its parent, mpiexec itself
        proxy = int(Path(f"/proc/{data['watchdog']}/stat").read_text().rsplit(")", 1)[1].split()[1])
        mpiexec = int(Path(f"/proc/{proxy}/stat").read_text().rsplit(")", 1)[1].split()[1])
        os.kill(mpiexec, signal.SIGKILL)

    run = run_job(installed_local_job, tmp_path, during=kill_launcher)
    assert_fault(run, "was killed by SIGKILL")


# -- a hang: the rank whose stack differs, and the frame it is in ---------------------------------------------

def test_a_hang_names_the_rank_whose_stack_differs(installed_local_job, tmp_path):
    """Rank 1 sleeps inside the collectives check where rank 0 waits in the same call's collective: both
    are as far as each other, and only their stacks tell them apart."""
    hook = patch_hook("torch.distributed.distributed_c10d", "broadcast", "time.sleep(3600)")
    python = overlay(installed_local_job, tmp_path / "venv", hook)
    run = run_job(installed_local_job, tmp_path, SITESTACK_PYTHON=python)
    cause = assert_fault(run, "time limit", f"rank 1 on {HOST} hung during collectives", "in patched (fault_hook.py:")
    assert f"rank 0 on {HOST} waited" in cause, cause
    assert "all 2 ranks" not in cause, cause


# -- the pieces, on their own ---------------------------------------------------------------------------------

DUMPER = textwrap.dedent("""\
    import faulthandler, os, signal, sys, threading, time
    sys.path.insert(0, sys.argv[1])
    from sitestack.onsite.ddpcheck import stacks
    print(stacks.register(sys.argv[2], 0), flush=True)
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
    def waiting_here():
        time.sleep(60)
    waiting_here()
    """)


def test_a_rank_answers_with_its_stacks_even_inside_a_blocking_call(tmp_path):
    repo = Path(__file__).resolve().parent.parent
    proc = subprocess.Popen([sys.executable, "-c", DUMPER, str(repo), str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        main_thread = int(proc.stdout.readline())
        time.sleep(0.3)
        path = stacks.stacks_path(str(tmp_path), 0)
        assert stacks.request(proc.pid, path)
        frames = stacks.main_stack(Path(path).read_text(), main_thread)
        assert frames and frames[0].func == "waiting_here", frames
        assert proc.poll() is None  # the signal asked; it did not end the rank
    finally:
        proc.kill()
        proc.wait()


def test_the_odd_rank_out():
    def f(func: str, file: str = "/x/ddpcheck/training.py") -> stacks.Frame:
        return stacks.Frame(file, 10, func)

    wait = [f("all_reduce", "/t/torch/distributed/distributed_c10d.py"), f("ddp")]
    stuck = [f("hang", "/v/fault_hook.py"), f("ddp")]
    assert stacks.odd_ones({0: wait, 1: stuck, 2: wait, 3: wait}) == [1]  # a minority
    assert stacks.odd_ones({0: wait, 1: stuck}) == [1]  # a tie: the one not waiting for its peers
    assert stacks.odd_ones({0: wait, 1: wait}) == []  # nothing tells them apart
    assert stacks.where_words(stuck) == "in hang (fault_hook.py:10), called from ddp (training.py:10)"


def test_faulthandler_dumps_parse_by_thread():
    import io
    import tempfile

    with tempfile.TemporaryFile("w+") as handle:
        faulthandler.dump_traceback(handle, all_threads=True)
        handle.seek(0)
        text = handle.read()
    frames = stacks.main_stack(text, threading.main_thread().ident)
    assert frames and frames[0].func == "test_faulthandler_dumps_parse_by_thread", text
    assert stacks.main_stack(text + text, threading.main_thread().ident) == frames  # the last dump counts
    assert stacks.main_stack(io.StringIO("no dump").read(), None) == []


def test_invoke_validate_waits_for_the_jobs_last_words(tmp_path):
    """At a time limit squeue forgets the job while the guard still writes its result: the result is read
    once the log has the guard's closing line."""
    from sitestack.core.host import local_host
    from sitestack.engine.validate import await_result

    log, result = tmp_path / "job.log", tmp_path / "result.json"
    log.write_text("sitestack validation: 2 ranks (1 x 2) via srun, master vm:20001, results in x\n")

    def guard() -> None:
        time.sleep(1.5)
        result.write_text('{"verdict": "failed"}\n')
        with log.open("a") as handle:
            handle.write("sitestack validation: FAILED, exit code 3; summary: x/summary.md\n")

    threading.Thread(target=guard, daemon=True).start()
    start = time.monotonic()
    assert await_result(local_host(), str(result), str(log), wait=20) == '{"verdict": "failed"}\n'
    assert 1.0 < time.monotonic() - start < 10
    log.write_text("nothing said\n")
    assert await_result(local_host(), str(tmp_path / "none.json"), str(log), wait=0.5) is None
