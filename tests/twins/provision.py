"""A site twin brought up and provisioned once per test session, for every test that needs it.

``bring_up(site, ...)`` makes the twin (tests/twins/sites.py), starts its mount namespace and, inside
it, a Slurm cluster shaped like the site's, then runs ``invoke provision --site <site>`` twice (the
playbook from ``playbooks/``, unchanged; the hardware's facts through ``SITESTACK_FACTS``). The
twins' tests (tests/test_twins.py) and the sites' own user commands (tests/test_site_commands.py)
share the result through the session fixture ``site_twins`` (tests/conftest.py).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tests.slurm import SlurmCluster
from tests.twins import sites
from tests.twins.namespace import SiteNamespace
from tests.twins.rocm import upstream_sources

REPO = sites.REPO
#: The tags whose steps every twin leaves out (tests/test_twins.py says why): the same every run.
TWIN_SKIP_TAGS = ("horovod",)
#: The project each site's user documents use (tests/data/site_commands/<site>.yaml ``account``).
COMMANDS = REPO / "tests" / "data" / "site_commands"


def account_of(site: str) -> str:
    return str(yaml.safe_load((COMMANDS / f"{site}.yaml").read_text())["account"])


@dataclass
class RunningTwin:
    """A twin whose namespace and Slurm cluster run, provisioned (``first``, ``second``: the two runs)."""

    twin: sites.Twin
    ns: SiteNamespace
    cluster: SlurmCluster
    env: dict[str, str]
    args: list[str] = field(default_factory=list)
    first: subprocess.CompletedProcess[str] | None = None
    second: subprocess.CompletedProcess[str] | None = None
    seconds: tuple[float, float] = (0.0, 0.0)
    skipped_tags: tuple[str, ...] = ()

    @property
    def site(self) -> str:
        return self.twin.site

    @property
    def modules_init(self) -> str:
        return str(sites.playbook_facts(self.site)["modules"]["init"])

    def invoke(self, *args: str, env: dict[str, str] | None = None, timeout: float = 1800,
               cwd: str | Path = REPO) -> subprocess.CompletedProcess[str]:
        """``invoke ARGS`` from the checkout, inside the twin, in its login environment."""
        return self.ns.run([sys.executable, "-m", "invoke", *args], env={**self.env, **(env or {})}, cwd=cwd,
                           timeout=timeout)

    def shell(self, script: str, *, cwd: str | Path | None = None, env: dict[str, str] | None = None,
              timeout: float = 900) -> subprocess.CompletedProcess[str]:
        """``script`` in bash as a user's login shell on the site has it: the site's module command
        defined (its ``modules.init``), the login environment, in ``cwd`` (default: HOME)."""
        full = f". {shlex.quote(self.modules_init)}\n{script}"
        return self.ns.run(["bash", "-c", full], env={**self.env, **(env or {})}, cwd=cwd or self.twin.home,
                           timeout=timeout)

    def stop(self) -> None:
        self.cluster.stop()
        self.ns.stop()


def login_env(twin: sites.Twin, root: Path, cluster: SlurmCluster) -> dict[str, str]:
    """What a login shell on the twin has: this machine's basics, the site's login variables, the
    cluster, the hardware's facts, and the tests' caches (the build cache is shared with the other
    tests: each package is compiled once per compiler/MPI)."""
    builds = os.environ.get("SITESTACK_TEST_BUILD_CACHE") or str(Path.home() / ".cache" / "sitestack" / "builds")
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TERM", "TMPDIR", "PIP_CONFIG_FILE",
                                                          "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS",
                                                          "SITESTACK_TEST_TWINS", "CI")}
    # the `sitestack` command on PATH, as an administrator's installation puts it there (only it: the
    # checkout's venv Python must not stand before the site's)
    tools = root / "sitestack-bin"
    tools.mkdir(exist_ok=True)
    if not (tools / "sitestack").exists():
        (tools / "sitestack").symlink_to(Path(sys.executable).parent / "sitestack")
    keep["PATH"] = f"{keep.get('PATH', os.defpath)}:{tools}"
    env = {**keep, "USER": sites.USER, "LOGNAME": sites.USER, **twin.login, **cluster.env,
           "SITESTACK_FACTS": str(twin.facts_file()), "SITESTACK_BUILD_CACHE": builds,
           "SITESTACK_LOG_DIR": str(root / "logs"), "SITESTACK_PROGRESS_INTERVAL": "120"}
    if twin.docker is not None:
        env["RUNTIME_TWIN_DOCKER_DIR"] = str(twin.docker)
    return env


def bring_up(site: str, root: Path, python: str | None) -> RunningTwin:
    """The twin of ``site`` made under ``root``, its namespace and cluster started (not provisioned)."""
    twin = sites.make(site, root, account_of(site), python)
    # the site's login profile: a job submitted with --export=NONE gets the node's login environment
    # (Slurm runs the user's login shell), where the site's module tree is on MODULEPATH
    profile = root / "site-profile.sh"
    profile.write_text(f"# {sites.si.STAND_IN.format(what=f'the login profile of {site}', why='MODULEPATH')}\n"
                       f"export MODULEPATH={shlex.quote(twin.login['MODULEPATH'])}\n")
    twin.binds["/etc/profile.d/zz-site.sh"] = profile
    ns = SiteNamespace(twin.binds).start()
    try:
        cluster = SlurmCluster(root / "slurm", partition=twin.slurm["partition"], node=twin.slurm["node"],
                               mpi_default=twin.slurm["mpi_default"], launch=ns.argv,
                               partition_options=twin.slurm.get("partition_options"))
        env = login_env(twin, root, cluster)
        cluster.start()
    except BaseException:
        ns.stop()
        raise
    return RunningTwin(twin, ns, cluster, env)


def provision(running: RunningTwin) -> RunningTwin:
    """``invoke provision --site <site>`` twice, the way an administrator runs it."""
    args = ["provision", "--site", running.site, "--account", running.twin.account]
    if running.site == "frontier":
        args += ["--mirror", str(upstream_sources())]   # the plugin's checked git archive (no --source)
    wanted = os.environ.get("SITESTACK_TEST_TWIN_SKIP_TAGS")
    tags = TWIN_SKIP_TAGS if wanted is None else tuple(t for t in wanted.split(",") if t)
    have = {t for step in yaml.safe_load((REPO / "playbooks" / f"{running.site}.yml").read_text())["steps"]
            for t in step.get("tags") or ()}
    running.skipped_tags = tuple(t for t in tags if t in have)
    if running.skipped_tags:
        args += ["--skip-tags", ",".join(running.skipped_tags)]
    running.args = args
    start = time.monotonic()
    running.first = running.invoke(*args, timeout=3600)
    middle = time.monotonic()
    running.second = running.invoke(*args, timeout=1800)
    running.seconds = (middle - start, time.monotonic() - middle)
    print(f"\n{running.site} twin: provision {running.seconds[0]:.0f} s, again {running.seconds[1]:.0f} s")
    return running
