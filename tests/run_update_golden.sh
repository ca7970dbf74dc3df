#!/bin/sh
# tests/run_update_golden.sh: UPDATE_GOLDEN=1 must not turn a failure into a
# golden.  Runs the three golden runners of this directory (run_diagnostics.sh,
# run_ir_diagnostics.sh, run_golden.sh) in a temporary directory, in update
# mode, with a stand-in for duet whose output and exit status each case sets
# (CASE.out, CASE.rc), and checks which goldens were written, which were left
# as they were, and that the runner exits nonzero when it refused one.
#
#   usage: run_update_golden.sh     (ctest update_golden)
set -u
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/duet-update-golden.XXXXXX") || exit 2
trap 'rm -rf "$tmp"' EXIT HUP INT TERM
fails=0
fail() { echo "FAIL $*"; fails=$((fails + 1)); }
ok() { echo "ok $*"; }

# the stand-in: the first argument naming a .model or .ir file picks the
# case; it prints CASE.out (default: a line naming its arguments) and exits
# with CASE.rc (default 0)
cat > "$tmp/duet" <<'EOF'
#!/bin/sh
for a in "$@"; do
  case $a in
    *.model|*.ir) base=${a%.*}; break ;;
  esac
done
if [ -f "$base.out" ]; then cat "$base.out"; else echo "output of $*"; fi
[ -f "$base.rc" ] && exit "$(cat "$base.rc")"
exit 0
EOF
chmod +x "$tmp/duet"

# --- run_diagnostics.sh: CASE.model, CASE.expected (golden), CASE.out, CASE.rc
d=$tmp/diag
mkdir -p "$d"
mk() { # case golden-text-or-"" out-text rc
  echo "model $1" > "$d/$1.model"
  [ -n "$2" ] && printf '%s\n' "$2" > "$d/$1.expected"
  printf '%s\n' "$3" > "$d/$1.out"
  echo "$4" > "$d/$1.rc"
}
mk new_diag "" "new_diag.model:1:1: error: new message" 1
mk changed_diag "changed_diag.model:1:1: error: old message" "changed_diag.model:1:1: error: new message" 1
mk new_ok "" "new_ok.model: ok, 3 parameters" 0
mk crash "" "duet: internal error at ir/ir.c:12: assertion failed: x" 134
mk segv "segv.model:1:1: error: old message" "" 139
mk asan "asan.model:1:1: error: old message" "asan.model:1:1: error: old message
==42==ERROR: AddressSanitizer: heap-use-after-free on address 0x1" 1
mk flip_to_error "flip_to_error.model: ok, 3 parameters" "flip_to_error.model:1:1: error: now an error" 1
mk flip_to_ok "flip_to_ok.model:1:1: error: was an error" "flip_to_ok.model: ok" 0
mk exit1_no_diag "" "something went wrong" 1
mk usage "" "usage: duet check M.model" 2
(cd "$d" && UPDATE_GOLDEN=1 sh "$here/run_diagnostics.sh" "$tmp/duet") > "$tmp/diag.log" 2>&1
rc=$?
[ $rc -ne 0 ] && ok "run_diagnostics.sh exits $rc after refusing" || fail "run_diagnostics.sh exits 0 after failed commands"
for c in new_diag changed_diag new_ok; do
  if cmp -s "$d/$c.out" "$d/$c.expected"; then ok "$c: written"; else fail "$c: not written"; fi
done
for c in crash exit1_no_diag usage; do
  [ -f "$d/$c.expected" ] && fail "$c: a golden was written from exit $(cat "$d/$c.rc")" || ok "$c: refused"
done
for c in segv asan flip_to_error flip_to_ok; do
  if cmp -s "$d/$c.out" "$d/$c.expected"; then fail "$c: golden overwritten (exit $(cat "$d/$c.rc"))"; else ok "$c: golden kept"; fi
done
grep -q "FAIL crash: not updated: exit 134" "$tmp/diag.log" && ok "the refusal says why" || {
  fail "no reason given for the crash"; cat "$tmp/diag.log"; }

# --- run_ir_diagnostics.sh: the same rule for .ir cases (`# run:` lines too)
d=$tmp/ir
mkdir -p "$d"
printf '# run: run --steps 1\nmodel a\n' > "$d/dump_crash.ir"
printf 'dump_crash.ir:3:1: error: old\n' > "$d/dump_crash.expected"
printf 'Segmentation fault\n' > "$d/dump_crash.out"; echo 139 > "$d/dump_crash.rc"
printf 'model b\n' > "$d/fine.ir"
printf 'fine.ir:2:1: error: new\n' > "$d/fine.out"; echo 1 > "$d/fine.rc"
(cd "$d" && UPDATE_GOLDEN=1 sh "$here/run_ir_diagnostics.sh" "$tmp/duet") > "$tmp/ir.log" 2>&1
rc=$?
[ $rc -ne 0 ] && ok "run_ir_diagnostics.sh exits $rc after refusing" || fail "run_ir_diagnostics.sh exits 0 after a crash"
grep -q old "$d/dump_crash.expected" && ok "dump_crash: golden kept" || fail "dump_crash: golden overwritten"
cmp -s "$d/fine.out" "$d/fine.expected" && ok "fine: written" || fail "fine: not written"

# --- run_golden.sh (from a repository root: models/, tests/golden/): a
# golden records a successful command's output only
r=$tmp/root
mkdir -p "$r/models" "$r/tests/golden"
echo "model m" > "$r/models/m.model"
echo "old C" > "$r/tests/golden/m.c"
printf 'm.model:1:1: error: cannot emit\n' > "$r/models/m.out"; echo 1 > "$r/models/m.rc"
(cd "$r" && UPDATE_GOLDEN=1 sh "$here/run_golden.sh" "$tmp/duet") > "$tmp/golden.log" 2>&1
rc=$?
[ $rc -ne 0 ] && ok "run_golden.sh exits $rc after refusing" || fail "run_golden.sh exits 0 after failed commands"
grep -q "old C" "$r/tests/golden/m.c" && ok "m.c: golden kept" || fail "m.c: golden overwritten by an error"
[ -f "$r/tests/golden/m.shape.ir" ] && fail "m.shape.ir written from a failed command" || ok "m.shape.ir: refused"
[ -f "$r/tests/golden/fmnist_mlp.fp16.c" ] && ok "a successful command's golden is written" ||
  fail "fmnist_mlp.fp16.c (the stand-in succeeds) not written"

echo "$fails failed"
[ $fails -eq 0 ]
