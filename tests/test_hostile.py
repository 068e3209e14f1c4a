"""Hostile values and bad input, tried as an attacker or a careless admin would.

Every case of the corpus is refused before anything runs: exit code 1, one line on stderr
naming the file and line (a playbook or recipe) or the option (the command line), no
traceback, and nothing written: the case's HOME, install prefix, current directory and the
checkout stay as they were, and the marker file an injected command would create never
appears. Values that are legitimate but look dangerous (``$(...)``, quotes, backticks in an
environment value) are accepted and must stay inert: the generated batch script is run with
bash under stub launchers, the module file is loaded in real Lmod and the prelude run by bash.

The other classes, with the same assertion (:func:`assert_refused_cleanly`) where input is refused:
``test_hostile_runtime.py`` (what the shipped helpers, run scripts and the validation job read when
a job runs, under bash, dash, zsh and sh = bash; per-job scratch), ``test_hostile_files.py`` (files
the user names; caches and logs under any umask), ``test_hostile_secrets.py`` (index credentials),
``test_hostile_bounds.py`` (linear time, bounded reads, terminal sequences, ``--step``, the lock) and
``test_hostile_settings.py`` (the ``sitestack:`` settings, ``SITESTACK_*`` variables, empty options,
``gc``'s cache root).
"""

from __future__ import annotations

import copy
import os
import re
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO, tree
from tests.contexts import offline_context

MARK = "SITESTACK_PWNED"


@dataclass(frozen=True)
class Case:
    """One hostile input: a change to a copy of a site's playbook, or command-line arguments."""

    id: str
    where: str  # regex the message must match: the file and line (book.yml:N), or the option
    edit: Callable[[dict[str, Any], str], None] | None = None  # changes the playbook data; gets the marker path
    raw: Callable[[str], str] | None = None  # the playbook's text instead (YAML-level cases)
    args: tuple[str, ...] = ("provision",)
    site: str = "local"
    expect: str = ""  # a fragment of the message
    extra_env: dict[str, str] = field(default_factory=dict)


def setter(path: str, value: Any) -> Callable[[dict[str, Any], str], None]:
    """An edit that sets the dotted ``path`` of the playbook to ``value`` (``{mark}`` is the marker)."""
    def edit(data: dict[str, Any], mark: str) -> None:
        node: Any = data
        keys = path.split(".")
        for key in keys[:-1]:
            node = node[int(key)] if isinstance(node, list) else node.setdefault(key, {})
        filled = value.replace("{mark}", mark) if isinstance(value, str) else value
        if isinstance(node, list):
            node[int(keys[-1])] = filled
        else:
            node[keys[-1]] = filled
    return edit


def env_key(key: str) -> Callable[[dict[str, Any], str], None]:
    def edit(data: dict[str, Any], mark: str) -> None:
        data["facts"].setdefault("env", {})[key.replace("{mark}", mark)] = "1"
    return edit


def step_arg(action: str, name: str, value: Any) -> Callable[[dict[str, Any], str], None]:
    def edit(data: dict[str, Any], mark: str) -> None:
        for step in data["steps"]:
            if step["action"] == action:
                step.setdefault("args", {})[name] = (
                    value.replace("{mark}", mark) if isinstance(value, str)
                    else [v.replace("{mark}", mark) for v in value] if isinstance(value, list) else value)
    return edit


def deep(text: str) -> str:
    return text + "deep: " + "[" * 5000 + "]" * 5000 + "\n"


