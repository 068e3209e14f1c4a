#!/usr/bin/env bash
# The whole test suite, from nothing, on Debian 12 as root (or with passwordless sudo):
# installs the system packages the tests use for real (Lmod, MPICH, Slurm, sshd, autotools,
# HIP, libfabric, and the shells the activate hook supports), makes .venv with sitestack and its
# test tools, runs the linters (ruff, mypy --strict), then pytest.
# Extra arguments go to pytest, e.g. `scripts/test.sh -k engine`.
# Where the time went is printed at the end: the seconds of each phase, pytest's 25 slowest set-ups,
# calls and tear-downs (--durations), and the slowest test files (scripts/test_times.py reading the
# JUnit report build/test-results/junit.xml, which stays for the next look; docs/testing.md).
set -euo pipefail
cd "$(dirname "$0")/.."
JUNIT=build/test-results/junit.xml
PHASES=()
phase_done() {   # phase_done NAME START: one "NAME Ns" entry for the closing summary
  PHASES+=("$1 $((SECONDS - $2))s")
}
started=$SECONDS

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

phase_done packages "$started"

started=$SECONDS
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  if ! "$PY" -m venv --help >/dev/null 2>&1; then
    $SUDO apt-get install -y -qq python3-venv >/dev/null   # Debian's python3 ships venv separately
  fi
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'

phase_done venv "$started"

export PATH="$PWD/.venv/bin:$PATH"
echo "scripts/test.sh: ruff"
started=$SECONDS
.venv/bin/ruff check sitestack tasks.py setup.py tests benchmarks scripts/test_times.py
phase_done ruff "$started"
echo "scripts/test.sh: mypy --strict"
started=$SECONDS
.venv/bin/mypy
phase_done mypy "$started"

mkdir -p "$(dirname "$JUNIT")"
rm -f "$JUNIT"   # a report left by an earlier run must not be read as this one's
started=$SECONDS
status=0
.venv/bin/python -m pytest --durations=25 --junitxml="$JUNIT" "$@" || status=$?
phase_done pytest "$started"
echo
if [ -f "$JUNIT" ]; then
  .venv/bin/python scripts/test_times.py "$JUNIT" || true
fi
echo "scripts/test.sh: ${PHASES[*]}; all ${SECONDS}s ($((SECONDS / 60)) min); pytest exit status $status"
exit "$status"
