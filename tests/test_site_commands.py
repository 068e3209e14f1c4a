"""The sites' own user commands (tests/data/site_commands/<site>.yaml) run on the provisioned site twins.

One test per site runs every command the file serves (``where`` login, file, job, container, and the
``replacement`` of a command served by a sitestack task) in file order, each in the file's
``workdir`` inside the twin, and checks its ``expect`` (tests/data/site_commands/README.md). Later
commands use what earlier ones left on disk (``needs``), so a failure is recorded and the site's
remaining commands still run; the test then fails naming every failing id with its output. A command
whose ``needs`` failed is reported as not run. The counts per site (run, served by a sitestack task,
not served) are printed once at the end (``test_site_commands_summary``).
"""

from __future__ import annotations

import re
import shlex
import shutil
from typing import Any

import pytest

from tests.slurm import SBATCH_WAIT
from tests.test_site_commands_data import COUNTS, FILES, SITES, load, status
from tests.twins import sites
from tests.twins.provision import RunningTwin

PROBE = re.compile(r"^sitestack-probe: (?:env (?P<name>[A-Za-z_][A-Za-z0-9_]*)=(?P<value>.*)|(?P<key>\w+)=(?P<kv>.*))$",
                   re.M)
#: Per site, the ids the site's test ran (the summary reports them).
RAN: dict[str, list[str]] = {}
#: Per site, the ids not run because the twin left out the steps they need (``twin_tags``).
LEFT_OUT: dict[str, list[str]] = {}
JOB_TIMEOUT = 900


def entries(site: str) -> list[dict[str, Any]]:
    """The commands of ``site`` that are run: served ones, files the user writes, and replacements."""
    out = []
    for command in load(site)["commands"]:
        kind = status(command)
        if kind in ("served", "file"):
            out.append(command)
        elif kind == "served_by" and "replacement" in command:
            out.append({**command["replacement"], "id": command["id"], "verbatim": command["replacement"]["run"],
                        "substitutions": command["replacement"].get("substitutions", [])})
    return out


def text_of(entry: dict[str, Any]) -> str:
    """``verbatim`` with the substitutions applied in order and the documents' ``$ `` prompts removed."""
    text = str(entry["verbatim"])
    for sub in entry.get("substitutions", []):
        text = text.replace(sub["from"], sub["to"])
    return "\n".join(line[2:] if line.startswith("$ ") else line for line in text.splitlines()) + "\n"


def job_script(entry: dict[str, Any]) -> str:
    """The job script: the text, ``script_head`` after its leading ``#!``/``#SBATCH`` lines, ``script_tail``."""
    lines = text_of(entry).splitlines()
    cut = 0
    for index, line in enumerate(lines):
        if line.startswith(("#!", "#SBATCH")):
            cut = index + 1
        elif line.strip():
            break
    head = entry.get("script_head", "").splitlines()
    tail = entry.get("script_tail", "").splitlines()
    return "\n".join(lines[:cut] + head + lines[cut:] + tail) + "\n"


