#!/usr/bin/env bash
# make demo's main job: it must end by itself, show a task admitted and one
# denied with its figures, and leave no process or segment behind.
set -euo pipefail
build=$1 src=$(cd "$(dirname "$0")/../.." && pwd)
before=$(ls /dev/shm | grep -c '^memtally-demo-' || true)
out=$(timeout 120 bash "$src/deploy/demo.sh" "$build" 2>&1)
grep -q '^admitted: r-' <<<"$out" || { echo "no admission shown"; exit 1; }
grep -q '^denied: fleet limit: .* measured + .* reserved + .* requested > ' <<<"$out" \
  || { echo "no denial with figures shown"; exit 1; }
grep -q '(exit status 3)' <<<"$out" || { echo "denial did not exit 3"; exit 1; }
after=$(ls /dev/shm | grep -c '^memtally-demo-' || true)
[ "$after" -le "$before" ] || { echo "demo left a segment behind"; exit 1; }
if pgrep -f "memtally-demo\." >/dev/null; then echo "demo left a process"; exit 1; fi
echo "1 passed, 0 failed"
