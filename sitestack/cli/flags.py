"""The options only the command line has (which site, where output goes, what a task acts on), each
declared once with its help, beside RunOptions', ValidateOptions' (sitestack/model/options.py) and the
packages' (sitestack/packages/package_args.py). A task names the fields it takes (``options_task``); a
class here is a declaration, never built. A field of a shared option's flag gives a task its own help."""

from __future__ import annotations

from dataclasses import dataclass

from sitestack.model.options import RunOptions, ValidateOptions, option
from sitestack.onsite.nccl_lines import LINE_MAX, MESSAGES_MAX
from sitestack.packages.package_args import HorovodArgs, PluginArgs

#: Builds wait this long for another run's lock on the same install (builds take long).
BUILD_LOCK_WAIT = 6 * 3600.0


@dataclass(frozen=True)
class Task:
    """What the tasks that read a site share."""

    site: str | None = option(None, "site name: one of the playbooks in playbooks/ (see `invoke sites`)")
    playbook: str | None = option(None, "use this playbook file instead of playbooks/<site>.yml")
    json: str | None = option(None, "write the outcome as JSON to FILE ('-': to stdout, instead of the human "
                              "lines); docs/cli.md")
    debug: bool = option(False, "show tracebacks of errors")


@dataclass(frozen=True)
class Data:
    """The ``--json`` of a task that prints data (a listing), not a run's outcome."""

    json: str | None = option(None, "write what this prints as JSON to FILE ('-': to stdout, instead of the human "
                              "lines); docs/cli.md")


@dataclass(frozen=True)
class OneHost:
    """The one host of the tasks that look at what is installed."""

    hosts: str | None = option(None, "look on this host (a playbook host, an ssh-config alias or a host name); "
                               "default: the site's first", flag="host")


@dataclass(frozen=True)
class Build:
    """What the build tasks add to a run's options."""

    version: str | None = option(None, "version to build (default: the recipe's default_version); must be listed in "
                                 "the recipe")
    rebuild_it: bool = option(False, "build again from source though it is installed and up to date", flag="rebuild")
    recipe: str | None = option(None, "recipe name: sources/<recipe>.yml (see `invoke recipes`)", positional=True,
                                required=True)
    python: str | None = option(None, "interpreter with the stack's torch that builds and runs Horovod (default: the "
                                "site's facts.python.executable)")


@dataclass(frozen=True)
class Plugin:
    """What the network plugin's build tasks say of their shared options."""

    site: str | None = option(None, "site name: one of the playbooks in playbooks/ (default: local, this machine, "
                              "when it has the toolkit (ROCm, CUDA) or --rocm-home / --cuda-home is given)")
    source: str | None = option(None, "the plugin's source: a tarball or a directory (a checkout)")
    rccl_version: str | None = option(None, "plugin version (default: the fork for ROCm < 6, aws-ofi-nccl from ROCm 6)",
                                      flag="version")
    nccl_version: str | None = option(None, "plugin version (default: aws-ofi-nccl 1.18.0; the ROCm fork is refused)",
                                      flag="version")


@dataclass(frozen=True)
class Listing:
    """The options of the tasks that list, remove or act on what a site has."""

    format: str = option("yaml", "yaml (default) or json (the facts alone; --json gives the document docs/cli.md "
                         "describes)")
    output: str | None = option(None, "write the script to FILE, a regular file ('-' or default: print it); docs/cli.md")
    template_launcher: str | None = option(None, "srun, mpiexec or torchrun: what starts the ranks (default: the "
                                           "site's first MPI launcher, else its mpi.launcher)", flag="launcher")
    target: str | None = option(None, "a URL (https, http, file) or a local file", positional=True, required=True)
    spec: str | None = option(None, "what to remove: NAME or NAME@VERSION (see `invoke installed`)", positional=True,
                              required=True)
    stack: str | None = option(None, "the stack, by its module name (e.g. pytorch/2.13.0-cpu): generations lists only "
                               "it; rollback needs it where the site has several; promote: the one to make the default "
                               "(default: the one that awaits it)")
    max_size: str | None = option(None, "keep at most this much (e.g. 500M, 20G); the oldest artefacts go first")
    max_age: str | None = option(None, "remove artefacts stored more than this many days ago")
    dry_run: bool = option(False, "list what would be removed, remove nothing")
    gc_site: str | None = option(None, "site name: one of the playbooks in playbooks/ (default: local; the cache is the host's, shared by every site)",
                                 flag="site")
    last: str | None = option(None, "show only the last N runs (default: all)")
    perflog: str | None = option(None, "also write the site's validation runs as a ReFrame perflog to FILE (- for "
                                 "stdout); see docs/history.md")