def alias_bomb(text: str) -> str:
    lines = ["  bomb:", "    a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):
        lines.append(f"    a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]")
    return text.replace("facts:\n", "facts:\n" + "\n".join(lines) + "\n", 1)


BOOK = r"book/(local|lumi)\.yml:\d+"
INJECT = "x; touch {mark}"
NL = "x\ntouch {mark}"

PLAYBOOK_CASES = [
    # 1. values into generated shell
    Case("env-key-injection", BOOK + r": facts\.env\.", env_key("NCCL_X=1; touch {mark}"), expect="environment variable name"),
    Case("env-key-digit", BOOK + r": facts\.env\.", env_key("1BAD")),
    Case("env-key-empty", BOOK + r": facts\.env\.", env_key("")),
    Case("env-key-dash", BOOK + r": facts\.env\.", env_key("NCCL-X")),
    Case("env-value-newline", BOOK + r": facts\.env\.GLOO_SOCKET_IFNAME", setter("facts.env.GLOO_SOCKET_IFNAME", NL), expect="newline"),
    Case("env-value-cr", BOOK + r": facts\.env\.", setter("facts.env.GLOO_SOCKET_IFNAME", "lo\rtouch {mark}"), expect="carriage return"),
    Case("partition-newline", BOOK + r": facts\.scheduler\.partition", setter("facts.scheduler.partition", NL)),
    Case("options-newline", BOOK + r": facts\.scheduler\.options\[0\]", setter("facts.scheduler.options", [NL])),
    Case("time-newline", BOOK + r": facts\.scheduler\.time", setter("facts.scheduler.time", "00:10:00\ntouch {mark}")),
    Case("account-fact-newline", BOOK + r": facts\.scheduler\.account", setter("facts.scheduler.account", NL)),
    Case("modules-load-newline", BOOK + r": facts\.modules\.load\[0\]", setter("facts.modules.load", [NL])),
    Case("modules-init-newline", BOOK + r": facts\.modules\.init", setter("facts.modules.init", "/x\ntouch {mark}")),
    Case("modules-use-newline", BOOK + r": facts\.modules\.use\[0\]", setter("facts.modules.use", ["/x\ntouch {mark}"])),
    # 2. values into module files and activate scripts
    Case("variant-newline", BOOK + r": facts\.torch\.variant", setter("facts.torch.variant", "cpu\nos.execute('touch {mark}')")),
    Case("variant-quote", BOOK + r": facts\.torch", setter("facts.torch.variant", "cpu'; touch {mark}; '")),
    Case("description-newline", BOOK + r": facts\.description", setter("facts.description", "x\n]] os.execute('touch {mark}') --")),
    Case("python-executable-newline", BOOK + r": facts\.python\.executable", setter("facts.python.executable", NL)),
    Case("interfaces-newline", BOOK + r": facts\.network\.interfaces\[0\]", setter("facts.network.interfaces", [NL])),
    Case("nul-in-value", BOOK + r": facts\.node\.local_scratch", setter("facts.node.local_scratch", "/tmp\x00x")),
    Case("escape-in-value", BOOK + r": facts\.env\.", setter("facts.env.GLOO_SOCKET_IFNAME", "lo\x1b[2J")),
    # 5. tracebacks
    Case("placeholder-format-d", BOOK + r": facts\.prefix", setter("facts.prefix", "{home:d}/x"), expect="format spec"),
    Case("placeholder-conversion", BOOK + r": facts\.prefix", setter("facts.prefix", "{home!r}/x")),
    Case("placeholder-width", BOOK + r": facts\.prefix", setter("facts.prefix", "{home:>60}/x")),
    Case("placeholder-attribute", BOOK + r": facts\.prefix", setter("facts.prefix", "{home.__class__}/x")),
    Case("placeholder-index", BOOK + r": facts\.prefix", setter("facts.prefix", "{home[0]}/x")),
    Case("torch-version-x", BOOK + r": facts\.torch", setter("facts.torch.version", "2.x"), expect="not a version"),
    Case("torch-version-empty", BOOK + r": facts\.torch", setter("facts.torch.version", "")),
    Case("mpi-cc-empty", BOOK + r": facts\.mpi", setter("facts.mpi.cc", ""), expect="empty"),
    Case("mpi-cc-unbalanced-quote", BOOK + r": facts\.mpi", setter("facts.mpi.cc", "mpicc '")),
    Case("prefix-newline", BOOK + r": facts\.prefix", setter("facts.prefix", "/tmp/x\ntouch {mark}")),
    Case("deep-nesting", r"book/local\.yml:\d+", raw=deep, expect="nested"),
    Case("nul-byte-in-file", r"book/local\.yml:\d+", raw=lambda t: t.replace("site: local", "site: local\x00", 1), expect="NUL"),
    Case("alias-bomb", r"book/local\.yml:\d+", raw=alias_bomb, expect="aliases"),
    # 6. accepted with exit 0, but wrong
    Case("build-jobs-negative", BOOK + r": facts\.build_jobs", setter("facts.build_jobs", -8), expect="at least 1"),
    Case("build-jobs-huge-float", BOOK + r": facts\.build_jobs", setter("facts.build_jobs", 1e21)),
    Case("build-jobs-huge-int", BOOK + r": facts\.build_jobs", setter("facts.build_jobs", 10**21)),
    Case("cores-negative", BOOK + r": facts\.node\.cores", setter("facts.node.cores", -2)),
    Case("ranks-per-node-huge", BOOK + r": facts\.validation\.ranks_per_node", setter("facts.validation.ranks_per_node", 100000)),
    Case("ranks-per-node-negative", BOOK + r": facts\.validation\.ranks_per_node", setter("facts.validation.ranks_per_node", -2)),
    Case("busbw-nan", BOOK + r": facts\.validation\.single_node\.busbw_gbs", setter("facts.validation.single_node.busbw_gbs", float("nan")), expect="finite"),
    Case("busbw-inf", BOOK + r": facts\.validation\.single_node\.busbw_gbs", setter("facts.validation.single_node.busbw_gbs", float("inf"))),
    Case("empty-host-name", BOOK + r": hosts\[0\]", setter("hosts.0.name", "")),
    Case("host-name-injection", BOOK + r": hosts\[0\]", setter("hosts.0.name", "x;touch {mark}")),
    Case("host-port-huge", BOOK + r": hosts\[0\]\.port", setter("hosts.0.port", 99999), expect="at most 65535"),
    Case("host-port-zero", BOOK + r": hosts\[0\]\.port", setter("hosts.0.port", 0)),
    Case("empty-step-name", BOOK + r": steps\[0\]", setter("steps.0.name", "")),
    Case("blank-step-name", BOOK + r": steps\[0\]", setter("steps.0.name", "   ")),
    Case("empty-tag", BOOK + r": steps\[0\]", setter("steps.0.tags", [""])),
    # 4. paths
    Case("prefix-empty", BOOK + r": facts", setter("facts.prefix", ""), expect="absolute"),
    Case("prefix-relative", BOOK + r": facts", setter("facts.prefix", "stack/local"), expect="absolute"),
    Case("directory-arg-newline", BOOK + r": steps\[\d+\]\.args\.paths\[0\]", step_arg("directory", "paths", ["{prefix}/x\ntouch {mark}"])),
    Case("recipe-version-dotdot", r"book/local\.yml:\d+|sources/mpi4py\.yml", step_arg("recipe-install", "version", "../../x")),
    Case("recipe-name-dotdot", BOOK + r": steps\[\d+\]\.args", step_arg("recipe-install", "recipe", "../../etc/x")),
    Case("recipe-dest-relative", BOOK + r": steps\[\d+\]\.args", step_arg("recipe-install", "dest", "rel/dir")),
    # 6. the account placeholder with no --account: refused in check mode too
    Case("account-placeholder-check", r"--account", setter("facts.scheduler.account", "{account}"),
         args=("provision", "--check"), expect="needs an account"),
    # option injection and writes outside the prefix (a red-team review)
    Case("apt-option-injection", BOOK + r": steps\[0\]\.args", step_arg("apt-packages", "packages",
         ["-oDPkg::Pre-Invoke::=touch {mark}", "hello"]), expect="not a Debian package name"),
    Case("apt-name-injection", BOOK + r": steps\[0\]\.args", step_arg("apt-packages", "packages", ["lmod; touch {mark}"])),
    Case("extras-index-option", BOOK + r": facts\.torch", setter("facts.torch.extras", ["--index-url=http://evil.invalid/s"]),
         expect="pip option"),
    Case("extras-requirements-file", BOOK + r": facts\.torch", setter("facts.torch.extras", ["-r /etc/passwd"])),
    Case("extras-shell", BOOK + r": facts\.torch", setter("facts.torch.extras", ["six; touch {mark}"])),
    Case("packages-pin-injection", BOOK + r": facts\.torch", setter("facts.torch.packages", {"torchvision": "0.1; touch {mark}"})),
    Case("index-url-injection", BOOK + r": facts\.torch", setter("facts.torch.index_url", "http://x/$(touch {mark})")),
    Case("site-facts-path-outside", BOOK + r": steps\[\d+\]\.args", step_arg("site-facts", "path", "/tmp/victim/.bashrc"),
         expect="{prefix}"),
    Case("directory-outside", BOOK + r": steps\[\d+\]\.args", step_arg("directory", "paths", ["/tmp/outside-dir"])),
    Case("directory-dotdot", BOOK + r": steps\[\d+\]\.args", step_arg("directory", "paths", ["{prefix}/../../x"]), expect=".."),
    Case("directory-setuid-mode", BOOK + r": steps\[\d+\]\.args", step_arg("directory", "mode", "4777")),
    Case("validation-dir-outside", BOOK + r": steps\[\d+\]\.args", step_arg("install-validation-job", "dir", "/tmp/val")),
    Case("recipe-dest-root", BOOK + r": steps\[\d+\]\.args", step_arg("recipe-install", "dest", "/")),
    Case("module-root-relative", BOOK + r": facts\.modules", setter("facts.modules.install_root", "rel/mods")),
    Case("c1-control", BOOK + r": facts\.description", setter("facts.description", "x\x9b2J")),
    Case("line-separator", BOOK + r": facts\.description", setter("facts.description", "x\u2028os.execute('touch {mark}')")),
    Case("bidi-override", BOOK + r": facts\.env\.", setter("facts.env.GLOO_SOCKET_IFNAME", "lo\u202e")),
    Case("python-version-unicode-digits", BOOK + r": facts\.python", setter("facts.python.version", "3.\u0661\u0661")),
    # 3. the site name of a --playbook file
    Case("site-name-of-file", r"--playbook|book/.*\.yml", raw=lambda t: t.replace("site: local", "site: 'Bad Name'", 1)),
]

CLI_CASES = [
    Case("jobs-abc", "--jobs", args=("build-mpi4py", "--site", "local", "--check", "--jobs", "abc")),
    Case("jobs-negative", "--jobs", args=("build-mpi4py", "--site", "local", "--check", "--jobs", "-3")),
    Case("jobs-zero", "--jobs", args=("build-mpi4py", "--site", "local", "--check", "--jobs", "0")),
    Case("host-empty", "--host", args=("provision", "--site", "local", "--check", "--host", "")),
    Case("host-bad-port", "--host", args=("provision", "--site", "local", "--check", "--host", "user@host:notaport")),
    Case("host-port-range", "--host", args=("provision", "--site", "local", "--check", "--host", "host:99999")),
    Case("host-injection", "--host", args=("provision", "--site", "local", "--check", "--host", "h;touch MARKFILE")),
    Case("prefix-empty-option", "--prefix", args=("provision", "--site", "local", "--check", "--prefix", "")),
    Case("prefix-relative-option", "--prefix", args=("provision", "--site", "local", "--check", "--prefix", "rel/dir")),
    Case("prefix-newline-option", "--prefix", args=("provision", "--site", "local", "--check", "--prefix", "/tmp/x\ny")),
    Case("account-dotdot", "--account", args=("provision", "--site", "lumi", "--check", "--account", "../../x")),
    Case("account-slash", "--account", args=("show-site", "--site", "lumi", "--account", "a/b")),
    Case("account-newline", "--account", args=("provision", "--site", "lumi", "--check", "--account", "a\nb")),
    Case("account-quote", "--account", args=("provision", "--site", "lumi", "--check", "--account", "a'b")),
    Case("tags-only-commas", "--tags", args=("provision", "--site", "local", "--check", "--tags", ",,,")),
    Case("skip-tags-empty-item", "--skip-tags", args=("provision", "--site", "local", "--check", "--skip-tags", "build,,x")),
    Case("validate-nodes-abc", "--nodes", args=("validate", "--site", "local", "--nodes", "abc")),
    Case("validate-nodes-negative", "--nodes", args=("validate", "--site", "local", "--nodes", "-1")),
    Case("validate-ranks-negative", "--ranks-per-node", args=("validate", "--site", "local", "--ranks-per-node", "-2")),
    Case("validate-ranks-huge", "--ranks-per-node", args=("validate", "--site", "local", "--ranks-per-node", "100000")),
    Case("validate-timeout-negative", "--timeout", args=("validate", "--site", "local", "--timeout", "-5")),
    Case("validate-results-relative", "--results", args=("validate", "--site", "local", "--results", "relative")),
    Case("validate-collect-injection", "--collect", args=("validate", "--site", "local", "--collect", "1;touch x")),
    Case("site-dotdot", "--site", args=("provision", "--site", "../local", "--check")),
    Case("site-newline", "--site", args=("provision", "--site", "local\n", "--check")),
    Case("playbook-dev-zero", "/dev/zero", args=("provision", "--playbook", "/dev/zero", "--check")),
    Case("playbook-directory", "playbooks", args=("provision", "--playbook", str(REPO / "playbooks"), "--check")),
    Case("ssh-config-bad-port", r"bad-port\.config: .*notaport", args=("provision", "--site", "local", "--check",
                                                                         "--host", "farhost"),
         extra_env={"SITESTACK_SSH_CONFIG": str(REPO / "tests" / "data" / "ssh" / "bad-port.config")}),
    Case("playbook-file-not-a-site-name", "--playbook", args=("provision", "--check", "--playbook",
                                                              str(REPO / "tests" / "data" / "sites" / "Bad Name.yml"))),
    Case("prefix-root", "--prefix", args=("provision", "--site", "local", "--tags", "layout", "--prefix", "/")),
    Case("prefix-tmp", "--prefix", args=("provision", "--site", "local", "--tags", "layout", "--prefix", "/tmp/")),
    Case("prefix-dotdot", "--prefix", args=("provision", "--site", "local", "--check", "--prefix", "/tmp/a/../b")),
    Case("log-dir-relative", "SITESTACK_LOG_DIR", args=("provision", "--site", "local", "--tags", "layout"),
         extra_env={"SITESTACK_LOG_DIR": "rel-logs"}),
    Case("log-dir-is-a-file", "SITESTACK_LOG_DIR", args=("provision", "--site", "local", "--tags", "layout"),
         extra_env={"SITESTACK_LOG_DIR": str(REPO / "README.md")}),
    Case("build-cache-relative", "SITESTACK_BUILD_CACHE", args=("build-mpi4py", "--site", "local", "--check"),
         extra_env={"SITESTACK_BUILD_CACHE": "rel-cache"}),
    Case("jobs-padded", "--jobs", args=("build-mpi4py", "--site", "local", "--check", "--jobs", " 3 ")),
    Case("jobs-other-digits", "--jobs", args=("build-mpi4py", "--site", "local", "--check", "--jobs", "\u0663")),
    Case("source-missing", "--source", args=("build-mpi4py", "--site", "local", "--check", "--source", "/nonexistent.tgz")),
    Case("mirror-missing", "--mirror", args=("build-mpi4py", "--site", "local", "--check", "--mirror", "/nonexistent")),
    # the operator conventions (docs/cli.md)
    Case("limit-typo", "--limit", args=("provision", "--site", "local", "--check", "--limit", "locahost"), expect="--host"),
    Case("limit-injection", "--limit", args=("provision", "--site", "local", "--check", "--limit", "a\nb")),
    Case("forks-abc", "--forks", args=("provision", "--site", "local", "--check", "--forks", "abc")),
    Case("forks-zero", "--forks", args=("provision", "--site", "local", "--check", "--forks", "0")),
    Case("start-at-unknown", "--start-at", args=("provision", "--site", "local", "--check", "--start-at", "nope")),
    Case("rebuild-unknown", "--rebuild", args=("provision", "--site", "local", "--check", "--rebuild", "mpi4pi")),
    Case("json-newline", "--json", args=("provision", "--site", "local", "--check", "--json", "/tmp/a\nb")),
    Case("json-directory", "--json", args=("provision", "--site", "local", "--check", "--json", "/tmp")),
    Case("gc-size-abc", "--max-size", args=("gc", "--max-size", "lots")),
    Case("gc-age-negative", "--max-age", args=("gc", "--max-age", "-1")),
    Case("uninstall-dotdot", "NAME", args=("uninstall", "../x", "--site", "local")),
    Case("ssh-config-missing", "SITESTACK_SSH_CONFIG", args=("provision", "--site", "local", "--check", "--host", "farhost"),
         extra_env={"SITESTACK_SSH_CONFIG": "/nonexistent/ssh_config"}),
]


# 4. paths in recipes and source tarballs: build-recipe with a recipe of our own (--sources-dir)
def evil_tarball(root: Path, kind: str) -> Path:
    """A source tarball that tries to escape: a top-level symlink, a ../ member, an absolute member."""
    import io
    import tarfile

    out = root / f"evil-{kind}.tar.gz"
    with tarfile.open(out, "w:gz") as tar:
        def add(name: str, data: bytes = b"x", link: str | None = None) -> None:
            info = tarfile.TarInfo(name)
            if link is not None:
                info.type, info.linkname = tarfile.SYMTYPE, link
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        if kind == "symlink-top":
            add("evil-1.0", link="/tmp")
        elif kind == "symlink-top-dot":     # inside the unpack directory: the data filter lets it through
            add("evil-1.0", link=".")
        elif kind == "symlink-top-sibling":
            add("evil-1.0-real/configure")
            add("./evil-1.0", link="evil-1.0-real")
        elif kind == "dotdot":
            add("evil-1.0/configure")
            add("evil-1.0/../../../escaped")
        elif kind == "absolute":
            add("/tmp/evil-absolute")
        elif kind == "link-out":
            add("evil-1.0/configure")
            add("evil-1.0/out", link="../../../../etc")
    return out


def recipe_text(version: str = "1.0", filename: str | None = None, sha: str = "0" * 64) -> str:
    lines = ["name: evil", "description: a recipe of the hostile corpus", "homepage: https://example.invalid/evil",
             "build: autotools", f'default_version: "{version}"', "versions:", f'  "{version}":',
             "    url: https://example.invalid/evil-{version}.tar.gz", f"    sha256: {sha}"]
    if filename is not None:
        lines.append(f'    filename: "{filename}"')
    lines.append("sanity: [bin/evil]")
    return "\n".join(lines) + "\n"


RECIPE_CASES = [
    ("recipe-filename-dotdot", r"evil\.yml:\d+: versions\.1\.0", {"filename": "../../x.tar.gz"}, None),
    ("recipe-filename-slash", r"evil\.yml:\d+: versions\.1\.0", {"filename": "a/b.tar.gz"}, None),
    ("recipe-version-key-dotdot", r"evil\.yml:\d+: versions\.", {"version": "../../x"}, None),
    ("recipe-version-key-slash", r"evil\.yml:\d+: versions\.", {"version": "1.0/x"}, None),
    ("tarball-top-symlink", r"--source", {}, "symlink-top"),
    ("tarball-top-symlink-dot", r"--source: .*top-level member 'evil-1\.0' is a link", {}, "symlink-top-dot"),
    ("tarball-top-symlink-sibling", r"--source: .*top-level member '\./evil-1\.0' is a link", {}, "symlink-top-sibling"),
    ("tarball-dotdot-member", r"--source", {}, "dotdot"),
    ("tarball-absolute-member", r"--source", {}, "absolute"),
    ("tarball-link-outside", r"--source", {}, "link-out"),
]


@pytest.mark.parametrize("case", RECIPE_CASES, ids=lambda c: c[0])
def test_hostile_recipes_and_tarballs_are_refused(case: tuple[str, str, dict[str, str], str | None], tmp_path: Path,
                                                  repo_before: str):
    from tests.recipe_projects import sha256

    name, where, recipe_args, tar_kind = case
    home, cwd, prefix, sources = (tmp_path / n for n in ("home", "cwd", "prefix", "sources"))
    for d in (home, cwd, sources):
        d.mkdir()
    args = ["build-recipe", "evil", "--site", "local", "--sources-dir", str(sources), "--prefix", str(prefix)]
    if tar_kind:
        tarball = evil_tarball(tmp_path, tar_kind)
        (sources / "evil.yml").write_text(recipe_text(sha=sha256(tarball)))
        args += ["--source", str(tarball)]
    else:
        (sources / "evil.yml").write_text(recipe_text(**recipe_args))
    env = {**os.environ, "HOME": str(home)}
    env.pop("SITESTACK_LOG_DIR", None)
    result = subprocess.run([sys.executable, "-m", "invoke", "--search-root", str(REPO), *args], cwd=cwd, env=env,
                            text=True, capture_output=True, timeout=120)
    message = result.stderr.strip()
    assert result.returncode == 1 and "Traceback" not in result.stdout + message, result.stdout + message
    assert len(message.splitlines()) == 1 and re.search(where, message), message
    assert result.stdout == ""
    assert tree(home) == [] and tree(cwd) == [] and not prefix.exists()
    assert not Path("/tmp/evil-absolute").exists() and not (tmp_path.parent / "escaped").exists()
    assert git_status() == repo_before


def run_case(case: Case, tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], dict[str, Path]]:
    home, cwd, prefix, book_dir = (tmp_path / n for n in ("home", "cwd", "prefix", "book"))
    for d in (home, cwd, book_dir):
        d.mkdir()
    mark = str(tmp_path / MARK)
    args = [a.replace("MARKFILE", mark) for a in case.args]
    if case.edit or case.raw:
        text = (REPO / "playbooks" / f"{case.site}.yml").read_text()
        if case.edit:
            data = copy.deepcopy(yaml.safe_load(text))
            case.edit(data, mark)
            text = yaml.safe_dump(data, sort_keys=False, allow_unicode=False)
        if case.raw:
            text = case.raw(text)
        book = book_dir / f"{case.site}.yml"
        book.write_text(text)
        args += ["--playbook", str(book)]
        if "--check" not in args:
            args += ["--tags", "layout"]   # applying: the steps that write, if the input got through
    if "--prefix" not in case.args and case.args[0] not in ("validate", "show-site", "gc"):
        args += ["--prefix", str(prefix)]
    env = {k: v for k, v in os.environ.items() if k not in ("SITESTACK_LOG_DIR", "SITESTACK_ACCOUNT")}
    env.update({"HOME": str(home), **case.extra_env})
    result = subprocess.run([sys.executable, "-m", "invoke", "--search-root", str(REPO), *args], cwd=cwd, env=env, text=True,
                            capture_output=True, timeout=120)
    return result, {"home": home, "cwd": cwd, "prefix": prefix, "mark": Path(mark)}


