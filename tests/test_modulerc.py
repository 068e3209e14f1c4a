"""A module directory's rc files and a deprecated module file, without a host: golden text for an
old stack (pytorch/2.2.2-rocm5.7, hidden and deprecated, with a newer default beside it) in Lua
and Tcl, and the rules of merging every stack's entry (sitestack/installs/modulerc.py). The module
file is a plain spec's, not a site's stack's, so only the deprecation shapes it.
Regenerate the goldens with ``SITESTACK_UPDATE_GOLDEN=1 python -m pytest tests/test_modulerc.py``."""

from __future__ import annotations

import dataclasses
import difflib
import os
from pathlib import Path

import pytest

from sitestack.actions import ACTIONS
from sitestack.core.errors import InputError
from sitestack.installs import modulefile_render as mf
from sitestack.installs import modulerc
from sitestack.installs.modulefile_text import literal
from sitestack.installs.modulerc import Mark, State
from sitestack.model.site import StepSpec
from tests.test_modulefile_golden import built_for, context, step_of

GOLDEN = Path(__file__).parent / "golden" / "modulerc"
UPDATE = os.environ.get("SITESTACK_UPDATE_GOLDEN") == "1"
OLD, NEW = "pytorch/2.2.2-rocm5.7", "pytorch/2.10.0-rocm7.1"
NOTICE = f"{OLD} is deprecated and will be removed after 2027-03-31; use {NEW}"


def old_stack_files(fmt: str) -> dict[str, str]:
    """OLD's module file, deprecated, and the rc files with it hidden and NEW the default."""
    spec = mf.ModuleSpec(name="pytorch", version="2.2.2-rocm5.7", template="base", site="test",
                         summary="an old stack", whatis=(("Name", "pytorch"),), help="help text", family="pytorch",
                         paths=(mf.PathOp("prepend", "PATH", literal("/opt/pytorch/2.2.2-rocm5.7/bin")),),
                         deprecated=NOTICE)
    return {**mf.render_all([spec], fmt),
            **modulerc.rc_files({OLD: Mark(fmt, hidden=True), NEW: Mark(fmt, default=True)})}


@pytest.mark.parametrize("fmt", ["lua", "tcl"])
def test_golden(fmt: str):
    files, root = old_stack_files(fmt), GOLDEN / fmt
    if UPDATE:
        for rel, text in files.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
    on_disk = {str(p.relative_to(root)): p.read_text() for p in root.rglob("*") if p.is_file()}
    assert sorted(files) == sorted(on_disk)
    for rel, text in files.items():
        if text != on_disk[rel]:
            diff = "".join(difflib.unified_diff(on_disk[rel].splitlines(True), text.splitlines(True), rel, "rendered"))
            pytest.fail(f"{rel} differs from its golden file (SITESTACK_UPDATE_GOLDEN=1 to accept):\n{diff}")


def test_what_each_format_writes():
    lua = old_stack_files("lua")
    assert lua["pytorch/.modulerc.lua"].splitlines()[-2:] == [f'module_version("{NEW}", "default")',
                                                              f'hide_version("{OLD}")']
    assert f'LmodMessage("{NOTICE}")' in lua[f"{OLD}.lua"] and 'add_property("state", "obsolete")' in lua[f"{OLD}.lua"]
    tcl = old_stack_files("tcl")
    assert 'set ModulesVersion "2.10.0-rocm7.1"' in tcl["pytorch/.version"]
    assert f'module-version "{NEW}" default' in tcl["pytorch/.modulerc"]
    assert f'module-hide "{OLD}"' in tcl["pytorch/.modulerc"] and f'hide-version "{OLD}"' in tcl["pytorch/.modulerc"]
    assert f'puts stderr "{NOTICE}"' in tcl[OLD]


