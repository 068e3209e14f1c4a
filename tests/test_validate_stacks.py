"""Per-stack validation jobs: ``install-validation-job`` with ``stack:``, ``invoke validate --stack NAME``
and ``--all-stacks`` (sitestack/engine/stack_validation.py), on the real playbooks, without a host.

The jobs running for real on the Frontier twin: tests/test_twins.py
(``test_frontier_validates_the_rocm7_stack_with_its_own_job``).
"""

from __future__ import annotations

import dataclasses
import io
import json

import pytest

from sitestack.actions import ACTIONS
from sitestack.core.errors import InputError, SitestackError
from sitestack.core.report import Reporter
from sitestack.engine import playbook as pb
from sitestack.engine import stack_validation
from sitestack.engine.validate import Outcome, install_dir
from sitestack.model.options import ValidateOptions
from sitestack.model.site import Site
from tests.contexts import offline_context

PREFIX = "/lustre/orion/abc123/world-shared/sitestack"


def frontier() -> Site:
    return pb.load("frontier")


def without_step(site: Site, name: str) -> Site:
    return dataclasses.replace(site, steps=[s for s in site.steps if s.name != name])


# -- the options ------------------------------------------------------------------------------------

@pytest.mark.parametrize("given, option, words", [
    ({"stack": "rocm7", "all_stacks": True}, "--all-stacks", "drop --stack"),
    ({"all_stacks": True, "collect": "123"}, "--all-stacks", "--collect reads one job"),
    ({"all_stacks": True, "calibrate": True}, "--all-stacks", "use --calibrate with --stack"),
    ({"stack": "../rocm7"}, "--stack", "is not a stack's name"),
    ({"stack": ""}, "--stack", "is not a stack's name"),
])
def test_contradicting_or_bad_stack_options_are_refused_naming_the_option(given, option, words):
    with pytest.raises(InputError) as caught:
        ValidateOptions(**given)
    assert str(caught.value).startswith(option) and words in str(caught.value), str(caught.value)


def test_one_stack_or_all_stacks_alone_are_accepted():
    assert ValidateOptions(stack="rocm7").stack == "rocm7"
    assert ValidateOptions(all_stacks=True, wait=False).all_stacks


def test_a_stack_the_playbook_lacks_or_that_has_no_job_is_one_error_naming_stack_and_playbook():
    site = frontier()
    with pytest.raises(InputError) as caught:
        stack_validation.stack_site(site, "rocm9")
    assert "'rocm9' is not one of the stacks of" in str(caught.value) and "frontier.yml (rocm7)" in str(caught.value)
    with pytest.raises(InputError) as caught:
        stack_validation.stack_site(without_step(site, "rocm7-validation-job"), "rocm7")
    message = str(caught.value)
    assert message.startswith("--stack") and "stack rocm7 has no validation job" in message
    assert "frontier.yml has no install-validation-job step with `stack: rocm7`" in message


# -- where each stack's job is, and what it is rendered with ------------------------------------------

def test_each_stack_has_its_own_job_directory():
    site = frontier()
    values = site.resolve(home="/home/u", user="u", account="abc123", prefix=None).values
    assert install_dir(site, values) == f"{PREFIX}/validation"
    assert install_dir(stack_validation.stack_site(site, "rocm7"), values) == f"{PREFIX}/validation-rocm7"


def test_the_rocm7_job_is_rendered_with_the_rocm7_stacks_facts():
    """Its module, its env's Python and its site modules (rocm/7.1.1, rccl-net-plugin), not the guide stack's."""
    site = frontier()
    ctx = offline_context(site, account="abc123")
    (spec,) = [s for s in site.steps if s.action == "install-validation-job" and s.stack == "rocm7"]
    step = ACTIONS[spec.action].from_spec(spec, ctx.for_step(spec))
    assert step.args.dir == f"{PREFIX}/validation-rocm7"
    files = step.files()
    script = files["jobs/validate-srun.sbatch"][0]
    assert "module load pytorch/2.10.0-rocm7.1 " in script and "module load rocm/7.1.1 " in script
    assert "rocm/5.7.1" not in script and "pytorch/2.2.2-rocm5.7" not in script
    config = json.loads(files["check-config.json"][0])
    assert config["stack"]["module"] == "pytorch/2.10.0-rocm7.1" and config["torch_version"] == "2.10.0"
    assert config["stack"]["includes"] == ["mpi4py"]   # its own mpi4py; no Horovod (OLCF documents none for ROCm 7)
    own = ACTIONS[spec.action].from_spec(next(s for s in site.steps if s.name == "validation-job"), ctx)
    assert own.args.dir == f"{PREFIX}/validation"
    assert "module load pytorch/2.2.2-rocm5.7 " in own.files()["jobs/validate-srun.sbatch"][0]


