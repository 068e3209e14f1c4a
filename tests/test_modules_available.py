"""The preflight ``modules-available`` step checks the site modules of every stack of a playbook with real
Lmod: the facts' ``modules.load`` of each stack and the ``requires`` of its modulefiles step, each list loaded
in order in its own shell. Frontier's playbook, its modules stubbed in a directory the site-local facts add
with ``module use``: a module only the rocm7 stack needs that is missing is named with that stack."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sitestack.actions import ACTIONS
from sitestack.actions.modules_available import ModulesAvailable
from sitestack.core.errors import SitestackError
from sitestack.core.host import LocalHost
from sitestack.engine import playbook as pb
from sitestack.model.context import RunContext, RunOptions
from tests.conftest import LMOD_INIT

pytestmark = pytest.mark.integration

if not Path(LMOD_INIT, "bash").exists():  # pragma: no cover - the test script installs lmod
    pytest.skip("Lmod is not installed (Debian package lmod)", allow_module_level=True)


def frontier_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, missing: set[str]) -> ModulesAvailable:
    """Frontier's site-modules step, with every module its stacks name stubbed but ``missing``."""
    stubs = tmp_path / "site-modules"
    facts = tmp_path / "local-facts.yml"
    facts.write_text(yaml.safe_dump({"facts": {"modules": {"init": f"{LMOD_INIT}/bash", "use": [str(stubs)]}}}))
    monkeypatch.setenv("SITESTACK_FACTS", str(facts))
    site = pb.load("frontier")
    ctx = RunContext.resolve(site, home="/home/u", user="u", account="proj", prefix=str(tmp_path / "prefix"),
                             options=RunOptions(), actions=ACTIONS)
    names = {*ctx.facts.modules.load, *ctx.for_stack("rocm7").facts.modules.load, "rccl-net-plugin"}
    for name in names - missing:
        stub = stubs / f"{name}.lua"
        stub.parent.mkdir(parents=True, exist_ok=True)
        stub.write_text("")
    spec = next(s for s in site.steps if s.action == "modules-available")
    step = ModulesAvailable.from_spec(spec, ctx)
    assert isinstance(step, ModulesAvailable)
    return step


def test_a_missing_module_of_a_further_stack_is_named_with_that_stack(tmp_path: Path, monkeypatch):
    step = frontier_step(tmp_path, monkeypatch, {"rocm/7.1.1", "rccl-net-plugin"})
    assert "rocm/7.1.1" in step.describe() and "rccl-net-plugin" in step.describe()
    with pytest.raises(SitestackError) as err:
        step.pending(LocalHost())
    rocm7 = "stack rocm7 (pytorch/2.10.0-rocm7.1)"
    assert str(err.value) == (
        f"site modules do not load: rocm/7.1.1 (needed by {rocm7}: stacks.rocm7 facts.modules.load, {rocm7}: step "
        f"'rocm7-modulefiles' requires); rccl-net-plugin (needed by {rocm7}: stacks.rocm7 facts.modules.load, "
        f"{rocm7}: step 'rocm7-modulefiles' requires)")