def git_status() -> str:
    return subprocess.run(["git", "status", "--porcelain", "--untracked-files=all", "--", "."],
                          cwd=REPO, capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def repo_before() -> str:
    return git_status()


def test_the_corpus_covers_every_class():
    assert len(PLAYBOOK_CASES) + len(CLI_CASES) + len(RECIPE_CASES) >= 60
    assert len({c.id for c in PLAYBOOK_CASES + CLI_CASES}) == len(PLAYBOOK_CASES) + len(CLI_CASES)


@pytest.mark.parametrize("case", PLAYBOOK_CASES + CLI_CASES, ids=lambda c: c.id)
def test_hostile_input_is_refused_cleanly(case: Case, tmp_path: Path, repo_before: str):
    result, paths = run_case(case, tmp_path)
    assert_refused_cleanly(case, result, paths, repo_before)


def assert_refused_cleanly(case: Case, result: subprocess.CompletedProcess[str], paths: dict[str, Path],
                           repo_before: str) -> None:
    """The corpus's one assertion: exit 1, one ``error:`` line naming ``case.where``, no traceback,
    nothing on stdout, nothing written to HOME, the current directory or the prefix, no marker, the
    checkout unchanged. The other ``test_hostile_*`` files use it for their own classes."""
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "Traceback" not in output, output
    message = result.stderr.strip()
    assert len(message.splitlines()) == 1, message
    assert message.startswith("error: "), message
    assert re.search(case.where, message), (case.where, message)
    assert case.expect in message, (case.expect, message)
    assert result.stdout == "", result.stdout   # refused before anything was planned or run
    assert tree(paths["home"]) == [] and tree(paths["cwd"]) == [] and not paths["prefix"].exists()
    assert not paths["mark"].exists()
    assert git_status() == repo_before


# -- values that are accepted, and must stay inert ------------------------------------------------------
HOSTILE_VALUES = ["$(touch {mark})", "`touch {mark}`", "'; touch {mark}; '", '"; touch {mark}; "',
                  "]]; os.execute('touch {mark}') --[[", "}} ; exec touch {mark} ; {{", "$((1+1))$$\\"]


def expected(value: str, mark: Path) -> str:
    """What a hostile value is in the environment: itself (``{{``/``}}`` are braces in playbooks)."""
    return value.replace("{mark}", str(mark)).replace("{{", "{").replace("}}", "}")


def hostile_book(tmp_path: Path, mark: Path) -> Path:
    """The local playbook with hostile (but one-line) values in facts.env, where they are legitimate."""
    data = yaml.safe_load((REPO / "playbooks" / "local.yml").read_text())
    data["facts"]["env"] = {f"SITESTACK_HOSTILE_{i}": v.replace("{mark}", str(mark)) for i, v in enumerate(HOSTILE_VALUES)}
    data["facts"]["env"]["SITESTACK_REF"] = "$HOME/x:$USER"
    data["facts"]["scheduler"]["options"] = ["--comment=$(touch " + str(mark) + ")"]
    book = tmp_path / "book" / "local.yml"
    book.parent.mkdir(parents=True, exist_ok=True)
    book.write_text(yaml.safe_dump(data, sort_keys=False))
    return book


def test_hostile_env_values_stay_inert_in_the_batch_script(tmp_path: Path):
    from sitestack.engine import playbook as pb
    from sitestack.installs.site_stack import job_inputs
    from sitestack.validation.jobs import render_job

    mark = tmp_path / MARK
    site = pb.load(path=hostile_book(tmp_path, mark))
    ctx = offline_context(site, home=str(tmp_path), user="alice")
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    for tool in ("sbatch", "srun", "mpiexec", "torchrun", "python3", "scontrol", "squeue"):
        (stubs / tool).write_text("#!/bin/sh\nexit 0\n")
        (stubs / tool).chmod(0o755)
    for launcher in ("srun", "mpiexec", "torchrun"):
        script = tmp_path / f"{launcher}.sbatch"
        script.write_text(render_job(job_inputs(ctx, str(tmp_path / "job"), "python3"), launcher))
        env = {"PATH": f"{stubs}:/usr/bin:/bin", "HOME": str(tmp_path), "SLURM_JOB_ID": "42", "SLURM_NNODES": "1",
               "SLURM_JOB_NODELIST": "localhost", "SITESTACK_VALIDATION_OUT": str(tmp_path / "out")}
        run = subprocess.run(["bash", str(script)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert not mark.exists(), (launcher, run.stdout, run.stderr)
        export = subprocess.run(["bash", "-c", f'source <(grep "^export SITESTACK_HOSTILE" {script}); env'], env=env,
                                capture_output=True, text=True, timeout=60)
        for i, value in enumerate(HOSTILE_VALUES):
            assert f"SITESTACK_HOSTILE_{i}={expected(value, mark)}" in export.stdout, export.stdout
        assert not mark.exists()


@pytest.mark.skipif(not Path("/usr/share/lmod/lmod/init/bash").exists(), reason="Lmod is installed by scripts/test.sh")
def test_hostile_env_values_stay_inert_in_lmod(tmp_path: Path):
    from sitestack.engine import playbook as pb
    from sitestack.installs.modulefile_render import render
    from sitestack.installs.modulefile_specs import site_modules
    from sitestack.installs.venv_stack import stack_for

    mark = tmp_path / MARK
    site = pb.load(path=hostile_book(tmp_path, mark))
    ctx = offline_context(site, home=str(tmp_path), user="alice", account="proj")
    for fmt in ("lua", "tcl"):
        root = tmp_path / f"modules-{fmt}"
        for spec in site_modules(ctx, stack_for(ctx), [], requires=()):
            path = root / spec.relpath(fmt)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(render(spec, fmt))
        name = site_modules(ctx, stack_for(ctx), [], requires=())[0].relpath(fmt).removesuffix(".lua")
        script = (f". /usr/share/lmod/lmod/init/bash; module use {root}; module load {name} || exit 3; "
                  "env | grep ^SITESTACK_HOSTILE_")
        run = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60,
                             env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "USER": "alice"})
        assert run.returncode == 0, run.stdout + run.stderr
        assert not mark.exists(), (fmt, run.stdout, run.stderr)
        for i, value in enumerate(HOSTILE_VALUES):
            assert f"SITESTACK_HOSTILE_{i}={expected(value, mark)}" in run.stdout, (fmt, run.stdout)


def test_a_quote_in_a_module_name_cannot_break_out_of_the_prelude(tmp_path: Path):
    """The prelude runs during --check; a module name with quotes must only fail to load."""
    from sitestack.engine import playbook as pb
    from sitestack.model.siteenv import in_site_env

    mark = tmp_path / MARK
    data = yaml.safe_load((REPO / "playbooks" / "local.yml").read_text())
    data["facts"]["modules"]["load"] = [f"x'; touch {mark}; echo '", f'y"; touch {mark}; "']
    book = tmp_path / "book" / "local.yml"
    book.parent.mkdir()
    book.write_text(yaml.safe_dump(data, sort_keys=False))
    site = pb.load(path=book)
    ctx = offline_context(site, home=str(tmp_path), user="alice")
    fake = tmp_path / "init"
    fake.write_text("module() { return 1; }\n")  # every load fails, as an unknown module does
    facts = ctx.facts
    import dataclasses
    facts = dataclasses.replace(facts, modules=dataclasses.replace(facts.modules, init=str(fake)))
    run = subprocess.run(in_site_env(facts, ["true"]), capture_output=True, text=True, timeout=60)
    assert run.returncode != 0 and "cannot load module x'; touch" in run.stderr, run.stderr
    assert not mark.exists()
    check = subprocess.run([sys.executable, "-m", "invoke", "provision", "--playbook", str(book), "--check",
                            "--prefix", str(tmp_path / "p"), "--tags", "preflight"], cwd=REPO, capture_output=True,
                           text=True, timeout=120)
    assert "Traceback" not in check.stdout + check.stderr
    assert not mark.exists()


# -- permissions: installed trees do not depend on the admin's umask -----------------------------------------
def modes(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): stat.filemode(p.lstat().st_mode) for p in sorted([root, *root.rglob("*")])}


