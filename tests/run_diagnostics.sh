#!/bin/sh
# tests/run_diagnostics.sh: golden tests of `duet check` diagnostics.
#
#   usage: run_diagnostics.sh /path/to/duet
#
# Run with tests/diagnostics as the working directory (ctest does).  For each
# NAME.model (sorted) it runs `duet check NAME.model` and compares stdout and
# stderr together, byte for byte, with NAME.expected.  The exit status must be
# 1 when the expected text contains ": error: " and 0 otherwise.
#
# UPDATE_GOLDEN=1 rewrites the .expected files instead.  Read every rewritten
# file (message, line, column, caret) before committing it.  It records only
# what the test expects: exit 0 (a valid model), or exit 1 with a
# `file:line:col: error:` diagnostic (a malformed one); an existing golden
# keeps its kind (delete it to record the other).  A crash, a sanitizer
# report, an internal error or another exit status is refused, counted as a
# failure, and the golden is left as it was.
set -u
. "$(dirname "$0")/golden_lib.sh"

if [ $# -ne 1 ]; then
  echo "usage: $0 /path/to/duet  (run in tests/diagnostics)" >&2
  exit 2
fi
DUET=$1
case $DUET in
  /*) ;;
  *) DUET=$(pwd)/$DUET ;;
esac
if [ ! -x "$DUET" ]; then
  echo "$0: $DUET is not an executable" >&2
  exit 2
fi

tmp=$(mktemp "${TMPDIR:-/tmp}/duet-diag.XXXXXX") || exit 2
trap 'rm -f "$tmp"' EXIT HUP INT TERM

pass=0
fail=0
found=0
# the glob expands sorted (POSIX: in the collation order of the locale)
LC_ALL=C
export LC_ALL
for model in *.model; do
  [ -e "$model" ] || continue
  found=1
  name=${model%.model}
  expected=$name.expected
  "$DUET" check "$model" >"$tmp" 2>&1
  rc=$?
  if [ "${UPDATE_GOLDEN:-}" = 1 ]; then
    if golden_acceptable "$name" "$rc" "$tmp" "$expected"; then
      cp "$tmp" "$expected"
      echo "updated $name (exit $rc)"
      pass=$((pass + 1))
    else
      fail=$((fail + 1))
    fi
    continue
  fi
  if [ ! -f "$expected" ]; then
    echo "FAIL $name: $expected is missing"
    fail=$((fail + 1))
    continue
  fi
  if grep -q ': error: ' "$expected"; then want=1; else want=0; fi
  if [ "$rc" -ne "$want" ]; then
    echo "FAIL $name: exit status $rc, expected $want"
    diff -u "$expected" "$tmp"
    fail=$((fail + 1))
  elif ! cmp -s "$expected" "$tmp"; then
    echo "FAIL $name"
    diff -u "$expected" "$tmp"
    fail=$((fail + 1))
  else
    echo "ok $name"
    pass=$((pass + 1))
  fi
done

if [ "$found" = 0 ]; then
  echo "$0: no *.model files in $(pwd)" >&2
  exit 2
fi
if [ "${UPDATE_GOLDEN:-}" = 1 ]; then echo "$pass updated, $fail failed"; else echo "$pass passed, $fail failed"; fi
[ "$fail" -eq 0 ]
