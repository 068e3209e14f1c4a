"""An install prefix with shell syntax in it, through the shell text sitestack ships.

The prefix reaches the users' launch helpers (``sitestack-launch``, ``sitestack-launch-env``,
``sitestack-stage-env``), the job template and the activate scripts. Every value of it goes through
the one quoting filter (``|q``, :func:`sitestack.core.quoting.sh`; ``csh_quote`` for csh), so nothing in
it runs, under bash, dash, zsh, bash as ``sh``, csh and tcsh: the marker files an injected command would
make never appear, every script still parses, and messages show the path as it is. A test also reads
every template, so that a value added later without the filter is noticed.
"""

from __future__ import annotations

import io
import re
import shutil
import subprocess
import venv as venv_mod
from pathlib import Path

import pytest

from sitestack.actions import ACTIONS
from sitestack.actions.launch_env import launch_inputs
from sitestack.actions.venv_hook import hook_config
from sitestack.engine import playbook as pb
from sitestack.installs.venv_stack import stack_for
from sitestack.model.context import RunContext, RunOptions
from sitestack.onsite import activate_hook as hook
from sitestack.onsite.activate.stack_settings import pick_packages
from sitestack.validation import jobs
from sitestack.validation.launch_helpers import render_job_template
from tests.test_launch_env import render

#: A directory name with a command substitution, backticks, a double quote, a single quote and a history
#: reference: each would run a command or break the script where it reached the text unquoted.
HOSTILE_DIR = "p$(touch MARK)`touch MARK2`\"q'!"
MARKS = ("MARK", "MARK2")
SHELLS = [s for s in ("bash", "dash", "zsh") if shutil.which(s)] + ["sh=bash"]
CSHS = [s for s in ("csh", "tcsh") if shutil.which(s)]


def argv(shell: str, tmp_path: Path) -> list[str]:
    """The shell's argv prefix; "sh=bash" is a link named sh to bash (bash's POSIX mode, /bin/sh on RHEL)."""
    if shell != "sh=bash":
        return [shell]
    link = tmp_path / "shbin" / "sh"
    if not link.exists():
        link.parent.mkdir()
        link.symlink_to(shutil.which("bash") or "/bin/bash")
    return [str(link)]


def no_marks(cwd: Path) -> None:
    for mark in MARKS:
        assert not (cwd / mark).exists(), f"injected command ran ({mark})"


@pytest.fixture
def hostile(tmp_path: Path) -> tuple[Path, Path]:
    """(the prefix, an empty working directory where an injected ``touch`` would leave its marker)."""
    prefix = tmp_path / HOSTILE_DIR
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    return prefix, cwd


