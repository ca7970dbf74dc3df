#!/bin/sh
# tests/run_ir_diagnostics.sh: IR text files (tests/ir/*.ir) against their
# exact expected output.
#
#   usage: run_ir_diagnostics.sh /path/to/duet   (in tests/ir; ctest does)
#
# For each NAME.ir (sorted) it runs `duet check NAME.ir`, or, when the first
# line is `# run: CMD ARGS...`, `duet CMD NAME.ir ARGS...` (pass tests, as in
# QBE's test/*.ssa), and compares stdout and stderr together, byte for byte,
# with NAME.expected.  The exit status must be 1 when the expected text
# contains ": error: " and 0 otherwise.  UPDATE_GOLDEN=1 rewrites the
# .expected files: read every rewritten one (message, line, column, caret).
# As in run_diagnostics.sh, it records only exit 0 or a diagnostic (exit 1,
# `: error: `) of the kind an existing golden holds, never a crash.
set -u
. "$(dirname "$0")/golden_lib.sh"
if [ $# -ne 1 ]; then
  echo "usage: $0 /path/to/duet  (run in tests/ir)" >&2
  exit 2
fi
DUET=$1
case $DUET in
  /*) ;;
  *) DUET=$(pwd)/$DUET ;;
esac
[ -x "$DUET" ] || { echo "$0: $DUET is not an executable" >&2; exit 2; }
tmp=$(mktemp "${TMPDIR:-/tmp}/duet-irdiag.XXXXXX") || exit 2
trap 'rm -f "$tmp"' EXIT HUP INT TERM
LC_ALL=C
export LC_ALL
pass=0 fail=0 found=0
for f in *.ir; do
  [ -e "$f" ] || continue
  found=1
  name=${f%.ir}
  first=$(head -n 1 "$f")
  case $first in
    "# run: "*)
      set -- ${first#"# run: "}
      cmd=$1; shift
      "$DUET" "$cmd" "$f" "$@" >"$tmp" 2>&1 ;;
    *) "$DUET" check "$f" >"$tmp" 2>&1 ;;
  esac
  rc=$?
  if [ "${UPDATE_GOLDEN:-}" = 1 ]; then
    if golden_acceptable "$name" "$rc" "$tmp" "$name.expected"; then
      cp "$tmp" "$name.expected"; echo "updated $name (exit $rc)"; pass=$((pass + 1))
    else
      fail=$((fail + 1))
    fi
    continue
  fi
  if [ ! -f "$name.expected" ]; then
    echo "FAIL $name: $name.expected is missing"; fail=$((fail + 1)); continue
  fi
  if grep -q ': error: ' "$name.expected"; then want=1; else want=0; fi
  if [ "$rc" -ne "$want" ]; then
    echo "FAIL $name: exit status $rc, expected $want"; diff -u "$name.expected" "$tmp"; fail=$((fail + 1))
  elif ! cmp -s "$name.expected" "$tmp"; then
    echo "FAIL $name"; diff -u "$name.expected" "$tmp"; fail=$((fail + 1))
  else
    echo "ok $name"; pass=$((pass + 1))
  fi
done
[ "$found" = 1 ] || { echo "$0: no *.ir files in $(pwd)" >&2; exit 2; }
if [ "${UPDATE_GOLDEN:-}" = 1 ]; then echo "$pass updated, $fail failed"; else echo "$pass passed, $fail failed"; fi
[ "$fail" -eq 0 ]
