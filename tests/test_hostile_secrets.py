"""Secrets never stored or shown: an index URL's credentials (``user:password@``, ``token@``, a
``?token=`` query) given to ``pack-env`` (in the requirements file) and to ``install-venv`` /
``show-site`` (facts.torch.index_url) appear in no file under HOME, the prefix, the caches and the
logs, on no console (success and failure), in no ``--json`` document; pip gets them by environment
(a real HTTP index with Basic authentication, started here, serves the wheels only to a client that
sends them); a changed password still changes the install's stamp."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import http.server
import json
import os
import re
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sitestack.core.host import LocalHost
from sitestack.core.hostbase import Host
from sitestack.core.redact import fingerprint, redact, redact_data, split_credentials
from tests.conftest import playbook_copy, run_invoke, uv_dir
from tests.test_site_fixes import make_wheel
from tests.twins import runtime as twin

SECRET = "S3cr3tPASS"
OTHER = "N3wS3cr3tPASS"
USERS = {("alice", SECRET), ("alice", OTHER), ("tok" + SECRET, "")}
needs_twin = pytest.mark.skipif(twin.available() is not None, reason=f"stand-in runtime: {twin.available()}")


class Index:
    """A PEP 503 index at ``/simple/`` and ``/extra/`` serving the wheels in ``wheels`` to clients that
    send Basic authentication of one of :data:`USERS`; ``/simple/torch/`` answers 500 when ``broken``."""

    def __init__(self, wheels: Path) -> None:
        self.wheels, self.broken, self.served, self.refused = wheels, False, [], []
        index = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:  # noqa: N802 - http.server's name
                self.do_GET(body=False)

            def do_GET(self, body: bool = True) -> None:  # noqa: N802 - http.server's name
                header = self.headers.get("Authorization", "")
                try:
                    user, _, password = base64.b64decode(header.removeprefix("Basic ")).decode().partition(":")
                except ValueError:
                    user = password = ""
                if (user, password) not in USERS:
                    index.refused.append(self.path)
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="sitestack"')
                    self.end_headers()
                    return
                index.served.append(self.path)
                code, text = index.page(self.path)
                self.send_response(code)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(text)))
                self.end_headers()
                if body:
                    self.wfile.write(text)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def page(self, path: str) -> tuple[int, bytes]:
        parts = [p for p in path.split("?")[0].split("/") if p]
        if parts[:1] == ["files"] and len(parts) == 2 and (self.wheels / parts[1]).is_file():
            return 200, (self.wheels / parts[1]).read_bytes()
        if len(parts) == 2 and parts[0] in ("simple", "extra"):
            if parts[1] == "torch" and self.broken:
                return 500, b"broken"
            links = [w.name for w in sorted(self.wheels.glob("*.whl"))
                     if w.name.split("-")[0].replace("_", "-") == parts[1] and (parts[0] == "simple") == ("extra" not in w.name)]
            if links:
                return 200, "".join(f'<a href="/files/{n}">{n}</a>\n' for n in links).encode()
        return 404, b"not found"

    def url(self, path: str = "simple", who: str = f"alice:{SECRET}") -> str:
        return f"http://{who}@127.0.0.1:{self.port}/{path}"


@pytest.fixture
def index(tmp_path: Path) -> Iterator[Index]:
    wheels = tmp_path / "wheels"
    make_wheel(wheels, "sitestack_twin_secret", "1.0")
    make_wheel(wheels, "sitestack_twin_extra", "1.0")
    make_wheel(wheels, "sitestack_twin_direct", "1.0")
    served = Index(wheels)
    yield served
    served.server.shutdown()


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A HOME of the test's own (pip's cache and sitestack's land there, to be searched)."""
    path = tmp_path / "home"
    path.mkdir()
    monkeypatch.setenv("HOME", str(path))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("SITESTACK_LOG_DIR", str(tmp_path / "logs"))
    return path


