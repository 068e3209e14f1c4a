"""Packed environments (LUMI's container wrapper "Tykky", LUMI's make-squashfs): a Python venv
packed into one squashfs image, run through small wrapper scripts.

A parallel file system pays for every file an import touches; a venv with torch has tens of
thousands (https://docs.lumi-supercomputer.eu/software/installing/python/). Packed, the environment is one image file plus a handful of
wrappers. The layout under ``<dest>`` (``<parent>/<leaf>``, a symlink to a generation)::

    <parent>/<leaf> -> .<leaf>.gen-TOKEN/
        bin/<command>      wrappers: python, pip, torchrun, every console script of the venv
        env.sqfs           the venv, packed with mksquashfs
        root/              empty: where the image is mounted; the venv was built at this path
        requirements.txt   the requirements it was built from (an env.yml's pip: lines)
        conda-requirements.txt  an env.yml's conda dependencies taken from the package index, installed first
        packed.json        the stamp: digest of the inputs, the commands wrapped

A wrapper runs its command with the image mounted at ``root``: in the site's container
(``<runtime> exec --bind env.sqfs:root:image-src=/ IMAGE root/bin/CMD``, as Tykky does), or,
where the site uses no container, with ``squashfuse_ll`` (else ``squashfuse``; the mount is made
once per node, under a lock, and stays). Inside a container that already has the image mounted it runs the command
directly (Tykky's nesting rule). This module renders the texts and parses the inputs; the
``pack-env`` action (sitestack/actions/pack_env.py) runs the build.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

from packaging.requirements import InvalidRequirement, Requirement

from sitestack.core.errors import InputError
from sitestack.core.quoting import sh
from sitestack.core.redact import fingerprint, redact
from sitestack.model.container_facts import Runtime

#: Bump when the layout or the wrappers change, so existing packs are rebuilt.
#: 2: the base's console scripts of the requested distributions are wrapped too.
#: 3: lz4 images mounted with squashfuse_ll where there is no container (:data:`COMPRESSION`, :data:`MOUNTERS`).
#: 4: the wrappers detach a mount whose daemon died before mounting again.
FORMAT = 4
#: Options a requirements file may carry: where packages come from. Anything else (``-r``, ``-e``,
#: ``-c``) names files or checkouts the host may not have.
ALLOWED_OPTIONS = ("--index-url", "--extra-index-url", "--find-links", "--pre", "--only-binary", "--no-binary")
#: The allowed options that take a value.
VALUED_OPTIONS = ("--index-url", "--extra-index-url", "--find-links", "--only-binary", "--no-binary")
#: Files of a venv's bin/ that are not commands (sourced, not run).
NOT_COMMANDS = re.compile(r"(?i)activate(\..*)?|Activate\.ps1|deactivate")
#: mksquashfs options: no appending to an old image, files owned by root (the build user is nobody's concern).
MKSQUASHFS_OPTIONS = ("-noappend", "-quiet", "-no-progress", "-all-root")
#: Compression and block size, by who mounts the image (benchmarks/packed_env.py measures them). squashfuse
#: decompresses in user space on a node's first start: lz4 costs a fifth of gzip's CPU there and packs in
#: seconds instead of a minute, for a larger image. 128K blocks (mksquashfs's default): FUSE reads at most
#: 128K at a time, so a 1M block is decompressed again for each of its pieces. In a container the site's
#: runtime mounts it, possibly with the kernel's squashfs, whose compressors are a kernel build choice:
#: gzip there, mksquashfs's default and what Tykky builds (its sqfs_options default to none).
COMPRESSION = {"squashfuse": ("-comp", "lz4", "-b", "128K"), "container": ("-comp", "gzip", "-b", "128K")}
#: What mounts the image where there is no container, the first one found: squashfuse_ll (FUSE's low-level
#: API) answers lookups and attributes with an unlimited timeout and opens files with keep_cache, so a
#: second process reads the image from the page cache; the high-level squashfuse resolves every path and
#: re-reads every file through user space, unless told to cache. The image never changes (a re-pack is a
#: new generation at a new path), so caching everything for as long as it is mounted is safe.
MOUNTERS = (("squashfuse_ll",),
            ("squashfuse", "-o", "kernel_cache,entry_timeout=86400,attr_timeout=86400,negative_timeout=86400"))


#: What an index option's value may be: one URL or path, no spaces or quotes (it becomes an argv word).
OPTION_VALUE = re.compile(r"(https?|file)://[^\s'\"\\]+|/[^\s'\"\\]*|[A-Za-z0-9:_,.+-]+")


def check_requirement_line(raw: str, where: str) -> str | None:
    """One line of a requirements file (or of an env.yml's ``pip:`` list) checked: the line without
    its comment, or None for a blank or comment line. A line that is not a PEP 508 requirement nor
    an allowed option with a sane value is an :class:`InputError` naming ``where``."""
    line = re.sub(r"(^|\s)#.*$", "", raw).strip()
    if not line:
        return None
    if line.startswith("-"):
        # --option=value or --option value: the first "=" or blank ends the option (a URL's query
        # has "=" of its own: ?token=...)
        option, value = re.match(r"(-[^\s=]*)[\s=]*(.*)", line).groups()  # type: ignore[union-attr]
        value = value.strip()
        if option not in ALLOWED_OPTIONS:
            raise InputError(where, f"option {option!r} is not supported in a packed "
                             f"environment's requirements (allowed: {', '.join(ALLOWED_OPTIONS)})")
        if option in VALUED_OPTIONS and not OPTION_VALUE.fullmatch(value):
            raise InputError(where, f"{option} needs one URL or path as its value, not {value!r}")
        if option not in VALUED_OPTIONS and value:
            raise InputError(where, f"{option} takes no value")
        return f"{option} {value}" if value else option
    try:
        Requirement(line)
    except InvalidRequirement as exc:
        raise InputError(where, f"not a requirement: {line!r} ({exc})") from None
    return line


def parse_requirements(text: str, where: str) -> list[str]:
    """The checked lines of a requirements.txt (comments and blanks dropped; see
    :func:`check_requirement_line`); a file with no requirement is an error naming ``where``."""
    out = [line for number, raw in enumerate(text.splitlines(), 1)
           if (line := check_requirement_line(raw, f"{where}:{number}")) is not None]
    if not any(not line.startswith("-") for line in out):
        raise InputError(where, "no requirements in the file")
    return out


def split_options(lines: Sequence[str]) -> tuple[list[str], list[str]]:
    """``(pip options as argv words, requirement lines)`` of checked requirement lines."""
    options = [word for line in lines if line.startswith("-") for word in line.split(" ", 1)]
    return options, [line for line in lines if not line.startswith("-")]


@dataclass(frozen=True)
class PackedEnv:
    """One packed environment: where it goes and what it is built from."""

    name: str
    dest: str                       # <parent>/<leaf>, the stable path users put /bin of on PATH
    requirements: tuple[str, ...]   # checked lines of the requirements file
    python: str                     # the base interpreter (inside the container where there is one)
    system_site_packages: bool
    runtime: Runtime | None         # None: no container, squashfuse
    image: str | None               # the container image
    binds: tuple[str, ...]          # the site's binds (the dest's prefix first)
    conda: tuple[str, ...] = ()     # an env.yml's conda dependencies, as written
    channels: tuple[str, ...] = ()  # and its channels

    @property
    def parent(self) -> str:
        return self.dest.rstrip("/").rsplit("/", 1)[0] or "/"

    @property
    def leaf(self) -> str:
        return self.dest.rstrip("/").rsplit("/", 1)[1]

    def inputs(self) -> dict[str, object]:
        """Everything the packed image depends on; its digest decides whether to re-pack. It is kept
        in the world-readable stamp: an index's credentials are there as ``***`` and a fingerprint
        (:func:`sitestack.core.redact.fingerprint`), which a changed password changes."""
        secret = fingerprint([*self.requirements, *self.channels])
        return {"format": FORMAT, "requirements": [redact(r) for r in self.requirements], "python": self.python,
                "system_site_packages": self.system_site_packages,
                "runtime": self.runtime.name if self.runtime else None, "image": self.image,
                "mksquashfs": list(self.mksquashfs_options()),
                **({} if self.runtime else {"mount": [list(m) for m in MOUNTERS]}),
                **({"conda": list(self.conda), "channels": [redact(c) for c in self.channels]} if self.conda else {}),
                **({"credentials": secret} if secret else {})}

    def mksquashfs_options(self) -> tuple[str, ...]:
        """mksquashfs's options for this environment's image (:data:`COMPRESSION`)."""
        return (*MKSQUASHFS_OPTIONS, *COMPRESSION["container" if self.runtime else "squashfuse"])

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.inputs(), sort_keys=True).encode()).hexdigest()

    def in_env(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run where the environment lives: in the container, or on the host."""
        if self.runtime is None or self.image is None:
            return list(argv)
        return self.runtime.exec_argv(self.image, argv, self.binds)


def wrapper(packed: PackedEnv, gen_dir: str, command: str) -> str:
    """The text of ``bin/<command>``: run the venv's command with the image mounted."""
    root, image = f"{gen_dir}/root", f"{gen_dir}/env.sqfs"
    head = (f"#!/bin/bash\n# {command} of the packed environment {packed.name}, written by sitestack (pack-env):\n"
            f"# runs {root}/bin/{command} with {image} mounted at {root}.\n"
            f"root={sh(root)}\nimage={sh(image)}\n")
    if packed.runtime is not None and packed.image is not None:
        rt = packed.runtime
        # the site's binds first: a bind of a parent directory mounted after the image would hide it
        site = ",".join(dict.fromkeys(packed.binds))
        binds = (f"{sh(site)}," if site else "") + f'"{rt.image_bind("$image", "$root")}"'
        # Already inside a container with the image mounted (a wrapper called from a wrapped
        # command): run the command directly, no nested container (Tykky does the same).
        return head + (
            f'if grep -qsF " $root " /proc/self/mountinfo; then exec "$root/bin/{command}" "$@"; fi\n'
            f'exec {sh(rt.command)} exec --bind {binds} {sh(packed.image)} "$root/bin/{command}" "$@"\n')
    # No container: the image is mounted once per node (under a lock on the image, so two first calls
    # do not stack two mounts) by the first of MOUNTERS found; the mount stays until fusermount -u or a
    # reboot. The mounter does not inherit the lock's descriptor: its daemon would hold the lock for as
    # long as the image stays mounted, and every other first call would wait on it for ever. root is an
    # empty directory until mounted, so a test of root/bin (a shell builtin) tells a mounted image
    # without starting mountpoint on every call. A mount whose daemon is gone (killed by the
    # out-of-memory killer or a node's clean-up) answers "Transport endpoint is not connected" (or
    # "Software caused connection abort") for root itself, while the kernel's cached entries still
    # show root/bin: so root is tested too (its attributes are cached while the daemon lives), and a
    # dead mount is detached (lazily, as its owner may) before mounting again. Another user's dead
    # mount cannot be: the mount's error then says why.
    low, high = (" ".join(map(sh, m)) for m in MOUNTERS)
    return head + (
        'if ! { [ -d "$root" ] && [ -e "$root/bin" ]; }; then\n'
        '  exec 9<"$image" && flock 9\n'
        '  if ! [ -d "$root" ]; then\n'
        '    fusermount3 -u -z "$root" 2>/dev/null || fusermount -u -z "$root" 2>/dev/null\n'
        '  fi\n'
        '  if ! mountpoint -q "$root"; then\n'
        f'    if command -v {sh(MOUNTERS[0][0])} >/dev/null 2>&1; then mount=({low}); else mount=({high}); fi\n'
        '    "${mount[@]}" "$image" "$root" 9<&- || {\n'
        f'      echo "{command}: cannot mount $image at $root (${{mount[0]}})" >&2; exit 1; }}\n'
        '  fi\n'
        '  exec 9<&-\n'
        'fi\n'
        f'exec "$root/bin/{command}" "$@"\n')


#: Run by the env's python with ``ROOT NAME...``: for each requested distribution that the base (the
#: container image, through system site packages) provides, so that pip installed nothing, its
#: console scripts are written into ROOT/bin as pip writes them. Without this, a requirement the image
#: already satisfies (``torch`` over a PyTorch image) leaves ``torchrun`` out of the wrappers, which
#: the user of an env.yml naming torch expects (LUMI's container-wrapper page runs ``srun torchrun``
#: from ``<install_dir>/bin``).
BASE_SCRIPTS = r"""
import importlib.metadata as md, os, sys
root, names = os.path.realpath(sys.argv[1]), sys.argv[2:]
for name in names:
    try:
        dist = md.distribution(name)
    except md.PackageNotFoundError:
        continue
    if os.path.realpath(str(dist.locate_file(""))).startswith(root + os.sep):
        continue
    for ep in dist.entry_points.select(group="console_scripts"):
        path = os.path.join(root, "bin", ep.name)
        if os.path.exists(path) or "/" in ep.name:
            continue
        module, _, attr = ep.value.partition(":")
        call = attr.split("[")[0].strip() or "main"
        with open(path, "w") as out:
            out.write(f"#!{root}/bin/python\nimport sys\nfrom {module.strip()} import {call.split('.')[0]}\n"
                      f"if __name__ == '__main__':\n    sys.exit({call}())\n")
        os.chmod(path, 0o755)
"""


def requirement_names(requirements: Sequence[str]) -> list[str]:
    """The distribution names of checked requirement lines (options left out)."""
    return [Requirement(line).name for line in requirements if not line.startswith("-")]


def commands_of(listing: str) -> list[str]:
    """The commands to wrap, from ``find bin -maxdepth 1 ( -type f -perm -u+x ) -o -type l`` names."""
    names = sorted({line.strip() for line in listing.splitlines() if line.strip()})
    return [n for n in names if not NOT_COMMANDS.fullmatch(n) and re.fullmatch(r"[A-Za-z0-9_.+-]+", n)]