@dataclass(frozen=True)
class Render:
    """Where ``invoke render`` writes."""

    out: str | None = option(None, "write the files under this local directory, each at its path on the site "
                             "(DIR/lustre/...), with DIR/INDEX.md and DIR/index.json; it must be empty or new",
                             required=True)
    force: bool = option(False, "write into --out though it is not empty (a re-render over an earlier one)")


@dataclass(frozen=True)
class Jobs:
    """The options of the tasks about jobs and logs besides ValidateOptions: tune, nccl-log, pack-env, provision."""

    sweep_check: bool = option(False, "submit nothing: show the points the sweep would run and what the stack's "
                               "module sets now", flag="check")
    files: str | None = option(None, "NCCL_DEBUG=INFO log files of one run: paths or quoted globs, comma-separated "
                               f"(e.g. 'out/nccl/*.log'); read line by line, each line up to {LINE_MAX // 1024} KiB, at "
                               f"most {MESSAGES_MAX} NCCL messages in all (the verdict notes a cut)", positional=True)
    log_site: str | None = option(None, "site name: one of the playbooks in playbooks/; judge against what its facts "
                                  "expect (network plugin, libfabric provider, fabric)", flag="site")
    log_nodes: str | None = option(None, "multi (the run spanned nodes) or single; default: what the logs show "
                                   "(nNodes, local ranks, channels via NET, bootstrap addresses, host names), WARN when "
                                   "they cannot tell", flag="nodes")
    name: str | None = option(None, "the environment's name (default: the playbook's pack-env steps, all of them; "
                              "with an env.yml: its name:)")
    requirements: str | None = option(None, "a requirements.txt or a conda env.yml to pack (overrides the playbook "
                                      "step's)")
    dest: str | None = option(None, "where it goes (default: <prefix>/envs/<name>); put <dest>/bin on PATH")
    list_steps: bool = option(False, "list the steps (name, action, tags, whether this run would run them) and exit")
    list_tags: bool = option(False, "list the tags and the steps that carry them, and exit")
    benchmarks: str | None = option(None, "run only these benchmarks/NAME.py (comma-separated; default: all)",
                                    flag="name")


#: The options of a task that runs steps on a site's hosts.
RUN = (Task, (RunOptions, "check diff fail_on_change hosts prefix account accept_new_host_keys verbose"))
#: ... of a build task besides those.
BUILD = (*RUN, (RunOptions, "source sources_dir mirror jobs no_cache"), (Build, "version rebuild_it"))
#: ... of a task that looks at, or changes, what is installed on one host.
INSTALLED = (Task, Data, (RunOptions, "prefix account accept_new_host_keys"), OneHost)
#: ... of a task that reads a site's facts only.
FACTS = ((Task, "site playbook debug"), (RunOptions, "prefix account"))
#: ... of a task that runs or reads validation jobs.
VALIDATE = (Task, (ValidateOptions, "prefix account accept_new_host_keys host"))
#: The network plugin's build tasks' options, and which of the plugin's (PluginArgs) each takes.
PLUGIN = (*BUILD, (Plugin, "site source"))
PLUGIN_ARGS = {"rocm": (PluginArgs, "rocm rocm_home rccl_home libfabric mpi_home tests"),
               "cuda": (PluginArgs, "cuda cuda_home nccl libfabric hwloc mpi_home tests")}
#: Horovod's build task's options from its hooks' (HorovodArgs).
HOROVOD_ARGS = (HorovodArgs, "gpu_operations")
