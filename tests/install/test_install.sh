#!/usr/bin/env bash
# cmake --install into a temporary prefix, then build an outside program
# against it twice: with pkg-config and with find_package(memtally).
set -euo pipefail
build=$1 src=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
for f in bin/memtallyd bin/memtally lib/libmemtally.so lib/libmemtally.a \
         lib/libmemtally_preload.so include/memtally.h include/memtally_query.h \
         lib/pkgconfig/memtally.pc lib/cmake/memtally/memtallyConfig.cmake; do
  [ -e "$tmp/prefix/$f" ] || { echo "missing after install: $f"; exit 1; }
done
export MEMTALLY_SOCKET=/nonexistent/memtally.sock
PKG_CONFIG_PATH=$tmp/prefix/lib/pkgconfig
cc "$src/../../examples/c/main.c" -o "$tmp/pc" \
  $(PKG_CONFIG_PATH=$PKG_CONFIG_PATH pkg-config --cflags --libs memtally) \
  -Wl,-rpath,"$tmp/prefix/lib"
"$tmp/pc"
cmake -S "$src/../../examples/c" -B "$tmp/b" -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/b" >/dev/null
"$tmp/b/consumer"
echo "2 passed, 0 failed"