class SiteRun:
    """One site's commands on its twin: the expanded workdir (site path and host path) and the paths
    that tell where torch came from."""

    def __init__(self, running: RunningTwin, data: dict[str, Any]) -> None:
        self.running = running
        made = running.shell(f"mkdir -p {data['workdir']} && cd {data['workdir']} && pwd -P")
        assert made.returncode == 0, f"workdir {data['workdir']}: {made.stdout}{made.stderr}"
        self.workdir = made.stdout.strip().splitlines()[-1]
        self.host = running.twin.site_dir(self.workdir)
        facts = sites.playbook_facts(running.site)
        fill = {"account": running.twin.account, "home": running.twin.home, "site": running.site, "user": sites.USER}
        self.prefix = str(facts["prefix"]).format(**fill).rstrip("/") + "/"
        scratch = (facts.get("node") or {}).get("local_scratch")
        self.scratch = str(scratch).format(**fill).rstrip("/") + "/" if scratch else None
        self.texts: dict[str, dict[str, Any]] = {}
        self.renames = self.stack_renames(running.site, running.twin.account, str(running.twin.facts_file()))

    def renamed(self, text: str) -> str:
        """``text`` (a command, its prelude and check, a job script) with the twin's renames."""
        for old, new in self.renames.items():
            text = text.replace(old, new)
        return text

    def renamed_expect(self, expect: dict[str, Any]) -> dict[str, Any]:
        """``expect`` with the renames in its regexes (written with ``\\.`` for a dot) and values."""
        def pattern(text: str) -> str:
            for old, new in self.renames.items():
                text = text.replace(old.replace(".", "\\."), new.replace(".", "\\."))
            return text

        out = dict(expect)
        for key in ("stdout_regex", "stdout_absent_regex"):
            out[key] = [pattern(p) for p in expect.get(key, [])]
        out["env_inside"] = {k: self.renamed(v) for k, v in expect.get("env_inside", {}).items()}
        out["env_inside_regex"] = {k: pattern(v) for k, v in expect.get("env_inside_regex", {}).items()}
        return out

    @staticmethod
    def stack_renames(site: str, account: str, facts_file: str) -> dict[str, str]:
        """The stack module as the twin names it: the playbook's stack name with the site's torch
        (``pytorch/2.7.1-rocm6.2.4``) is, with the twin's CPU torch (a hardware key,
        tests/twins/sites.py), ``pytorch/2.13.0-cpu``; a command's, prelude's or check's mention of
        the one means the other. Nothing else in a command is renamed."""
        import os
        from unittest import mock

        from sitestack.actions import ACTIONS
        from sitestack.engine import playbook as pb
        from tests.contexts import offline_context

        def name(facts: str) -> str:
            with mock.patch.dict(os.environ, {"SITESTACK_FACTS": facts}):   # "": no site-local facts
                ctx = offline_context(pb.load(site), account=account)
            step = next(s for s in ctx.site.steps if s.action == "modulefiles")
            return str(ACTIONS["modulefiles"].from_spec(step, ctx).stack.name)

        old, new = name(""), name(facts_file)
        return {} if old == new else {old: new}

    def shell_file(self, name: str, body: str, timeout: float = JOB_TIMEOUT) -> tuple[int, str, str]:
        """``body`` written to ``name`` in the workdir and fed to bash on its stdin (so that a shell
        the body opens, ``salloc`` or ``singularity shell``, reads the lines after it)."""
        # srun forwards its stdin to task 0 and would swallow the lines after it; a user at a terminal
        # types nothing while srun runs, which is srun --input=none (SLURM_STDINMODE, srun(1))
        (self.host / name).write_text(f". {shlex.quote(self.running.modules_init)}\n"
                                      f"export SLURM_STDINMODE=none\n{self.renamed(body)}")
        done = self.running.shell(f"cd {shlex.quote(self.workdir)} && bash < {shlex.quote(name)}", cwd=self.workdir,
                                  timeout=timeout)
        return done.returncode, done.stdout, done.stderr

    def run(self, entry: dict[str, Any]) -> list[str]:
        """Run ``entry`` (and its variants); the problems found, each with the output."""
        for name in entry.get("files", []):
            shutil.copy(FILES / name, self.host / name)
        self.texts[entry["id"]] = entry
        where = entry["where"]
        if where == "file":
            (self.host / entry["path"]).write_text(self.renamed(text_of(entry)))
            return []
        if where == "job":
            problems = self.job(entry, entry.get("prelude", ""), entry["expect"])
            for variant in entry.get("variants", []):
                prelude = entry.get("prelude", "") + variant.get("prelude", "")
                problems += [f"variant {variant['name']}: {p}" for p in self.job(entry, prelude, variant["expect"])]
            return problems
        body = entry.get("prelude", "") + text_of(entry) + entry.get("check", "")
        if where == "container":
            opener = self.texts[entry["inside"]]
            body = opener.get("prelude", "") + text_of(opener) + text_of(entry) + entry.get("check", "")
        code, out, err = self.shell_file(f".sitestack-{entry['id']}.sh", body)
        return [f"{p}\n--- stdout\n{out}\n--- stderr\n{err}" for p in self.expect(entry["expect"], code, out)]

    def job(self, entry: dict[str, Any], prelude: str, expect: dict[str, Any]) -> list[str]:
        """Write the script, run the prelude and the submission (as ``sbatch --wait``, tests/slurm.py: the job's exit
        status), and check the newest output file matching ``expect.output``."""
        script = self.host / entry["script"]
        script.parent.mkdir(parents=True, exist_ok=True)
        script.write_text(self.renamed(job_script(entry)))
        for old in self.host.glob(expect["output"]):
            old.unlink()
        submit = entry.get("submit", f"sbatch {entry['script']}")
        waited = re.sub(r"^sbatch\b", "sitestack_sbatch_wait", submit.strip())
        assert waited != submit.strip(), f"{entry['id']}: the submission is not an sbatch line: {submit!r}"
        code, out, err = self.shell_file(f".sitestack-{entry['id']}-submit.sh", f"{prelude}{SBATCH_WAIT}{waited}\n")
        found = sorted(self.host.glob(expect["output"]), key=lambda p: p.stat().st_mtime)
        if not found:
            return [f"no output file {expect['output']} (sbatch exit {code})\n--- stdout\n{out}\n--- stderr\n{err}"]
        text = found[-1].read_text(errors="replace")
        return [f"{p}\n--- {found[-1].name}\n{text}\n--- sbatch\n{out}{err}" for p in self.expect(expect, code, text)]

    def expect(self, expect: dict[str, Any], code: int, out: str) -> list[str]:
        """What of ``expect`` the exit status ``code`` and output ``out`` do not meet (its patterns and
        values with the twin's renames)."""
        expect = self.renamed_expect(expect)
        problems = [] if code == expect["exit"] else [f"exit {code}, expected {expect['exit']}"]
        problems += [f"no match for {p!r}" for p in expect.get("stdout_regex", []) if not re.search(p, out)]
        problems += [f"unexpected match for {p!r}" for p in expect.get("stdout_absent_regex", []) if re.search(p, out)]
        probes: dict[str, list[str]] = {}
        for match in PROBE.finditer(out):
            key = f"env {match['name']}" if match["name"] else match["key"]
            probes.setdefault(key, []).append(match["value"] if match["name"] else match["kv"])
        if "torch_from" in expect:
            problems += self.torch_from(expect["torch_from"], probes.get("torch_file", []))
        if "world_size" in expect:
            sizes = probes.get("world_size", [])
            if not sizes or any(s != str(expect["world_size"]) for s in sizes):
                problems.append(f"world_size lines {sizes}, expected all {expect['world_size']}")
        for name, value in expect.get("env_inside", {}).items():
            seen = probes.get(f"env {name}", [])
            if not seen or any(v != value for v in seen):
                problems.append(f"env {name}: {seen}, expected all {value!r}")
        for name, pattern in expect.get("env_inside_regex", {}).items():
            seen = probes.get(f"env {name}", [])
            if not seen or not all(re.search(pattern, v) for v in seen):
                problems.append(f"env {name}: {seen}, expected all to match {pattern!r}")
        return problems

    def torch_from(self, origin: str, files: list[str]) -> list[str]:
        """Each rank's torch.__file__ from ``origin``: the image (neither under the prefix nor the
        node-local copy), the node-local copy (``staged``), or the stack env under the prefix."""
        def under(path: str, root: str | None) -> bool:
            return root is not None and path.startswith(root)

        ok = {"image": lambda f: not under(f, self.prefix) and not under(f, self.scratch),
              "staged": lambda f: under(f, self.scratch),
              "env": lambda f: under(f, self.prefix)}[origin]
        if files and all(ok(f) for f in files):
            return []
        return [f"torch_from {origin}: torch_file lines {files} (prefix {self.prefix}, node-local {self.scratch})"]


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("site", SITES)
def test_site_commands(site: str, site_twins: Any) -> None:
    """Every command the site's file serves runs on the site's twin as its ``expect`` says."""
    running = site_twins(site)
    data = load(site)
    runner = SiteRun(running, data)
    failed: dict[str, list[str]] = {}
    ran, left_out = RAN.setdefault(site, []), LEFT_OUT.setdefault(site, [])
    for entry in entries(site):
        if set(entry.get("twin_tags", [])) & set(running.skipped_tags):
            left_out.append(entry["id"])   # its steps were not applied on this twin (TWIN_SKIP_TAGS)
            continue
        blocked = [n for n in entry.get("needs", []) if n in failed]
        if blocked:
            failed[entry["id"]] = [f"not run: needs {blocked}, which failed"]
            continue
        ran.append(entry["id"])
        problems = runner.run(entry)
        if problems:
            failed[entry["id"]] = problems
    report = "\n\n".join(f"== {site}:{cid}\n" + "\n".join(problems) for cid, problems in failed.items())
    assert not failed, f"{len(failed)} of {len(entries(site))} commands failed on the {site} twin:\n{report}"


