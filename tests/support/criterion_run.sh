#!/bin/sh
# Run a Criterion unit test binary (its arguments after the first) as ctest
# does, and exit 77, ctest's skip, when none failed but one or more were
# skipped (a probe found the machine without what it needs: IPv6 loopback,
# sock_diag, leases, ...). Criterion itself exits 0 then, and a skip must
# never be reported as a pass. The skips are said on stderr.
tap=$(mktemp "${TMPDIR:-/tmp}/mt-unit-tap.XXXXXX") || exit 1
trap 'rm -f "$tap"' EXIT
"$@" --tap="$tap"
rc=$?
echo >&2
if [ "$rc" -eq 0 ] && grep -q '# SKIP' "$tap"; then
  grep '# SKIP' "$tap" | sed 's/^/skipped: /' >&2
  exit 77
fi
exit "$rc"