def files_with(secret: str, *roots: Path, but: tuple[Path, ...] = ()) -> list[str]:
    """Every file under ``roots`` (hidden ones included, not following links) whose bytes hold ``secret``."""
    found = []
    for root in roots:
        for top, dirs, files in os.walk(root):
            dirs[:] = [d for d in dirs if not os.path.ismount(os.path.join(top, d))]
            for name in files:
                path = Path(top, name)
                if path in but or path.is_symlink() or not path.is_file():
                    continue
                if secret.encode() in path.read_bytes():
                    found.append(str(path))
    return found


def assert_no_secret(result: subprocess.CompletedProcess[str], *roots: Path, but: tuple[Path, ...] = (),
                     secrets: tuple[str, ...] = (SECRET, OTHER)) -> None:
    for secret in secrets:
        assert secret not in result.stdout + result.stderr, result.stdout + result.stderr
        assert files_with(secret, *roots, but=but) == []
    assert "Traceback" not in result.stderr


# -- the one implementation ----------------------------------------------------------------------------------
def test_redact_keeps_scheme_host_and_path_and_hides_any_userinfo() -> None:
    assert redact(f"--extra-index-url https://bob:{SECRET}@pypi.example.org/simple") == \
        "--extra-index-url https://***@pypi.example.org/simple"
    assert redact(f"https://{SECRET}@h.example/simple x") == "https://***@h.example/simple x"
    assert redact(f"https://u:{SECRET}@with@at@h/s") == "https://***@h/s"
    assert redact(f"https://h/simple?token={SECRET}&v=1") == "https://h/simple?token=***&v=1"
    assert redact(f"https://conda.anaconda.org/t/{SECRET}/chan") == "https://conda.anaconda.org/t/***/chan"
    assert redact("git+ssh://git@github.com/o/r.git user@example.org https://h/a@b") == \
        "git+ssh://git@github.com/o/r.git user@example.org https://h/a@b"
    assert redact(f"SITESTACK_INDEX_CREDENTIALS_1=alice:{SECRET}") == "SITESTACK_INDEX_CREDENTIALS_1=***"
    assert redact_data({"a": [f"https://u:{SECRET}@h/s", 3], f"https://{SECRET}@k": None}) == \
        {"a": ["https://***@h/s", 3], "https://***@k": None}
    assert split_credentials(f"https://u:{SECRET}@h/s") == ("https://h/s", f"u:{SECRET}")
    assert split_credentials("https://h/s") == ("https://h/s", None)
    # a stamp's fingerprint: follows the password, does not hold it, none without a secret
    a, b = fingerprint([f"https://u:{SECRET}@h/s"]), fingerprint([f"https://u:{OTHER}@h/s"])
    assert a and b and a != b and SECRET not in a and fingerprint(["https://h/s"]) is None
    # linear on hostile input
    redact("https://" + "a" * 300_000)
    redact("a://" * 100_000 + "@")


def test_a_failed_commands_message_is_redacted() -> None:
    from sitestack.core.errors import CommandFailed
    exc = CommandFailed(["pip", "install"], 1, f"Looking in indexes: https://tok{SECRET}@h/simple\nERROR: no")
    assert SECRET not in str(exc) and "https://***@h/simple" in str(exc)


