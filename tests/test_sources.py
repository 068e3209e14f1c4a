"""The controller's source cache: download once over real HTTP, verify sha256, reuse; mirrors;
--source; `invoke checksum`."""

from __future__ import annotations

import hashlib
import http.server
import textwrap
import threading
from pathlib import Path

import pytest

from sitestack.core.errors import SitestackError
from sitestack.installs import sources
from sitestack.model.recipe import load_recipe

PAYLOAD = b"not really a tarball, but bytes with a known sha256\n" * 100
SHA = hashlib.sha256(PAYLOAD).hexdigest()


class Server:
    """A real HTTP server on loopback serving ``root``, counting GET requests per path."""

    def __init__(self, root: Path) -> None:
        hits: dict[str, int] = {}

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, directory=str(root), **kwargs)

            def do_GET(self):  # noqa: N802
                hits[self.path] = hits.get(self.path, 0) + 1
                super().do_GET()

            def log_message(self, *args):
                pass

        self.hits = hits
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server(tmp_path):
    root = tmp_path / "www"
    root.mkdir()
    (root / "demo-1.0.tar.gz").write_bytes(PAYLOAD)
    (root / "demo-2.0.tar.gz").write_bytes(PAYLOAD + b"tampered")
    srv = Server(root)
    yield srv
    srv.stop()


def recipe_at(tmp_path: Path, url: str, sha: str = SHA):
    sources_dir = tmp_path / "sources"
    sources_dir.mkdir(exist_ok=True)
    (sources_dir / "demo.yml").write_text(textwrap.dedent(f"""\
        name: demo
        description: a demo
        homepage: https://example.org
        build: autotools
        default_version: "1.0"
        versions:
          "1.0":
            url: {url}/demo-{{version}}.tar.gz
            sha256: {sha}
          "2.0":
            url: {url}/demo-{{version}}.tar.gz
            sha256: {SHA}
        sanity: [bin/demo]
        """))
    return load_recipe("demo", sources_dir)


def test_download_once_then_reuse(tmp_path, server):
    recipe = recipe_at(tmp_path, server.url)
    cache = tmp_path / "cache"
    first = sources.fetch(recipe, "1.0", cache=cache)
    assert first == cache / SHA / "demo-1.0.tar.gz" and first.read_bytes() == PAYLOAD
    again = sources.fetch(recipe, "1.0", cache=cache)
    assert again == first
    assert server.hits == {"/demo-1.0.tar.gz": 1}
    server.stop()
    assert sources.fetch(recipe, "1.0", cache=cache) == first  # no network needed any more


def test_download_with_wrong_sha256_is_refused_and_not_cached(tmp_path, server):
    recipe = recipe_at(tmp_path, server.url)
    cache = tmp_path / "cache"
    with pytest.raises(sources.ChecksumMismatch) as err:
        sources.fetch(recipe, "2.0", cache=cache)
    assert f"the recipe says {SHA}; refusing it, nothing was built" in str(err.value)
    assert not any(p.is_file() for p in cache.rglob("*"))


def test_damaged_cache_entry_is_fetched_again(tmp_path, server):
    recipe = recipe_at(tmp_path, server.url)
    cache = tmp_path / "cache"
    path = sources.fetch(recipe, "1.0", cache=cache)
    path.write_bytes(b"bit rot")
    assert sources.fetch(recipe, "1.0", cache=cache).read_bytes() == PAYLOAD
    assert server.hits["/demo-1.0.tar.gz"] == 2


def test_mirror_directories(tmp_path):
    recipe = recipe_at(tmp_path, "https://unreachable.invalid")
    flat = tmp_path / "mirror"
    flat.mkdir()
    (flat / "demo-1.0.tar.gz").write_bytes(PAYLOAD)
    got = sources.fetch(recipe, "1.0", mirrors=[flat], cache=tmp_path / "c1")
    assert got.read_bytes() == PAYLOAD and got.parent.parent == tmp_path / "c1"
    nested = tmp_path / "mirror2" / "demo"
    nested.mkdir(parents=True)
    (nested / "demo-1.0.tar.gz").write_bytes(PAYLOAD)
    assert sources.fetch(recipe, "1.0", mirrors=[tmp_path / "mirror2"], cache=tmp_path / "c2").read_bytes() == PAYLOAD
    (flat / "demo-1.0.tar.gz").write_bytes(b"wrong")
    with pytest.raises(sources.ChecksumMismatch, match=r"from mirror .*mirror\)"):
        sources.fetch(recipe, "1.0", mirrors=[flat], cache=tmp_path / "c3")


