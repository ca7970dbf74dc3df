#!/bin/sh
# Progress you can watch (runtime/progress.c), the start-up line, --quiet
# and --version, on real runs:
#  - a pipe: "duet: progress: ..." lines (training and evaluation) at the
#    DUET_PROGRESS_SECONDS interval, exact formats, no carriage return;
#    none in a run shorter than the default 5 s;
#  - a terminal (util-linux `script`; skipped without it): the bar
#    rewritten in place ("\r\033[K" ... "\r") and no plain progress lines;
#  - compiling (`duet run` on a cache miss, `duet compile`): the compiler
#    is alive ("compiling N kernels with cc | E elapsed");
#  - --quiet: no progress, the final line, and its warnings still printed;
#  - the start-up line: precision, devices and threads, lr schedule;
#  - --version on every command, `duet version`, and the fallback outside
#    a git checkout (tools/version.cmake).
# usage: run_progress.sh path/to/duet   (from the repository root)
DUET=${1:?usage: run_progress.sh path/to/duet}
d=$(mktemp -d "${TMPDIR:-/tmp}/duet-progress.XXXXXX") || exit 2
trap 'rm -rf "$d"' EXIT
FM=/usr/share/datasets/fashion-mnist
[ -r "$FM/train-images-idx3-ubyte.gz" ] || { echo "skip: no Fashion-MNIST ($FM)"; exit 77; }
pass=0 fail=0
ok() { echo "ok $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
M=models/fmnist_mlp.model
R="--steps 6 --log-every 100 --train-subset 1536 --test-subset 2000 --threads 1"

# a pipe: progress lines every 0.01 s, training and evaluation (8 batches of 256)
DUET_PROGRESS_SECONDS=0.01 "$DUET" run $M $R > "$d/pipe" 2> "$d/pipe.err"; rc=$?
P='^duet: progress: epoch 1 step [1-6]/6 \| loss [0-9]+\.[0-9]{4} \| [0-9]+ samples/s \| [0-9]+s elapsed, ETA [0-9]+s$'
E='^duet: progress: evaluating: batch [1-7]/8 \| [0-9]+s elapsed, ETA [0-9]+s$'
C='^duet: progress: compiling 18 kernels with [^ ]+ \| [0-9]+s elapsed$' # when the kernel cache misses
if [ $rc -eq 0 ] && [ ! -s "$d/pipe.err" ] && grep -Eq "$P" "$d/pipe" && grep -Eq "$E" "$d/pipe" &&
  [ "$(grep '^duet: progress:' "$d/pipe" | grep -Evc "$P|$E|$C")" = 0 ] &&
  ! grep -q "$(printf '\r')" "$d/pipe" && grep -q '^epoch 1 step 6/6 | loss ' "$d/pipe"; then ok pipe_lines
else bad "pipe_lines: exit $rc"; cat "$d/pipe" "$d/pipe.err"; fi
# the start-up line
grep -qx 'duet: precision fp32, devices cpu (1 thread), lr schedule constant' "$d/pipe" && ok setup_line ||
  { bad setup_line; grep '^duet: precision' "$d/pipe"; }
"$DUET" run $M $R --devices cpu:0,cpu:1 --threads 2 --lr-schedule cosine --warmup 2 --no-eval > "$d/pipe2" 2>&1
grep -qx 'duet: precision fp32, devices cpu:0,cpu:1 (1 thread per CPU device), lr schedule cosine to 0 after warmup 2 over 6 steps, pipeline schedule gpipe' "$d/pipe2" &&
  ok setup_line_pipeline || { bad setup_line_pipeline; grep '^duet: precision' "$d/pipe2"; }
# the default interval (5 s): a short run has no progress line
"$DUET" run $M --steps 2 --train-subset 512 --no-eval --threads 1 > "$d/short" 2>&1 &&
  ! grep -q '^duet: progress' "$d/short" && ok no_lines_before_5s || { bad no_lines_before_5s; cat "$d/short"; }
# a text model: tokens/s
DUET_PROGRESS_SECONDS=0.0001 "$DUET" run tests/models/gpt_tiny.model --steps 20 --log-every 20 --eval-batches 8 \
  --threads 1 > "$d/text" 2>&1 &&
  grep -Eq '^duet: progress: step [0-9]+/20 \| loss [0-9]+\.[0-9]{4} \| [0-9]+ tokens/s \| [0-9]+s elapsed, ETA [0-9]+s$' "$d/text" &&
  grep -Eq '^duet: progress: evaluating: batch [1-7]/8 \| ' "$d/text" && ok text_lines || { bad text_lines; cat "$d/text"; }
# a bad interval: said once, the default used
DUET_PROGRESS_SECONDS=soon "$DUET" run $M --steps 1 --train-subset 512 --no-eval --threads 1 > /dev/null 2> "$d/env.err"
[ "$(cat "$d/env.err")" = "duet: warning: DUET_PROGRESS_SECONDS expects a number of seconds > 0 (at most 86400), got 'soon'; using 5" ] &&
  ok bad_interval || { bad bad_interval; cat "$d/env.err"; }

# compiling: the compiler's run shows it is alive (a fresh kernel cache: a miss)
DUET_CACHE_DIR="$d/cache" DUET_PROGRESS_SECONDS=0.0001 "$DUET" run $M --steps 1 --train-subset 512 --no-eval \
  --threads 1 > "$d/cc" 2>&1 &&
  grep -Eq '^duet: progress: compiling 18 kernels with [^ ]+ \| [0-9]+s elapsed$' "$d/cc" &&
  grep -q '^duet: kernels: 18 (14 functions), compiled in ' "$d/cc" && ok compile_alive || { bad compile_alive; cat "$d/cc"; }
DUET_PROGRESS_SECONDS=0.0001 "$DUET" compile tests/models/sched_tiny.model -o "$d/exe" > "$d/cc2" 2>&1 &&
  grep -Eq '^duet: progress: compiling 21 kernels and the training executable with [^ ]+ \| [0-9]+s elapsed$' "$d/cc2" &&
  ok compile_exe_alive || { bad compile_exe_alive; cat "$d/cc2"; }
rm -rf "$d/cache"

# --quiet: no progress (not even at the interval), the final line; warnings stay
DUET_PROGRESS_SECONDS=0.01 "$DUET" run $M $R --quiet --test-subset 1000000 > "$d/q" 2> "$d/q.err"; rc=$?
[ $rc -eq 0 ] && [ "$(grep -vc '^duet: trained 6 steps in ' "$d/q")" = 0 ] && [ "$(wc -l < "$d/q")" = 1 ] &&
  [ "$(cat "$d/q.err")" = "duet: warning: --test-subset 1000000 exceeds the 10000 test samples; using all" ] &&
  ok quiet_keeps_warnings || { bad "quiet_keeps_warnings: exit $rc"; cat "$d/q" "$d/q.err"; }

# a terminal: the bar, rewritten in place; no plain progress lines
if command -v script > /dev/null 2>&1; then
  DUET_PROGRESS_SECONDS=0.0001 script -qc "'$DUET' run $M $R --log-every 3" /dev/null > "$d/tty" 2>&1 < /dev/null
  tr '\r' '\n' < "$d/tty" > "$d/tty.lines"
  esc=$(printf '\033')
  # (script's terminal has 80 columns: the bar is cut to 79 characters)
  if grep -Eq "^${esc}\[Ktrain \[[#.]{20}\] +[0-9]+% \| [0-9]+s elapsed, ETA [0-9]+s \| epoch 1 step [1-6]/6" "$d/tty.lines" &&
    [ "$(grep "^${esc}\[K[te][ra][ai][il]* \[" "$d/tty.lines" | awk 'length($0) > 82' | wc -l)" = 0 ] &&
    grep -Eq "^${esc}\[Keval \[[#.]{20}\] +[0-9]+% \| [0-9]+s elapsed, ETA [0-9]+s \| evaluating: batch [1-7]/8" "$d/tty.lines" &&
    grep -q "^${esc}\[Kepoch 1 step 6/6 | loss " "$d/tty.lines" && ! grep -q 'duet: progress' "$d/tty" &&
    grep -q '^duet: trained 6 steps' "$d/tty.lines"; then ok terminal_bar
  else bad terminal_bar; cat -v "$d/tty" | head -20; fi
  # under an MPI launcher the terminal is the launcher's pseudo-terminal: plain lines
  OMPI_COMM_WORLD_SIZE=1 OMPI_COMM_WORLD_RANK=0 DUET_PROGRESS_SECONDS=0.0001 \
    script -qc "'$DUET' run $M $R" /dev/null > "$d/ttympi" 2>&1 < /dev/null
  grep -q '^duet: progress: epoch 1 step' "$d/ttympi" && ! grep -q "$esc" "$d/ttympi" && ok terminal_under_mpi_lines ||
    { bad terminal_under_mpi_lines; cat -v "$d/ttympi" | head; }
  script -qc "'$DUET' run $M $R --quiet" /dev/null > "$d/ttyq" 2>&1 < /dev/null
  [ "$(tr -d '\r' < "$d/ttyq" | grep -vc '^duet: trained 6 steps in ')" = 0 ] && ok terminal_quiet ||
    { bad terminal_quiet; cat -v "$d/ttyq"; }
else
  echo "skip terminal_bar: no util-linux script (tests/test_progress.c checks the bar's text)"
fi

# --version: every command, `duet version`, the same line; a commit of this repository
V=$("$DUET" --version); rc=$?
if [ $rc -eq 0 ] && echo "$V" | grep -Eqx 'duet [0-9]+\.[0-9]+\.[0-9]+ \(git ([0-9a-f]{12}, [0-9]{4}-[0-9]{2}-[0-9]{2}|unknown, unknown)\)'; then
  ok version_format
else bad "version_format: '$V'"; fi
h=$(echo "$V" | sed -n 's/.*(git \([0-9a-f]*\),.*/\1/p')
if git rev-parse --git-dir > /dev/null 2>&1; then
  [ -n "$h" ] && git cat-file -e "$h^{commit}" 2> /dev/null && ok version_commit || bad "version_commit: '$V'"
fi
for c in "version" "run --version" "run $M --version" "compile --version" "ir --version" "emit --version" \
         "plan --version" "check --version" "devices --version" "sample --version" "help --version"; do
  # shellcheck disable=SC2086
  [ "$("$DUET" $c 2>&1)" = "$V" ] || { bad "version: duet $c: $("$DUET" $c 2>&1 | head -2)"; continue; }
  pass=$((pass + 1))
done
# outside a git checkout: "unknown"
mkdir "$d/src" && cmake -DSRC="$d/src" -DOUT="$d/v.c" -DVERSION=1.2.3 -P tools/version.cmake &&
  grep -qx 'const char duet_version_line\[\] = "duet 1.2.3 (git unknown, unknown)";' "$d/v.c" && ok version_no_git ||
  { bad version_no_git; cat "$d/v.c"; }

echo "progress: $pass passed, $fail failed"
[ $fail -eq 0 ]
