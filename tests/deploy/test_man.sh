#!/usr/bin/env bash
# The man pages render without a warning (groff -ww, man --warnings) and
# name every option and command the binaries' --help names.
# usage: test_man.sh SOURCE_DIR MEMTALLYD MEMTALLY
set -euo pipefail
src=$1 memtallyd=$2 memtally=$3
fail() { echo "FAIL: $*"; exit 1; }
command -v groff >/dev/null || { echo "SKIPPED: groff not installed (apt-get install groff-base)"; exit 77; }
command -v man >/dev/null || { echo "SKIPPED: man not installed (apt-get install man-db)"; exit 77; }
n=0
check_page() { # page binary [commands...]
  local page=$1 bin=$2; shift 2
  local err
  err=$(groff -man -ww -z "$page" 2>&1) || fail "groff $page: $err"
  [ -z "$err" ] || fail "groff warns on $page: $err"
  err=$(MANWIDTH=80 man --warnings -l "$page" 2>&1 >/dev/null) || fail "man -l $page: $err"
  [ -z "$err" ] || fail "man warns on $page: $err"
  local text opts version
  text=$(sed 's/\\-/-/g' "$page")
  # The page's header names the release the binary reports.
  version=$("$bin" --version | awk '{print $2}')
  head -1 "$page" | grep -qF "\"memtally $version\"" ||
    fail "$page's .TH does not say memtally $version: $(head -1 "$page")"
  opts=$("$bin" --help | grep -oE -- '--[a-z][a-z-]*' | sort -u)
  for o in $opts; do
    grep -qF -- "$o" <<<"$text" || fail "$page does not document $o (from $(basename "$bin") --help)"
  done
  for c in "$@"; do
    grep -qE "^\.(B|BR|BI|TP).*\b$c\b" <<<"$text" || fail "$page does not document command $c"
  done
  n=$((n + 1))
}
check_page "$src/docs/memtallyd.8" "$memtallyd"
# The configuration file's keys in memtallyd.8 are checked against --help
# and the start-up log by house/config_agree (scripts/config_agree.py).
cmds=$("$memtally" --help | sed -n '/^Commands:/,/^$/p' | awk 'NR>1 && /^  [a-z]/ {print $1}')
check_page "$src/docs/memtally.1" "$memtally" $cmds
echo "$n passed, 0 failed"