def test_installs_have_the_same_modes_under_any_umask(tmp_path: Path):
    """The prefix layout and the site facts under umask 000 and 077 are as under 022."""
    seen = {}
    for umask in ("022", "000", "077"):
        prefix = tmp_path / f"prefix-{umask}"
        home = tmp_path / f"home-{umask}"
        home.mkdir()
        run = subprocess.run(["bash", "-c", f'umask {umask}; exec "$@"', "bash", sys.executable, "-m", "invoke",
                              "provision", "--site", "local", "--tags", "layout", "--prefix", str(prefix)],
                             cwd=REPO, capture_output=True, text=True, timeout=300,
                             env={**os.environ, "HOME": str(home)})
        assert run.returncode == 0, run.stdout + run.stderr
        seen[umask] = modes(prefix)
        logs = home / ".cache" / "sitestack"
        assert stat.S_IMODE(logs.stat().st_mode) & 0o077 == 0, "caches and logs are private to the user"
    assert seen["000"] == seen["022"] == seen["077"], seen
    assert all(m[7:] in ("r-x", "r--") for m in seen["022"].values()), seen["022"]



def test_a_group_shared_install_is_owned_by_the_group_and_group_writable(tmp_path: Path):
    """facts.install: {group, mode: group-write}: the tree is the group's, directories setgid and
    group-writable, under any umask; a second run changes nothing."""
    import grp

    group = grp.getgrgid(os.getgid()).gr_name
    data = yaml.safe_load((REPO / "playbooks" / "local.yml").read_text())
    data["facts"]["install"] = {"group": group, "mode": "group-write"}
    book = tmp_path / "book" / "local.yml"
    book.parent.mkdir()
    book.write_text(yaml.safe_dump(data, sort_keys=False))
    prefix = tmp_path / "prefix"
    argv = ["bash", "-c", 'umask 077; exec "$@"', "bash", sys.executable, "-m", "invoke", "provision", "--playbook",
            str(book), "--tags", "layout", "--prefix", str(prefix)]
    env = {**os.environ, "SITESTACK_LOG_DIR": str(tmp_path / "logs")}
    first = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    for path in [prefix, *prefix.rglob("*")]:
        info = path.lstat()
        assert info.st_gid == os.getgid(), path
        if path.is_dir() and path.name != "lock.d":
            assert info.st_mode & 0o2070 == 0o2070, (path, oct(info.st_mode))
    assert (prefix / "share" / "sitestack" / "site.json").stat().st_mode & 0o044 == 0o044
    second = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert second.returncode == 0 and " changed " not in second.stdout.split("RECAP")[0], second.stdout


