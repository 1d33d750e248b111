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
  strace  # widens a race the client must close (test_failopen)
  iproute2  # ip netns: a TCP peer on a host of its own (test_tcp_identity)
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
  # a VM whose only cgroup hierarchy is v2 (test_cgroup_v2), with the
  # kernel fetched below
  qemu-system-x86 busybox-static cpio
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

SUDO=
[ "$(id -u)" -eq 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
if [ ${#missing[@]} -gt 0 ]; then
  echo "memtally: installing ${missing[*]}" >&2
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
[ "${1:-all}" = all ] || exit 0

# Debian 12's own kernel for test_cgroup_v2's VM: vmlinuz and the modules a
# 9p root under an overlay needs. Not installed (a container has no use for
# a kernel in /boot): the package is unpacked in a scratch directory.
vm_dir=/var/cache/memtally/vm-kernel
vm_modules=(virtio_ring virtio virtio_pci_legacy_dev virtio_pci_modern_dev
  virtio_pci netfs fscache 9pnet 9pnet_virtio 9p overlay)
have=1
[ -f "$vm_dir/vmlinuz" ] || have=0
for m in "${vm_modules[@]}"; do [ -f "$vm_dir/modules/$m.ko" ] || have=0; done
[ $have = 1 ] && exit 0
kpkg() {
  apt-cache depends linux-image-amd64 2>/dev/null |
    awk '/Depends: linux-image-[0-9]/ { print $2; exit }'
}
pkg=$(kpkg)
if [ -z "$pkg" ]; then
  $SUDO apt-get update -qq
  pkg=$(kpkg)
fi
if [ -z "$pkg" ]; then
  echo "memtally: no linux-image-amd64 in apt's lists" >&2
  exit 1
fi
echo "memtally: fetching $pkg for the cgroup v2 VM into $vm_dir" >&2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
chmod 755 "$tmp"  # apt's download user writes there
(cd "$tmp" && apt-get download -qq "$pkg" 2>/dev/null)
patterns=('./boot/vmlinuz-*')
for m in "${vm_modules[@]}"; do patterns+=("*/$m.ko"); done
dpkg-deb --fsys-tarfile "$tmp"/*.deb |
  tar -x -C "$tmp" --wildcards "${patterns[@]}"
$SUDO mkdir -p "$vm_dir/modules"
for m in "${vm_modules[@]}"; do
  f=$(find "$tmp" -name "$m.ko" | head -1)
  [ -n "$f" ] || { echo "memtally: $pkg has no $m.ko" >&2; exit 1; }
  $SUDO cp "$f" "$vm_dir/modules/"
done
$SUDO cp "$tmp"/boot/vmlinuz-* "$vm_dir/vmlinuz"
echo "$pkg" | $SUDO tee "$vm_dir/package" >/dev/null
