#!/usr/bin/env bash
# The whole test suite, from nothing, on Debian 12 as root (or with passwordless sudo):
# installs the system packages the tests use for real (Lmod, MPICH, Slurm, sshd, autotools,
# HIP, libfabric, and the shells the activate hook supports), makes .venv with sitestack and its
# test tools, runs the linters (ruff, mypy --strict), then pytest.
# Extra arguments go to pytest, e.g. `scripts/test.sh -k engine`.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo -n"

PACKAGES=(
  lmod mpich libmpich-dev build-essential pkg-config
  autoconf automake libtool
  slurm-wlm munge openssh-server openssh-client
  libfabric-dev libhwloc-dev hipcc libamdhip64-dev
  procps psmisc
  bubblewrap squashfuse squashfs-tools fuse3 libfuse3-dev   # libfuse3-dev: tests/test_slowfs.py builds slowfs
  zsh fish tcsh
  python3-pip python3-venv   # the local site's python3 is the system's: .venv is sitestack's, never the site's
)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "scripts/test.sh: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  if ! "$PY" -m venv --help >/dev/null 2>&1; then
    $SUDO apt-get install -y -qq python3-venv >/dev/null   # Debian's python3 ships venv separately
  fi
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'

export PATH="$PWD/.venv/bin:$PATH"
echo "scripts/test.sh: ruff"
.venv/bin/ruff check sitestack tasks.py setup.py tests benchmarks
echo "scripts/test.sh: mypy --strict"
.venv/bin/mypy
exec .venv/bin/python -m pytest "$@"
