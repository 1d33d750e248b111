#!/usr/bin/env bash
# cmake --install into a temporary prefix, then build an outside program
# against it twice: with pkg-config and with find_package(memtally).
set -euo pipefail
build=$1 src=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
for f in bin/memtallyd bin/memtally lib/libmemtally.so lib/libmemtally.a \
         lib/libmemtally_preload.so lib/libmemtally_query.so \
         include/memtally.h include/memtally_query.h include/memtally_errors.h \
         include/memtally_version.h lib/pkgconfig/memtally.pc \
         lib/pkgconfig/memtally-query.pc lib/cmake/memtally/memtallyConfig.cmake; do
  [ -e "$tmp/prefix/$f" ] || { echo "missing after install: $f"; exit 1; }
done
# The unit runs the daemon this install put in place, not /usr/bin's.
grep -qx "ExecStart=$tmp/prefix/bin/memtallyd --config /etc/memtally/memtallyd.conf" \
  "$tmp/prefix/lib/systemd/system/memtallyd.service" \
  || { echo "the installed unit does not run $tmp/prefix/bin/memtallyd:"; \
       grep ExecStart "$tmp/prefix/lib/systemd/system/memtallyd.service"; exit 1; }
export MEMTALLY_SOCKET=/nonexistent/memtally.sock
PKG_CONFIG_PATH=$tmp/prefix/lib/pkgconfig
cc "$src/../../examples/c/main.c" -o "$tmp/pc" \
  $(PKG_CONFIG_PATH=$PKG_CONFIG_PATH pkg-config --cflags --libs memtally) \
  -Wl,-rpath,"$tmp/prefix/lib"
"$tmp/pc"
cmake -S "$src/../../examples/c" -B "$tmp/b" -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/b" >/dev/null
"$tmp/b/consumer"

# A scheduler links the query library alone: it asks a server, and none of
# libmemtally (worker state, thread-locals) comes with it.
cat > "$tmp/sched.c" <<'C'
#include <stdio.h>
#include <string.h>
#include <memtally_query.h>
int main(void)
{
	memtally_query *q;
	int err = memtally_query_open(&q, "/nonexistent/memtally.sock", 200);
	uint64_t v;
	if (memtally_parse_size("1.5G", &v) || v != 1610612736ull) return 2;
	if (strcmp(memtally_version(), MEMTALLY_VERSION_STRING)) return 3;
	printf("scheduler: %s\n", err ? memtally_strerror(err) : "connected");
	return err ? 0 : 4; /* nothing listens there */
}
C
cc "$tmp/sched.c" -o "$tmp/sched" \
  $(PKG_CONFIG_PATH=$PKG_CONFIG_PATH pkg-config --cflags --libs memtally-query) \
  -Wl,-rpath,"$tmp/prefix/lib"
"$tmp/sched"
if ldd "$tmp/sched" | grep -q 'libmemtally\.so'; then
  echo "the scheduler pulled in libmemtally"; exit 1
fi
echo "3 passed, 0 failed"