#: The guide's batch script with `module load pytorch` (the default stack, rocm7) in place of its modules and conda
#: env: the lines after the entry's own substitutions, and what takes their place.
DEFAULT_MODULE = [
    ("module load PrgEnv-gnu/8.5.0\nmodule load rocm/5.7.1\nmodule load craype-accel-amd-gfx90a\n"
     "module load miniforge3/23.11.0-0\n", "module use /lustre/orion/abc123/world-shared/sitestack/modules\n"
                                           "module load pytorch\n"),
    ("source activate /lustre/orion/abc123/world-shared/sitestack/pytorch/2.2.2-rocm5.7\n", ""),
]


@pytest.mark.integration
@pytest.mark.slow
def test_frontier_default_module_runs_the_guides_program(site_twins: Any) -> None:
    """OLCF's `multinode_olcf.py` (`from mpi4py import MPI`) runs as written, by the guide's batch script
    and srun line, with `module load pytorch`, the rocm7 stack, in place of the guide's modules and conda
    env: torch from the rocm7 env, mpi4py built for it."""
    running = site_twins("frontier")
    data = load("frontier")
    entry = dict(next(e for e in entries("frontier") if e["id"] == "ddp-batch-script"))
    guide = text_of(entry)
    assert all(old in guide for old, _ in DEFAULT_MODULE), "the guide's script changed: update DEFAULT_MODULE"
    entry["substitutions"] = [*entry["substitutions"], *({"from": a, "to": b} for a, b in DEFAULT_MODULE)]
    entry["variants"] = []
    rocm7 = r"torch_file=/lustre/orion/abc123/world-shared/sitestack/pytorch/\.2\.10\.0-rocm7\.1\.gen-"
    entry["expect"] = {**entry["expect"], "stdout_regex": [*entry["expect"]["stdout_regex"], rocm7]}
    runner = SiteRun(running, data)
    problems = runner.run(entry)
    script = (runner.host / entry["script"]).read_text()
    assert "module load pytorch\n" in script and "source activate" not in script, script
    assert not problems, "\n".join(problems)


