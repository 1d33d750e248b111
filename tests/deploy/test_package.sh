#!/usr/bin/env bash
# The Debian package: cpack -G DEB from the build directory (into a scratch
# directory), then its metadata and file list, and that its postinst is a
# valid shell script.
# usage: test_package.sh BUILD_DIR
set -euo pipefail
build=$1
for tool in cpack dpkg-deb dpkg-shlibdeps; do
  command -v $tool >/dev/null || { echo "SKIPPED: $tool not installed (apt-get install dpkg-dev cmake)"; exit 77; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
cpack -G DEB --config "$build/CPackConfig.cmake" -B "$tmp" >"$tmp/cpack.log" 2>&1 \
  || { cat "$tmp/cpack.log"; fail "cpack -G DEB"; }
deb=$(ls "$tmp"/memtally_*.deb 2>/dev/null | head -1)
[ -n "$deb" ] || { cat "$tmp/cpack.log"; fail "no memtally_*.deb"; }
echo "built $(basename "$deb")"

dpkg-deb -c "$deb" | awk '{print $6}' | sed 's#^\./#/#' > "$tmp/files"
for f in /usr/bin/memtallyd /usr/bin/memtally /usr/lib/libmemtally.so \
         /usr/lib/libmemtally_preload.so /usr/include/memtally.h \
         /usr/include/memtally_query.h /usr/lib/pkgconfig/memtally.pc \
         /usr/lib/cmake/memtally/memtallyConfig.cmake \
         /usr/lib/cmake/memtally/memtallyConfigVersion.cmake \
         /usr/lib/systemd/system/memtallyd.service \
         /usr/lib/sysusers.d/memtally.conf /usr/lib/tmpfiles.d/memtally.conf \
         /usr/share/doc/memtally/examples/memtallyd.conf \
         /usr/lib/python3/dist-packages/memtally/__init__.py \
         /usr/lib/python3/dist-packages/memtally/client.py \
         /usr/lib/python3/dist-packages/memtally/celery.py \
         /usr/lib/python3/dist-packages/memtally/dask.py \
         /usr/lib/python3/dist-packages/memtally/memtally_pb2.py \
         /usr/share/doc/memtally/examples/prometheus/memtally.rules.yml \
         /usr/bin/memtally-slurm-task /usr/libexec/memtally/memtally-slurm-hook \
         /usr/libexec/memtally/memtally-slurm-taskprolog \
         /usr/share/memtally/proto/memtally.proto \
         /usr/share/man/man8/memtallyd.8 /usr/share/man/man1/memtally.1; do
  grep -qxF "$f" "$tmp/files" || { cat "$tmp/files"; fail "package lacks $f"; }
done
grep -qE '^/usr/lib/libmemtally\.so\.[0-9]' "$tmp/files" \
  || grep -qE '^/usr/lib/libmemtally\.so$' "$tmp/files" || fail "no libmemtally.so*"
! grep -qE '^/(etc|usr/local|tmp|work)/' "$tmp/files" || fail "files outside /usr: $(grep -E '^/(etc|usr/local|tmp|work)/' "$tmp/files")"

dpkg-deb -f "$deb" Package Version Architecture Depends Section Maintainer Description > "$tmp/control"
grep -qx 'Package: memtally' "$tmp/control" || fail "Package: $(cat "$tmp/control")"
for dep in libstdc++6 libuv1 libprotobuf-c1 libc6; do
  grep -q "^Depends:.*\b$dep\b" "$tmp/control" || fail "Depends lacks $dep: $(grep ^Depends "$tmp/control")"
done
grep -q '^Maintainer: .\+' "$tmp/control" || fail "no Maintainer"
dpkg-deb -e "$deb" "$tmp/ctl"
sh -n "$tmp/ctl/postinst" || fail "postinst does not parse"
cat "$tmp/control"
echo "1 passed, 0 failed"
