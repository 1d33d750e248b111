#!/usr/bin/env bash
# deploy/memtallyd.service, memtally.sysusers and memtally.tmpfiles checked
# offline by systemd's own tools (systemd need not be PID 1):
# - systemd-analyze verify on a copy of the unit whose ExecStart is the
#   built memtallyd and whose --config is deploy/memtallyd.conf; any
#   warning (an unknown key, a bad value) fails the test;
# - the same unit's config file is accepted by memtallyd itself (it starts
#   with --config and the flags of ExecStart, on a private socket);
# - systemd-sysusers and systemd-tmpfiles --create into a scratch --root.
# usage: test_systemd.sh SOURCE_DIR MEMTALLYD
set -euo pipefail
src=$(realpath "$1") memtallyd=$(realpath "$2")
if ! command -v systemd-analyze >/dev/null; then
  echo "SKIPPED: systemd-analyze not installed (apt-get install systemd)"
  exit 77
fi
tmp=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$tmp"' EXIT
pass=0
fail() { echo "FAIL: $*"; exit 1; }

unit=$src/deploy/memtallyd.service
grep -q '^ExecStart=/usr/bin/memtallyd --config /etc/memtally/memtallyd.conf$' "$unit" \
  || fail "ExecStart is not /usr/bin/memtallyd --config /etc/memtally/memtallyd.conf"
for key in Type=notify RuntimeDirectory=memtally Group=memtally ProtectSystem=strict \
           ProtectHome=yes PrivateTmp=yes PrivateDevices=yes NoNewPrivileges=yes \
           'RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK' \
           'ExecReload=/bin/kill -HUP $MAINPID'; do
  grep -qxF "$key" "$unit" || fail "unit lacks $key"
done
for bad in ProtectProc=invisible ProtectProc=noaccess ProcSubset=pid PrivateUsers=yes; do
  ! grep -qxF "$bad" "$unit" || fail "unit sets $bad (breaks access to other users' /proc)"
done
# The shared memory is memfds passed over the socket: nothing in /dev/shm.
! grep -q '^[^#]*/dev/shm' "$unit" || fail "unit still gives memtallyd /dev/shm"
! grep -q '^[^#]*/dev/shm' "$src/deploy/memtally.tmpfiles" \
  || fail "tmpfiles still manages a /dev/shm segment"
# Restart adoption reopens other users' slot tables through /proc/PID/map_files.
for cap in CAP_SYS_PTRACE CAP_DAC_READ_SEARCH CAP_CHECKPOINT_RESTORE; do
  grep -q "^CapabilityBoundingSet=.*\b$cap\b" "$unit" || fail "unit lacks $cap (restart adoption)"
done
pass=$((pass + 1))

sed -e "s#^ExecStart=/usr/bin/memtallyd#ExecStart=$memtallyd#" \
    -e "s#/etc/memtally/memtallyd.conf#$src/deploy/memtallyd.conf#" \
    "$unit" > "$tmp/memtallyd.service"
out=$(systemd-analyze verify --man=no "$tmp/memtallyd.service" 2>&1) \
  || fail "systemd-analyze verify: $out"
[ -z "$out" ] || fail "systemd-analyze verify warned: $out"
pass=$((pass + 1))

# The config the unit names must be one memtallyd accepts.
"$memtallyd" --config "$src/deploy/memtallyd.conf" --socket "$tmp/s.sock" \
  --segment "mt-unit-$$" 2>"$tmp/log" &
pid=$!
for _ in $(seq 200); do [ -S "$tmp/s.sock" ] && break; sleep 0.05; done
[ -S "$tmp/s.sock" ] || { kill $pid 2>/dev/null; cat "$tmp/log"; fail "memtallyd did not start with deploy/memtallyd.conf"; }
kill -HUP $pid
for _ in $(seq 200); do grep -q 'msg="config reloaded"' "$tmp/log" && break; sleep 0.05; done
grep -q 'msg="config reloaded"' "$tmp/log" || { cat "$tmp/log"; fail "no reload after SIGHUP"; }
kill -TERM $pid; wait $pid || fail "memtallyd exit status $? after SIGTERM"
pid=
grep -q 'level=error' "$tmp/log" && fail "errors in log: $(cat "$tmp/log")"
pass=$((pass + 1))

root=$tmp/root
mkdir -p "$root/etc"
systemd-sysusers --root="$root" "$src/deploy/memtally.sysusers" >/dev/null 2>&1 \
  || fail "systemd-sysusers rejected deploy/memtally.sysusers"
grep -q '^memtally:' "$root/etc/group" || fail "sysusers made no memtally group"
out=$(systemd-tmpfiles --root="$root" --create "$src/deploy/memtally.tmpfiles" 2>&1) \
  || fail "systemd-tmpfiles: $out"
[ -z "$out" ] || fail "systemd-tmpfiles warned: $out"
[ "$(stat -c %a "$root/run/memtally")" = 750 ] || fail "/run/memtally not 0750"
pass=$((pass + 1))
echo "$pass passed, 0 failed"
