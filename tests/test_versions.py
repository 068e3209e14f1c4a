"""Versions and ranges are PEP 440 (through packaging): every version torch has shipped parses."""

from __future__ import annotations

import pytest

from sitestack.core import versions
from sitestack.core.errors import SitestackError

TORCH_VERSIONS = ["2.3.0a0+6ddf5cf85e.nv24.04", "2.1.0+cu121", "2.5.1+rocm6.2", "2.8.0rc1", "2.6.0.dev20241112",
                  "1.13.1", "2.14.1+cu130"]


@pytest.mark.parametrize("text", TORCH_VERSIONS)
def test_every_torch_version_parses(text):
    version = versions.parse(text)
    assert version.local is None                      # the build label is not part of the release
    assert version[0] == int(text.split(".")[0])      # callers compare majors with parse(x)[0]
    assert versions.check_spec(">=1.0") is None
    assert versions.matches(">=1.0", text)


def test_local_label_is_dropped_by_parse_and_ignored_by_ranges():
    assert versions.parse("2.1.0+cu121") == versions.parse("2.1.0")
    assert versions.parse("2.5.1+rocm6.2") == versions.parse("2.5.1")
    assert versions.matches("==2.1.0", "2.1.0+cu121")
    assert versions.matches(">=2.2", "2.2.2+rocm5.7")


def test_pre_and_dev_releases_are_ordered_by_pep_440():
    assert versions.parse("2.8.0rc1") < versions.parse("2.8.0")
    assert versions.parse("2.6.0.dev20241112") < versions.parse("2.6.0a0") < versions.parse("2.6.0")
    assert versions.matches(">=2.7", "2.8.0rc1")          # pre-releases are not left out of a range
    assert not versions.matches(">=2.8", "2.8.0rc1")      # ... but 2.8.0rc1 comes before 2.8
    assert versions.matches(">=2.8.0rc1", "2.8.0rc1")
    assert versions.matches(">=2.1,<2.14", "2.3.0a0+6ddf5cf85e.nv24.04")
    assert versions.matches("<2.7", "2.6.0.dev20241112")


def test_major_and_equality_like_the_old_tuples():
    assert versions.parse("12.1")[0] == 12
    assert versions.parse("5.7") == versions.parse("5.7.0")
    assert versions.parse("12.1")[1] == 1


def test_sort_key_orders_pep_440_and_puts_refs_first():
    got = sorted(["2.8.0", "main", "2.8.0rc1", "2.10.0", "2.6.0.dev20241112"], key=versions.sort_key)
    assert got == ["main", "2.6.0.dev20241112", "2.8.0rc1", "2.8.0", "2.10.0"]


@pytest.mark.parametrize("text", ["", "main", "4.x", "1.2.3-foo-bar+", "torch 2.1"])
def test_invalid_version_is_a_clear_sitestack_error(text):
    with pytest.raises(SitestackError, match="is not a version") as err:
        versions.parse(text)
    assert isinstance(err.value, ValueError)          # callers that catch ValueError keep working
    with pytest.raises(SitestackError, match="is not a version"):
        versions.matches(">=1", text)


@pytest.mark.parametrize("spec", ["3.8+", ">=x", ">=4.*", "~=5", "4.1"])
def test_invalid_range_is_a_clear_sitestack_error(spec):
    assert "bad version range clause" in (versions.check_spec(spec) or "")
    with pytest.raises(SitestackError, match="bad version range clause"):
        versions.matches(spec, "1.0")


@pytest.mark.parametrize("spec", ["*", "", " * ", ">=1.0, <2", "~=4.1", "==4.1.*"])
def test_valid_ranges(spec):
    assert versions.check_spec(spec) is None