def test_the_rocm7_stack_builds_its_own_mpi4py_for_its_env():
    """Beside the guide stack's install, with the rocm7 env's interpreter, and in the rocm7 env and module."""
    site = frontier()
    ctx = offline_context(site, account="abc123")
    (spec,) = [s for s in site.steps if s.name == "rocm7-mpi4py"]
    step = ACTIONS[spec.action].from_spec(spec, ctx.for_step(spec))
    assert step.target.dest == f"{PREFIX}/mpi4py/4.1.2-rocm7.1"
    assert step.env_python == f"{PREFIX}/pytorch/2.10.0-rocm7.1/bin/python"
    assert not [s for s in site.steps if s.stack == "rocm7" and s.args.get("recipe") == "horovod"]


# -- --all-stacks -----------------------------------------------------------------------------------

def test_all_stacks_runs_every_stacks_job_in_turn_and_fails_when_one_failed():
    """The playbook's own stack first, then each of stacks:; a stack whose run fails with an error does
    not stop the next; one verdict line per stack; exit 1."""
    ran: list[tuple[str | None, str | None]] = []

    def run_one(site: Site, options: ValidateOptions, reporter: Reporter) -> Outcome:
        ran.append((site.stack, options.stack))
        assert not options.all_stacks
        if site.stack is None:
            raise SitestackError("job 7 left no result\nlog tail")
        if site.stack == "rocm7":
            return Outcome(0, job_id="8", result={"verdict": "passed", "stack": {"module": "pytorch/2.10.0-rocm7.1"}})
        return Outcome(1, job_id="9", result={"verdict": "passed", "stack": {"module": "pytorch/2.2.2-rocm5.7"}})

    stream = io.StringIO()
    code, stacks = stack_validation.validate_all(frontier(), ValidateOptions(all_stacks=True), Reporter(stream), run_one)
    assert ran == [(None, None), ("rocm7", "rocm7")]
    assert code == 1
    text = stream.getvalue()
    assert "stacks: 1 of 2 passed" in text
    assert "  (own): FAILED: job 7 left no result\n" in text
    assert "  rocm7 (pytorch/2.10.0-rocm7.1): PASSED, job 8\n" in text
    assert stacks["rocm7"]["exit_code"] == 0 and stacks["(own)"]["error"] == "job 7 left no result"


def test_all_stacks_names_a_stack_whose_passing_job_failed_the_run():
    """A job that passed but whose run exits 1 (a regression FAIL against its stack's history) is FAILED."""
    def run_one(site: Site, options: ValidateOptions, reporter: Reporter) -> Outcome:
        if site.stack == "rocm7":
            return Outcome(1, job_id="9", result={"verdict": "passed", "stack": {"module": "pytorch/2.10.0-rocm7.1"}})
        return Outcome(0, job_id="8", result={"verdict": "passed", "stack": {"module": "pytorch/2.2.2-rocm5.7"}})

    stream = io.StringIO()
    code, _ = stack_validation.validate_all(frontier(), ValidateOptions(all_stacks=True), Reporter(stream), run_one)
    assert code == 1
    assert "  (own) (pytorch/2.2.2-rocm5.7): PASSED, job 8\n" in stream.getvalue()
    assert "  rocm7 (pytorch/2.10.0-rocm7.1): FAILED (the job's verdict: passed), job 9\n" in stream.getvalue()


def test_all_stacks_refuses_before_running_anything_when_a_stack_has_no_job():
    def run_one(site: Site, options: ValidateOptions, reporter: Reporter) -> Outcome:
        raise AssertionError("nothing runs")

    site = without_step(frontier(), "rocm7-validation-job")
    with pytest.raises(InputError) as caught:
        stack_validation.validate_all(site, ValidateOptions(all_stacks=True), Reporter(io.StringIO()), run_one)
    assert "no install-validation-job step for stack rocm7" in str(caught.value)


def test_validate_with_an_unknown_stack_is_one_message_and_exit_1(cli):
    out = cli("validate", "--site", "frontier", "--account", "abc123", "--stack", "rocm9")
    assert out.returncode == 1 and "Traceback" not in out.stderr + out.stdout
    assert "--stack: 'rocm9' is not one of the stacks of" in out.stderr + out.stdout


def test_provision_validates_a_further_stack_by_its_own_job_before_promoting_it():
    """The promotion after a provision (engine/promotion.py) finds the rocm7 stack's job by its module name,
    and leaves a stack without a job hidden."""
    from sitestack.engine import promotion

    site = frontier()
    ctx = offline_context(site, account="abc123")
    assert promotion.validatable(site, ctx, "pytorch/2.10.0-rocm7.1")
    assert promotion.validatable(site, ctx, "pytorch/2.2.2-rocm5.7")
    bare = without_step(site, "rocm7-validation-job")
    assert not promotion.validatable(bare, offline_context(bare, account="abc123"), "pytorch/2.10.0-rocm7.1")
