"""A new package is data, not code: a recipe YAML for an autotools package sitestack has never
seen, dropped into a sources directory, builds (real ./configure && make && make install),
installs and checks through the ``recipe-install`` action, with no Python added. A second run
finds it done and changes nothing."""

from __future__ import annotations

import os
import subprocess
import tarfile
import textwrap
from pathlib import Path

import pytest

from tests.conftest import run_invoke
from tests.recipe_projects import sha256

pytestmark = pytest.mark.integration

#: A hand-written configure (no autoconf needed): it writes the Makefile with the prefix baked in.
CONFIGURE = """\
#!/bin/sh
prefix=/usr/local
for arg in "$@"; do
  case "$arg" in
    --prefix=*) prefix=${arg#--prefix=} ;;
    --with-word=*) word=${arg#--with-word=} ;;
  esac
done
sed -e "s|@prefix@|$prefix|g" -e "s|@word@|${word:-plain}|g" Makefile.in > Makefile
echo "configured greet for $prefix"
"""

MAKEFILE_IN = """\
prefix = @prefix@
CC ?= cc

all: greet

greet: greet.c
\t$(CC) -DWORD='"@word@"' -o greet greet.c

install: greet
\tmkdir -p $(DESTDIR)$(prefix)/bin
\tcp greet $(DESTDIR)$(prefix)/bin/greet
"""

GREET_C = """\
#include <stdio.h>
int main(void) { printf("greetings, %s\\n", WORD); return 0; }
"""


def make_greet(root: Path, version: str) -> Path:
    """``greet-<version>.tar.gz``: configure, Makefile.in and one C file."""
    tree = root / f"greet-{version}"
    tree.mkdir(parents=True)
    (tree / "configure").write_text(CONFIGURE)
    (tree / "configure").chmod(0o755)
    (tree / "Makefile.in").write_text(MAKEFILE_IN)
    (tree / "greet.c").write_text(GREET_C)
    out = root / f"greet-{version}.tar.gz"
    with tarfile.open(out, "w:gz") as tar:
        tar.add(tree, arcname=tree.name)
    return out


def greet_recipe(tarball: Path, version: str) -> str:
    # The URL is never fetched: --source gives the tarball, checked against this sha256.
    return textwrap.dedent(f"""\
        name: greet
        description: a package added by a recipe alone (test)
        homepage: https://example.invalid/greet
        build: autotools
        default_version: "{version}"
        versions:
          "{version}":
            url: https://example.invalid/greet-{{version}}.tar.gz
            sha256: {sha256(tarball)}
        args:
          - --with-word=sitestack
        tools:
          - cc
        sanity:
          - bin/greet
        checks:
          - name: greets
            run: ["{{install}}/bin/greet"]
            expect: greetings, sitestack
        """)


def test_new_autotools_recipe_installs_with_no_code(tmp_path):
    version = "2.3"
    tarball = make_greet(tmp_path / "upstream", version)
    sources = tmp_path / "sources"
    sources.mkdir()
    (sources / "greet.yml").write_text(greet_recipe(tarball, version))
    prefix = tmp_path / "prefix"
    env = {"SITESTACK_BUILD_CACHE": str(tmp_path / "build-cache"), "SITESTACK_SOURCE_CACHE": str(tmp_path / "src"),
           "SITESTACK_LOG_DIR": str(tmp_path / "logs")}
    argv = ["build-recipe", "greet", "--site", "local", "--sources-dir", str(sources), "--source", str(tarball),
            "--prefix", str(prefix)]

    out = run_invoke(*argv, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "changed  greet@2.3: not installed" in out.stdout, out.stdout
    dest = prefix / "greet" / version
    assert dest.is_symlink()
    ran = subprocess.run([str(dest / "bin" / "greet")], capture_output=True, text=True, check=True)
    assert ran.stdout == "greetings, sitestack\n"

    stamp = dest / ".sitestack" / "install.json"
    before = stamp.stat().st_mtime_ns, os.readlink(dest)
    again = run_invoke(*argv, env=env)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "ok       greet@2.3" in again.stdout, again.stdout
    assert (stamp.stat().st_mtime_ns, os.readlink(dest)) == before
