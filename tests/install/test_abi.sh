#!/usr/bin/env bash
# A shared library exports exactly its committed ABI: every symbol named in
# its .abi list with its version, nothing more (an internal helper or
# protobuf-c's generated names leaking out would show here), and every
# function the given public headers declare is among them. With --no-tls,
# the library must also carry no thread-local storage (the query-only
# library must not bring a worker's state into a scheduler).
#   test_abi.sh [--no-tls] LIB ABI_LIST HEADER...
set -euo pipefail
no_tls=0
[ "${1:-}" = --no-tls ] && { no_tls=1; shift; }
lib=$1 abi=$2
shift 2

for t in nm readelf; do
  command -v $t >/dev/null || { echo "SKIP: $t (binutils) not installed"; exit 77; }
done

got=$(nm -D --defined-only "$lib" | awk '{print $3}' | grep -v '^MEMTALLY_[A-Z_]*[0-9.]*$' | sort)
want=$(grep -v '^#' "$abi" | sed '/^$/d' | sort)
if [ "$got" != "$want" ]; then
  echo "FAIL: $lib exports a different ABI from $abi:"
  diff <(echo "$want") <(echo "$got") | sed 's/^</  missing:/; s/^>/  extra:  /' | grep -v '^---\|^[0-9]'
  exit 1
fi

# Every declaration marked MEMTALLY_EXTERN in the given headers.
declared=$(cat "$@" \
  | tr '\n' ' ' | grep -o 'MEMTALLY_EXTERN[^;]*;' \
  | grep -o '[A-Za-z_][A-Za-z0-9_]*[[:space:]]*(' \
  | sed 's/[[:space:]]*($//' | grep '^memtally_' | sort -u)
for f in $declared; do
  grep -q "^$f@@MEMTALLY_" <<<"$got" || { echo "FAIL: $f is declared public but not exported"; exit 1; }
done

if [ $no_tls = 1 ]; then
  if readelf -lW "$lib" | grep -q '^ *TLS '; then
    echo "FAIL: $lib has a TLS segment"; exit 1
  fi
  if nm -D "$lib" | grep -q ' [uU] memtally_'; then
    echo "FAIL: $lib needs libmemtally:"; nm -D "$lib" | grep ' [uU] memtally_'; exit 1
  fi
fi
n=$(wc -l <<<"$got")
echo "ok: $(basename "$lib"): $n symbols, all versioned, $(wc -w <<<"$declared") public functions exported$([ $no_tls = 1 ] && echo ', no TLS')"