def test_site_commands_summary(capsys: pytest.CaptureFixture[str]) -> None:
    """Per site: how many commands run on the twin, are served by a sitestack task, are not served;
    for every site whose twin ran here, every runnable command was run."""
    lines = []
    for site in SITES:
        commands = load(site)["commands"]
        kinds = [status(c) for c in commands]
        run = len(entries(site))
        by_task = sum(1 for c, k in zip(commands, kinds) if k == "served_by" and "replacement" not in c)
        not_served = kinds.count("not_served")
        assert run + by_task + not_served == len(commands), site
        done = (f" ({len(RAN[site])} run this session, {len(LEFT_OUT[site])} left out with the twin's skipped tags:"
                f" {', '.join(LEFT_OUT[site]) or 'none'})" if site in RAN else "")
        lines.append(f"{site}: {run} run, {by_task} served by tasks, {not_served} not served{done}")
        replaced = sum(1 for c, k in zip(commands, kinds) if k == "served_by" and "replacement" in c)
        served, served_by, _, files = COUNTS[site]
        assert (run - replaced, by_task + replaced) == (served + files, served_by), site
        if site in RAN:
            assert len(RAN[site]) <= run, site
    with capsys.disabled():
        print("\n" + "\n".join(lines))


def test_job_scripts_keep_their_directives_first() -> None:
    """Every job's script starts with its ``#!`` line and has all ``#SBATCH`` lines before the first
    command (sbatch ignores directives after it), the head and tail included (no twin needed)."""
    for site in SITES:
        for entry in entries(site):
            if entry["where"] != "job":
                continue
            lines = [line for line in job_script(entry).splitlines() if line.strip()]
            assert lines[0].startswith("#!"), f"{site}:{entry['id']}"
            first = next(i for i, line in enumerate(lines) if not line.startswith("#"))
            assert not [line for line in lines[first:] if line.startswith("#SBATCH")], f"{site}:{entry['id']}"
            assert job_script(entry).endswith(entry.get("script_tail", "\n")), f"{site}:{entry['id']}"
