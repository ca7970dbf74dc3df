#!/bin/sh
# The README's five-minute tour runs as written (issue 18, item 8: every
# example in the README run by a test).  Every command line of the tour's
# fenced blocks that starts with `build/duet` is run from a scratch
# directory whose build/, models/ and data/ are the repository's; lines
# joined by `&&` run as one.  Training commands get a shorter run appended
# (`--steps 3 --test-subset 500`; with `--warmup N`, N + 1 steps, the
# shortest run the warm-up fits; gpt_kjv: `--steps 2 --eval-batches 2`),
# nothing else is changed.  The claims the README prints are checked against the
# output, read from the README's prose: the IR lines shown; for GPT-2 small
# on one 16 GiB P100 the `... DOES NOT FIT` quoted and exit 1, on two the
# forward ops, GiB (the plan's MiB / 1024, one decimal) and bubble it
# names, and `--fit`'s best command line holding the flags quoted; and the
# model file shown is models/fmnist_mlp.model without its comments, blank
# lines, seed and log_every.
# Without Fashion-MNIST the training parts are skipped, without
# data/kjv.txt the GPT part (exit 77 after the rest).
# usage: run_readme.sh SOURCE_DIR BUILD_DIR
SRC=${1:?usage: run_readme.sh SOURCE_DIR BUILD_DIR}
BUILD=${2:?usage: run_readme.sh SOURCE_DIR BUILD_DIR}
d=$(mktemp -d "${TMPDIR:-/tmp}/duet-readme.XXXXXX") || exit 2
trap 'rm -rf "$d"' EXIT
pass=0 fail=0 skipped=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
ln -s "$BUILD" "$d/build" && ln -s "$SRC/models" "$d/models" || exit 2
[ -e "$SRC/data/kjv.txt" ] && { mkdir "$d/data" && ln -s "$SRC/data/kjv.txt" "$d/data/kjv.txt"; }
fmnist=/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz
# the tour: from its heading to the next section, fenced lines only
sed -n '/^## A five-minute tour/,/^## Where to read next/p' "$SRC/README.md" > "$d/tour.md"
awk '/^```/ { f = !f; next } f && /^build\/duet / { sub(/[ ]+#.*$/, ""); print }' "$d/tour.md" > "$d/cmds"
n=$(wc -l < "$d/cmds")
[ "$n" -ge 8 ] && ok || bad "the tour has $n build/duet command lines (expected at least 8)"
# the model file shown, line for line, is models/fmnist_mlp.model's
awk '/^```/ { f = !f; if (!f) exit; next } f' "$d/tour.md" > "$d/shown.model"
sed 's/[ ]*#.*$//; /^[ ]*$/d' "$SRC/models/fmnist_mlp.model" |
  grep -v '^  seed = \|^  log_every = ' > "$d/file.model"
cmp -s "$d/shown.model" "$d/file.model" && ok || { bad "the model shown is not models/fmnist_mlp.model"; diff "$d/shown.model" "$d/file.model"; }
# a claim of the tour's prose, the text joined into one line: claim SED-SCRIPT
tr '\n' ' ' < "$d/tour.md" > "$d/flat"
claim() { sed -n "$1" "$d/flat"; }
i=0
while IFS= read -r line; do
  i=$((i + 1))
  case "$line" in
    *gpt_kjv*) [ -e "$d/data/kjv.txt" ] || { echo "SKIP: $line (no data/kjv.txt: make data)"; skipped=1; continue; } ;;
    *fmnist_mlp*) [ -e "$fmnist" ] || { echo "SKIP: $line (no Fashion-MNIST)"; skipped=1; continue; } ;;
  esac
  cmd=$line
  case "$line" in
    "build/duet run "*gpt_kjv*) cmd="$line --steps 2 --eval-batches 2" ;;
    "build/duet run "*--eval-only*) cmd="$line --test-subset 500" ;;
    "build/duet run "*--warmup*) cmd="$line --steps $(($(echo "$line" | sed 's/.*--warmup \([0-9]*\).*/\1/') + 1)) --test-subset 500" ;;
    "build/duet run "*) cmd="$line --steps 3 --test-subset 500" ;;
  esac
  (cd "$d" && eval "$cmd") > "$d/out.$i" 2>&1
  rc=$?
  case "$line" in
    *"plan models/gpt2_124m.model --devices 16GiB:sm_60"*--fit)
      want=$(claim 's/.*prints the best as a `duet run` command line (here with `\([^`]*\)`).*/\1/p')
      if [ "$rc" -eq 0 ] && [ -n "$want" ] && grep "^best: duet run models/gpt2_124m.model " "$d/out.$i" | grep -qF -- "$want"; then ok; else
        bad "$line: want a best line with '$want' (exit $rc)"; grep '^best' "$d/out.$i"; fi ;;
    *"plan models/gpt2_124m.model --devices 16GiB:sm_60"*)
      want=$(claim 's/.*The first says `\([^`]*\)`.*/\1/p')
      if [ "$rc" -eq 1 ] && [ -n "$want" ] && grep -qF -- "$want" "$d/out.$i"; then ok; else
        bad "$line: want exit 1 and '$want' (exit $rc)"; grep 'memory' "$d/out.$i"; fi ;;
    *"plan models/gpt2_124m.model --devices 2x16GiB:sm_60"*)
      # "puts A forward ops on the first card and B on the second, X and Y GiB each, with a bubble of N/D"
      set -- $(claim 's/.*puts \([0-9]*\) forward ops on the first card and \([0-9]*\) on the second, \([0-9.]*\) and \([0-9.]*\) GiB each, with a bubble of \([0-9]*\/[0-9]*\) .*/\1 \2 \3 \4 \5/p')
      got=$(awk '/^stage [01] on/ { ops[$2] = $5 }
                 /^  memory:/ { n++; m = $0; sub(/ MiB of .*/, "", m); sub(/.* /, "", m); g[n] = sprintf("%.1f", m / 1024) }
                 /^bubble fraction/ { b = $5 }
                 END { print ops[0], ops[1], g[1], g[2], b }' "$d/out.$i")
      if [ "$rc" -eq 0 ] && [ $# -eq 5 ] && [ "$got" = "$*" ]; then ok; else
        bad "$line: the README says '$*' (ops, ops, GiB, GiB, bubble), duet prints '$got' (exit $rc)"; fi ;;
    *"ir models/fmnist_mlp.model --after fuse"*)
      awk '/^```/ { f = !f; next } f && /^%[0-9]/' "$d/tour.md" > "$d/irlines"
      if [ "$rc" -eq 0 ] && [ -s "$d/irlines" ] && ! grep -vxFf "$d/out.$i" "$d/irlines" > "$d/irmiss"; then ok; else
        bad "$line: exit $rc, or the README's IR lines are not in its output:"; cat "$d/irmiss"; fi ;;
    *)
      if [ "$rc" -eq 0 ]; then ok; else bad "$cmd: exit $rc"; tail -5 "$d/out.$i"; fi ;;
  esac
done < "$d/cmds"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ] || exit 1
[ "$skipped" -eq 0 ] || exit 77
