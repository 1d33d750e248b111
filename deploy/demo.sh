#!/usr/bin/env bash
# The demo fleet: memtallyd with a 600 MiB fleet limit, a few unmodified
# workers under the preload in two groups, `memtally status` / `memtally ps`
# watching them, and a scheduler asking to start tasks: admitted while the
# fleet has room, denied with the figures once it does not; then a job
# started with `memtally run --wait` that waits for room and runs once
# another task's memory is freed. Ends by itself and leaves no process,
# socket or restart record behind.
# usage: deploy/demo.sh [BUILD_DIR]
set -euo pipefail
build=$(cd "${1:-build}" && pwd)
memtallyd=$build/server/memtallyd
memtally=$build/programs/memtally
preload=$build/client/libmemtally_preload.so
workers=$build/tests/integration

dir=$(mktemp -d /tmp/memtally-demo.XXXXXX)
sock=$dir/memtally.sock
label=memtally-demo-$$
pids=()
cleanup() {
  exec 3>&- 2>/dev/null || true
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
mt() { "$memtally" --socket "$sock" "$@"; }

say "starting memtallyd (socket $sock, shared objects $label)"
"$memtallyd" --socket "$sock" --label "$label" --fleet-limit 600MiB \
  --high-watermark 80 --log-level info 2>"$dir/memtallyd.log" &
pids+=($!)
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done

# Workers: unmodified programs, counted through LD_PRELOAD. They hold their
# memory until their stdin (a FIFO this script keeps open) closes.
mkfifo "$dir/hold"
exec 3<>"$dir/hold"
worker() { # group program args...
  local group=$1; shift
  LD_PRELOAD=$preload MEMTALLY_SOCKET=$sock MEMTALLY_GROUP=$group \
    "$@" < "$dir/hold" > /dev/null &
  pids+=($!)
}
say "starting workers: python3 (etl), a 4-thread C worker and a C++ worker (ml)"
worker etl python3 -c 'import sys; b=[bytearray((1<<20)-1) for _ in range(150)]; print("ready", flush=True); sys.stdin.read()'
worker ml "$workers/mt_worker" hold 96 4
worker ml "$workers/mt_cxx" 48
sleep 2

say "memtally status"
mt status
say "memtally ps"
mt ps

say "scheduler: admit a 100 MiB task (fits under the 600 MiB limit)"
# Print the answer and keep its reservation id. (Not `tee /dev/stderr`:
# with the demo's output redirected to a file, that reopens the file and
# truncates what was written before.)
answer=$(mt admit --bytes 100MiB --group etl --task demo-1)
printf '%s\n' "$answer"
rid=$(printf '%s\n' "$answer" | awk '/^admitted/ {print $2}')
say "scheduler: admit a 300 MiB task (would not fit): denied, exit status 3"
set +e
mt admit --bytes 300MiB --group ml --task demo-2
echo "(exit status $?)"
set -e

victim=${pids[2]}
say "kill -9 the 4-thread worker (pid $victim): it leaves at once"
kill -9 "$victim"
wait "$victim" 2>/dev/null || true
sleep 0.2
mt ps
say "scheduler: release the first reservation, then try the 300 MiB task again"
mt release "$rid"
mt admit --bytes 300MiB --group ml --task demo-2
say "memtally status --json"
mt --json status

etl=${pids[1]}
say "memtally run: a job of 200 MiB waits for room (--wait 30), not started"
mt run --bytes 200MiB --group ml --task demo-job --wait 30 -- python3 -c \
  'import os; b = bytearray(150 << 20); print("job", os.environ["MEMTALLY_TASK"], "ran, holding 150 MiB", flush=True)' &
job=$!
pids+=($job)
sleep 1.5
say "the etl worker (pid $etl) ends: its 150 MiB are freed, the job starts"
kill "$etl"
wait "$etl" 2>/dev/null || true
set +e
wait "$job"
echo "(job exit status $?)"
set -e

say "stopping; memtallyd log:"
for p in "${pids[@]:1}"; do kill "$p" 2>/dev/null || true; done
sleep 0.3
kill "${pids[0]}"
wait "${pids[0]}" || true
cat "$dir/memtallyd.log"
