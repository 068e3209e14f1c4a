"""Small real projects for recipe tests: an autotools package, a CMake package and a Python sdist,
made into tarballs with their sha256, and recipes (in a scratch sources/ dir) that build them.

The autotools project pauses one second in ``all-local`` and ``install-data-hook`` so a test
can watch the build log for a phase and kill the build while it is in that phase.
"""

from __future__ import annotations

import difflib
import hashlib
import subprocess
import tarfile
import textwrap
from pathlib import Path

HELLO_C = """\
#include "config.h"
#include <stdio.h>

int main(void)
{
#ifdef SHOUT
    puts("HELLO FROM SITESTACK");
#else
    puts("hello from sitestack");
#endif
    return 0;
}
"""

CONFIGURE_AC = """\
AC_INIT([hello], [VERSION])
AM_INIT_AUTOMAKE([foreign])
AC_PROG_CC
AC_ARG_ENABLE([shout], [AS_HELP_STRING([--enable-shout], [greet loudly])],
              [AC_DEFINE([SHOUT], [1], [greet loudly])])
AC_CONFIG_HEADERS([config.h])
AC_CONFIG_FILES([Makefile])
AC_OUTPUT
"""

MAKEFILE_AM = """\
bin_PROGRAMS = hello
hello_SOURCES = hello.c
dist_pkgdata_DATA = greeting.txt
PAUSE = 1

# Slow on purpose: tests kill the build while it is in the build and stage phases.
all-local:
\tsleep $(PAUSE)

install-data-hook:
\tsleep $(PAUSE)
"""


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _tar(src: Path, out: Path) -> Path:
    with tarfile.open(out, "w:gz") as tar:
        tar.add(src, arcname=src.name)
    return out


def make_hello(root: Path, version: str = "1.0", *, bootstrapped: bool = True) -> Path:
    """``hello-<version>.tar.gz`` in ``root``: with a generated configure (a release tarball), or
    without one (a git snapshot that needs autoreconf)."""
    tree = root / "trees" / f"hello-{version}{'' if bootstrapped else '-raw'}" / f"hello-{version}"
    tree.mkdir(parents=True)
    (tree / "configure.ac").write_text(CONFIGURE_AC.replace("VERSION", version))
    (tree / "Makefile.am").write_text(MAKEFILE_AM)
    (tree / "hello.c").write_text(HELLO_C)
    (tree / "greeting.txt").write_text("hello\n")
    if bootstrapped:
        subprocess.run(["autoreconf", "-fi"], cwd=tree, check=True, capture_output=True)
        subprocess.run(["rm", "-rf", "autom4te.cache"], cwd=tree, check=True)
    out = root / ("" if bootstrapped else "raw")
    out.mkdir(exist_ok=True)
    return _tar(tree, out / f"hello-{version}.tar.gz")


def patch_text(old: str, new: str, path: str = "hello.c", *, applies_to: str = ">=1.0",
               upstream: str = "not for upstream: a test fixture", why: str = "changes the greeting") -> str:
    diff = "".join(difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                        fromfile=f"a/{path}", tofile=f"b/{path}"))
    return f"Upstream: {upstream}\nApplies-to: {applies_to}\nWhy: {why}\n---\n{diff}"


PATCHED_C = HELLO_C.replace('puts("hello from sitestack");', 'puts("hello from sitestack, patched");')


def hello_recipe(tarballs: dict[str, Path], *, args: list[str] | None = None, patches: list[str] | None = None,
                 extra: str = "", tools: list[str] | None = None, bootstrap: str | None = None) -> str:
    versions = "".join(
        f'  "{v}":\n    url: {p.as_uri()}\n    sha256: {sha256(p)}\n' for v, p in tarballs.items())
    text = textwrap.dedent(f"""\
        name: hello
        description: a small autotools package for tests
        homepage: https://example.org/hello
        build: autotools
        default_version: "{next(iter(tarballs))}"
        versions:
        """) + versions
    if args:
        text += "args:\n" + "".join(f"  - {a!r}\n" for a in args)
    if patches:
        text += "patches:\n" + "".join(f"  - file: {p}\n" for p in patches)
    if tools:
        text += "tools:\n" + "".join(f'  - "{t}"\n' for t in tools)
    if bootstrap:
        text += f"autotools:\n  bootstrap: {bootstrap}\n"
    text += textwrap.dedent("""\
        sanity:
          - bin/hello
          - share/hello/greeting.txt
        checks:
          - name: greets
            run: ["{install}/bin/hello"]
            expect: hello
        """)
    return text + extra


CMAKE_LISTS = """\
cmake_minimum_required(VERSION 3.18)
project(hicmake C)
add_executable(hicmake main.c)
target_compile_definitions(hicmake PRIVATE GREETING="${GREETING}")
install(TARGETS hicmake DESTINATION bin)
"""


def make_hicmake(root: Path) -> Path:
    tree = root / "trees" / "hicmake-0.1" / "hicmake-0.1"
    tree.mkdir(parents=True)
    (tree / "CMakeLists.txt").write_text(CMAKE_LISTS)
    (tree / "main.c").write_text('#include <stdio.h>\nint main(void) { puts(GREETING); return 0; }\n')
    return _tar(tree, root / "hicmake-0.1.tar.gz")


def hicmake_recipe(tarball: Path, *, minimum: str = "3.18") -> str:
    return textwrap.dedent(f"""\
        name: hicmake
        description: a small CMake package for tests
        homepage: https://example.org/hicmake
        build: cmake
        default_version: "0.1"
        versions:
          "0.1":
            url: {tarball.as_uri()}
            sha256: {sha256(tarball)}
        cmake:
          minimum: "{minimum}"
        args:
          - -DGREETING=hello from cmake
        sanity: [bin/hicmake]
        checks:
          - name: greets
            run: ["{{install}}/bin/hicmake"]
            expect: hello from cmake
        """)


def make_hipy(root: Path) -> Path:
    """A pure-Python sdist (setuptools) whose wheel builds in a second."""
    tree = root / "trees" / "hipy-0.1" / "hipy-0.1"
    (tree / "hipy").mkdir(parents=True)
    (tree / "hipy" / "__init__.py").write_text('GREETING = "hello from hipy"\n')
    (tree / "pyproject.toml").write_text(textwrap.dedent("""\
        [build-system]
        requires = ["setuptools>=61"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "hipy"
        version = "0.1"
        """))
    return _tar(tree, root / "hipy-0.1.tar.gz")


def hipy_recipe(tarball: Path) -> str:
    return textwrap.dedent(f"""\
        name: hipy
        description: a small Python sdist for tests
        homepage: https://example.org/hipy
        build: pip
        default_version: "0.1"
        versions:
          "0.1":
            url: {tarball.as_uri()}
            sha256: {sha256(tarball)}
        pip:
          build_isolation: true    # a recent setuptools (with bdist_wheel) comes from the index
        sanity: [hipy/__init__.py]
        checks:
          - name: imports
            run: ["{{python}}", "-c", "import hipy; print(hipy.GREETING)"]
            env: {{PYTHONPATH: "{{install}}"}}
            expect: hello from hipy
        """)