def test_a_missing_install_group_is_refused_before_anything_is_made(tmp_path: Path):
    data = yaml.safe_load((REPO / "playbooks" / "local.yml").read_text())
    data["facts"]["install"] = {"group": "no-such-group-here", "mode": "group-write"}
    book = tmp_path / "book" / "local.yml"
    book.parent.mkdir()
    book.write_text(yaml.safe_dump(data, sort_keys=False))
    prefix = tmp_path / "prefix"
    for extra in ((), ("--check",)):
        run = subprocess.run([sys.executable, "-m", "invoke", "provision", "--playbook", str(book), "--prefix", str(prefix),
                              *extra], cwd=REPO, capture_output=True, text=True, timeout=300,
                             env={**os.environ, "SITESTACK_LOG_DIR": str(tmp_path / "logs")})
        text = run.stdout + run.stderr
        assert run.returncode == 1 and "facts.install.group: there is no group 'no-such-group-here' on localhost" in text, text
        assert "Traceback" not in text and not prefix.exists()


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="runs the check as another user")
def test_the_group_check_knows_members_from_others():
    """The check run before any step: root may give files to any group, another user only to its own."""
    from sitestack.engine.playbook import _GROUP_CHECK

    def rc(group: str, *as_nobody: str) -> int:
        return subprocess.run([*as_nobody, "sh", "-c", _GROUP_CHECK, "sh", group], timeout=30).returncode

    nobody = ("setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups")
    assert (rc("nogroup", *nobody), rc("root", *nobody), rc("root"), rc("no-such-group-here")) == (0, 4, 0, 3)