def test_unreachable_url_says_how_to_work_offline(tmp_path):
    recipe = recipe_at(tmp_path, "http://127.0.0.1:9")
    with pytest.raises(SitestackError, match=r"cannot download demo 1.0 .*put demo-1\.0\.tar\.gz in a mirror directory"):
        sources.fetch(recipe, "1.0", cache=tmp_path / "cache", timeout=5)


def test_explicit_source_file(tmp_path):
    recipe = recipe_at(tmp_path, "https://unreachable.invalid")
    good = tmp_path / "good.tar.gz"
    good.write_bytes(PAYLOAD)
    assert sources.fetch(recipe, "1.0", source=good, cache=tmp_path / "cache") == good
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(b"other")
    with pytest.raises(sources.ChecksumMismatch, match=r"bad\.tar\.gz \(demo 1\.0, from --source\)"):
        sources.fetch(recipe, "1.0", source=bad, cache=tmp_path / "cache")


def test_checksum_task_file_and_url(cli, tmp_path, server):
    file = tmp_path / "x.tar.gz"
    file.write_bytes(PAYLOAD)
    out = cli("checksum", str(file))
    assert out.returncode == 0 and out.stdout.startswith(f"{SHA}  x.tar.gz  ({len(PAYLOAD)} bytes)")
    out = cli("checksum", f"{server.url}/demo-1.0.tar.gz")
    assert out.returncode == 0, out.stderr
    assert f"    url: {server.url}/demo-1.0.tar.gz\n    sha256: {SHA}" in out.stdout
    out = cli("checksum", str(tmp_path / "missing.tar.gz"))
    assert out.returncode == 1 and "no such file, and not an http(s) or file URL" in out.stderr


# -- provision --source NAME=PATH / --mirror DIR --------------------------------------------------------------
def test_provision_source_options_are_checked_before_anything_runs(cli, tmp_path):
    env = {"SITESTACK_LOG_DIR": str(tmp_path / "logs")}
    prefix = ["--prefix", str(tmp_path / "p")]
    for given, message in (("mpi4py", "error: --source: 'mpi4py' must be NAME=PATH"),
                           (f"nosuch={tmp_path}", "no step of site local installs recipe nosuch (its recipe-install "
                                                   "steps install: horovod, mpi4py)"),
                           (f"mpi4py={tmp_path}/missing.tar.gz", "not a file or directory")):
        out = cli("provision", "--site", "local", "--source", given, *prefix, env=env)
        assert out.returncode == 1 and out.stdout == "" and message in out.stderr, out.stderr
    out = cli("provision", "--site", "local", "--mirror", str(tmp_path / "none"), *prefix, env=env)
    assert out.returncode == 1 and "error: --mirror: " in out.stderr and "not a directory" in out.stderr
    assert not (tmp_path / "p").exists() and not (tmp_path / "logs").exists()


@pytest.mark.integration
def test_provision_source_reaches_the_recipe_step(cli, tmp_path):
    """A --source for the mpi4py step is checked against the recipe's sum even when the install needs
    no build (the wheel is in the build cache): the wrong tarball fails that step, naming the file."""
    wrong = tmp_path / "mpi4py-4.1.2.tar.gz"
    wrong.write_bytes(b"not mpi4py\n")
    out = cli("provision", "--site", "local", "--tags", "mpi4py", "--prefix", str(tmp_path / "p"),
              "--source", f"mpi4py={wrong}", env={"SITESTACK_LOG_DIR": str(tmp_path / "logs")})
    assert out.returncode == 1
    assert f"failed   mpi4py: sha256 mismatch for {wrong} (mpi4py 4.1.2, from --source)" in out.stdout
    assert not (tmp_path / "p" / "mpi4py").exists()
