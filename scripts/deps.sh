#!/usr/bin/env bash
# Install what memtally needs on Debian 12 (run as root, or with sudo
# available). Installs only what is missing, so a second run costs nothing.
#   scripts/deps.sh build   what building and the demo need (make demo)
#   scripts/deps.sh         that and everything the tests and benchmarks
#                           run for real: Slurm, Prometheus, Celery, redis,
#                           ... (make check, make bench)
set -euo pipefail

build_pkgs=(
  build-essential cmake pkg-config git
  libjemalloc-dev libjemalloc2 libuv1-dev libprotobuf-c-dev protobuf-c-compiler
  libjansson-dev libmicrohttpd-dev libinih-dev libsystemd-dev
  libcriterion-dev python3 g++  # the build compiles the tests too
)
pkgs=(
  "${build_pkgs[@]}"
  # tests
  clang libclang-rt-14-dev procps
  prometheus  # promtool, to check /metrics
  python3-protobuf protobuf-compiler python3-yaml  # Python package, manifest check
  # the cluster integrations, each run for real by its test
  python3-celery python3-redis  # Celery (its redis broker: redis-server, below)
  python3-distributed  # Dask: a scheduler and workers (memtally.dask)
  python3-pip python3-setuptools python3-wheel python3-venv  # pip install ./python
  slurm-wlm munge  # slurmctld + slurmd + munged started by the Slurm test
  systemd man-db groff-base dpkg-dev  # unit, man page and package checks
  redis-server redis-tools  # a program linked to libjemalloc (one heap; real suite)
  nodejs  # a V8 runtime: a heap committed with mprotect (test_node_heap)
  golang-go  # a Go program built with cgo at test time (test_go_heap)
  openjdk-17-jdk-headless  # HotSpot with G1 and Serial (test_jvm_heap)
  ruby  # an idle interpreter with sparse mappings of its own (test_sparse)
  # benchmarks
  valgrind util-linux
  sqlite3  # the sqlite3 CLI: bench/real.py, bench/quiet.py, test_quiet
  python3-matplotlib  # the node-memory picture of bench/fleet.py
)

case "${1:-all}" in
  build) pkgs=("${build_pkgs[@]}") ;;
  all) ;;
  *) echo "usage: scripts/deps.sh [build]" >&2; exit 2 ;;
esac

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" \
    || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "memtally: installing ${missing[*]}" >&2
SUDO=
[ "$(id -u)" -eq 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