def test_pip_gets_credentials_by_environment_with_its_own_semantics() -> None:
    """--index-url -> PIP_INDEX_URL; extras -> PIP_EXTRA_INDEX_URL after pip's configured ones (the
    variable replaces them, the option adds to them); a direct URL -> ${VAR}; uv -> all its indexes."""
    from sitestack.core.pip_auth import Configured, pip_auth, uv_auth
    from sitestack.engine import playbook as pb
    from sitestack.packages.horovod import build_env_commands

    asked = []

    def configured() -> Configured:
        asked.append(1)
        return Configured(extra_index_urls=("https://site.example/extra",))

    auth = pip_auth(["--pre", "--index-url", f"https://u:{SECRET}@i/simple", "--extra-index-url", "https://plain/x",
                     "--extra-index-url", f"https://tok{SECRET}@e/simple"],
                    ["six", f"pkg @ https://u:{SECRET}@h/pkg-1.0-py3-none-any.whl"], configured)
    assert auth.options == ["--pre", "--extra-index-url", "https://plain/x"]
    assert auth.env["PIP_INDEX_URL"] == f"https://u:{SECRET}@i/simple"
    assert auth.env["PIP_EXTRA_INDEX_URL"] == f"https://site.example/extra https://tok{SECRET}@e/simple"
    assert auth.lines == ["six", "pkg @ https://${SITESTACK_INDEX_CREDENTIALS_1}@h/pkg-1.0-py3-none-any.whl"]
    assert auth.env["SITESTACK_INDEX_CREDENTIALS_1"] == f"u:{SECRET}"
    assert pip_auth(["--extra-index-url", "https://plain/x"], [], configured).env == {} and len(asked) == 1
    argv, env = uv_auth(["uv", "--index-url", "https://a/s", "--extra-index-url", f"https://u:{SECRET}@b/s", "--no-deps"])
    assert argv == ["uv", "--no-deps"] and env == {"UV_INDEX_URL": "https://a/s", "UV_EXTRA_INDEX_URL": f"https://u:{SECRET}@b/s"}
    # Horovod's build environment: the torch line's index from the facts, the same way
    facts = pb.load("frontier").facts
    facts = dataclasses.replace(facts, torch=dataclasses.replace(facts.torch, index_url=f"https://u:{SECRET}@i/rocm"))
    for argv in build_env_commands("python3", "/env", facts):
        moved = pip_auth(argv, (), configured)
        assert not any(SECRET in word for word in moved.options)


