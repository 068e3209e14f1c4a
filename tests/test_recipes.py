"""Recipes as data: the loader's errors (file:line:key), version ranges, version rules, patch headers."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from sitestack.core import versions
from sitestack.core.errors import InputError, SitestackError
from sitestack.model.recipe import list_recipes, load_recipe, parse_patch_header
from tests.recipe_facts import facts

SHA = "a" * 64

MINIMAL = textwrap.dedent(f"""\
    name: demo
    description: a demo
    homepage: https://example.org
    build: autotools
    default_version: "1.0"
    versions:
      "1.0":
        url: https://example.org/demo-1.0.tar.gz
        sha256: {SHA}
      "2.0":
        url: https://example.org/demo-2.0.tar.gz
        sha256: {SHA}
    sanity: [bin/demo]
    """)


def write(tmp_path: Path, text: str, name: str = "demo") -> Path:
    sources = tmp_path / "sources"
    sources.mkdir(exist_ok=True)
    (sources / f"{name}.yml").write_text(text)
    return sources


def load_error(tmp_path: Path, text: str) -> str:
    sources = write(tmp_path, text)
    with pytest.raises(InputError) as err:
        load_recipe("demo", sources)
    return str(err.value)


# -- the recipes we ship ------------------------------------------------------------------------
@pytest.mark.parametrize("name", list_recipes())
def test_every_shipped_recipe_loads(name):
    recipe = load_recipe(name)
    assert recipe.default_version in recipe.versions
    for patch in recipe.patches:
        assert patch.sha256 and patch.header["Why"]


def test_mpi4py_recipe():
    recipe = load_recipe("mpi4py")
    assert recipe.build == "pip" and recipe.default_version == "4.1.2"
    source = recipe.versions["4.1.2"]
    assert source.sha256 == "56860286dc45f20e8821e93cb06669e30462348bf866f685553fa4b712d58d02"
    assert source.url.startswith("https://files.pythonhosted.org/") and source.url.endswith("/mpi4py-4.1.2.tar.gz")
    assert recipe.env["MPICC"] == "{mpicc}"
    assert [c.name for c in recipe.checks] == ["linked MPI", "2-rank message"]
    assert recipe.checks[1].ranks == 2


# -- loader errors name file, line and key ----------------------------------------------------------
def test_unknown_key_names_file_line_key(tmp_path):
    text = MINIMAL.replace("    sha256: " + SHA + "\n  \"2.0\"", "    sha265: " + SHA + "\n  \"2.0\"")
    message = load_error(tmp_path, text)
    assert re.search(r"demo\.yml:9: versions\.1\.0\.sha265: unknown key \(known keys: .*sha256", message), message


def test_wrong_type_names_key(tmp_path):
    message = load_error(tmp_path, MINIMAL + "args: --enable-foo\n")
    assert re.search(r"demo\.yml:14: args: expected a list, got a string", message), message


def test_missing_required_key(tmp_path):
    message = load_error(tmp_path, MINIMAL.replace("homepage: https://example.org\n", ""))
    assert "missing required key 'homepage'" in message


def test_bad_sha256(tmp_path):
    message = load_error(tmp_path, MINIMAL.replace(SHA, "abc", 1))
    assert "versions.1.0: sha256: must be 64 lower-case hex digits" in message


def test_unknown_placeholder(tmp_path):
    message = load_error(tmp_path, MINIMAL + "env:\n  CC: \"{mpi_cc}\"\n")
    assert re.search(r"demo\.yml:15: env\.CC: unknown placeholder \{mpi_cc\} \(known: .*\{mpicc\}", message), message


def test_default_version_must_be_known(tmp_path):
    message = load_error(tmp_path, MINIMAL.replace('default_version: "1.0"', 'default_version: "3.0"'))
    assert "default_version: '3.0' is not in versions (1.0, 2.0)" in message


def test_builder_options_must_match_build(tmp_path):
    message = load_error(tmp_path, MINIMAL + "pip:\n  build_isolation: false\n")
    assert "pip: options for the pip builder, but build is autotools" in message


def test_bad_rule_range(tmp_path):
    text = MINIMAL + "rules:\n  - versions: '>=1'\n    requires: {python: '3.8+'}\n    why: because\n"
    message = load_error(tmp_path, text)
    assert "rules[0].requires: python: bad version range clause '3.8+'" in message


def test_name_must_match_file(tmp_path):
    message = load_error(tmp_path, MINIMAL.replace("name: demo", "name: other"))
    assert "name: must be 'demo' (the file name), not 'other'" in message


# -- patches -------------------------------------------------------------------------------------------
PATCH = textwrap.dedent("""\
    Upstream: https://example.org/pr/1 (merged in 2.0)
    Applies-to: <2.0
    Why: fixes the build with gcc 12
    ---
    --- a/demo.c
    +++ b/demo.c
    @@ -1 +1 @@
    -old
    +new
    """)


def with_patch(tmp_path: Path, patch_text: str, entry: str = "  - file: 0001-fix.patch\n") -> Path:
    (tmp_path / "patches" / "demo").mkdir(parents=True, exist_ok=True)
    (tmp_path / "patches" / "demo" / "0001-fix.patch").write_text(patch_text)
    return write(tmp_path, MINIMAL + "patches:\n" + entry)


def test_patch_versions_come_from_header(tmp_path):
    recipe = load_recipe("demo", with_patch(tmp_path, PATCH))
    assert recipe.patches[0].applies_to == "<2.0"
    assert [p.file for p in recipe.patches_for("1.0")] == ["0001-fix.patch"]
    assert recipe.patches_for("2.0") == []
    assert len(recipe.patches[0].sha256) == 64


def test_patch_without_header_is_refused(tmp_path):
    sources = with_patch(tmp_path, PATCH.replace("Why: fixes the build with gcc 12\n", ""))
    with pytest.raises(InputError, match=r"demo\.yml:\d+: patches\[0\]\.file: .*0001-fix\.patch: patch header lacks Why"):
        load_recipe("demo", sources)


def test_missing_patch_file(tmp_path):
    sources = write(tmp_path, MINIMAL + "patches:\n  - file: 0002-gone.patch\n")
    with pytest.raises(InputError, match=r"patches\[0\]\.file: patch file .*0002-gone\.patch not found"):
        load_recipe("demo", sources)


def test_patch_versions_must_agree_with_header(tmp_path):
    sources = with_patch(tmp_path, PATCH, "  - file: 0001-fix.patch\n    versions: '>=1.0'\n")
    with pytest.raises(InputError, match=r"versions '>=1.0' disagrees with Applies-to '<2.0'"):
        load_recipe("demo", sources)


def test_patch_header_continuation_lines():
    header = parse_patch_header("Upstream: a\nApplies-to: *\nWhy: one\n  two\ndiff -u a b\n--- a\n+++ b\n")
    assert header == {"Upstream": "a", "Applies-to": "*", "Why": "one two"}


# -- versions and version rules ------------------------------------------------------------------------
@pytest.mark.parametrize("spec,version,expected", [
    ("*", "1.2", True), ("", "1", True),
    (">=4.0", "4.1.2", True), (">=4.0", "3.1.6", False),
    ("<4.0.1", "4.0.0", True), ("<4.0.1", "4.0.1", False),
    ("==4.0.*", "4.0.3", True), ("==4.0.*", "4.1", False), ("!=4.0.*", "4.1", True),
    (">=3.8,<3.13", "3.12", True), (">=3.8,<3.13", "3.13", False),
    ("~=5.7", "5.9.1", True), ("~=5.7", "6.0", False),
    ("==5.7", "5.7.0", True), (">=2.2", "2.2.2+rocm5.7", True),
])
def test_version_ranges(spec, version, expected):
    assert versions.matches(spec, version) is expected


@pytest.mark.parametrize("spec", ["3.8+", ">=x", ">=4.*", "~=5"])
def test_bad_version_ranges(spec):
    assert versions.check_spec(spec)


def test_rules_refuse_unsupported_python_and_say_what_fits():
    recipe = load_recipe("mpi4py")
    with pytest.raises(SitestackError) as err:
        recipe.select_version("4.1.2", facts(python__version="3.7"), "site old")
    message = str(err.value)
    assert "mpi4py 4.1.2 is not supported on site old: needs python >=3.8, the site has 3.7" in message
    assert "mpi4py 4.1.0 CHANGES.rst" in message
    assert "versions of mpi4py that fit site old: 3.1.6, 4.0.3" in message


def test_rules_with_no_fitting_version(tmp_path):
    text = MINIMAL + "rules:\n  - versions: '*'\n    requires: {gpu: [amd], rocm: '>=6'}\n    why: needs HIP\n"
    recipe = load_recipe("demo", write(tmp_path, text))
    with pytest.raises(SitestackError) as err:
        recipe.select_version(None, facts(), "site cpu")
    assert "needs rocm >=6, the site has no rocm (needs HIP)" in str(err.value)
    assert "needs gpu one of amd, the site has none (facts.gpu.vendor)" in str(err.value)
    assert "no known version of demo fits site cpu" in str(err.value)


def test_unknown_version_lists_known_ones():
    with pytest.raises(InputError, match=r"unknown version '9\.9' of mpi4py \(known versions in .*mpi4py\.yml: "
                                         r"3\.1\.6, 4\.0\.3, 4\.1\.1, 4\.1\.2\)"):
        load_recipe("mpi4py").select_version("9.9", facts())


def test_per_version_requires(tmp_path):
    text = MINIMAL.replace('    sha256: ' + SHA + '\n  "2.0"', '    sha256: ' + SHA + '\n    requires: {mpi: [openmpi]}\n  "2.0"')
    recipe = load_recipe("demo", write(tmp_path, text))
    assert recipe.select_version("2.0", facts()) == "2.0"
    with pytest.raises(SitestackError, match="needs mpi one of openmpi, the site has mpich"):
        recipe.select_version("1.0", facts())


# -- the CLI refuses before anything runs --------------------------------------------------------------
def test_cli_unknown_version(cli, scratch):
    out = cli("build-mpi4py", "--site", "local", "--version", "9.9", "--prefix", str(scratch))
    assert out.returncode == 1
    assert "unknown version '9.9' of mpi4py" in out.stderr and "Traceback" not in out.stderr
    assert not scratch.exists()


def test_cli_unsupported_combination(cli, scratch, repo, tmp_path):
    text = (repo / "playbooks" / "local.yml").read_text().replace('version: "3.11"', 'version: "3.7"')
    assert 'version: "3.7"' in text
    (tmp_path / "local.yml").write_text(text)
    out = cli("build-mpi4py", "--playbook", str(tmp_path / "local.yml"), "--prefix", str(scratch))
    assert out.returncode == 1, out.stdout + out.stderr
    assert "mpi4py 4.1.2 is not supported on site local: needs python >=3.8, the site has 3.7" in out.stderr
    assert "versions of mpi4py that fit site local: 3.1.6, 4.0.3" in out.stderr
    assert not scratch.exists()


def test_cli_recipes_lists_mpi4py(cli):
    out = cli("recipes")
    assert out.returncode == 0
    assert re.search(r"^mpi4py\s+pip\s+3\.1\.6, 4\.0\.3, 4\.1\.1, 4\.1\.2\*", out.stdout, re.M), out.stdout


def test_cli_bad_recipe_names_file_line_key(cli, tmp_path):
    sources = write(tmp_path, MINIMAL + "args: --enable-foo\n")
    out = cli("build-recipe", "demo", "--site", "local", "--sources-dir", str(sources), "--check")
    assert out.returncode == 1
    assert re.search(r"demo\.yml:14: args: expected a list", out.stderr), out.stderr


def test_every_recipe_key_and_placeholder_is_documented(repo):
    import dataclasses

    from sitestack.model import recipe as recipe_mod

    doc = (repo / "docs" / "recipes.md").read_text()
    classes = (recipe_mod.Recipe, recipe_mod.Source, recipe_mod.Requires, recipe_mod.Rule, recipe_mod.Patch,
               recipe_mod.Autotools, recipe_mod.CMake, recipe_mod.Pip, recipe_mod.Check, recipe_mod.ModuleSettings)
    missing = [f"{c.__name__}.{f.name}" for c in classes for f in dataclasses.fields(c)
               if f.init and f"`{f.name}`" not in doc]
    assert not missing, f"docs/recipes.md lacks {missing}"
    assert not [p for p in recipe_mod.PLACEHOLDERS if f"`{{{p}}}`" not in doc]