def test_no_marks_no_rc_files_and_a_default_alone_needs_no_tcl_modulerc():
    assert modulerc.rc_files({}) == {}
    assert sorted(modulerc.rc_files({NEW: Mark("tcl", default=True)})) == ["pytorch/.version"]
    assert sorted(modulerc.rc_files({OLD: Mark("tcl", hidden=True)})) == ["pytorch/.modulerc"]


def test_merging_keeps_the_others_and_the_default_moves_only_by_promotion():
    state = State({OLD: Mark("lua", default=True), "pytorch/gone": Mark("lua", hidden=True)})
    present = {modulerc.module_file("/m", OLD, "lua")}.__contains__
    stacks, notes = modulerc.merged(state, NEW, Mark("lua", default=True), present, "/m")
    # OLD keeps the default; NEW awaits it, hidden; gone's file is gone
    assert stacks == {OLD: Mark("lua", default=True), NEW: Mark("lua", hidden=True, awaiting=True)}
    assert notes == [f"{NEW} awaits validation: {OLD} stays the default until it passes (`invoke promote`)"]
    stacks, notes = modulerc.merged(state, NEW, Mark("lua", hidden=True), present, "/m")
    assert stacks == {OLD: Mark("lua", default=True), NEW: Mark("lua", hidden=True)} and notes == []
    stacks, _ = modulerc.merged(state, OLD, None, present, "/m")
    assert stacks == {}
    # the holder's step drops its claim while NEW awaits: it stays the default until NEW is promoted
    waiting = State({OLD: Mark("lua", default=True), NEW: Mark("lua", hidden=True, awaiting=True)})
    both = {modulerc.module_file("/m", n, "lua") for n in (OLD, NEW)}.__contains__
    stacks, notes = modulerc.merged(waiting, OLD, None, both, "/m")
    assert stacks[OLD] == Mark("lua", default=True) and notes == [f"{OLD} stays the default until {NEW} is promoted"]
    assert modulerc.awaiting(waiting) == [NEW]
    assert modulerc.read_state(waiting.text()) == waiting
    # promotion: NEW the default, listed; OLD's entry goes (it was neither hidden nor deprecated)
    assert modulerc.promoted(waiting, NEW) == {NEW: Mark("lua", default=True)}
    rc = modulerc.rc_files(modulerc.promoted(waiting, NEW))["pytorch/.modulerc.lua"]
    assert f'module_version("{NEW}", "default")' in rc and "hide_version" not in rc
    # with no default to protect, the first claim takes it at once
    stacks, notes = modulerc.merged(State({}), NEW, Mark("lua", default=True), present, "/m")
    assert stacks == {NEW: Mark("lua", default=True)} and notes == []


def test_a_broken_record_reads_as_empty():
    for text in (None, "", "{", '{"stacks": {"a/b": {"format": "lua"}}}', '{"stacks": []}',
                 '{"stacks": {"a/b": {"format": "csh", "default": true, "hidden": false}}}'):
        assert modulerc.read_state(text).stacks == {}, text
    state = State({NEW: Mark("tcl", default=True)}, ("pytorch/.version",))
    assert modulerc.read_state(state.text()) == state


def test_a_message_that_would_break_the_file_is_refused_when_rendered():
    site, ctx = context("frontier")
    step = step_of(site, ctx, "modulefiles")
    bad = type(step)(site.steps[0], dataclasses.replace(step.args, deprecated='x"]] os.exit(1) --'), ctx)
    with pytest.raises(InputError, match="deprecated: '\"' is not allowed"):
        bad.render_files(built_for(ctx), "lua")


def test_placeholders_in_the_notice_are_filled_in():
    site, ctx = context("frontier")
    spec = StepSpec(name="modules-old", action="modulefiles",
                    args={"deprecated": "{torch_version} is going: use pytorch/2.10.0-rocm7.1"})
    step = ACTIONS["modulefiles"].from_spec(spec, ctx)
    text = step.render_files(built_for(ctx), "lua")[f"{step.root}/{OLD}.lua"]
    assert 'LmodMessage("2.2.2 is going: use pytorch/2.10.0-rocm7.1")' in text