@pytest.mark.skipif(os.geteuid() != 0, reason="gives the tree to another group: needs root")
def test_a_group_shared_prefix_behind_a_symlink_is_shared_and_links_inside_are_not_followed(tmp_path: Path):
    """Sites often reach the prefix through a symlink (/appl/local/x -> /pfs/...): the group goes
    to the tree behind it; a symlink inside the prefix to somewhere else changes nothing there."""
    import grp

    group = grp.getgrgid(65534).gr_name  # Debian's nogroup: not the caller's group
    data = yaml.safe_load((REPO / "playbooks" / "local.yml").read_text())
    data["facts"]["install"] = {"group": group, "mode": "group-write"}
    book = tmp_path / "book" / "local.yml"
    book.parent.mkdir()
    book.write_text(yaml.safe_dump(data, sort_keys=False))
    real, outside = tmp_path / "pfs" / "prefix", tmp_path / "outside"
    real.mkdir(parents=True)
    outside.mkdir()
    (outside / "f").write_text("x")
    (real / "elsewhere").symlink_to(outside)
    prefix = tmp_path / "prefix"
    prefix.symlink_to(real)
    argv = [sys.executable, "-m", "invoke", "provision", "--playbook", str(book), "--tags", "layout",
            "--prefix", str(prefix)]
    env = {**os.environ, "SITESTACK_LOG_DIR": str(tmp_path / "logs")}
    run = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    inside = [real, *(p for p in real.rglob("*") if p.name != "elsewhere")]
    assert len(inside) > 3 and all(p.lstat().st_gid == 65534 for p in inside), \
        [(str(p), p.lstat().st_gid) for p in inside if p.lstat().st_gid != 65534]
    assert all(p.lstat().st_mode & 0o2000 for p in inside if p.is_dir() and p.name != "lock.d")
    for p in (outside, outside / "f"):
        assert p.stat().st_gid == os.getgid() and not p.stat().st_mode & 0o2000, p


