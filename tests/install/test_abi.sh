#!/usr/bin/env bash
# The shared library exports exactly the committed ABI: every symbol named
# in client/libmemtally.abi with its version, nothing more (an internal
# helper or protobuf-c's generated names leaking out would show here), and
# every function the public headers declare is among them.
set -euo pipefail
lib=$1 abi=$2 hdrdir=$3

command -v nm >/dev/null || { echo "SKIP: nm (binutils) not installed"; exit 77; }

got=$(nm -D --defined-only "$lib" | awk '{print $3}' | grep -v '^MEMTALLY_[0-9.]*$' | sort)
want=$(grep -v '^#' "$abi" | sed '/^$/d' | sort)
if [ "$got" != "$want" ]; then
  echo "FAIL: $lib exports a different ABI from $abi:"
  diff <(echo "$want") <(echo "$got") | sed 's/^</  missing:/; s/^>/  extra:  /' | grep -v '^---\|^[0-9]'
  exit 1
fi

# Every declaration marked MEMTALLY_EXTERN in the installed headers.
declared=$(cat "$hdrdir"/memtally.h "$hdrdir"/memtally_query.h \
  | tr '\n' ' ' | grep -o 'MEMTALLY_EXTERN[^;]*;' \
  | grep -o '[A-Za-z_][A-Za-z0-9_]*[[:space:]]*(' | grep -v '^\(const\|void\|int\)' \
  | sed 's/[[:space:]]*($//' | grep '^memtally_' | sort -u)
for f in $declared; do
  grep -q "^$f@@MEMTALLY_" <<<"$got" || { echo "FAIL: $f is declared public but not exported"; exit 1; }
done
n=$(wc -l <<<"$got")
echo "ok: $n symbols, all versioned, $(wc -w <<<"$declared") public functions exported"