class Recording(LocalHost):
    """This machine, keeping every shell line it runs."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def _exec(self, line: str, **kwargs: object) -> object:
        self.lines.append(line)
        return super()._exec(line, **kwargs)


class Remote(Host):
    """A host reached through a shell (as over SSH): files written with the shell's tools, so secrets
    take the private-file path of :meth:`Host.run`."""

    def __init__(self) -> None:
        from invoke.context import Context
        super().__init__("remote", Context())
        self.lines: list[str] = []

    def _exec(self, line: str, **kwargs: object) -> object:
        self.lines.append(line)
        return super()._exec(line, **kwargs)

    def write_text(self, path: str, text: str, mode: int = 0o644) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        self.written = (path, os.stat(path).st_mode & 0o777, os.stat(os.path.dirname(path)).st_mode & 0o777)


def test_secrets_reach_the_command_by_environment_and_no_command_line(tmp_path: Path) -> None:
    local = Recording()
    out = local.run(["sh", "-c", 'printf %s "$PIP_INDEX_URL"'], secrets={"PIP_INDEX_URL": f"https://u:{SECRET}@h/s"})
    assert out.stdout == f"https://u:{SECRET}@h/s" and not any(SECRET in line for line in local.lines)
    assert local.probe(["sh", "-c", 'printf %s "$X"'], secrets={"X": SECRET}).stdout == SECRET
    remote = Remote()
    out = remote.run(["sh", "-c", 'printf %s "$X" | sha256sum'], secrets={"X": SECRET}, log=tmp_path / "log")
    assert out.stdout.split()[0] == hashlib.sha256(SECRET.encode()).hexdigest()
    assert not any(SECRET in line for line in remote.lines)
    path, mode, parent = remote.written
    assert mode == 0o600 and parent == 0o700 and not os.path.exists(os.path.dirname(path))  # removed after
    assert remote.probe(["sh", "-c", 'printf %s "$X"'], secrets={"X": SECRET}).stdout == SECRET
    assert SECRET not in (tmp_path / "log").read_text()


# -- install-venv: facts.torch.index_url with credentials -------------------------------------------------------
@pytest.mark.parametrize("installer, index_only", [("pip", False), ("pip", True), ("uv", False)])
def test_the_stack_env_gets_the_credentials_by_environment(tmp_path: Path, index: Index, home: Path,
                                                          installer: str, index_only: bool,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """pip (and uv) install from an index that needs the credentials; no command line, log or report
    holds them."""
    from sitestack.engine import playbook as pb
    from sitestack.installs.venv_env import EnvTools
    from sitestack.installs.venv_stack import Base, Stack

    venv = tmp_path / "venv"
    subprocess.run(["python3", "-m", "venv", str(venv)], check=True)
    if installer == "uv":
        monkeypatch.setenv("PATH", f"{uv_dir(tmp_path)}{os.pathsep}{os.environ['PATH']}")
    stack = Stack(site="t", name="pytorch/t", path=str(venv), source="system", python_version="3.11",
                  requirements=("sitestack-twin-secret==1.0",), extras=(), checks=(), index_url=index.url(),
                  system_site_packages=False, compile=False, index_only=index_only, installer=installer)
    host = Recording()
    log = tmp_path / "logs" / "pip.log"
    tools = EnvTools(host, stack, Base(pb.load("local").facts, stack, str(tmp_path)), log, report=lambda s: None)
    tools.pip_install(str(venv), ["sitestack-twin-secret==1.0"], str(tmp_path / "report.json"))
    assert list((venv / "lib" / "python3.11" / "site-packages").glob("sitestack_twin_secret-1.0.dist-info"))
    assert any(p.startswith("/files/sitestack_twin_secret") for p in index.served), (index.served, index.refused)
    assert not any(SECRET in line for line in host.lines), host.lines
    assert files_with(SECRET, tmp_path, but=()) == []


def test_install_venv_and_show_site_never_show_the_index_credentials(tmp_path: Path, index: Index, home: Path) -> None:
    index.broken = True   # the index probe fails: the error names the index, redacted
    book = playbook_copy(tmp_path / "book", facts={"torch": {"index_url": index.url()}})
    prefix, doc = tmp_path / "prefix", tmp_path / "out.json"
    out = run_invoke("install-venv", "--playbook", str(book), "--prefix", str(prefix), "--json", str(doc))
    assert out.returncode == 1, out.stdout + out.stderr
    shown = f"wheel index http://***@127.0.0.1:{index.port}/simple cannot be reached from localhost: HTTP 500"
    assert shown in out.stdout, out.stdout
    assert "/simple/torch/" in index.served  # the probe sent the credentials (the server answered 500, not 401)
    assert_no_secret(out, home, prefix, tmp_path / "logs", doc, but=(book,))
    # unreachable: the same
    book = playbook_copy(tmp_path / "book2", facts={"torch": {"index_url": f"http://tok{SECRET}@127.0.0.1:9/simple"}})
    out = run_invoke("install-venv", "--playbook", str(book), "--prefix", str(prefix), "--check", "--json", "-")
    assert out.returncode == 1 and "http://***@127.0.0.1:9/simple" in out.stdout, out.stdout + out.stderr
    assert_no_secret(out, home, prefix, tmp_path / "logs", but=(book,))
    for args in (["--json", "-"], ["--format", "json"], []):
        shown_site = run_invoke("show-site", "--playbook", str(book), *args)
        assert shown_site.returncode == 0 and "http://***@127.0.0.1:9/simple" in shown_site.stdout, shown_site.stderr
        assert_no_secret(shown_site, home)


def test_the_stack_plan_keeps_a_fingerprint_not_the_password() -> None:
    from dataclasses import replace

    from sitestack.engine import playbook as pb
    from sitestack.installs.venv_manifest import explain, plan_for
    from sitestack.installs.venv_stack import Stack

    stack = Stack(site="t", name="pytorch/t", path="/p", source="system", python_version="3.11",
                  requirements=("torch==2.13.0",), extras=(), checks=(), index_url=f"https://alice:{SECRET}@h/simple",
                  system_site_packages=False, compile=False)
    facts = pb.load("local").facts
    plan = plan_for(stack, facts, [])
    changed = plan_for(replace(stack, index_url=f"https://alice:{OTHER}@h/simple"), facts, [])
    assert SECRET not in json.dumps(plan) and plan["index_url"] == "https://***@h/simple"
    assert plan != changed and explain(plan, changed) == "index https://***@h/simple: credentials changed"
    assert plan == plan_for(stack, facts, [])
    assert "index_credentials" not in plan_for(replace(stack, index_url="https://h/simple"), facts, [])


# -- pack-env: the requirements file's index options with credentials -------------------------------------------
def pack(tmp_path: Path, req: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return run_invoke("pack-env", "--site", "local", "--name", "tools", "--requirements", str(req),
                      "--prefix", str(tmp_path / "prefix"), *extra, timeout=300)


def unmount_all(root: Path) -> None:
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4]
        if point.startswith(str(root)):
            subprocess.run(["fusermount3", "-u", "-z", point], capture_output=True)


@needs_twin
def test_pack_env_keeps_no_credentials_and_repacks_when_they_change(tmp_path: Path, index: Index, home: Path) -> None:
    req = tmp_path / "input" / "requirements.txt"
    req.parent.mkdir()

    def write(password: str) -> None:
        req.write_text(f"--index-url {index.url(who='alice:' + password)}\n"
                       f"--extra-index-url {index.url('extra', who='tok' + SECRET)}\n"
                       "sitestack-twin-secret==1.0\nsitestack-twin-extra\n"
                       f"sitestack-twin-direct @ http://alice:{password}@127.0.0.1:{index.port}/files/"
                       "sitestack_twin_direct-1.0-py3-none-any.whl\n")

    write(SECRET)
    prefix, doc = tmp_path / "prefix", tmp_path / "out.json"
    roots = (home, prefix, tmp_path / "logs", doc)
    try:
        first = pack(tmp_path, req, "--json", str(doc))
        assert first.returncode == 0, first.stdout + first.stderr
        assert f"--index-url http://***@127.0.0.1:{index.port}/simple" in first.stdout, first.stdout
        assert_no_secret(first, *roots)
        dest = prefix / "envs" / "tools"
        listing = subprocess.run(["unsquashfs", "-l", str(dest / "env.sqfs")], capture_output=True, text=True).stdout
        for name in ("sitestack_twin_secret.py", "sitestack_twin_extra.py", "sitestack_twin_direct.py"):
            assert name in listing
        # pip's direct_url.json in the image keeps the variable, not its value (PEP 610)
        image = tmp_path / "unpacked"
        subprocess.run(["unsquashfs", "-q", "-d", str(image), str(dest / "env.sqfs")], check=True, capture_output=True)
        assert files_with(SECRET, image) == []
        assert "${SITESTACK_INDEX_CREDENTIALS_1}" in (dest / "requirements.txt").read_text()
        stamp = json.loads((dest / "packed.json").read_text())
        assert stamp["inputs"]["credentials"].startswith("pbkdf2-sha256:")
        again = pack(tmp_path, req)
        assert again.returncode == 0 and "ok       pack-env tools" in again.stdout, again.stdout
        write(OTHER)   # the same index, another password: the stamp's digest changes
        check = pack(tmp_path, req, "--check", "--fail-on-change")
        assert check.returncode == 2 and "inputs changed (credentials)" in check.stdout, check.stdout
        assert_no_secret(check, *roots)
    finally:
        unmount_all(tmp_path)


@needs_twin
def test_a_failing_pip_shows_its_tail_without_the_password(tmp_path: Path, index: Index, home: Path) -> None:
    req = tmp_path / "input" / "requirements.txt"
    req.parent.mkdir()
    req.write_text(f"--extra-index-url {index.url('extra')}?token={SECRET}\n"
                   f"--index-url {index.url()}\nno-such-package-sitestack==1.0\n")
    prefix, doc = tmp_path / "prefix", tmp_path / "out.json"
    try:
        out = pack(tmp_path, req, "--json", str(doc))
        assert out.returncode == 1 and "pip could not install the requirements" in out.stdout, out.stdout + out.stderr
        assert f"http://***@127.0.0.1:{index.port}/simple" in out.stdout   # pip's tail names the index, redacted
        assert "no-such-package-sitestack" in out.stdout
        assert_no_secret(out, home, prefix, tmp_path / "logs", doc)
        assert re.search(r"\[localhost\] failed", out.stdout)
    finally:
        unmount_all(tmp_path)


def test_a_refused_requirement_line_is_shown_redacted(tmp_path: Path, home: Path) -> None:
    req = tmp_path / "requirements.txt"
    req.write_text(f"--extra-index-url https://alice:{SECRET}@h.example/simple extra-word\nsix\n")
    out = pack(tmp_path, req)
    assert out.returncode == 1 and "https://***@h.example/simple" in out.stdout + out.stderr, out.stdout + out.stderr
    assert_no_secret(out, home, tmp_path / "logs")
    assert not (tmp_path / "prefix").exists()


@pytest.mark.parametrize(("key", "value"), [("PIP_INDEX_URL", f"https://alice:{SECRET}@pypi.example.org/simple"),
                                            ("PIP_EXTRA_INDEX_URL", f"https://tok{SECRET}@pypi.example.org/simple"),
                                            ("HF_TOKEN", SECRET)])
def test_a_credential_in_facts_env_is_refused(key: str, value: str, tmp_path: Path):
    """facts.env goes into world-readable module files and job scripts: a credential there is refused
    at load time, naming the key, before anything is written."""
    from tests.test_hostile import Case, assert_refused_cleanly, git_status, run_case, setter
    before = git_status()
    case = Case(f"env-{key}", r"book/local\.yml:\d+", edit=setter(f"facts.env.{key}", value), expect=f"env.{key}")
    result, paths = run_case(case, tmp_path)
    assert_refused_cleanly(case, result, paths, before)
    assert SECRET not in result.stdout + result.stderr


def test_a_credential_in_a_requirement_of_the_stack_is_refused(tmp_path: Path):
    """facts.torch.extras are listed in the stack's manifest, readable by every user: a URL with
    credentials there is refused at load time (index_url's go to pip by environment instead)."""
    from tests.test_hostile import Case, assert_refused_cleanly, git_status, run_case, setter
    before = git_status()
    case = Case("extras-credential", r"book/local\.yml:\d+",
                edit=setter("facts.torch.extras", [f"tool @ https://alice:{SECRET}@files.example.org/tool-1.0.tar.gz"]),
                expect="holds a credential")
    result, paths = run_case(case, tmp_path)
    assert_refused_cleanly(case, result, paths, before)
    assert SECRET not in result.stdout + result.stderr


@pytest.mark.parametrize(("text", "shown"), [
    (f"PASSWORD={SECRET} next", "PASSWORD=*** next"),
    (f"--password={SECRET}", "--password=***"),
    (f"TOKEN='{SECRET}'", "TOKEN=***"),
    (f"--mirror /work/https:/alice:{SECRET}@idx.example/x: not a directory", "/work/https:/***@idx.example/x"),
    (f"https://h/simple?token={SECRET}&v=1", "https://h/simple?token=***&v=1")])
def test_bare_secret_names_and_a_url_a_path_normalised_are_redacted(text: str, shown: str):
    assert SECRET not in redact(text) and shown in redact(text)


def test_every_kind_of_index_credential_reaches_pip_by_environment():
    """Not only a userinfo: an index's ``?token=``, anaconda.org's ``/t/TOKEN/`` path and a signed
    direct URL are passed by environment too, never on pip's command line or in its requirements file."""
    from sitestack.core.pip_auth import Configured, pip_auth
    options = ["--extra-index-url", f"https://idx.example/simple?token={SECRET}",
               "--index-url", f"https://h.example/t/{SECRET}/simple", "--no-deps"]
    lines = [f"pkg @ https://h.example/p-1.0-py3-none-any.whl?X-Amz-Signature={SECRET}", "plain==1.0"]
    auth = pip_auth(options, lines, configured=lambda: Configured())
    assert SECRET not in " ".join(auth.options + auth.lines), (auth.options, auth.lines)
    assert auth.options == ["--no-deps"] and auth.lines[1] == "plain==1.0"
    assert auth.env["PIP_INDEX_URL"] == options[3] and auth.env["PIP_EXTRA_INDEX_URL"].endswith(options[1])
    var = re.fullmatch(r"pkg @ \$\{(\w+)\}", auth.lines[0])
    assert var is not None and auth.env[var.group(1)] == lines[0].split("@ ", 1)[1]