def test_hostile_paths_stay_inert_in_the_activate_script(tmp_path: Path):
    """Quotes, $(...) and backticks in the module system's paths and the prefix reach
    extend-venv-activate's configuration; sourcing the extended activate in real bash (and
    deactivating) runs none of them."""
    import io
    import venv as venv_mod

    from sitestack.actions.venv_hook import hook_config
    from sitestack.engine import playbook as pb
    from sitestack.installs.venv_stack import stack_for
    from sitestack.onsite import activate_hook as hook

    mark = tmp_path / MARK
    evil = f"'$(touch {mark})`touch {mark}`\"; touch {mark}; \""
    data = yaml.safe_load((REPO / "playbooks" / "local.yml").read_text())
    data["facts"]["modules"]["init"] = f"/tmp/init{evil}/bash"
    data["facts"]["modules"]["use"] = [f"/tmp/use {evil}"]
    book = tmp_path / "book" / "local.yml"
    book.parent.mkdir()
    book.write_text(yaml.safe_dump(data, sort_keys=False))
    site = pb.load(path=book)
    ctx = offline_context(site, home=str(tmp_path), user="alice", prefix=f"/tmp/prefix {evil}")
    config = hook_config(ctx, stack_for(ctx))
    user_venv = tmp_path / "myenv"
    venv_mod.create(user_venv, with_pip=False)
    hook.extend(str(user_venv), config, out=io.StringIO())
    script = f'. {user_venv}/bin/activate; echo "active=$VIRTUAL_ENV"; deactivate; echo done'
    run = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert "done" in run.stdout, run.stdout + run.stderr
    assert not mark.exists(), run.stdout + run.stderr
