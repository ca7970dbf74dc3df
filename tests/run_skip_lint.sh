#!/bin/sh
# tests/run_skip_lint.sh: a test that skips work must say so to ctest.
#   1. every test script (tests/*.sh, tests/gpu/*.sh) that prints a skip
#      ("skip: ...", "SKIP: ...") also exits 77, so a skipped part is never
#      reported as a pass;
#   2. every registered test whose script or C source exits 77 (or calls
#      gpu_require, tests/gpu/common.sh's skip without a GPU) has the
#      property SKIP_RETURN_CODE 77, so ctest reports "Skipped", not "Failed"
#      (read from `ctest --show-only=json-v1` in the build tree).
# usage: run_skip_lint.sh CTEST BUILD_DIR   (ctest skip_reporting)
CTEST=${1:?usage: run_skip_lint.sh CTEST BUILD_DIR}
BUILD=${2:?usage: run_skip_lint.sh CTEST BUILD_DIR}
here=$(cd "$(dirname "$0")" && pwd)
fails=0 checked=0
bad() { echo "FAIL $*"; fails=$((fails + 1)); }

# 1. skips go with exit 77
for f in "$here"/*.sh "$here"/gpu/*.sh; do
  case $f in */run_skip_lint.sh) continue ;; esac
  # a message about skipping work (not fp16's skipped steps)
  if grep -Ei '(echo|skip) +"[^"]*skip' "$f" | grep -Eivq 'skipped steps|steps skipped|skip connection' ||
     grep -Eq '^ *skip\(\) *\{' "$f"; then
    checked=$((checked + 1))
    grep -q 'exit 77' "$f" || bad "$(basename "$f") prints a skip but never exits 77"
  fi
done

# 2. exit 77 goes with SKIP_RETURN_CODE 77: one line per test, "name|script
# or binary|skip code"
tests=$(cd "$BUILD" && "$CTEST" --show-only=json-v1 2>/dev/null | awk '
  function str(s) { sub(/^[^:]*: *"/, "", s); sub(/".*$/, "", s); return s }
  function flush() { if (name != "") print name "|" cmd "|" code; name = ""; cmd = ""; code = "" }
  /"tests" *:/ { in_tests = 1 }
  !in_tests { next }
  /"backtrace" *:/ { flush(); next }
  /"command" *:/ { in_cmd = 1; next }
  in_cmd && /^ *\[ *$/ { next }
  in_cmd && /^ *\]/ { in_cmd = 0; need_name = 1; next }
  in_cmd { v = $0; sub(/^ *"/, "", v); sub(/",? *$/, "", v); if (cmd == "" || (v ~ /\.sh$/ && cmd !~ /\.sh$/)) cmd = v; next }
  need_name && /"name" *:/ { name = str($0); need_name = 0; next }
  /"name" *: *"SKIP_RETURN_CODE"/ { want_code = 1; next }
  want_code && /"value"/ { v = $0; sub(/^[^:]*: */, "", v); sub(/[^0-9].*$/, "", v); code = v; want_code = 0 }
  END { flush() }
')
[ -n "$tests" ] || { echo "FAIL: no tests read from $CTEST --show-only=json-v1 in $BUILD"; exit 1; }
echo "$tests" | {
  n=0 f=0
  while IFS='|' read -r name cmd code; do
    n=$((n + 1))
    case $cmd in
      *.sh) src=$cmd ;;
      */test_*) b=$(basename "$cmd"); src=$here/$b.c; [ -f "$src" ] || src=$here/gpu/$b.c ;;
      *) src= ;;
    esac
    [ -n "$src" ] && [ -f "$src" ] || continue
    case $src in */run_skip_lint.sh) continue ;; esac
    # (gpu_require: tests/gpu/common.sh's skip without a GPU, exit 77)
    if grep -Eq 'exit 77|return 77|exit\(77\)|^ *gpu_require' "$src" && [ "$code" != 77 ]; then
      echo "FAIL test $name ($(basename "$src")) exits 77 to skip, but has no SKIP_RETURN_CODE 77"
      f=$((f + 1))
    fi
  done
  echo "$n tests read"
  exit $f
}
sub=$?
fails=$((fails + sub))
echo "$checked scripts print skips; $fails failed"
[ $fails -eq 0 ]