@pytest.mark.parametrize("shell", SHELLS)
def test_sitestack_launch_without_arguments_shows_the_path_and_runs_nothing(shell: str, hostile, tmp_path: Path):
    prefix, cwd = hostile
    for site in ("local", "frontier"):
        launch = render(site, prefix / site).parent / "sitestack-launch"
        out = subprocess.run([*argv(shell, tmp_path), str(launch)], capture_output=True, text=True, cwd=cwd,
                             timeout=20, env={"PATH": "/usr/bin:/bin"})
        no_marks(cwd)
        helper = launch.parent / "sitestack-launch-env"
        assert (out.returncode, out.stdout) == (2, ""), out
        assert out.stderr == f"usage: sitestack-launch COMMAND [ARG...]  (runs COMMAND with {helper} sourced)\n", out
        # and with a command: the helper is found by its path and sourced
        ran = subprocess.run([*argv(shell, tmp_path), str(launch), "sh", "-c", 'printf %s "$MASTER_PORT"'],
                             capture_output=True, text=True, cwd=cwd, timeout=20,
                             env={"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "42", "USER": "sitestack-hostile-sh"})
        no_marks(cwd)
        assert (ran.returncode, ran.stdout) == (0, str(20000 + 42 % 10000)), ran
    shutil.rmtree("/tmp/sitestack-hostile-sh-miopen-42", ignore_errors=True)


def test_every_script_with_the_prefix_parses(hostile):
    """The helpers of every site (the stage helper too) and the job template parse in the shells that run them."""
    prefix, cwd = hostile
    for site in ("local", "frontier", "dawn", "lumi", "cirrus"):
        ctx = RunContext.resolve(pb.load(site), home="/home/u", user="u", account="proj", prefix=str(prefix / site),
                                 options=RunOptions(), actions=ACTIONS)
        bindir = render(site, prefix / site).parent
        for launcher in ("srun", "torchrun"):
            template = bindir / f"job-template-{launcher}.sbatch"
            template.write_text(render_job_template(launch_inputs(ctx, str(bindir)), launcher))
        # the Python programs beside them (tests/test_hostlist.py, tests/test_torchrun_placement.py) aside
        scripts = sorted(p for p in bindir.iterdir() if p.name not in ("sitestack-hostlist", "sitestack-bind-rank"))
        for script in scripts:
            for shell in [s for s in ("bash", "dash", "zsh") if shutil.which(s)]:
                out = subprocess.run([shell, "-n", str(script)], capture_output=True, text=True, cwd=cwd, timeout=20)
                assert (out.returncode, out.stderr) == (0, ""), (site, script.name, shell, out.stderr)
        out = subprocess.run(["bash", "-n", str(template)], capture_output=True, text=True, cwd=cwd, timeout=20)
        assert (out.returncode, out.stderr) == (0, ""), (site, out.stderr)
    no_marks(cwd)


#: Template expressions that need no quoting filter: numbers, names sitestack defines, values quoted before
#: they reach the template (sh_expanding, sh_default), and shell text sitestack itself writes. Anything else
#: must be ``| q``, or be added here with the reason it is safe.
UNQUOTED = {
    # numbers and fixed words
    "max_id", "max_count", "port_base", "port_span", "load_failed", "out_refused", "result_space_mib", "stacks",
    "cards", "node_cores", "ranks_per_node", "cores_per_rank", "per_node", "time_limit", "job_seconds",
    "guard_grace", "launcher", "launch_name", "unit", "hierarchy", "1 if stacks else 0", "cards * stacks",
    "'{'", "loop.first", "'if' if loop.first else 'elif'", "'tune' if tune else 'validation'", "job.script", "script", "masks",
    # names: checked (SHELL_NAME, checked_name) or sitestack's own
    "key", "var", "generation_var", "own.generation_var", "p.generation_var", "generation_vars | join(', ')", "container.bind_var", "name", "container.runtime", "container.options_array",
    # quoted in Python before the template sees them (sh_expanding, sh_default)
    "value", "miopen", "scratch", "container.binds", "launcher_options", "bind_args",
    # the runtime's options: binds sh_expanding, modules sh, env words of checked names (validation/container_forms.py)
    "container.options", "container.modules",
    # shell text sitestack writes itself
    "checks", "results_check", "prelude", "per_node_command", "probe_command", "srun_mpi", "bind", "exec_prefix",
    "guard_python", "controller", "line",
    # prose in comments and the README (one line: values with control characters are refused when loaded)
    "site", "description", "scratch_text", "conda_unpack", "venv_unpack", "net_plugin", "mpi_flavour", "library",
    "library_match", "python", "affinity_text", "bandwidth_text", "plugin_text", "compute_text",
    "nccl_log_args", "ranks_per_node_text", "'      # the default' if loop.first else ''", "', ' if not loop.last",
    "' ' if not loop.last", "backend",
    "container.image",
}


def test_every_template_value_is_quoted_or_known_safe():
    found: set[str] = set()
    for template in sorted(jobs.TEMPLATES.glob("*.j2")):
        for expression in re.findall(r"\{\{(.*?)\}\}", template.read_text()):
            expression = expression.strip().replace('"', "'")
            if re.search(r"\|\s*q$", expression):
                continue
            found.add(expression)
            assert expression in UNQUOTED, f"{template.name}: {{{{ {expression} }}}} is not quoted (| q)"
    assert "path" not in found and "launch" not in found and "pack" not in found and "dir" not in found


# -- csh and tcsh -----------------------------------------------------------------------------------------------

@pytest.mark.skipif(not CSHS, reason="no csh or tcsh")
@pytest.mark.parametrize("shell", CSHS)
def test_csh_reads_the_stack_path_as_it_is(shell: str, hostile):
    """The stack's site-packages as csh's activate sets it: single quotes, ' and ! escaped (interactive too)."""
    prefix, cwd = hostile
    packages = f"{prefix}/stack/lib/python3.11/site-packages"
    config = {"site_packages": packages, "stack": f"{prefix}/stack", "generation_var": "__SITESTACK_GEN"}
    pick = pick_packages(config, "csh")["pick"]
    script = cwd.parent / "pick.csh"
    script.write_text(pick + 'printf "%s\\n" $_sitestack_p:q\n')
    for flags in (["-f"], ["-f", "-i"]):
        out = subprocess.run([shell, *flags], input=f"source {script}\n", capture_output=True, text=True, cwd=cwd,
                             timeout=20, env={"PATH": "/usr/bin:/bin", "HOME": str(cwd)})
        no_marks(cwd)
        # interactive, the line follows the prompt ("# " or "> ")
        assert any(line in (packages, f"# {packages}", f"> {packages}") for line in out.stdout.splitlines()), out
        assert "Event not found" not in out.stderr, out


@pytest.mark.skipif(not CSHS, reason="no csh or tcsh")
@pytest.mark.parametrize("shell", CSHS)
def test_csh_sources_the_activate_of_a_hostile_prefix_and_runs_nothing(shell: str, hostile, tmp_path: Path):
    """extend-venv-activate with the prefix: csh's activate (extended, or left as venv wrote it where csh
    cannot say a value) is sourced and deactivated without running anything."""
    from tests.contexts import offline_context

    prefix, cwd = hostile
    ctx = offline_context(pb.load("local"), home=str(tmp_path), user="alice", prefix=str(prefix))
    config = hook_config(ctx, stack_for(ctx))
    user_venv = tmp_path / "myenv"
    venv_mod.create(user_venv, with_pip=False)
    report = io.StringIO()
    hook.extend(str(user_venv), config, out=report)
    script = f'source {user_venv}/bin/activate.csh\necho "active=$VIRTUAL_ENV"\ndeactivate\necho done\n'
    out = subprocess.run([shell, "-f"], input=script, capture_output=True, text=True, cwd=cwd, timeout=30,
                         env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    no_marks(cwd)
    assert "done" in out.stdout, out
