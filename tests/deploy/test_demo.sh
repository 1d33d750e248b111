#!/usr/bin/env bash
# make demo's main job: it must end by itself, show a task admitted and one
# denied with its figures, a job waiting for room with `memtally run --wait`
# and running once memory is freed, and leave no process, socket or restart
# record behind (all three live in its /tmp/memtally-demo.* directory).
set -euo pipefail
build=$1 src=$(cd "$(dirname "$0")/../.." && pwd)
shopt -s nullglob
demo_dirs() { local d=(/tmp/memtally-demo.*); echo ${#d[@]}; }
before=$(demo_dirs)
# Into a file, as `make demo > demo.log 2>&1` does: nothing may be lost
# (a `tee /dev/stderr` inside once truncated the file mid-run).
log=$(mktemp)
trap 'rm -f "$log"' EXIT
timeout 120 bash "$src/deploy/demo.sh" "$build" >"$log" 2>&1
out=$(cat "$log")
grep -q '== starting memtallyd' <<<"$out" \
  || { echo "the start of the demo's output was lost"; exit 1; }
grep -q '^admitted: r-' <<<"$out" || { echo "no admission shown"; exit 1; }
grep -q '^denied: fleet limit: .* measured + .* reserved + .* requested > ' <<<"$out" \
  || { echo "no denial with figures shown"; exit 1; }
grep -q '(exit status 3)' <<<"$out" || { echo "denial did not exit 3"; exit 1; }
# The `memtally run` scene: the job waits, and runs only once the etl
# worker's memory is freed.
waiting=$(grep -n '^memtally: waiting up to 30 s for room: ' <<<"$out" | cut -d: -f1 | head -1)
freed=$(grep -n '== the etl worker .* ends' <<<"$out" | cut -d: -f1 | head -1)
ran=$(grep -n '^job demo-job ran, holding 150 MiB$' <<<"$out" | cut -d: -f1 | head -1)
[ -n "$waiting" ] || { echo "the job did not wait for room"; exit 1; }
[ -n "$freed" ] && [ -n "$ran" ] || { echo "the waiting job never ran"; exit 1; }
[ "$waiting" -lt "$freed" ] && [ "$freed" -lt "$ran" ] \
  || { echo "the job ran before room appeared (lines $waiting, $freed, $ran)"; exit 1; }
grep -q '^(job exit status 0)$' <<<"$out" || { echo "the job's status was not 0"; exit 1; }
after=$(demo_dirs)
[ "$after" -le "$before" ] || { echo "demo left its directory behind"; exit 1; }
if pgrep -f "memtally-demo\." >/dev/null; then echo "demo left a process"; exit 1; fi
echo "1 passed, 0 failed"
